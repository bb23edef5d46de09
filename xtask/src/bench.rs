//! `cargo xtask bench`: runs the benchmark binaries of `linger-tests` (tests/src/bin) and
//! rewrites BENCHMARKS.md with their figures, the commands that produced them and the machine.
//!
//! Every figure comes from runs made side by side in this one invocation: the machine is
//! shared and noisy, so only ratios and rates measured close together mean anything.

mod fuzz;
mod gate;
mod ioctl;
mod plan;
mod report;
mod results;
mod ring;
mod rounds;
mod sampling;
mod since;
mod soak;
mod stats;
mod storms;
mod table;
mod tax;
mod trace;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};

use crate::{build, setup};

use self::{
    plan::{Plan, BINARIES, GPU_DEVICE},
    report::Machine,
    results::{Measured, Results},
};

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

pub fn run(args: Args) -> Result<()> {
    if !is_root() {
        bail!("the benchmarks load eBPF programs: run as root (sudo -E cargo xtask bench)");
    }
    let root = build::workspace_root();
    let out = args.out.unwrap_or_else(|| root.join("BENCHMARKS.md"));
    // What is built now is what is measured: the tree may change while the benchmarks run.
    let commit = commit(&root);
    build::linger(build::Arch::Host)?;
    let mut cargo = build::cargo()?;
    cargo
        .current_dir(&root)
        .arg("build")
        .args(build::TESTS_PACKAGE);
    for bin in BINARIES {
        cargo.args(["--bin", bin]);
    }
    setup::status(&mut cargo)?;
    let fuzz_target = crate::fuzz::build(fuzz::TARGET)?;
    // The kill-exec storm runs beside bpftrace on the same hooks too.
    if setup::which("bpftrace").is_none() {
        crate::apt::install(&["bpftrace"])?;
    }
    let plan = if args.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    let started = Instant::now();
    let load_before = loadavg();
    let date = output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])?;
    let results = run_all(&root, &plan, &fuzz_target)?;
    let machine = Machine {
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        cpu: cpu_model(),
        virtualized: cpu_flags().contains(&"hypervisor".to_string()),
        date,
        commit,
        load_before,
        load_after: loadavg(),
        duration_s: started.elapsed().as_secs_f64(),
    };
    // The report it replaces, read before it is overwritten: the new one compares with it.
    let previous = fs::read_to_string(&out).ok();
    let report = report::render(&machine, &plan, &results, previous.as_deref(), args.quick)?;
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

/// Every benchmark of the plan, in the report's order.
fn run_all(root: &Path, plan: &Plan, fuzz_target: &Path) -> Result<Results> {
    let nice = plan.nice.to_string();
    let storm = |workload: &str, iterations: u32, rounds: u32, extra: &[&str]| {
        let iterations = iterations.to_string();
        let rounds = rounds.to_string();
        let mut argv = vec![
            "target/release/linger-bench-storm",
            "--linger",
            "target/release/linger",
            "--workload",
            workload,
            "--iterations",
            &iterations,
            "--rounds",
            &rounds,
            "--nice",
            &nice,
            "--out-dir",
            "target/bench",
        ];
        argv.extend_from_slice(extra);
        measure(root, &argv)
    };
    let storms = kill_storms(plan, &storm)?;
    let gpu = ["--gpu-device", GPU_DEVICE];
    let plain_variants: Vec<String> = ioctl::PLAIN_VARIANTS
        .iter()
        .flat_map(|v| ["--variant".to_string(), format!("'{v}'")])
        .collect();
    let plain_variants: Vec<&str> = plain_variants.iter().map(String::as_str).collect();
    let ioctl = storm("ioctl", plan.ioctls, plan.ioctl_rounds, &plain_variants)?;
    let gpu_ioctl = storm("ioctl-gpu", plan.gpu_ioctls, plan.ioctl_rounds, &gpu)?;
    let (idle, dying) = sampling(plan, &storm)?;
    let (sweep, syscall, decode) = ring(root, plan, &nice)?;
    let trace = measure(
        root,
        &[
            "target/release/linger-bench-trace",
            "--events",
            &plan.trace_events.to_string(),
            "--rounds",
            &plan.trace_rounds.to_string(),
            "--nice",
            &nice,
        ],
    )?;
    let replay = measure(
        root,
        &[
            "target/release/linger-bench-replay",
            "--linger",
            "target/release/linger",
            "--gpu-device",
            GPU_DEVICE,
            "--ioctls",
            &plan.replay_ioctls.to_string(),
            "--kills",
            &plan.replay_kills.to_string(),
            "--threads",
            "8",
            "--rounds",
            &plan.replay_rounds.to_string(),
            "--nice",
            &nice,
            "--out-dir",
            "target/bench",
        ],
    )?;
    let quoted: Vec<String> = tax::VARIANTS.iter().map(|v| format!("'{v}'")).collect();
    let mut variants = Vec::new();
    for v in &quoted {
        variants.extend(["--variant", v.as_str()]);
    }
    let tax = storm("syscalls", plan.tax_calls, plan.tax_rounds, &variants)?;
    let (soak, gate) = soak_and_gate(root, plan, &nice)?;
    // Last: about twenty minutes of CPU-bound work on every CPU, timing nothing else.
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let fuzz = fuzz::campaign(root, fuzz_target, plan.fuzz_runs, jobs)?;
    Ok(Results {
        fuzz,
        gate,
        soak,
        storm: storms,
        tax,
        sweep,
        syscall,
        decode,
        ioctl,
        gpu_ioctl,
        idle,
        dying,
        trace,
        replay,
    })
}

