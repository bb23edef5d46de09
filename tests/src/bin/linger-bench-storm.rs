//! Workload benchmark: how much slower a workload runs while `linger live` traces it, measured
//! side by side.
//!
//! ```text
//! linger-bench-storm --linger target/release/linger --workload kill-threads \
//!     --iterations 1000 --threads 4 --rounds 10 --nice -19 --out-dir target/bench
//! linger-bench-storm ... --workload spin --variant base --variant base --variant live \
//!     --variant 'live --sample-hz 0'
//! ```
//!
//! One run executes the workload `--iterations` times. Each round runs every variant once:
//! `base` (no tracer) or `live [ARGS]` (`linger live --json ARGS` in the background, writing to
//! a file); the order rotates from round to round (AB BA ..., ABC BCA CAB ...) so slow drift on a
//! noisy machine cancels. The first variant is the baseline the others are compared with; a
//! second `base` measures the noise itself. A workload times one or more parts of each run
//! (`parts_s`, see [`Workload::parts`]). A traced run counts only when the tracer's output holds
//! one SIGKILL incident per kill sent. `--nice` renices this process first, so the workload and
//! the tracer it starts run at that priority, ahead of unrelated work on a shared machine.
//! `--gpu-device PATH` is a char device node for /dev/full (1:7), made if missing, that the
//! GPU workloads open and the tracer is told to treat as a GPU file. Prints one JSON object with
//! every sample on stdout; `cargo xtask bench` turns it into tables.
//!
//! The process must stay single-threaded: the `kill-threads` workload forks without exec.

#[path = "linger-bench-storm/bpfstats.rs"]
mod bpfstats;
#[path = "linger-bench-storm/tracer.rs"]
mod tracer;
#[path = "linger-bench-storm/workload.rs"]
mod workload;

use std::{path::PathBuf, thread};

use anyhow::{bail, ensure, Result};
use clap::Parser;
use linger_tests::bench::{stand_in_device, Nice, Tracer};
use serde_json::{json, Value};

use bpfstats::Program;
use tracer::{Output, Traced};
use workload::{Run, Storm, Workload};

/// Bytes of a GPU ioctl record in the ring (header and payload).
const GPU_IOCTL_RECORD: usize =
    std::mem::size_of::<tracer_common::Record<tracer_common::GpuIoctl>>();

/// One way to run the workload: without a tracer, under `linger live` with these arguments,
/// or beside another program (another tracer to compare with: `cmd perf record ...`).
#[derive(Clone, Debug)]
enum Variant {
    Base,
    Live(Vec<String>),
    Cmd(Vec<String>),
}

impl Variant {
    /// `base`, or `live` followed by extra arguments for `linger live`.
    fn parse(s: &str) -> Result<Self> {
        let mut words = s.split_whitespace();
        match words.next() {
            Some("base") if words.next().is_none() => Ok(Self::Base),
            Some("live") => Ok(Self::Live(words.map(str::to_string).collect())),
            Some("cmd") => {
                let argv: Vec<String> = words.map(str::to_string).collect();
                ensure!(!argv.is_empty(), "variant {s:?}: `cmd PROGRAM [ARGS]`");
                Ok(Self::Cmd(argv))
            }
            _ => bail!("variant {s:?}: `base`, `live [LINGER LIVE ARGS]` or `cmd PROGRAM [ARGS]`"),
        }
    }

    fn label(&self) -> String {
        match self {
            Self::Base => "base".into(),
            Self::Live(args) if args.is_empty() => "live".into(),
            Self::Live(args) => format!("live {}", args.join(" ")),
            Self::Cmd(argv) => format!("cmd {}", argv.join(" ")),
        }
    }
}

/// Workload benchmark under `linger live`; prints one JSON object on stdout.
#[derive(Clone, Parser)]
#[command(args_override_self = true)]
pub struct Config {
    #[command(flatten)]
    tracer: Tracer,
    /// kill-threads, kill-exec, spawn-true, ioctl, ioctl-gpu, spin, dying or syscalls.
    #[arg(long, value_parser = Workload::parse, default_value = "kill-threads")]
    workload: Workload,
    /// Workload iterations in one run.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 1000)]
    iterations: u32,
    #[arg(long, default_value_t = 4)]
    threads: u32,
    /// Rounds, each running every variant once.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 12)]
    rounds: u32,
    /// `base` or `live [LINGER LIVE ARGS]`, once per variant (default: base, live).
    #[arg(long = "variant", value_parser = Variant::parse)]
    variants: Vec<Variant>,
    #[command(flatten)]
    nice: Nice,
    /// The stand-in GPU device: a node for /dev/full, made if missing.
    #[arg(long)]
    gpu_device: Option<PathBuf>,
    /// Runs the workload on CPU 0 and the tracer on the others: what the tracer costs the
    /// workload where a core is free for it (as on a GPU node), apart from sharing CPUs.
    #[arg(long)]
    pin: bool,
}

