//! The dying process's side of an incident: who sent what, how it was delivered, how its
//! threads exited and who reaped it. Plain data.

use serde::Serialize;

use crate::event::Workload;

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
    /// The pod, container or Slurm job it ran for, when its cgroup names one (GPU holders:
    /// /proc is read when they open a GPU file, fork from one, or exec).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<Workload>,
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

impl Reaper {
    /// The reaper's wait4() returned the pid.
    pub fn waited(pid: u32, comm: &str) -> Self {
        Self {
            pid: Some(pid),
            comm: Some(comm.to_string()),
            how: ReapHow::Wait,
        }
    }

    /// Nobody seen: the kernel freed the task.
    pub fn freed() -> Self {
        Self {
            pid: None,
            comm: None,
            how: ReapHow::Freed,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReapHow {
    /// The reaper's wait4() returned the pid, at `t_reaped_ns` exactly.
    Wait,
    /// No wait4 hook: its parent (the process its SIGCHLD went to) reaped it, between
    /// `t_zombie_ns` and `t_reaped_ns`, when the kernel freed the task an RCU grace period
    /// later.
    Parent,
    /// Seen only when the kernel freed the task, and no SIGCHLD went to a parent (auto-reaped,
    /// or its parent ignores SIGCHLD): `t_reaped_ns` is an upper bound.
    Freed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every thread exited.
    Exited,
    /// Still alive: tracing stopped first, or a SIGKILLed process would not die.
    Pending,
}
