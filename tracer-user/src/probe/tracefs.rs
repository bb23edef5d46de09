//! Tracepoints are attached through tracefs, which these machines do not mount by default.

use std::path::Path;

use nix::mount::{mount, MsFlags};

use crate::error::{Error, Result};

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// Mounts tracefs at /sys/kernel/tracing unless it (or the debugfs copy) is already there.
pub fn ensure_mounted() -> Result<()> {
    if Path::new(TRACEFS).join("events").exists() || Path::new(DEBUGFS_TRACING).join("events").exists()
    {
        return Ok(());
    }
    mount(Some("nodev"), TRACEFS, Some("tracefs"), MsFlags::empty(), None::<&str>)
        .map_err(|e| Error::Tracefs(format!("mounting tracefs at {TRACEFS} failed: {e}")))
}
