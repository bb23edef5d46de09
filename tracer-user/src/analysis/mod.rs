//! From events to incidents.

mod agenda;
pub mod correlate;
mod demands;
pub mod gpu_errors;
pub mod holders;
mod holding;
mod id_map;
pub mod incident;
pub mod ledger;
pub mod losses;
pub mod memory;
pub mod merge;
pub mod notice;
mod references;
pub mod signals;
pub mod stats;
pub mod storm;
pub mod stuck;
pub mod teardown;
pub mod termination;
#[cfg(test)]
mod tests;
pub mod unheld;
pub mod verdict;
pub mod xid_catalog;

pub use correlate::{Correlator, CorrelatorConfig, Output};
pub use demands::Demands;
pub use incident::Incident;
pub use notice::SignalNotice;
