//! Byte offsets of kernel struct fields, resolved by user space from the running kernel's BTF.
//!
//! Rust eBPF has no CO-RE relocations, so the collector reads `/sys/kernel/btf/vmlinux` at load
//! time and hands these to the programs as a read-only global.

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_comm: u32,
    pub task_group_leader: u32,
    pub task_signal: u32,
    pub task_exit_code: u32,
    pub signal_nr_threads: u32,
    /// `signal_struct.live` (atomic_t): zero once the last thread has started exiting.
    pub signal_live: u32,
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdtable_max_fds: u32,
    pub fdtable_fd: u32,
    pub fdtable_close_on_exec: u32,
    /// `fdtable.open_fds`: the bitmap of descriptors in use, which a walk skips 64 at a time.
    pub fdtable_open_fds: u32,
    pub file_inode: u32,
    /// `f_ref` (6.13+, stores count - 1) or `f_count` (the count itself).
    pub file_refcount: u32,
    /// 1 when `file_refcount` is `f_ref`, whose raw value is one less than the count.
    pub file_refcount_bias: u32,
    pub inode_rdev: u32,
    /// `file.private_data`: the NVIDIA driver keeps its per-open state there.
    pub file_private_data: u32,
    /// `task_struct.stack`, the base of the task's kernel stack.
    pub task_stack: u32,
    /// Where the saved user registers sit above `task_struct.stack` (THREAD_SIZE minus
    /// sizeof(struct pt_regs)), for kernels without `bpf_task_pt_regs` (before 5.15); 0 where
    /// that helper is used instead.
    pub stack_regs: u32,
    /// `task_struct.__state` (5.14+) or `state`: the state a task switches out in, for kernels
    /// whose `sched_switch` does not pass `prev_state` (before 5.18).
    pub task_state: u32,
    /// 1 when `sched_switch` passes `prev_state` as its fourth argument.
    pub switch_prev_state: u32,
    /// `task_struct.nvcsw`: the thread's voluntary context switches, one more for each sleep
    /// (counted before `sched_switch` runs).
    pub task_nvcsw: u32,
}

#[cfg(feature = "user")]
// SAFETY: only u32 fields.
unsafe impl aya::Pod for KernelOffsets {}
