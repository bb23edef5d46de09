//! Who holds GPU device files: opens, dups, closes, inheritance at fork, what survives exec, and
//! what each dying process still held.

use aya_ebpf::{
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use tracer_common::{FdOp, GpuCloseRange, GpuFd, Loss, FD_CLOEXEC, FD_WALK_MAX, FD_WALK_TRUNCATED};

use crate::{
    dying::is_dying,
    emit::{count_loss, current_ids, emit},
    holders::{add_holder, is_holder},
    regs::syscall_args,
    task::{file_dev, file_refcount, FdTable, Task},
};

/// Char majors whose every minor is a GPU file (nvidia, nvidia-uvm, nvidia-caps). Filled by
/// user space from /proc/devices.
#[map]
pub static GPU_MAJORS: HashMap<u32, u8> = HashMap::with_max_entries(64, 0);

/// Single devices (kernel dev_t) declared GPU files with `--gpu-device`.
#[map]
pub static GPU_DEVS: HashMap<u32, u8> = HashMap::with_max_entries(256, 0);

/// Whether system call `nr` opens a file: x86-64's open, openat and openat2; arm64 has the
/// generic table's numbers (no open, openat 56; openat2 has one number everywhere). With
/// x86-64's on arm64, every open read as a dup (the arm64 VM, 6.1, 2026-12-04).
fn opens(nr: i32) -> bool {
    #[cfg(not(bpf_target_arch = "aarch64"))]
    let opens = matches!(nr, 2 | 257 | 437);
    #[cfg(bpf_target_arch = "aarch64")]
    let opens = matches!(nr, 56 | 437);
    opens
}

const F_DUPFD: u64 = 0;
const F_DUPFD_CLOEXEC: u64 = 1030;

pub fn is_gpu_dev(dev: u32) -> bool {
    // SAFETY: values are plain bytes, not held beyond the lookup.
    unsafe { GPU_DEVS.get(dev).is_some() || GPU_MAJORS.get(dev >> 20).is_some() }
}

/// The GPU file at `fd` of the current process: (file, dev).
pub fn gpu_file_at(fd: u32) -> Option<(FdTable, u64, u32)> {
    let fdt = Task::current().fdtable()?;
    let file = fdt.file(fd);
    if file == 0 {
        return None;
    }
    let dev = file_dev(file);
    is_gpu_dev(dev).then_some((fdt, file, dev))
}

fn emit_fd(op: u32, fd: u32, fdt: FdTable, file: u64, dev: u32, extra_flags: u32) {
    emit::<GpuFd>(|e| {
        e.op = op;
        e.fd = fd as i32;
        e.dev = dev;
        e.flags = extra_flags | if fdt.cloexec(fd) { FD_CLOEXEC } else { 0 };
        e.file = file;
        e.refcount = file_refcount(file);
    });
}

/// Exit of open/openat/openat2/dup/dup2/dup3: `ret` is a new descriptor; record it when it is a
/// GPU file. Format: __syscall_nr@8, ret@16.
#[tracepoint]
pub fn fd_installed(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets of the stable sys_exit format.
    let (nr, ret) = unsafe {
        (
            ctx.read_at::<i32>(8).unwrap_or(-1),
            ctx.read_at::<i64>(16).unwrap_or(-1),
        )
    };
    if ret < 0 {
        return 0;
    }
    let op = if opens(nr) { FdOp::Open } else { FdOp::Dup };
    installed(op, ret as u32);
    0
}

/// linger's own pid: its NVML use opens nvidiactl, which is not a GPU holder to follow.
#[unsafe(no_mangle)]
static SELF_PID: u32 = 0;

/// `--lean`: no open is traced, so any process may be a GPU process.
#[unsafe(no_mangle)]
static LEAN: u32 = 0;

/// Whether a record about `tgid` wakes the collector at once: GPU processes' records start
/// NVML's fast readings and the teardown's sampling; everyone else's wait for the next tick
/// (20 ms), which keeps wake-ups off kill storms of processes that never touched a GPU.
pub fn urgent(tgid: u32) -> bool {
    is_holder(tgid) || is_dying(tgid)
}

/// `--lean`: any process may hold GPU memory unseen, so a fatal signal wakes the collector
/// (NVML's fast readings, `signal::lean_wake`); other records wait for the tick like
/// everyone's.
pub fn lean() -> bool {
    // SAFETY: read-only global filled before load.
    unsafe { core::ptr::read_volatile(&LEAN) != 0 }
}

/// Whether `tgid` is linger itself.
pub fn is_self(tgid: u32) -> bool {
    // SAFETY: read-only global filled before load.
    tgid == unsafe { core::ptr::read_volatile(&SELF_PID) }
}

pub fn installed(op: FdOp, fd: u32) {
    if is_self(current_ids().0) {
        return;
    }
    if let Some((fdt, file, dev)) = gpu_file_at(fd) {
        add_holder(current_ids().0);
        emit_fd(op as u32, fd, fdt, file, dev, 0);
    }
}

/// sys_exit_fcntl: ret@16 is the new descriptor of a dup command (cmd, the second argument).
#[tracepoint]
pub fn fcntl_exit(ctx: TracePointContext) -> u32 {
    if !is_holder(current_ids().0) {
        return 0;
    }
    // SAFETY: offset of `ret` in the stable sys_exit format.
    let ret = unsafe { ctx.read_at::<i64>(16) }.unwrap_or(-1);
    let Some([_, cmd, _]) = syscall_args() else {
        return 0;
    };
    if ret >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) {
        installed(FdOp::Dup, ret as u32);
    }
    0
}

