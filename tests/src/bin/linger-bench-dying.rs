//! The process the `dying` benchmark kills: it opens a stand-in GPU device (so the tracer counts
//! it as a GPU holder and samples its teardown), starts threads until it has THREADS in all,
//! prints `ready` and waits for its SIGKILL.
//!
//! Usage: linger-bench-dying DEVICE THREADS

use std::{fs::OpenOptions, io::Write, thread, time::Duration};

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, device, threads] = args.as_slice() else {
        bail!("usage: linger-bench-dying DEVICE THREADS");
    };
    let threads: u32 = threads.parse().context("THREADS")?;
    let gpu = OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
        .with_context(|| format!("opening {device}"))?;
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
