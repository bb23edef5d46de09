//! The process the `dying` benchmark kills: it opens a stand-in GPU device (so the tracer counts
//! it as a GPU holder and samples its teardown), starts threads until it has THREADS in all,
//! prints `ready` and waits for its SIGKILL.
//!
//! Usage: linger-bench-dying DEVICE THREADS

use std::{fs::OpenOptions, io::Write, path::PathBuf, thread, time::Duration};

use anyhow::{Context, Result};
use clap::Parser;

/// A GPU-holding process for the `dying` benchmark to kill.
#[derive(Parser)]
struct Args {
    /// The stand-in GPU device to hold open.
    device: PathBuf,
    /// Threads in all, the main thread included.
    threads: u32,
}

fn main() -> Result<()> {
    let Args { device, threads } = Args::parse();
    let gpu = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&device)
        .with_context(|| format!("opening {}", device.display()))?;
    for _ in 1..threads {
        thread::Builder::new().spawn(|| loop {
            thread::park();
        })?;
    }
    let mut out = std::io::stdout().lock();
    out.write_all(b"ready\n")?;
    out.flush()?;
    drop(out);
    loop {
        thread::sleep(Duration::from_secs(3600));
        // Held until the end.
        let _ = &gpu;
    }
}
