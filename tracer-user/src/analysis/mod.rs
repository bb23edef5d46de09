//! From events to incidents.

pub mod correlate;
pub mod incident;
pub mod signals;

pub use correlate::{Correlator, CorrelatorConfig};
pub use incident::Incident;
