//! Where the evidence for a moment came from: the incident reports it, and the memory book
//! that finds the moment names it too, from below the incident.

use serde::Serialize;

/// Where the evidence for a time came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// NVML: the pid left its process list and the device's used memory fell by its share.
    Nvml,
    /// The kernel: the last reference to the GPU files went (driver hooks, or the zombie
    /// transition as an upper bound), without NVML to confirm.
    Kernel,
    /// The kernel's release of the last reference, confirmed by NVML no longer listing the
    /// pid and by its driver calls showing no import: where other jobs' allocations keep the
    /// device's used memory from saying so, or NVML said so later.
    Confirmed,
    /// The driver hooks timed the exit path's `__fput` of the last GPU file.
    Fput,
    /// The zombie transition (SIGCHLD to the parent), which follows the exit path's release of
    /// the files: an upper bound.
    Zombie,
    /// Its threads' first sight outside the NVIDIA driver (an on-CPU stack sample or a switch)
    /// after their last inside, none inside after it: the driver's free was over, and the
    /// moment is off by at most the gap since that last sight inside (kernels where no hook
    /// times the driver's release).
    LeftDriver,
    /// The last of its threads' final switch, for a process that sent no SIGCHLD (reaped by
    /// nobody: its parent ignores SIGCHLD, as a pid namespace's dying init does): an upper
    /// bound, where the kernel's free comes an RCU grace period later.
    Exited,
}
