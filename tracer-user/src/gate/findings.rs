//! What keeps a gate closed: processes (alive) that hold the GPU files or memory, and memory
//! NVML accounts to dead processes. Plain data, for the report.

use crate::event::Workload;
use serde::Serialize;

use super::{estimate::Estimate, log::LoggedHolder};

/// Why a live process keeps the gate closed, worst first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A process named with `--pid` is still alive.
    NotDead,
    /// A process of the scope (a child of a named one, a member of the group, cgroup, job or
    /// pod) is alive and holds GPU files or memory: a forked worker that outlived the job.
    LiveHolder,
    /// A process outside the scope holds an open GPU file of the scope's (inherited before
    /// it left, or passed over a socket).
    SharedFd,
    /// `--any-process`: a process not allowed holds GPU files or memory on the GPUs.
    GpuBusy,
    /// Without NVML or the agent's word: a named process was gone before the gate looked,
    /// and this process holds GPU files that may be its.
    Unattributed,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Self::NotDead => "not_dead",
            Self::LiveHolder => "live_holder",
            Self::SharedFd => "shared_fd",
            Self::GpuBusy => "gpu_busy",
            Self::Unattributed => "unattributed",
        }
    }
}

/// A live process keeping the gate closed.
#[derive(Clone, Debug, Serialize)]
pub struct Blocker {
    pub kind: Kind,
    pub pid: u32,
    pub comm: String,
    /// `/proc/PID/stat`'s state letter: `D` is a sleep in the kernel no signal ends.
    pub state: char,
    pub ppid: u32,
    pub session: u32,
    #[serde(skip)]
    pub start_ticks: u64,
    /// Why it is in the scope (`named`, `child of 812`, `in Slurm job 7's cgroup`, ...).
    pub scope: Option<String>,
    /// How it came to hold the files or memory.
    pub how: String,
    pub cgroup: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<Workload>,
    /// Its GPU descriptors.
    pub fds: Vec<i32>,
    /// Its memory mappings of GPU device files.
    pub mappings: usize,
    /// What NVML accounts to it, when NVML lists it.
    pub nvml_bytes: Option<u64>,
    pub hint: String,
}

/// GPU memory NVML accounts to a dead process.
#[derive(Clone, Debug, Serialize)]
pub struct Dead {
    pub pid: u32,
    pub gpu: u32,
    pub bytes: Option<u64>,
    /// `gone` (no such process here), `zombie` (dead, not reaped yet) or `unlisted` (NVML
    /// no longer lists it, and the device's used memory has not come down by its share yet).
    pub state: &'static str,
    /// The agent's latest word on its death (this boot, after the process started).
    pub incident: Option<Known>,
    /// When its teardown should end, from past incidents in the log.
    pub estimate: Option<Estimate>,
}

/// What the agent's incident log says about a death.
#[derive(Clone, Debug, Serialize)]
pub struct Known {
    pub id: u64,
    pub verdict: String,
    pub hint: String,
    /// Holders still alive.
    pub holders: Vec<LoggedHolder>,
}
