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
}

#[cfg(feature = "user")]
// SAFETY: only u32 fields.
unsafe impl aya::Pod for KernelOffsets {}
