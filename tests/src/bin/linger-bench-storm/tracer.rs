//! `linger live` as users run it, around one workload run: started and attached first (not
//! timed), stopped with SIGINT after, its output read back and its CPU time measured.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    io::{BufRead, BufReader, Read},
    path::Path,
    process::{Child, ChildStderr, Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{bail, ensure, Context, Result};
use nix::{
    sched::{sched_setaffinity, CpuSet},
    sys::signal::{kill, Signal},
    unistd::{sysconf, Pid, SysconfVar},
};
use serde_json::Value;

use crate::{
    bpfstats::{self, Accounting, Program},
    workload::Run,
};

pub struct Traced {
    pub run: Run,
    pub linger: Usage,
    pub output: Output,
    /// With `accounting`: linger's eBPF programs, their runs and time during `work`.
    pub programs: Vec<Program>,
    /// perf events linger held once `work` was done (its stack sampler's, while attached).
    pub perf_events: usize,
}

/// Keeps this process, and the workload it starts, on CPU 0.
pub fn pin_workload() -> Result<()> {
    let mut cpus = CpuSet::new();
    cpus.set(0)?;
    sched_setaffinity(Pid::from_raw(0), &cpus).context("pinning the workload to CPU 0")
}

/// Every CPU but 0, for the tracer beside a pinned workload.
fn tracer_cpus() -> Result<CpuSet> {
    // The machine's CPUs: this process's own affinity is CPU 0 alone by now.
    let n = sysconf(SysconfVar::_NPROCESSORS_ONLN)?.unwrap_or(1) as usize;
    ensure!(n >= 2, "--pin needs a second CPU for the tracer");
    let mut cpus = CpuSet::new();
    for cpu in 1..n.min(CpuSet::count()) {
        cpus.set(cpu)?;
    }
    Ok(cpus)
}

/// Moves every thread of the tracer off CPU 0 (threads it starts later inherit that).
fn pin_tracer(pid: u32) -> Result<()> {
    let cpus = tracer_cpus()?;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Some(tid) = task?.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        sched_setaffinity(Pid::from_raw(tid), &cpus)
            .with_context(|| format!("moving linger's thread {tid} off CPU 0"))?;
    }
    Ok(())
}

/// Runs `work` (given the tracer's pid) while `linger live --json ARGS` writes to `out_path`;
/// with `accounting`, the kernel counts the time spent in linger's programs meanwhile; with
/// `pin`, linger runs off the workload's CPU 0 once attached.
pub fn run_under(
    linger: &Path,
    args: &[String],
    out_path: &Path,
    accounting: bool,
    pin: bool,
    work: impl FnOnce(u32) -> Result<Run>,
) -> Result<Traced> {
    let out = File::create(out_path).with_context(|| format!("creating {}", out_path.display()))?;
    let mut child = Command::new(linger)
        .args(["live", "--json", "--duration", "120s"])
        .args(args)
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", linger.display()))?;
    let mut stderr = BufReader::new(child.stderr.take().context("linger stderr")?);
    wait_ready(&mut child, &mut stderr)?;
    let pid = child.id();
    if pin {
        pin_tracer(pid)?;
    }
    let before = Usage::of(pid)?;
    let switch = accounting.then(Accounting::on).transpose()?;
    let run = work(pid);
    let programs = match switch {
        Some(_on) => bpfstats::programs(pid)?,
        None => Vec::new(),
    };
    let used = Usage::of(pid)?.since(&before);
    let perf_events = perf_events(pid);
    // Let the last records reach the collector before asking it to stop.
    thread::sleep(Duration::from_millis(50));
    kill(Pid::from_raw(pid as i32), Signal::SIGINT)?;
    let status = child.wait()?;
    let mut rest = String::new();
    stderr.read_to_string(&mut rest)?;
    let run = run?;
    ensure!(status.success(), "linger live failed ({status}): {rest}");
    let output = Output::read(out_path).with_context(|| format!("stderr: {rest}"))?;
    Ok(Traced {
        run,
        linger: used,
        output,
        programs,
        perf_events,
    })
}

