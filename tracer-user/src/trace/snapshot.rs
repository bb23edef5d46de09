//! The processes alive when recording starts (read by `source::procfs::processes`), so that
//! a replay can name processes whose fork and exec happened before the trace.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// Arguments; only the program when command lines are redacted; empty for kernel threads.
    pub cmdline: Vec<String>,
}
