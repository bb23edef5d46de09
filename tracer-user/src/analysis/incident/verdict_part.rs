//! Why the memory lingered (or did not), as the incident records it (decided by
//! `analysis/verdict/rules.rs`). Plain data.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// The memory came back in the usual way.
    Released,
    /// Other processes held the dead process's GPU files.
    SharedFd,
    /// Another process imported some of its memory (CUDA IPC, an exported handle) and holds it.
    Imported,
    /// The driver handed the release to one of its kthreads.
    DeferredClose,
    /// A thread sleeps uninterruptibly inside the driver.
    StuckInDriver,
    /// The memory came back, but slowly (or is still on its way after `slow_after`).
    SlowTeardown,
    /// The fatal signal is pending but the process does not exit.
    NotDelivered,
    /// NVML accounts the memory to a pid that cannot be seen here.
    PidUnresolved,
    /// Memory still in use though no known process holds the files or imported them.
    UnknownHolder,
    /// The memory appears back but the kernel lost records while this was traced, and NVML
    /// did not confirm it; or NVML charges it to a process whose traced driver calls show no
    /// import of it: linger cannot vouch for it.
    Incomplete,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    /// Facts that support it, in words.
    pub evidence: Vec<String>,
    /// What to do.
    pub hint: String,
}
