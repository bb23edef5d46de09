//! What an NVML reading is read with and what it brings: a process's figure in it, what
//! linger saw the process do itself, and the changes the reading makes.

use crate::event::NvmlGpu;

use super::watch::Residual;

/// What linger saw a process do itself, to tell a rise of its NVML figure from an import.
pub trait OwnUse {
    /// Video memory `pid` took on through its own driver calls in `[from_ns, to_ns]`.
    fn taken_on(&self, pid: u32, from_ns: u64, to_ns: u64) -> u64;
    /// Whether linger first saw `pid` open a GPU file at or after `t_ns`: a new job.
    fn new_since(&self, pid: u32, t_ns: u64) -> bool;
    /// Whether driver calls are traced: without them (`--lean`) a rise of NVML's figure for a
    /// process has nothing to tell an import from the process's own allocation.
    fn sees_calls(&self) -> bool {
        true
    }
}

/// Without opens: allocations (or their absence) alone.
impl<F: Fn(u32, u64, u64) -> u64> OwnUse for F {
    fn taken_on(&self, pid: u32, from_ns: u64, to_ns: u64) -> u64 {
        self(pid, from_ns, to_ns)
    }

    fn new_since(&self, _: u32, _: u64) -> bool {
        false
    }
}

/// A change a reading brought.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The victim's own part is back (its share, less what importers hold).
    OwnBack {
        key: u64,
        bytes: u64,
    },
    /// Its memory is short although NVML stopped listing it: importers hold this much.
    Imported {
        key: u64,
        residuals: Vec<Residual>,
    },
    ResidualBack {
        key: u64,
        importer: u32,
    },
    /// What an importer only NVML suggested was thought to hold is the victim's own after all:
    /// the importer's own driver calls explain its rise.
    Withdrawn {
        key: u64,
        importer: u32,
    },
}

/// NVML's figure for `pid` in reading `g`, where it lists it.
pub(super) fn figure(g: &NvmlGpu, pid: u32) -> Option<u64> {
    g.processes
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| p.used.unwrap_or(0))
}
