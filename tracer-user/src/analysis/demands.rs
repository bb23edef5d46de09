//! What the analysis wants of the live sources after a batch of events: handed out once per
//! batch, in place of flags shared between the two.

use super::{correlate::Correlator, memory::NvmlNeed};

/// The analysis's wishes after a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demands {
    /// How closely NVML is to be read.
    pub nvml: NvmlNeed,
    /// No incident is open: what was kept for open ones (resolved stacks) can go.
    pub idle: bool,
    /// A dead holder's files have holders nobody saw get them: walk every process holding
    /// GPU files.
    pub search: bool,
}

impl Default for Demands {
    /// Nothing open, nothing wanted.
    fn default() -> Self {
        Self {
            nvml: NvmlNeed::Quiet,
            idle: true,
            search: false,
        }
    }
}

impl Demands {
    /// The correlator's wishes now; takes its search request.
    pub fn of(correlator: &mut Correlator) -> Self {
        Self {
            nvml: correlator.nvml_need(),
            idle: correlator.is_idle(),
            search: correlator.take_search_request(),
        }
    }
}
