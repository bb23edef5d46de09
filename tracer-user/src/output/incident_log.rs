//! The agent's incident log: JSON lines in the state directory, rotated by size, reopened on
//! SIGHUP (after logrotate moved it). A failed write is counted and logged, never fatal: the
//! agent keeps tracing and serving metrics when the disk is full.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use log::warn;
use prometheus_client::metrics::counter::Counter;

use super::state_dir::create_state_dir;
use crate::escape;

pub const FILE_NAME: &str = "incidents.jsonl";
/// At most one log line about failed writes this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

pub struct IncidentLog {
    path: PathBuf,
    file: Option<File>,
    size: u64,
    max_bytes: u64,
    /// Rotated files kept: `incidents.jsonl.1` (newest) to `.N`.
    keep: usize,
    reopen: Arc<AtomicBool>,
    errors: Counter,
    warned: Option<Instant>,
}

impl IncidentLog {
    /// Opens (appending) `dir/incidents.jsonl` after creating `dir` where missing and checking
    /// that it is safe to write in as root; `reopen` set means: close and open the file again before the next line.
    pub fn open(
        dir: &Path,
        max_bytes: u64,
        keep: usize,
        reopen: Arc<AtomicBool>,
        errors: Counter,
    ) -> anyhow::Result<Self> {
        create_state_dir(dir)?;
        let mut log = Self {
            path: dir.join(FILE_NAME),
            file: None,
            size: 0,
            max_bytes,
            keep,
            reopen,
            errors,
            warned: None,
        };
        log.file = Some(log.open_file()?);
        Ok(log)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_file(&mut self) -> io::Result<File> {
        // O_NOFOLLOW: a link planted in place of the log is refused, not written through.
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&self.path)?;
        self.size = file.metadata()?.len();
        Ok(file)
    }

    fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.reopen.swap(false, Ordering::Relaxed) || self.file.is_none() {
            // The size that counts is the file's now there (logrotate may have moved it).
            self.file = Some(self.open_file()?);
        }
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.file = None;
            self.rotate()?;
        }
        if self.file.is_none() {
            self.file = Some(self.open_file()?);
        }
        let Some(file) = self.file.as_mut() else {
            unreachable!("opened above");
        };
        file.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    /// incidents.jsonl.N-1 → .N, ..., incidents.jsonl → .1; the oldest beyond `keep` goes.
    fn rotate(&self) -> io::Result<()> {
        let numbered = |n: usize| PathBuf::from(format!("{}.{n}", self.path.display()));
        if self.keep == 0 {
            return fs::remove_file(&self.path);
        }
        for n in (1..self.keep).rev() {
            match fs::rename(numbered(n), numbered(n + 1)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        fs::rename(&self.path, numbered(1))
    }

    fn failed(&mut self, e: &io::Error) {
        self.errors.inc();
        // The file may be gone or half-written: start afresh with the next line.
        self.file = None;
        if self.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            self.warned = Some(Instant::now());
            warn!(
                "incident log {}: {e}; incidents are still counted in the metrics",
                escape::path(&self.path)
            );
        }
    }
}

impl Write for IncidentLog {
    /// Takes one whole line (the JSON writer writes each line at once).
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        if let Err(e) = self.write_line(line) {
            self.failed(&e);
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
