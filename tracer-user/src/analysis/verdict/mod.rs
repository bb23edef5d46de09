//! Why the memory lingered (or did not): one primary verdict per incident, with its evidence
//! and what to do about it. The verdict itself is plain data beside the incident
//! (incident/verdict_part.rs); `rules` decides it.

pub use super::incident::{Verdict, VerdictKind};

pub mod facts;
mod held;
pub mod rules;
mod undead;

/// Bytes as GiB with one decimal (MiB below 1 GiB).
pub fn gib(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if bytes as f64 >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}
