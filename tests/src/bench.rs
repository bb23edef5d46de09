//! What the benchmark programs (`src/bin/linger-bench-*`) share: their common flags and the
//! setup they do before measuring.

use std::{
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::{Path, PathBuf},
};

use anyhow::{ensure, Context, Result};
use clap::Args;
use nix::{
    libc,
    sys::stat::{makedev, mknod, Mode, SFlag},
};

/// `--nice N`: the priority to run at, ahead of unrelated work on a shared machine.
#[derive(Args, Clone, Copy, Debug)]
pub struct Nice {
    /// Renice this process first (e.g. -19).
    #[arg(long, allow_negative_numbers = true)]
    pub nice: Option<i32>,
}

impl Nice {
    /// Renices the calling thread when `--nice` was given (see [`renice`]).
    pub fn apply(self) -> Result<()> {
        match self.nice {
            Some(nice) => renice(nice),
            None => Ok(()),
        }
    }
}

/// Renices the calling thread, and so every thread and child process it starts later
/// (niceness is per thread on Linux and inherited).
pub fn renice(nice: i32) -> Result<()> {
    // SAFETY: plain syscall on the calling thread (who = 0), no pointers.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    ensure!(
        rc == 0,
        "setpriority({nice}): {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// `--linger PATH` and `--out-dir DIR`: the tracer binary a benchmark runs, and where it puts
/// what the tracer writes.
#[derive(Args, Clone, Debug)]
pub struct Tracer {
    /// The `linger` binary to run.
    #[arg(long, default_value = "target/release/linger")]
    pub linger: PathBuf,
    /// Directory for the tracer's output files (made if missing).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub out_dir: PathBuf,
}

/// Makes `path` a char device node for /dev/full (1:7), or checks that it is one.
pub fn stand_in_device(path: &Path) -> Result<()> {
    if let Ok(m) = std::fs::metadata(path) {
        ensure!(
            m.file_type().is_char_device() && m.rdev() == makedev(1, 7),
            "{} exists and is not a node for /dev/full (char 1:7)",
            path.display()
        );
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o600),
        makedev(1, 7),
    )
    .with_context(|| format!("mknod {} (as root)", path.display()))
}
