//! One case: a process's way to its death and its memory's return, with what was last
//! reported of it. Plain data the correlator's rules (`death.rs`, `group.rs`, …) fill in.

use std::collections::BTreeMap;

use crate::analysis::{
    holding::{FileId, Holder, How},
    incident::{Incident, Source},
    ledger::LedgerPart,
    references::Unseen,
    termination::SignalSent,
};

/// What was last reported of a case, to tell when an update is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Reported {
    pub holders_left: Vec<u32>,
    pub residuals_back: usize,
    pub importers: usize,
    pub back: bool,
    pub lingering: bool,
    pub dead: bool,
}

/// One process's way to its death and its memory's return.
pub(in crate::analysis) struct Case {
    pub inc: Incident,
    pub signals: Vec<SignalSent>,
    /// Signals already reported as survived.
    pub(super) noticed: usize,
    pub oom: bool,
    /// The thread that ended the group: it runs the exit path's release of the files.
    pub dead_tid: Option<u32>,
    /// GPU files it held when its group died.
    pub files: Vec<FileId>,
    /// The video memory of those files' clients on each GPU, by the ledger, at the death.
    pub ledger_parts: Vec<LedgerPart>,
    /// A GPU holder: its memory is watched.
    pub gpu: bool,
    /// End of the last exit-path `__fput` of one of its files (driver hooks): of the driver's
    /// release inside it, where the driver's functions are hooked too.
    pub(super) fput_end: Option<u64>,
    /// Its own release of its GPU files.
    pub kernel_release: Option<(u64, Source)>,
    /// Other processes holding its files at death, and when each let go.
    pub fd_holders: Vec<Holder>,
    /// For a holder of another dead process's files: that process, "comm[pid]".
    pub owner: Option<String>,
    /// NVML listed it, or the ledger saw it allocate: the memory of its files is its own.
    pub(super) owns: bool,
    pub holder_gone: BTreeMap<u32, Option<u64>>,
    /// The process its SIGCHLD went to, and its comm: the one that reaps it.
    pub(super) parent: Option<(u32, String)>,
    /// Holders of its files killed with it (`group.rs`).
    pub(super) co_victims: BTreeMap<u32, CoVictim>,
    /// Importers of its memory: comm and parent, as known when the import was found.
    pub importer_names: BTreeMap<u32, (String, u32)>,
    /// References to its files at death that no known holder accounted for; less as the
    /// search finds their holders.
    pub unaccounted: Unseen,
    /// How it got its GPU files, and its parent, as known when it died (for the cases it
    /// still holds files of while its exit closes them).
    pub(super) how_held: Option<How>,
    pub(super) ppid: u32,
    pub(super) reported: Option<Reported>,
    pub(super) stuck_reported: bool,
}

impl Case {
    /// Its files may still be open: it has not let go of them itself, or a holder of them
    /// lives (known, or behind references nobody accounted for). Once every reference is gone
    /// the kernel reuses the files' addresses for others' opens.
    pub(super) fn files_may_be_open(&self) -> bool {
        self.kernel_release.is_none()
            || self.unaccounted.any()
            || self.holder_gone.values().any(Option::is_none)
    }
}

/// A holder of a victim's files that went with it: killed with it, or dead of its own
/// within `group.rs`'s `WENT_WITH_NS` of its death (a child exiting as its parent is killed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CoVictim {
    /// When a SIGKILL reached it; None for one that exited on its own.
    pub killed_ns: Option<u64>,
    /// When its group died, once it has.
    pub dead_ns: Option<u64>,
    /// Killed by the kernel as the victim, its pid namespace's init, exited: the namespace's
    /// teardown waits for its release before the init's exit goes on.
    pub in_teardown: bool,
}
