//! What `Probes::load` is asked for: the plain configuration of the kernel side.

use super::devices::GpuDevices;
use crate::event::DriverHooks;

/// Signals that open an incident by default: the ones that kill a process unless handled,
/// as issued by users, supervisors and the kernel (OOM killer, faults).
pub const DEFAULT_FATAL_SIGNALS: &[i32] = &[
    libc_sig::SIGHUP,
    libc_sig::SIGINT,
    libc_sig::SIGQUIT,
    libc_sig::SIGILL,
    libc_sig::SIGABRT,
    libc_sig::SIGBUS,
    libc_sig::SIGFPE,
    libc_sig::SIGKILL,
    libc_sig::SIGSEGV,
    libc_sig::SIGTERM,
];

mod libc_sig {
    pub const SIGHUP: i32 = 1;
    pub const SIGINT: i32 = 2;
    pub const SIGQUIT: i32 = 3;
    pub const SIGILL: i32 = 4;
    pub const SIGABRT: i32 = 6;
    pub const SIGBUS: i32 = 7;
    pub const SIGFPE: i32 = 8;
    pub const SIGKILL: i32 = 9;
    pub const SIGSEGV: i32 = 11;
    pub const SIGTERM: i32 = 15;
}

#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// Ring buffer size in bytes (a power of two, at least one page).
    pub ring_size: u32,
    pub fatal_signals: Vec<i32>,
    /// Attach the ring buffer throughput benchmark for this pid.
    pub bench_pid: Option<u32>,
    /// Which char devices count as GPU files.
    pub gpu_devices: GpuDevices,
    /// On-CPU stack samples per second of dying GPU processes (0: none; sleeps are still
    /// recorded).
    pub sample_hz: u64,
    /// Follow GPU ioctls (the ledger). Off, holders and teardown are still traced.
    pub ioctls: bool,
    /// No system call tracepoint at all (`--lean`): none of linger's hooks runs for a
    /// process's system calls.
    pub lean: bool,
    /// Which driver hooks to try.
    pub driver_hooks: DriverHooks,
    /// Where the driver's functions cannot be hooked, use the system call tracepoints even
    /// when the NVIDIA libraries can be (`--syscall-hooks`).
    pub syscall_hooks: bool,
    /// A GPU holder's thread asleep uninterruptibly with the driver on its stack this long is
    /// reported stuck (0: not watched).
    pub stuck_after_ns: u64,
}

/// `--stuck-after`'s default: far past any driver call's own uninterruptible waits (a large
/// allocation's scrub, a GSP call), well before anyone gives up on the node.
pub const STUCK_AFTER_NS: u64 = 10_000_000_000;

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            ring_size: 1 << 22,
            fatal_signals: DEFAULT_FATAL_SIGNALS.to_vec(),
            bench_pid: None,
            gpu_devices: GpuDevices::default(),
            sample_hz: 4999,
            ioctls: true,
            lean: false,
            driver_hooks: DriverHooks::Auto,
            syscall_hooks: false,
            stuck_after_ns: STUCK_AFTER_NS,
        }
    }
}
