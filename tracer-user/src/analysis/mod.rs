//! From events to incidents.

pub mod correlate;
pub mod holders;
pub mod incident;
pub mod ledger;
pub mod signals;
pub mod teardown;
pub mod verdict;

pub use correlate::{Correlator, CorrelatorConfig};
pub use incident::Incident;
