//! The state machine and its verdicts from synthetic event sequences, shaped like the kill
//! situations seen on the H200 (no root, no kernel): one test per way the answer went wrong.

mod children;
mod groups;
mod imports;
mod incidents;
mod lean;
mod moments;
mod nvml;
mod phases;
pub(super) mod run;
mod storms;
mod verdicts;