/// Runs the storm benchmark binary with a workload, its iterations and rounds, and more
/// arguments.
type Storm<'a> = dyn Fn(&str, u32, u32, &[&str]) -> Result<Measured> + 'a;

/// The kill storms, free and pinned to a CPU.
fn kill_storms(plan: &Plan, storm: &Storm) -> Result<Vec<Measured>> {
    let threads = plan.storm_threads.to_string();
    let mut storms = Vec::new();
    // Quoted as one argument in the commands the report shows.
    let same_hooks = format!("'{}'", storms::SAME_HOOKS);
    let syscall_hooks = format!("'{}'", storms::SYSCALL_HOOKS);
    for &(workload, iterations) in &plan.storm {
        let mut extra = vec!["--threads", &threads];
        extra.extend(storms::VARIANTS.iter().flat_map(|v| ["--variant", v]));
        if workload == "kill-exec" {
            extra.extend(["--variant", &same_hooks, "--variant", &syscall_hooks]);
        }
        storms.push(storm(workload, iterations, plan.storm_rounds, &extra)?);
    }
    for &(workload, iterations) in &plan.storm_pinned {
        let mut extra = vec!["--threads", &threads, "--pin"];
        extra.extend(storms::VARIANTS.iter().flat_map(|v| ["--variant", v]));
        storms.push(storm(workload, iterations, plan.storm_rounds, &extra)?);
    }
    Ok(storms)
}

/// Idle machines and dying processes, with and without the stack sampler.
fn sampling(plan: &Plan, storm: &Storm) -> Result<(Measured, Measured)> {
    let idle = storm(
        "spin",
        plan.spin,
        plan.idle_rounds,
        &[
            "--variant",
            "base",
            "--variant",
            "base",
            "--variant",
            "live",
            "--variant",
            "'live --sample-hz 0'",
        ],
    )?;
    let dying_threads = plan.dying_threads.to_string();
    let dying = storm(
        "dying",
        plan.dying_kills,
        plan.dying_rounds,
        &[
            "--threads",
            &dying_threads,
            "--gpu-device",
            GPU_DEVICE,
            "--variant",
            "base",
            "--variant",
            "live",
            "--variant",
            "'live --sample-hz 0'",
        ],
    )?;
    Ok((idle, dying))
}

/// The ring buffer: its size against event rates, the system call tax, decoding.
fn ring(root: &Path, plan: &Plan, nice: &str) -> Result<(Measured, Measured, Measured)> {
    let ring = "target/release/linger-bench-ring";
    let sizes: Vec<String> = plan.ring_sizes.iter().map(u32::to_string).collect();
    let seconds = plan.ring_seconds.to_string();
    let ring_phase = |phase: &str, rounds: u32, extra: &[&str]| {
        let rounds = rounds.to_string();
        let mut argv = vec![ring, "--phase", phase];
        argv.extend_from_slice(extra);
        argv.extend_from_slice(&["--seconds", &seconds, "--rounds", &rounds, "--nice", nice]);
        measure(root, &argv)
    };
    let sweep = ring_phase(
        "sweep",
        plan.ring_rounds,
        &["--ring-sizes", &sizes.join(","), "--rates", plan.rates],
    )?;
    let syscall = ring_phase("syscall", plan.syscall_rounds, &[])?;
    let decode = ring_phase("decode", plan.decode_rounds, &[])?;
    Ok((sweep, syscall, decode))
}

/// The soak of many kills, and the gate's cost.
fn soak_and_gate(root: &Path, plan: &Plan, nice: &str) -> Result<(Measured, Measured)> {
    let soak = measure(
        root,
        &[
            "target/release/linger-bench-soak",
            "--linger",
            "target/release/linger",
            "--kills",
            &plan.soak_kills.to_string(),
            "--nice",
            nice,
        ],
    )?;
    let gate = measure(
        root,
        &[
            "target/release/linger-bench-gate",
            "--linger",
            "target/release/linger",
            "--gpu-device",
            GPU_DEVICE,
            "--seconds",
            &plan.gate_seconds.to_string(),
            "--rounds",
            &plan.gate_rounds.to_string(),
            "--extra",
            &plan.gate_extra.to_string(),
            "--nice",
            nice,
        ],
    )?;
    Ok((soak, gate))
}

/// Runs one benchmark binary from the workspace root; its stdout is one JSON object. An
/// argument in single quotes (shown so in the command) is passed without them, as one.
fn measure(root: &Path, argv: &[&str]) -> Result<Measured> {
    let command = argv.join(" ");
    eprintln!("\nxtask bench: {command}");
    let out = Command::new(root.join(argv[0]))
        .args(argv[1..].iter().map(|a| a.trim_matches('\'')))
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
