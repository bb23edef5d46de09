//! Kernel pseudo file systems the tracer reads but many machines do not mount by default:
//! tracefs (tracepoint attachment) and securityfs (the lockdown mode, for `doctor`).

use std::path::Path;

use nix::mount::{mount, MsFlags};

use crate::error::{Error, Result};

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// Mounts tracefs at /sys/kernel/tracing unless it (or the debugfs copy) is already there.
pub fn ensure_mounted() -> Result<()> {
    if Path::new(TRACEFS).join("events").exists()
        || Path::new(DEBUGFS_TRACING).join("events").exists()
    {
        return Ok(());
    }
    mount(
        Some("nodev"),
        TRACEFS,
        Some("tracefs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| {
        let hint = if e == nix::errno::Errno::EPERM {
            " (it takes CAP_SYS_ADMIN: mount it once as root, \
             `mount -t tracefs nodev /sys/kernel/tracing`, or grant CAP_SYS_ADMIN)"
        } else {
            ""
        };
        Error::Mount {
            fs: "tracefs",
            path: TRACEFS,
            hint,
            source: e,
        }
    })
}

/// Whether tracepoint `category/name` exists (tracefs must be mounted).
pub fn has_event(category: &str, name: &str) -> bool {
    [TRACEFS, DEBUGFS_TRACING].iter().any(|root| {
        Path::new(root)
            .join("events")
            .join(category)
            .join(name)
            .exists()
    })
}

const SECURITYFS: &str = "/sys/kernel/security";

/// Mounts securityfs at /sys/kernel/security unless something is already there.
pub fn ensure_securityfs() -> Result<()> {
    let mounted = std::fs::read_dir(SECURITYFS).is_ok_and(|mut d| d.next().is_some());
    if mounted {
        return Ok(());
    }
    mount(
        Some("none"),
        SECURITYFS,
        Some("securityfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|source| Error::Mount {
        fs: "securityfs",
        path: SECURITYFS,
        hint: "",
        source,
    })
}