fn parse_args() -> Result<Config> {
    let mut config = Config::parse();
    if config.variants.is_empty() {
        config.variants = vec![Variant::Base, Variant::Live(Vec::new())];
    }
    ensure!(
        matches!(config.variants[0], Variant::Base) && config.variants.len() >= 2,
        "the first variant is the baseline (`base`), and at least one other is needed"
    );
    ensure!(
        !config.workload.needs_gpu() || config.gpu_device.is_some(),
        "workload {} needs --gpu-device",
        config.workload.name()
    );
    Ok(config)
}

fn main() -> Result<()> {
    let config = parse_args()?;
    std::fs::create_dir_all(&config.tracer.out_dir)?;
    // The process is single-threaded: the workload and the tracer it starts inherit it.
    config.nice.apply()?;
    if config.pin {
        tracer::pin_workload()?;
    }
    if let Some(device) = &config.gpu_device {
        stand_in_device(device)?;
    }
    let mut storm = Storm::new(&config)?;
    // Warm-up: page in the binaries and settle the allocator; not measured.
    storm.measured(config.iterations / 4 + 1)?;
    let check = check_run(&config, &mut storm)?;
    let k = config.variants.len();
    let mut rounds = Vec::new();
    for round in 0..config.rounds {
        let order: Vec<usize> = (0..k).map(|i| (i + round as usize) % k).collect();
        let mut runs: Vec<Option<Value>> = vec![None; k];
        let mut other_tracers = 0;
        for &v in &order {
            // Another tracer running would trace the baseline too.
            other_tracers = other_tracers.max(tracer::other_lingers());
            let run = match &config.variants[v] {
                Variant::Base => run_json(&storm.measured(config.iterations)?, None),
                Variant::Cmd(argv) => run_json(&beside(argv, &mut storm, config.iterations)?, None),
                Variant::Live(args) => {
                    let name = format!("{}-{round}-{v}", config.workload.name());
                    let traced = traced_run(&config, &mut storm, args, &name, false, false)?;
                    run_json(&traced.run, Some(&traced))
                }
            };
            runs[v] = Some(run);
        }
        let runs: Vec<Value> = runs.into_iter().map(Option::unwrap_or_default).collect();
        let parts: Vec<String> = runs
            .iter()
            .map(|r| format!("{:.4}", r["parts_s"][0].as_f64().unwrap_or(f64::NAN)))
            .collect();
        eprintln!(
            "{} round {}: {} s ({})",
            config.workload.name(),
            round + 1,
            parts.join(" / "),
            config
                .variants
                .iter()
                .map(Variant::label)
                .collect::<Vec<_>>()
                .join(" / ")
        );
        let letters: String = order.iter().map(|&v| (b'A' + v as u8) as char).collect();
        rounds.push(json!({
            "order": letters,
            "runs": runs,
            "other_lingers": other_tracers,
        }));
    }
    let out = json!({
        "workload": config.workload.name(),
        "iterations": config.iterations,
        "threads": config.threads,
        "nice": config.nice.nice,
        "cpus": thread::available_parallelism().map_or(1, |n| n.get()),
        "kills_per_run": if config.workload.kills() { config.iterations } else { 0 },
        "parts": config.workload.parts(),
        "pinned": config.pin,
        "variants": config.variants.iter().map(Variant::label).collect::<Vec<_>>(),
        "check": check,
        "rounds": rounds,
    });
    println!("{out}");
    Ok(())
}

/// One run while `argv` runs in the background: started a second before (to attach), stopped
/// with SIGINT after.
fn beside(argv: &[String], storm: &mut Storm, iterations: u32) -> Result<Run> {
    let mut child = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("starting {}: {e}", argv[0]))?;
    thread::sleep(std::time::Duration::from_secs(1));
    ensure!(child.try_wait()?.is_none(), "{} exited early", argv[0]);
    let run = storm.measured(iterations);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
    let _ = child.wait();
    run
}

