//! Replay of a real recording: `linger record` traces GPU ioctls and kills of this process,
//! then `linger replay FILE --json > /dev/null` is timed over the file, from the page cache.
//!
//! ```text
//! linger-bench-replay --linger target/release/linger --gpu-device target/bench/gpu0 \
//!     --ioctls 1000000 --kills 20 --threads 8 --rounds 3 --nice -19 --out-dir target/bench
//! ```
//!
//! The recording: this process holds the stand-in GPU device (`--gpu-device`, a node for
//! /dev/full, made if missing) and makes `--ioctls` ioctl(FIONREAD) calls on it, each one a
//! decoded GPU ioctl record; between them it starts and SIGKILLs `--kills` `linger-bench-dying`
//! children of `--threads` threads that hold the device too (incidents with thread exits,
//! teardown samples and holders). Once with the default zstd chunks, once `--uncompressed`;
//! a 64 MiB ring so that nothing is dropped. Each file is replayed once untimed (its incidents
//! checked) and then `--rounds` times. Prints one JSON object on stdout. Needs root.

use std::{
    fs::{File, OpenOptions},
    io::{BufRead, BufReader, Read},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use linger_tests::bench::{stand_in_device, Nice, Tracer};
use nix::{
    libc,
    sys::{
        signal::{kill, Signal},
        wait::waitpid,
    },
    unistd::Pid,
};
use serde_json::{json, Value};

/// Replay benchmark over a real recording; prints one JSON object on stdout.
#[derive(Parser)]
#[command(args_override_self = true)]
struct Config {
    #[command(flatten)]
    tracer: Tracer,
    #[command(flatten)]
    nice: Nice,
    /// The stand-in GPU device: a node for /dev/full, made if missing.
    #[arg(long = "gpu-device", default_value = "target/bench/gpu0")]
    device: PathBuf,
    /// GPU ioctls recorded in all.
    #[arg(long, default_value_t = 1_000_000)]
    ioctls: u32,
    /// GPU-holding children killed during the recording.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 20)]
    kills: u32,
    /// Threads of each killed child.
    #[arg(long, default_value_t = 8)]
    threads: u32,
    /// Timed replays of each file.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 3)]
    rounds: u32,
}

fn main() -> Result<()> {
    let config = Config::parse();
    config.nice.apply()?;
    std::fs::create_dir_all(&config.tracer.out_dir)?;
    stand_in_device(&config.device)?;
    let mut formats = Vec::new();
    for (name, extra) in [("zstd-1", None), ("plain", Some("--uncompressed"))] {
        let path = config.tracer.out_dir.join(format!("replay-{name}.lgr"));
        let recorded = record(&config, &path, extra)?;
        let mut replays = Vec::new();
        let incidents = replay(&config.tracer.linger, &path, true)?.1;
        ensure!(
            incidents == u64::from(config.kills),
            "the replay of {} shows {incidents} incidents, {} kills were recorded",
            path.display(),
            config.kills
        );
        for _ in 0..config.rounds {
            replays.push(replay(&config.tracer.linger, &path, false)?.0);
        }
        eprintln!(
            "{name}: {} records, {} bytes, recorder {:.0} ns CPU/record; replay {:?} s",
            recorded["records"],
            recorded["file_bytes"],
            recorded["recorder_ns_per_record"],
            replays
        );
        formats.push(json!({
            "name": name,
            "record_command": recorded["command"],
            "replay_command": format!(
                "{} replay {} --json > /dev/null",
                config.tracer.linger.display(),
                path.display()
            ),
            "recording": recorded,
            "replay_s": replays,
        }));
    }
    let out = json!({
        "ioctls": config.ioctls,
        "kills": config.kills,
        "threads": config.threads,
        "formats": formats,
    });
    println!("{out}");
    Ok(())
}

/// Runs `linger record` around the workload; what it wrote.
fn record(config: &Config, path: &Path, extra: Option<&str>) -> Result<Value> {
    let device = config.device.display().to_string();
    let mut args = vec![
        "record".to_string(),
        "-o".into(),
        path.display().to_string(),
        "--gpu-device".into(),
        device,
        "--ring-size".into(),
        (64u32 << 20).to_string(),
        "--duration".into(),
        "300s".into(),
        // The file of an earlier run is the benchmark's own.
        "--force".into(),
    ];
    args.extend(extra.map(str::to_string));
    let command = format!("{} {}", config.tracer.linger.display(), args.join(" "));
    let mut linger = Command::new(&config.tracer.linger)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {command}"))?;
    let mut stderr = BufReader::new(linger.stderr.take().context("stderr")?);
    let mut line = String::new();
    while !line.contains("recording") {
        line.clear();
        if stderr.read_line(&mut line)? == 0 {
            bail!("{command} exited before recording ({})", linger.wait()?);
        }
    }
    let pid = linger.id();
    let cpu0 = cpu_s(pid)?;
    let start = Instant::now();
    workload(config)?;
    let workload_s = start.elapsed().as_secs_f64();
    // Let the last records reach the recorder before asking it to stop.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let recorder_cpu_s = cpu_s(pid)? - cpu0;
    kill(Pid::from_raw(pid as i32), Signal::SIGINT)?;
    let status = linger.wait()?;
    let mut rest = String::new();
    stderr.read_to_string(&mut rest)?;
    ensure!(status.success(), "{command} failed ({status}): {rest}");
    ensure!(!rest.contains("dropped"), "{command}: {rest}");
    // "linger: wrote N records in C chunks, B bytes (...)"
    let wrote = rest
        .lines()
        .find_map(|l| l.strip_prefix("linger: wrote "))
        .with_context(|| format!("{command} said nothing about its file: {rest}"))?;
    let words: Vec<&str> = wrote.split_whitespace().collect();
    let num = |i: usize| -> Result<u64> {
        words
            .get(i)
            .map(|w| w.trim_end_matches(','))
            .and_then(|w| w.parse().ok())
            .with_context(|| format!("parsing {wrote:?}"))
    };
    let records = num(0)?;
    Ok(json!({
        "command": command,
        "records": records,
        "chunks": num(3)?,
        "file_bytes": num(5)?,
        "workload_s": workload_s,
        "recorder_cpu_s": recorder_cpu_s,
        "recorder_ns_per_record": recorder_cpu_s * 1e9 / records.max(1) as f64,
    }))
}

/// GPU ioctls in `kills` slices, a kill of a GPU-holding child after each.
fn workload(config: &Config) -> Result<()> {
    let gpu = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&config.device)?;
    let dying = std::env::current_exe()?.with_file_name("linger-bench-dying");
    let mut bytes: libc::c_int = 0;
    for _ in 0..config.kills {
        for _ in 0..config.ioctls / config.kills {
            // SAFETY: FIONREAD writes one int to the pointer given.
            unsafe { libc::ioctl(gpu.as_raw_fd(), libc::FIONREAD, &mut bytes) };
        }
        let mut child = Command::new(&dying)
            .arg(&config.device)
            .arg(config.threads.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", dying.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        ensure!(line == "ready\n", "linger-bench-dying: {line:?}");
        let pid = Pid::from_raw(child.id() as i32);
        kill(pid, Signal::SIGKILL)?;
        waitpid(pid, None)?;
    }
    Ok(())
}

/// Seconds `linger replay FILE --json` took, and (when `count`) the SIGKILL incidents of this
/// process's kills it printed.
fn replay(linger: &Path, path: &Path, count: bool) -> Result<(f64, u64)> {
    let stdout = if count {
        Stdio::piped()
    } else {
        Stdio::from(File::create("/dev/null")?)
    };
    let start = Instant::now();
    let mut child = Command::new(linger)
        .arg("replay")
        .arg(path)
        .arg("--json")
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()?;
    let mut incidents = 0;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let v: Value = serde_json::from_str(&line?)?;
            incidents += u64::from(
                v["type"] == "incident"
                    && v["signal"] == 9
                    && v["sender"]["pid"].as_u64() == Some(u64::from(std::process::id())),
            );
        }
    }
    let output = child.wait_with_output()?;
    let s = start.elapsed().as_secs_f64();
    ensure!(
        output.status.success(),
        "linger replay {} failed: {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((s, incidents))
}

/// CPU time of all threads of `pid` so far.
fn cpu_s(pid: u32) -> Result<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = std::fs::read_to_string(task?.path().join("schedstat"))?;
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .context("parsing schedstat")?;
    }
    Ok(ns as f64 / 1e9)
}