/// sys_exit_close of a GPU holder: the descriptor (the first argument) is gone, so the record
/// names only it; user space knows which file it was. Its closes of other files are recorded
/// too (hundreds for a CUDA program): `sys_enter_close` could look at the file first, but
/// every system call of every process would then pay for an entry tracepoint as well (+11 ns a
/// getppid in `cargo xtask bench`, 2026-12-05).
#[tracepoint]
pub fn fd_close(ctx: TracePointContext) -> u32 {
    if !is_holder(current_ids().0) {
        return 0;
    }
    // SAFETY: offset of `ret` in the stable sys_exit format.
    let ret = unsafe { ctx.read_at::<i64>(16) }.unwrap_or(-1);
    let Some([fd, _, _]) = syscall_args() else {
        return 0;
    };
    if ret != 0 || fd > i32::MAX as u64 {
        return 0;
    }
    emit::<GpuFd>(|e| {
        e.op = FdOp::Close as u32;
        e.fd = fd as i32;
    });
    0
}

/// sys_exit_close_range(first, last, flags) of a GPU holder.
#[tracepoint]
pub fn fd_close_range(ctx: TracePointContext) -> u32 {
    if !is_holder(current_ids().0) {
        return 0;
    }
    // SAFETY: offset of `ret` in the stable sys_exit format.
    let ret = unsafe { ctx.read_at::<i64>(16) }.unwrap_or(-1);
    let Some([first, last, flags]) = syscall_args() else {
        return 0;
    };
    if ret != 0 {
        return 0;
    }
    emit::<GpuCloseRange>(|e| {
        e.first = first as u32;
        e.last = last.min(u32::MAX as u64) as u32;
        e.flags = flags as u32;
    });
    0
}

/// Lists the GPU descriptors of `task` (the current task) as `op` records, 64 descriptors of
/// the open-descriptor bitmap at a time.
pub fn walk(task: Task, op: FdOp) {
    let Some(fdt) = task.fdtable() else {
        return;
    };
    let max = fdt.max_fds();
    let words = max.min(FD_WALK_MAX).div_ceil(64);
    for word in 0..FD_WALK_MAX / 64 {
        if word >= words {
            break;
        }
        walk_fds_word(fdt.addr(), word, op as u32);
    }
    if max > FD_WALK_MAX {
        // Counted, so that incidents traced meanwhile say so, and marked, so that user space
        // keeps what it knew of the descriptors the walk did not reach.
        count_loss(Loss::FdWalk);
        emit::<GpuFd>(|e| {
            e.op = op as u32;
            e.fd = -1;
            e.flags = FD_WALK_TRUNCATED;
        });
    }
}

/// The GPU files among descriptors `64 * word` to `64 * word + 63` of the table at `fdt`, as
/// `op` records. A global subprogram (exported, never inlined): the verifier checks it once on
/// its own, where the walk's loop inlined would be checked once per word, past its
/// instruction budget long before 1024 words. Numbers only as arguments: verifiers before
/// 5.12 take nothing else but the context.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn walk_fds_word(fdt: u64, word: u32, op: u32) -> u32 {
    let fdt = FdTable::at(fdt);
    let slots = fdt.slots();
    let mut open = fdt.open_word(word);
    let mut fd = word.wrapping_mul(64);
    for _ in 0..64 {
        if open == 0 {
            break;
        }
        if open & 1 != 0 {
            // Within max_fds: the bitmap has no bit beyond it.
            let file = slots.file(fd);
            // Sockets, pipes and regular files have no device number: no map lookup for them.
            let dev = if file == 0 { 0 } else { file_dev(file) };
            if dev != 0 && is_gpu_dev(dev) {
                emit_fd(op, fd, fdt, file, dev, 0);
            }
        }
        open >>= 1;
        fd = fd.wrapping_add(1);
    }
    0
}