/// One untimed run under `linger live` with the kernel's program accounting on, and for the
/// GPU workloads `--events`: what the tracer records of the workload (every ioctl on the
/// device; each kill's teardown samples) and how long its programs took. The ioctl workloads
/// run their first part only.
fn check_run(config: &Config, storm: &mut Storm) -> Result<Value> {
    let (events, iterations) = match config.workload {
        Workload::Ioctl => (false, config.iterations),
        // Every event is printed as JSON: keep these small.
        Workload::IoctlGpu => (true, config.iterations.min(50_000)),
        Workload::Dying => (true, config.iterations.min(5)),
        // What each program costs per kill, fork and exec.
        Workload::KillThreads | Workload::KillExec | Workload::SpawnTrue => {
            (false, config.iterations)
        }
        _ => return Ok(Value::Null),
    };
    let check = Config {
        iterations,
        ..config.clone()
    };
    // The first traced variant's flags: the accounting is of the programs its pairs measure.
    let args = config
        .variants
        .iter()
        .find_map(|v| match v {
            Variant::Live(args) => Some(args.as_slice()),
            _ => None,
        })
        .unwrap_or_default();
    storm.first_part_only = true;
    let traced = traced_run(&check, storm, args, "check", events, true);
    storm.first_part_only = false;
    let traced = traced?;
    let o = &traced.output;
    let programs: Vec<String> = traced
        .programs
        .iter()
        .map(|p| {
            format!(
                "{} {}x {:.0} ns",
                p.name,
                p.runs,
                p.ns as f64 / p.runs as f64
            )
        })
        .collect();
    eprintln!(
        "{} check: {iterations} iterations, {} GPU ioctls of this process recorded, \
         teardown samples {:?}; programs: {}",
        config.workload.name(),
        o.gpu_ioctls,
        o.samples,
        programs.join(", ")
    );
    Ok(json!({
        "iterations": iterations,
        "events": events,
        "part": config.workload.parts()[0],
        "gpu_ioctls": o.gpu_ioctls,
        "gpu_ioctl_record_bytes": GPU_IOCTL_RECORD,
        "on_cpu_samples": o.samples[0],
        "block_starts": o.samples[1],
        "block_ends": o.samples[2],
        "gpu_incidents": o.gpu_incidents,
        "incidents": o.incidents,
        "losses": o.losses,
        "programs": traced.programs.iter().map(Program::to_json).collect::<Vec<_>>(),
        "run": run_json(&traced.run, None),
    }))
}

fn run_json(run: &Run, traced: Option<&Traced>) -> Value {
    let mut v = json!({
        "wall_s": run.wall_s,
        "parts_s": run.parts_s,
        "cpu_s": run.cpu_s,
        "busy": run.busy_share(),
    });
    if let Some(extra) = &run.extra {
        v["extra"] = extra.clone();
    }
    if let Some(t) = traced {
        v["linger_cpu_s"] = json!(t.linger.cpu_s);
        v["linger_wakeups"] = json!(t.linger.wakeups);
        v["incidents"] = json!(t.output.incidents);
        v["gpu_incidents"] = json!(t.output.gpu_incidents);
        v["losses"] = json!(t.output.losses);
        v["linger_perf_events"] = json!(t.perf_events);
    }
    v
}

/// One workload run with `linger live --json ARGS` tracing in the background; the output is
/// checked against what the run did.
fn traced_run(
    config: &Config,
    storm: &mut Storm,
    args: &[String],
    name: &str,
    events: bool,
    accounting: bool,
) -> Result<Traced> {
    let out_path = config.tracer.out_dir.join(format!("storm-{name}.jsonl"));
    let mut live_args: Vec<String> = args.to_vec();
    if let Some(device) = &config.gpu_device {
        live_args.push("--gpu-device".into());
        live_args.push(device.display().to_string());
    }
    if events {
        live_args.push("--events".into());
    }
    let traced = tracer::run_under(
        &config.tracer.linger,
        &live_args,
        &out_path,
        accounting,
        config.pin,
        |pid| {
            storm.set_tracer(Some(pid));
            let run = storm.measured(config.iterations);
            storm.set_tracer(None);
            run
        },
    )?;
    let want = if config.workload.kills() {
        u64::from(config.iterations)
    } else {
        0
    };
    let Output {
        incidents,
        gpu_incidents,
        ..
    } = traced.output;
    ensure!(
        incidents == want,
        "linger reported {incidents} SIGKILL incidents from this benchmark, expected {want} \
         (output: {})",
        out_path.display()
    );
    if config.workload == Workload::Dying {
        ensure!(
            gpu_incidents == want,
            "only {gpu_incidents} of {want} incidents saw the stand-in GPU device held \
             (output: {})",
            out_path.display()
        );
    }
    Ok(traced)
}
