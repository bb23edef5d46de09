//! A system call's arguments at its exit, from the registers the kernel saved at its entry,
//! and the user memory they point to.
//! Hooking only the exits halves what every system call of every process pays while linger
//! is attached (one tracepoint call instead of two).

use aya_ebpf::helpers::{
    bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_probe_read_user, bpf_task_pt_regs,
};

use crate::task::{stack_regs, Task};

/// Where `struct pt_regs` (a fixed ABI per architecture) keeps the first four system call
/// arguments at the call's exit. x86_64: di, si, dx, r10.
#[cfg(not(bpf_target_arch = "aarch64"))]
const ARGS: [usize; 4] = [112, 104, 96, 56];
/// arm64: x0 holds the return value by then, so the first argument is `orig_x0` (after
/// regs[31], sp, pc and pstate); the others are regs[1] to regs[3].
#[cfg(bpf_target_arch = "aarch64")]
const ARGS: [usize; 4] = [272, 8, 16, 24];

/// The current system call's first `N` (at most four) arguments; None when they cannot be
/// read.
#[inline(always)]
pub fn syscall_args<const N: usize>() -> Option<[u64; N]> {
    // SAFETY: the helpers return the running task and its saved user registers, valid for
    // this program's run; the reads are checked by bpf_probe_read_kernel.
    unsafe {
        let above_stack = stack_regs();
        let regs = if above_stack == 0 {
            bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u8
        } else {
            // Before 5.15 (no bpf_task_pt_regs, nor bpf_get_current_task_btf before 5.11):
            // the registers sit at the top of the task's kernel stack, as task_pt_regs() has it.
            let stack = Task::current().stack();
            if stack.is_null() {
                return None;
            }
            stack.add(above_stack as usize)
        };
        if regs.is_null() {
            return None;
        }
        let mut args = [0u64; N];
        for (arg, off) in args.iter_mut().zip(ARGS) {
            *arg = bpf_probe_read_kernel(regs.add(off) as *const u64).ok()?;
        }
        Some(args)
    }
}

/// A `T` at the user address `addr` of the current process; the default when unreadable.
#[inline(always)]
pub fn read_user<T: Copy + Default>(addr: u64) -> T {
    // SAFETY: bpf_probe_read_user checks the address.
    unsafe { bpf_probe_read_user(addr as *const T) }.unwrap_or_default()
}
