//! How an importer of a victim's memory was found: the holders' and the ledger's records
//! name it too, below the book that accounts for it.

use serde::Serialize;

/// How an importer was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportVia {
    /// It duplicated one of the victim's objects (RM_DUP_OBJECT: legacy CUDA IPC handles).
    DupObject,
    /// It imported objects from an exported file descriptor (RM_CONTROL 0x3d06) after the
    /// victim exported some (0x3d05).
    FdImport,
    /// Only NVML says so: its figure rose as the victim left the list, and no allocation of its
    /// own explains the rise.
    Nvml,
}
