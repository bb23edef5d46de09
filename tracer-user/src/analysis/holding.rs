//! Who holds a dead process's GPU files and how, as the incident reports it: the descriptors
//! it held, each other process holding them, and how that one got them. Plain data that the
//! holders' tracker (`holders.rs`) fills and the incident carries.

use serde::Serialize;

use super::memory::ImportVia;

/// Kernel address of a `struct file`, or a snapshot group id until that address is known.
pub type FileId = u64;

/// How a process came to hold a descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum How {
    /// It opened the device.
    Open { t_ns: u64 },
    /// dup/dup2/dup3/fcntl of one of its own descriptors.
    Dup { t_ns: u64 },
    /// Inherited from `from` when it forked (copied descriptor table).
    Fork { from: u32, t_ns: u64 },
    /// Shares `from`'s descriptor table (clone with CLONE_FILES).
    SharedTable { from: u32, t_ns: u64 },
    /// Held when tracing began; origin unknown.
    Snapshot,
    /// Seen only in a walk of its table (e.g. received over a unix socket).
    Seen { t_ns: u64 },
    /// It holds memory it imported from the dead process (no descriptor of its files).
    Import {
        t_ns: u64,
        bytes: u64,
        via: ImportVia,
    },
}

impl How {
    /// When the holder got the files (or the memory), where known.
    pub fn t_ns(&self) -> Option<u64> {
        match self {
            Self::Open { t_ns }
            | Self::Dup { t_ns }
            | Self::Fork { t_ns, .. }
            | Self::SharedTable { t_ns, .. }
            | Self::Seen { t_ns }
            | Self::Import { t_ns, .. } => Some(*t_ns),
            Self::Snapshot => None,
        }
    }
}

/// A GPU descriptor a process held when its group died.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeldFile {
    pub fd: i32,
    pub file: FileId,
    pub dev: u32,
    pub refcount: u64,
}

/// Another process holding a dead process's GPU file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Holder {
    pub pid: u32,
    pub comm: String,
    pub ppid: u32,
    pub fds: Vec<i32>,
    #[serde(flatten)]
    pub how: How,
    /// When it let go (its own release, or its close of the files); absent while it holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_released_ns: Option<u64>,
    /// When its own group died, for a holder already dead (killed beside it) whose exit had
    /// not closed the files yet: it held them only until its exit did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_dead_ns: Option<u64>,
    /// When it was SIGKILLed, for a holder killed with the process (by the same group kill,
    /// or by the kernel as the process, its pid namespace's init, exited): a victim letting go
    /// with its own exit, never one to kill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_killed_ns: Option<u64>,
}

impl Holder {
    /// Found by a walk of its table (the search, an exec walk), not by how it got the files.
    pub fn found_by_walk(&self) -> bool {
        matches!(self.how, How::Seen { .. })
    }
}
