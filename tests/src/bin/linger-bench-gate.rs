//! The gate's own cost: `linger wait --any-process` on the stand-in GPU device while a process
//! holds it, its CPU time per second of waiting (after its first second), and how long after
//! the holder's SIGKILL it exits clean. Measured as the machine is, then with EXTRA more idle
//! processes each holding a few files (a busier node's /proc).
//! Prints one JSON object.

use std::{
    fs::{self, File},
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Parser;
use linger_tests::bench::{stand_in_device, Nice};
use serde_json::json;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "target/release/linger")]
    linger: PathBuf,
    #[arg(long, default_value = "target/bench/gpu0")]
    gpu_device: PathBuf,
    /// Seconds of waiting whose CPU time is measured (after the gate's first second).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Holder kills whose reaction is timed, per configuration.
    #[arg(long, default_value_t = 20)]
    rounds: u32,
    /// Idle processes added for the second configuration.
    #[arg(long, default_value_t = 1000)]
    extra: u32,
    #[command(flatten)]
    nice: Nice,
    /// An empty state directory: no agent's log to read.
    #[arg(long, default_value = "target/bench/gate-state")]
    state_dir: PathBuf,
}

/// A process holding the stand-in device (as its stdin), killed and reaped when dropped.
struct Holder(Child);

impl Holder {
    fn start(device: &PathBuf) -> Result<Self> {
        Ok(Self(
            Command::new("sleep")
                .arg("3600")
                .stdin(File::open(device).context("opening the stand-in device")?)
                .spawn()?,
        ))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn gate(args: &Args, timeout: &str) -> Result<Child> {
    Ok(Command::new(&args.linger)
        .args(["wait", "--any-process", "--json", "--timeout", timeout])
        .arg("--gpu-device")
        .arg(&args.gpu_device)
        .arg("--state-dir")
        .arg(&args.state_dir)
        .stdout(Stdio::null())
        .spawn()?)
}

/// The CPU time `pid`'s main thread has run, in nanoseconds (/proc/PID/schedstat: clock
/// ticks, /proc/PID/stat's unit, are 10 ms). The gate runs on that one thread.
fn cpu_ns(pid: u32) -> Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/schedstat"))?;
    Ok(stat
        .split_whitespace()
        .next()
        .context("schedstat")?
        .parse()?)
}

/// The gate's CPU while it waits on a holder: milliseconds per second.
fn cpu_ms_per_s(args: &Args) -> Result<f64> {
    let _holder = Holder::start(&args.gpu_device)?;
    let mut g = gate(args, "3600s")?;
    thread::sleep(Duration::from_secs(1));
    let before = (cpu_ns(g.id())?, Instant::now());
    thread::sleep(Duration::from_secs_f64(args.seconds));
    let after = (cpu_ns(g.id())?, Instant::now());
    if g.try_wait()?.is_some() {
        bail!("the gate exited while the device was held");
    }
    let _ = g.kill();
    let _ = g.wait();
    let cpu_ms = (after.0 - before.0) as f64 / 1e6;
    Ok(cpu_ms / after.1.duration_since(before.1).as_secs_f64())
}

/// From the holder's SIGKILL to the gate's clean exit, in milliseconds; `round` staggers the
/// kill against the gate's ticks.
fn reaction_ms(args: &Args, round: u32) -> Result<f64> {
    let mut holder = Holder::start(&args.gpu_device)?;
    let mut g = gate(args, "60s")?;
    // Past its first look, waiting; the kill at a different point of its tick each round.
    thread::sleep(Duration::from_millis(300 + u64::from(round * 37 % 97)));
    let killed = Instant::now();
    holder.0.kill()?;
    holder.0.wait()?;
    let status = g.wait()?;
    let ms = killed.elapsed().as_secs_f64() * 1e3;
    if !status.success() {
        bail!("the gate did not exit clean ({status})");
    }
    Ok(ms)
}

fn processes() -> usize {
    fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                .count()
        })
        .unwrap_or(0)
}

fn configuration(args: &Args) -> Result<serde_json::Value> {
    let procs = processes();
    let cpu = cpu_ms_per_s(args)?;
    let reactions = (0..args.rounds)
        .map(|round| reaction_ms(args, round))
        .collect::<Result<Vec<f64>>>()?;
    Ok(json!({ "processes": procs, "cpu_ms_per_s": cpu, "reaction_ms": reactions }))
}

fn main() -> Result<()> {
    let args = Args::parse();
    args.nice.apply()?;
    stand_in_device(&args.gpu_device)?;
    let _ = fs::remove_dir_all(&args.state_dir);
    fs::create_dir_all(&args.state_dir)?;
    let plain = configuration(&args)?;
    let idle: Vec<Child> = (0..args.extra)
        .map(|_| {
            Command::new("sleep")
                .arg("3600")
                .stdout(Stdio::null())
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    let busy = configuration(&args);
    for mut c in idle {
        let _ = c.kill();
        let _ = c.wait();
    }
    println!(
        "{}",
        json!({
            "seconds": args.seconds,
            "rounds": args.rounds,
            "extra": args.extra,
            "configurations": [plain, busy?],
        })
    );
    Ok(())
}
