//! What the dead process had allocated through the driver, as the incident records it
//! (counted by `analysis/ledger.rs`). Plain data.

use serde::Serialize;

/// Bytes by kind of memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Bytes {
    /// Physical video memory (classes 0x40 and kin).
    pub video: u64,
    /// System memory mapped for the GPU (0x3E).
    pub system: u64,
    /// GPU virtual address reservations (0x50A0): not physical memory.
    pub virtual_reserved: u64,
}

/// One class's live allocations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClassTotal {
    pub class: String,
    pub name: &'static str,
    pub count: u64,
    pub bytes: u64,
    pub largest: u64,
}

/// An allocation the driver refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailedAlloc {
    pub pid: u32,
    pub t_ns: u64,
    pub class: String,
    pub size: u64,
    pub status: String,
}
