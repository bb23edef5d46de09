//! How a process came to die, as the incident records it (decided by
//! `analysis/termination.rs`). Plain data.

use serde::Serialize;

use super::process::{Action, Sender};
use crate::analysis::signals::{Origin, SIGKILL};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// No fatal signal: the process exited on its own (see `exit.status`).
    Exit,
    /// It died of, or exited after, a catchable signal another process sent.
    Term,
    /// SIGKILL with no catchable signal before it.
    Kill,
    /// Catchable signal(s) first, then SIGKILL (`grace_ns` from the first to the SIGKILL).
    Escalated,
    /// The kernel's OOM killer chose it.
    Oom,
    /// A fault of its own, or a fatal signal it sent itself (as abort() does).
    Fault,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Self::Exit => "exit",
            Self::Term => "term",
            Self::Kill => "kill",
            Self::Escalated => "escalated",
            Self::Oom => "oom",
            Self::Fault => "fault",
        }
    }
}

/// One fatal signal generated for the process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SignalSent {
    pub sig: u32,
    pub name: String,
    pub origin: Origin,
    pub si_code: i32,
    pub sender: Sender,
    pub t_ns: u64,
    /// What its delivery did; null when no thread dequeued it (the process died first, or it
    /// is still pending).
    pub action: Option<Action>,
    /// The kernel discarded it at generation (ignored).
    pub discarded: bool,
}

impl SignalSent {
    pub(crate) fn catchable(&self) -> bool {
        self.sig != SIGKILL
    }

    /// Sent by the process to itself (abort(), raise(), `kill(0, ...)` in its own group).
    pub fn self_sent(&self, target: u32) -> bool {
        self.origin == Origin::User && self.sender.pid == target
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Termination {
    pub mode: Mode,
    pub signals: Vec<SignalSent>,
    /// For `escalated`: from the first catchable signal to the SIGKILL.
    pub grace_ns: Option<u64>,
}
