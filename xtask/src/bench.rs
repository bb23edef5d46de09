//! `cargo xtask bench`: runs the benchmark binaries of `linger-tests` (tests/src/bin) and
//! rewrites BENCHMARKS.md with their figures, the commands that produced them and the machine.
//!
//! Every figure comes from runs made side by side in this one invocation: the machine is
//! shared and noisy, so only ratios and rates measured close together mean anything.

mod report;
mod stats;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::{build, setup};

#[derive(clap::Args)]
pub struct Args {
    /// Fewer and shorter runs: checks that the benchmarks work; the figures are not worth keeping.
    #[arg(long)]
    quick: bool,
    /// Where to write the report [default: BENCHMARKS.md at the workspace root].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Fail when a performance target is missed (the report is written either way).
    #[arg(long)]
    strict: bool,
}

/// What to run: sized so that the whole benchmark takes about a minute and a half.
pub struct Plan {
    pub storm: Vec<(&'static str, u32)>,
    pub storm_threads: u32,
    pub storm_pairs: u32,
    /// Niceness of every benchmark process (and of the `linger live` the storm starts), ahead
    /// of unrelated work on a shared machine.
    pub nice: i32,
    pub ring_sizes: Vec<u32>,
    pub rates: &'static str,
    pub ring_seconds: f64,
    pub ring_rounds: u32,
    pub syscall_rounds: u32,
    pub decode_rounds: u32,
}

impl Plan {
    fn full() -> Self {
        Self {
            // Iterations per run: each run lasts roughly 0.3 s on an idle machine here. Short runs
            // keep the two runs of a pair close together in time.
            storm: vec![
                ("kill-threads", 1000),
                ("kill-exec", 3000),
                ("spawn-true", 1000),
            ],
            storm_threads: 4,
            storm_pairs: 12,
            nice: -19,
            ring_sizes: vec![1 << 16, 1 << 18, 1 << 20, DEFAULT_RING],
            rates: "0.5,1,2,max,max@2",
            ring_seconds: 0.4,
            ring_rounds: 3,
            syscall_rounds: 4,
            decode_rounds: 5,
        }
    }

