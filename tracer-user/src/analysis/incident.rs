//! An incident: one fatal signal to one process, followed until the process is reaped or
//! survives. Serialized as one JSON line (schema: docs/incident-json.md).

use serde::Serialize;

use super::{
    holders::{HeldFile, Holder},
    ledger::{Bytes, ClassTotal, FailedAlloc},
    signals::Origin,
    teardown::{DriverRelease, PhaseTime},
    verdict::Verdict,
};

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Incident {
    /// Always "incident": lets consumers of the JSON lines tell record types apart.
    #[serde(rename = "type")]
    pub record_type: &'static str,
    /// Sequence number within this run.
    pub id: u64,
    pub signal: u32,
    pub signal_name: String,
    pub origin: Origin,
    pub si_code: i32,
    pub sender: Sender,
    pub target: Target,
    pub t_signal_ns: u64,
    /// Further fatal signals to the same process while this incident was open.
    pub repeats: u32,
    /// Each thread that dequeued the signal.
    pub deliveries: Vec<Delivery>,
    /// Each thread's exit, the group-dead one last.
    pub exits: Vec<ThreadExit>,
    pub t_group_dead_ns: Option<u64>,
    /// How the process ended: `signal` when killed by one, else `status` of exit().
    pub exit: Option<ExitStatus>,
    /// When the process told its parent it is a zombie (SIGCHLD generated).
    pub t_zombie_ns: Option<u64>,
    pub t_reaped_ns: Option<u64>,
    pub reaper: Option<Reaper>,
    pub outcome: Outcome,
    /// The GPU side, when the process held GPU files.
    pub gpu: Option<GpuImpact>,
    /// Other processes holding the target's GPU files when its group died.
    pub holders: Vec<Holder>,
    /// Where the time from the group's death to the memory's return went (from kernel
    /// stacks, or the driver hooks where the kernel allows them), largest first.
    pub phases: Vec<PhaseTime>,
    /// The driver's release timed exactly by fentry/kprobe hooks, where the kernel allows
    /// them (`phases` then come from these calls when no stacks were sampled).
    pub release: Option<DriverRelease>,
    /// Why the memory lingered, or that it did not.
    pub verdict: Option<Verdict>,
    /// Allocations of other processes the driver refused while this one's memory was held.
    pub collateral: Vec<FailedAlloc>,
    /// The teardown's kernel stacks (outermost frame first) with the time each accounts for:
    /// the flamegraph `linger export --format folded|svg` draws. Not in the JSON lines.
    #[serde(skip)]
    pub teardown_stacks: Vec<(Vec<String>, u64)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GpuImpact {
    /// Physical video memory the driver gave the target's clients (decoded RM ioctls seen
    /// while tracing; allocations made before tracing began are not counted).
    pub bytes_ledger: u64,
    /// The ledger by kind of memory.
    pub ledger: Bytes,
    /// The ledger by memory class.
    pub classes: Vec<ClassTotal>,
    /// What NVML reported for the target's pid just before the signal; null without NVML.
    pub bytes_nvml: Option<u64>,
    /// NVML's `used` on the target's GPUs just before the signal.
    pub nvml_used_before: Option<u64>,
    /// When NVML stopped listing the target's pid (its memory was back); null while lingering
    /// or without NVML.
    pub t_memory_back_ns: Option<u64>,
    /// When no traced process held any of the target's GPU files any more.
    pub t_files_released_ns: Option<u64>,
    /// GPU descriptors the target held when its group died, with each file's references.
    pub files: Vec<HeldFile>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Sender {
    /// 0 when the kernel sent it on its own behalf.
    pub pid: u32,
    pub tid: u32,
    /// "kernel" when no user process sent it.
    pub comm: String,
    /// The task that was running when the kernel sent it (the faulting or allocating task).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_pid: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Target {
    pub pid: u32,
    pub comm: String,
    /// Threads in the group when the signal was generated.
    pub threads: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Delivery {
    pub tid: u32,
    pub t_ns: u64,
    pub sig: u32,
    pub action: Action,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Default,
    Ignore,
    Handler,
}

impl Action {
    pub fn from_handler(handler: u64) -> Self {
        match handler {
            0 => Self::Default,
            1 => Self::Ignore,
            _ => Self::Handler,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ThreadExit {
    pub tid: u32,
    pub t_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExitStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u32>,
}

impl ExitStatus {
    /// From `task->exit_code`: signal number in the low 7 bits, or status << 8.
    pub fn from_code(code: u32) -> Self {
        match code & 0x7f {
            0 => Self {
                signal: None,
                status: Some((code >> 8) & 0xff),
            },
            sig => Self {
                signal: Some(sig),
                status: None,
            },
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reaper {
    /// None when the kernel freed the task and the reaper was not seen.
    pub pid: Option<u32>,
    pub comm: Option<String>,
    pub how: ReapHow,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReapHow {
    /// The reaper's wait4() returned the pid.
    Wait,
    /// Seen only when the kernel freed the task (an upper bound on the reap time).
    Freed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every thread exited.
    Exited,
    /// The process handled or ignored the signal and lives on.
    Survived,
    /// Tracing stopped before the process either exited or was seen to survive.
    Pending,
}

impl Incident {
    /// Milliseconds from the signal to `t`.
    pub fn ms_after_signal(&self, t: u64) -> f64 {
        t.saturating_sub(self.t_signal_ns) as f64 / 1e6
    }

    pub fn handled(&self) -> bool {
        self.deliveries.iter().any(|d| d.action != Action::Default)
    }
}
