//! What the rules read: the incident's facts beside it, gathered by the snapshot.

use crate::analysis::{
    holders::Holder,
    incident::{GpuImpact, Incident},
};

/// What the verdict needs beyond the incident itself.
pub struct Context {
    /// Evidence that the driver deferred the release to its own thread.
    pub deferral: Option<String>,
    /// Threads asleep when the incident closed: (tid, since, innermost frames).
    pub asleep: Vec<(u32, u64, Vec<String>)>,
    /// NVML pids on the target's GPUs that no traced process matches.
    pub unknown_nvml_pids: Vec<u32>,
    /// Importers only NVML suggests whose driver calls linger traces and sees no import in:
    /// the sources disagree.
    pub unreconciled: Vec<u32>,
    /// Without driver calls (`--lean`): the processes whose NVML figures rose as the target
    /// left the list (pid, comm, bytes), where other processes' rose at the same time.
    pub ambiguous: Vec<(u32, String, u64)>,
    /// Whether NVML still lists the target's pid (None without NVML).
    pub still_listed: Option<bool>,
    /// Other teardowns on its GPU are under way: NVML lags behind them.
    pub others_in_flight: bool,
    pub slow_after_ns: u64,
    pub now_ns: u64,
}

/// What every rule of a dead process reads: the incident, its GPU part, the context, and its
/// holders by how they hold.
pub(super) struct Facts<'a> {
    pub inc: &'a Incident,
    pub gpu: &'a GpuImpact,
    pub cx: &'a Context,
    /// When its group died.
    pub dead: u64,
    /// Holders of memory it exported.
    pub importers: Vec<&'a Holder>,
    /// Holders of its GPU files.
    pub fd_holders: Vec<&'a Holder>,
}
