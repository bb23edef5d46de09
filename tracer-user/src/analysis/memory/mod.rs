//! Whether a dead process's GPU memory is back on the device, from NVML readings alone.
//!
//! A victim's memory is back when NVML no longer lists its pid *and* the device's used memory
//! has come down by its share. NVML's per-pid list is a coarse clock under load (several
//! victims can leave it in one reading while their memory leaves over hundreds of
//! milliseconds), and other processes allocate and free at the same time, so releases are
//! counted per GPU in a pool: each reading adds the drop in `used` since the previous one,
//! corrected by what other processes' NVML figures did meanwhile (their allocations hide a
//! release, their frees fake one), and victims that have left the list are credited from the
//! pool in the order their own kernel-side release happened.
//!
//! A process that imported a victim's memory (CUDA IPC, an exported handle) takes over its
//! accounting: NVML stops listing the victim, the importer's figure rises and `used` does not
//! fall. Importers' figures are never counted as corrections, so such memory stays unexplained
//! until the importer lets go (its figure falls or it exits); the part it holds is a
//! [`Residual`] of the victim, back when the importer's memory is.

mod book;
mod import_via;
mod imports;
mod limits;
mod pool;
mod reading;
mod role;
#[cfg(test)]
mod tests;
mod watch;

pub use book::MemoryBook;
pub use import_via::ImportVia;
pub use limits::{tolerance, NvmlNeed};
pub use reading::{Change, OwnUse};
pub use role::{Role, ShareFrom};
pub use watch::{Device, ImportEnd, Residual, Watch};