/// Reads linger's stderr until it says the probes are attached.
fn wait_ready(linger: &mut Child, stderr: &mut BufReader<ChildStderr>) -> Result<()> {
    let mut line = String::new();
    loop {
        line.clear();
        if stderr.read_line(&mut line)? == 0 {
            let status = linger.wait()?;
            bail!("linger live exited before attaching ({status})");
        }
        if line.contains("tracing") {
            return Ok(());
        }
    }
}

/// What linger printed about this benchmark process and the processes it killed.
#[derive(Default)]
pub struct Output {
    /// SIGKILL incidents sent by this process, target exited.
    pub incidents: u64,
    /// Of those, the ones whose target held a GPU file.
    pub gpu_incidents: u64,
    /// Records the kernel dropped.
    pub losses: u64,
    /// `gpu_ioctl` events of this process (only with `--events`).
    pub gpu_ioctls: u64,
    /// `teardown_sample` events of the killed processes: on-CPU, block start, block end (only
    /// with `--events`).
    pub samples: [u64; 3],
}

impl Output {
    fn read(path: &Path) -> Result<Self> {
        let me = u64::from(std::process::id());
        let mut o = Output::default();
        let mut targets = HashSet::new();
        let mut samples: HashMap<(u64, usize), u64> = HashMap::new();
        for line in BufReader::new(File::open(path)?).lines() {
            let v: Value = serde_json::from_str(&line?)?;
            match v["type"].as_str() {
                Some("incident")
                    if v["signal"] == 9
                        && v["sender"]["pid"].as_u64() == Some(me)
                        && v["outcome"] == "exited" =>
                {
                    o.incidents += 1;
                    if !v["gpu"].is_null() {
                        o.gpu_incidents += 1;
                    }
                    targets.insert(v["target"]["pid"].as_u64().unwrap_or(0));
                }
                Some("loss") => o.losses += v["count"].as_u64().unwrap_or(0),
                Some("event") => {
                    let e = &v["event"];
                    match e["data"]["kind"].as_str() {
                        Some("gpu_ioctl") if e["pid"].as_u64() == Some(me) => o.gpu_ioctls += 1,
                        Some("teardown_sample") => {
                            let kind = match e["data"]["sample"].as_str() {
                                Some("on_cpu") => 0,
                                Some("block_start") => 1,
                                _ => 2,
                            };
                            let owner = e["data"]["owner"].as_u64().unwrap_or(0);
                            *samples.entry((owner, kind)).or_default() += 1;
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        for ((owner, kind), n) in samples {
            if targets.contains(&owner) {
                o.samples[kind] += n;
            }
        }
        Ok(o)
    }
}

/// What a process has used so far, summed over its threads.
pub struct Usage {
    pub cpu_s: f64,
    /// Times it went to sleep and was woken again (voluntary context switches).
    pub wakeups: u64,
}

impl Usage {
    fn of(pid: u32) -> Result<Self> {
        let mut usage = Self {
            cpu_s: 0.0,
            wakeups: 0,
        };
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let task = task?.path();
            // schedstat: nanoseconds on CPU first.
            let stat = std::fs::read_to_string(task.join("schedstat"))?;
            let ns: u64 = stat
                .split_whitespace()
                .next()
                .and_then(|f| f.parse().ok())
                .context("parsing schedstat")?;
            usage.cpu_s += ns as f64 / 1e9;
            let status = std::fs::read_to_string(task.join("status"))?;
            usage.wakeups += status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .context("parsing voluntary_ctxt_switches")?;
        }
        Ok(usage)
    }

    fn since(&self, before: &Usage) -> Usage {
        Usage {
            cpu_s: self.cpu_s - before.cpu_s,
            wakeups: self.wakeups.saturating_sub(before.wakeups),
        }
    }
}

/// perf events the process holds open: linger's stack sampler, while it is attached, holds one
/// per CPU.
pub fn perf_events(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.as_os_str() == "anon_inode:[perf_event]")
        .count()
}

/// Other `linger live` processes running now (another tracer would slow the baseline too).
pub fn other_lingers() -> usize {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n != me && n.parse::<u32>().is_ok())
        })
        .filter(|e| {
            std::fs::read_to_string(e.path().join("cmdline")).is_ok_and(|c| {
                let mut args = c.split('\0');
                args.next().is_some_and(|a| a.ends_with("linger")) && args.next() == Some("live")
            })
        })
        .count()
}
