//! Files and directories linger writes, as root, in places other users can write to too (the
//! system's temporary directory, a shared scratch directory): trace files, exports, and the
//! agent's state directory and its incident log. Every writer opens its file here (the
//! agent's flight recorder too, from `agent/flight.rs`).
//!
//! A local user can plant a symbolic link or a file under the name an operator will write
//! to; linger never follows a link at the last component, creates files new (`O_EXCL`, mode
//! 0600 from the start), and replaces an existing file only when asked, only a regular file of
//! its own user, and only whole, by renaming a new file over it.

mod file;
mod incident_log;
mod state_dir;

pub use file::{Existing, OutputError, OutputFile};
pub use incident_log::{IncidentLog, FILE_NAME as INCIDENT_LOG};
pub use state_dir::{check_state_dir, create_state_dir, StateDirError};