    fn quick() -> Self {
        Self {
            storm: vec![
                ("kill-threads", 200),
                ("kill-exec", 600),
                ("spawn-true", 200),
            ],
            storm_pairs: 2,
            ring_sizes: vec![1 << 18, DEFAULT_RING],
            rates: "1,2,max",
            ring_seconds: 0.2,
            ring_rounds: 1,
            syscall_rounds: 2,
            decode_rounds: 2,
            ..Self::full()
        }
    }
}

/// The ring size `linger live` uses unless told otherwise (ProbeConfig's default).
pub const DEFAULT_RING: u32 = 1 << 22;
pub const STORM_TARGET: f64 = 1.05;
pub const RING_TARGET_PER_S: f64 = 2e6;

/// One benchmark command and the JSON it printed.
pub struct Measured {
    /// The command line, run from the workspace root.
    pub command: String,
    pub data: Value,
}

#[derive(Default)]
pub struct Results {
    pub storm: Vec<Measured>,
    pub sweep: Option<Measured>,
    pub syscall: Option<Measured>,
    pub decode: Option<Measured>,
}

/// Where and when the figures were taken.
pub struct Machine {
    pub nproc: usize,
    pub kernel: String,
    pub cpu: String,
    pub virtualized: bool,
    pub date: String,
    pub commit: String,
    pub load_before: String,
    pub load_after: String,
    pub duration_s: f64,
}

pub fn run(args: Args) -> Result<()> {
    if !is_root() {
        bail!("the benchmarks load eBPF programs: run as root (sudo -E cargo xtask bench)");
    }
    let root = build::workspace_root();
    let out = args.out.unwrap_or_else(|| root.join("BENCHMARKS.md"));
    build::linger()?;
    setup::status(build::cargo()?.current_dir(&root).args([
        "build",
        "--release",
        "--package",
        "linger-tests",
        "--bin",
        "linger-bench-storm",
        "--bin",
        "linger-bench-ring",
    ]))?;
    let plan = if args.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    let started = Instant::now();
    let load_before = loadavg();
    let date = output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])?;

    let nice = plan.nice.to_string();
    let mut results = Results::default();
    for &(workload, iterations) in &plan.storm {
        results.storm.push(measure(
            &root,
            &[
                "target/release/linger-bench-storm",
                "--linger",
                "target/release/linger",
                "--workload",
                workload,
                "--iterations",
                &iterations.to_string(),
                "--threads",
                &plan.storm_threads.to_string(),
                "--pairs",
                &plan.storm_pairs.to_string(),
                "--nice",
                &nice,
                "--out-dir",
                "target/bench",
            ],
        )?);
    }
    let ring = "target/release/linger-bench-ring";
    let sizes: Vec<String> = plan.ring_sizes.iter().map(u32::to_string).collect();
    results.sweep = Some(measure(
        &root,
        &[
            ring,
            "--phase",
            "sweep",
            "--ring-sizes",
            &sizes.join(","),
            "--rates",
            plan.rates,
            "--seconds",
            &plan.ring_seconds.to_string(),
            "--rounds",
            &plan.ring_rounds.to_string(),
            "--nice",
            &nice,
        ],
    )?);
    results.syscall = Some(measure(
        &root,
        &[
            ring,
            "--phase",
            "syscall",
            "--seconds",
            &plan.ring_seconds.to_string(),
            "--rounds",
            &plan.syscall_rounds.to_string(),
            "--nice",
            &nice,
        ],
    )?);
    results.decode = Some(measure(
        &root,
        &[
            ring,
            "--phase",
            "decode",
            "--seconds",
            &plan.ring_seconds.to_string(),
            "--rounds",
            &plan.decode_rounds.to_string(),
            "--nice",
            &nice,
        ],
    )?);

    let machine = Machine {
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        cpu: cpu_model(),
        virtualized: cpu_flags().contains(&"hypervisor".to_string()),
        date,
        commit: commit(&root),
        load_before,
        load_after: loadavg(),
        duration_s: started.elapsed().as_secs_f64(),
    };
    let report = report::render(&machine, &plan, &results, args.quick)?;
    fs::write(&out, &report.markdown).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("\nxtask bench: wrote {}", out.display());
    for verdict in &report.verdicts {
        eprintln!("  {verdict}");
    }
    if args.strict && !report.all_met {
        bail!("a performance target was missed (see {})", out.display());
    }
    Ok(())
}

/// Runs one benchmark binary from the workspace root; its stdout is one JSON object.
fn measure(root: &Path, argv: &[&str]) -> Result<Measured> {
    let command = argv.join(" ");
    eprintln!("\nxtask bench: {command}");
    let out = Command::new(root.join(argv[0]))
        .args(&argv[1..])
        .current_dir(root)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {command}"))?;
    if !out.status.success() {
        bail!("{command} failed ({})", out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let data = serde_json::from_str(stdout.trim())
        .with_context(|| format!("{command} printed no JSON result: {stdout:?}"))?;
    Ok(Measured { command, data })
}

fn is_root() -> bool {
    // "Uid: real effective saved fs"
    read_trimmed("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0")
}

fn read_trimmed(path: &str) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn loadavg() -> String {
    read_trimmed("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn cpuinfo_field(name: &str) -> Option<String> {
    fs::read_to_string("/proc/cpuinfo")
        .ok()?
        .lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
}

fn cpu_model() -> String {
    cpuinfo_field("model name").unwrap_or_else(|| "unknown CPU".into())
}

fn cpu_flags() -> Vec<String> {
    cpuinfo_field("flags")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The commit benchmarked, marked when the work tree differs from it.
fn commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    let head = head.trim().to_string();
    let Some(status) = git(&["status", "--porcelain", "--untracked-files=no"]) else {
        return head;
    };
    // "XY PATH" per changed file.
    let changed: Vec<&str> = status.lines().filter_map(|l| l.get(3..)).collect();
    match changed.len() {
        0 => head,
        1..=4 => format!("{head} + uncommitted changes to {}", changed.join(", ")),
        n => format!("{head} + uncommitted changes to {n} files"),
    }
}

fn output(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
