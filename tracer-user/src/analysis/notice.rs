//! A fatal-by-default signal a process survived: reported at once (nobody should wait for
//! the escalation window to learn of it), and part of its death's incident if it dies soon.

use serde::Serialize;

use super::{
    incident::{Incident, Target, SCHEMA},
    termination::SignalSent,
};

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SignalNotice {
    /// Always "signal".
    #[serde(rename = "type")]
    pub record_type: &'static str,
    pub schema: u32,
    /// The id its death's incident will carry, should it die within the escalation window.
    pub incident: u64,
    pub target: Target,
    pub signal: SignalSent,
    /// How long it had been alive after the signal when this was written.
    pub survived_ns: u64,
    /// It holds GPU files.
    pub gpu_holder: bool,
}

impl SignalNotice {
    pub fn new(inc: &Incident, signal: SignalSent, survived_ns: u64, gpu_holder: bool) -> Self {
        Self {
            record_type: "signal",
            schema: SCHEMA,
            incident: inc.id,
            target: inc.target.clone(),
            signal,
            survived_ns,
            gpu_holder,
        }
    }
}
