//! Process storm benchmark: how much slower a fork/exit/kill storm runs while `linger live`
//! traces it, measured side by side.
//!
//! ```text
//! linger-bench-storm --linger target/release/linger --workload kill-threads \
//!     --iterations 1000 --threads 4 --pairs 12 --nice -10 --out-dir target/bench
//! ```
//!
//! One run executes the workload `--iterations` times and is timed by wall clock. Runs alternate
//! between baseline (no tracer) and traced (`linger live --json` in the background, writing to a
//! file), in pairs whose order alternates (AB BA AB ...) so slow drift on a noisy machine cancels.
//! A traced run counts only when the tracer's output holds one SIGKILL incident per kill sent.
//! `--nice` renices this process first, so the workload and the tracer it starts both run at
//! that priority, ahead of unrelated work on a shared machine. Prints one JSON object with every
//! sample on stdout; `cargo xtask bench` turns it into a table.
//!
//! The process must stay single-threaded: the `kill-threads` workload forks without exec.

use std::{
    fs::File,
    io::{BufRead, BufReader, Read},
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
    process::{Child, ChildStderr, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use nix::{
    libc,
    sys::{
        signal::{kill, Signal},
        wait::{waitpid, WaitStatus},
    },
    unistd::{fork, pause, pipe, read, write, ForkResult, Pid},
};
use serde_json::{json, Value};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    /// fork() a child that starts `threads - 1` more threads, SIGKILL it, reap it.
    KillThreads,
    /// Spawn `/bin/sleep 60` (fork + exec), SIGKILL it, reap it.
    KillExec,
    /// Spawn `/bin/true` and wait for it: fork, exec, exit, no signal.
    SpawnTrue,
}

impl Workload {
    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "kill-threads" => Self::KillThreads,
            "kill-exec" => Self::KillExec,
            "spawn-true" => Self::SpawnTrue,
            _ => bail!("unknown workload {s:?} (kill-threads, kill-exec, spawn-true)"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::KillThreads => "kill-threads",
            Self::KillExec => "kill-exec",
            Self::SpawnTrue => "spawn-true",
        }
    }

    fn kills(self) -> bool {
        self != Self::SpawnTrue
    }
}

struct Config {
    linger: PathBuf,
    workload: Workload,
    iterations: u32,
    threads: u32,
    pairs: u32,
    nice: Option<i32>,
    out_dir: PathBuf,
}

fn parse_args() -> Result<Config> {
    let mut config = Config {
        linger: PathBuf::from("target/release/linger"),
        workload: Workload::KillThreads,
        iterations: 1000,
        threads: 4,
        pairs: 12,
        nice: None,
        out_dir: std::env::temp_dir(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--linger" => config.linger = value.into(),
            "--workload" => config.workload = Workload::parse(&value)?,
            "--iterations" => config.iterations = value.parse()?,
            "--threads" => config.threads = value.parse()?,
            "--pairs" => config.pairs = value.parse()?,
            "--nice" => config.nice = Some(value.parse()?),
            "--out-dir" => config.out_dir = value.into(),
            _ => bail!("unknown argument {flag}"),
        }
    }
    ensure!(
        config.iterations > 0 && config.pairs > 0,
        "--iterations and --pairs must be positive"
    );
    Ok(config)
}

fn main() -> Result<()> {
    let config = parse_args()?;
    std::fs::create_dir_all(&config.out_dir)?;
    if let Some(nice) = config.nice {
        renice(nice)?;
    }
    let mut storm = Storm::new(&config)?;
    // Warm-up: page in the binaries and settle the allocator; not measured.
    storm.run(config.iterations / 4 + 1)?;
    let mut pairs = Vec::new();
    for i in 0..config.pairs {
        let traced_first = i % 2 == 1;
        let mut base = None;
        let mut traced = None;
        // Another tracer running would trace the baseline too.
        let mut other_tracers = 0;
        for traced_turn in [traced_first, !traced_first] {
            other_tracers = other_tracers.max(other_lingers());
            if traced_turn {
                traced = Some(traced_run(&config, &mut storm, i)?);
            } else {
                base = Some(storm.measured(config.iterations)?);
            }
        }
        let (base, traced) = (base.context("baseline run")?, traced.context("traced run")?);
        let ratio = traced.run.wall_s / base.wall_s;
        eprintln!(
            "storm {} pair {}: base {:.3}s traced {:.3}s ratio {ratio:.3} ({} incidents, \
             linger cpu {:.3}s, {} wake-ups; machine busy {:.0}%/{:.0}%)",
            config.workload.name(),
            i + 1,
            base.wall_s,
            traced.run.wall_s,
            traced.incidents,
            traced.linger.cpu_s,
            traced.linger.wakeups,
            100.0 * base.busy_share(),
            100.0 * traced.run.busy_share(),
        );
        pairs.push(json!({
            "order": if traced_first { "BA" } else { "AB" },
            "base_s": base.wall_s,
            "traced_s": traced.run.wall_s,
            "ratio": ratio,
            "base_cpu_s": base.cpu_s,
            "traced_cpu_s": traced.run.cpu_s,
            "base_busy": base.busy_share(),
            "traced_busy": traced.run.busy_share(),
            "linger_cpu_s": traced.linger.cpu_s,
            "linger_wakeups": traced.linger.wakeups,
            "incidents": traced.incidents,
            "losses": traced.losses,
            "other_lingers": other_tracers,
        }));
    }
    let out = json!({
        "workload": config.workload.name(),
        "iterations": config.iterations,
        "threads": config.threads,
        "nice": config.nice,
        "cpus": thread::available_parallelism().map_or(1, |n| n.get()),
        "kills_per_run": if config.workload.kills() { config.iterations } else { 0 },
        "pairs": pairs,
    });
    println!("{out}");
    Ok(())
}

/// Renices this (single-threaded) process; the children and the tracer it starts inherit it.
fn renice(nice: i32) -> Result<()> {
    // SAFETY: plain syscall on the calling thread (who = 0), no pointers.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    ensure!(
        rc == 0,
        "setpriority({nice}): {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// The workload, with what it keeps between iterations.
struct Storm {
    workload: Workload,
    threads: u32,
    /// Children of `kill-threads` write one byte here once all their threads run.
    ready: (OwnedFd, OwnedFd),
}

/// One timed run of the workload.
struct Run {
    wall_s: f64,
    /// CPU time of this process and of the children it reaped during the run.
    cpu_s: f64,
    /// CPU time the whole machine spent busy during the run, all CPUs together.
    machine_busy_s: f64,
}

impl Run {
    /// The machine's busy time as a share of all its CPUs over the run.
    fn busy_share(&self) -> f64 {
        let cpus = thread::available_parallelism().map_or(1, |n| n.get());
        self.machine_busy_s / (self.wall_s * cpus as f64)
    }
}

impl Storm {
    fn new(config: &Config) -> Result<Self> {
        Ok(Self {
            workload: config.workload,
            threads: config.threads.max(1),
            ready: pipe()?,
        })
    }

    fn measured(&mut self, iterations: u32) -> Result<Run> {
        let busy = machine_busy_s()?;
        let cpu = own_cpu_s();
        let start = Instant::now();
        self.run(iterations)?;
        let wall_s = start.elapsed().as_secs_f64();
        Ok(Run {
            wall_s,
            cpu_s: own_cpu_s() - cpu,
            machine_busy_s: machine_busy_s()? - busy,
        })
    }

    fn run(&mut self, iterations: u32) -> Result<()> {
        for _ in 0..iterations {
            match self.workload {
                Workload::KillThreads => self.kill_threads()?,
                Workload::KillExec => {
                    let child = Command::new("/bin/sleep").arg("60").spawn()?;
                    let pid = Pid::from_raw(child.id() as i32);
                    kill(pid, Signal::SIGKILL)?;
                    expect_killed(pid)?;
                }
                Workload::SpawnTrue => {
                    let status = Command::new("/bin/true").status()?;
                    ensure!(status.success(), "/bin/true failed: {status}");
                }
            }
        }
        Ok(())
    }

    fn kill_threads(&mut self) -> Result<()> {
        // SAFETY: this process is single-threaded, and the child only starts threads, writes to
        // a pipe and waits for its SIGKILL, never returning into the parent's code.
        match unsafe { fork() }? {
            ForkResult::Child => child(self.threads, &self.ready.1),
            ForkResult::Parent { child } => {
                let mut byte = [0u8];
                let n = read(self.ready.0.as_fd(), &mut byte)?;
                ensure!(n == 1, "child {child} did not report ready");
                kill(child, Signal::SIGKILL)?;
                expect_killed(child)
            }
        }
    }
}

fn child(threads: u32, ready: &OwnedFd) -> ! {
    for _ in 1..threads {
        if thread::Builder::new()
            .spawn(|| loop {
                thread::park()
            })
            .is_err()
        {
            // SAFETY: leaves the forked child at once, without running the parent's destructors.
            unsafe { libc::_exit(1) };
        }
    }
    if write(ready, b"r").is_err() {
        // SAFETY: as above.
        unsafe { libc::_exit(1) };
    }
    loop {
        pause();
    }
}

fn expect_killed(pid: Pid) -> Result<()> {
    match waitpid(pid, None)? {
        WaitStatus::Signaled(_, Signal::SIGKILL, _) => Ok(()),
        other => bail!("child {pid}: unexpected status {other:?}"),
    }
}

/// CPU time of this process plus that of its reaped children, in seconds.
fn own_cpu_s() -> f64 {
    let mut total = 0.0;
    for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
        // SAFETY: an all-zero rusage is valid, and getrusage only writes into it.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `usage` is a valid, writable rusage.
        if unsafe { libc::getrusage(who, &mut usage) } == 0 {
            for t in [usage.ru_utime, usage.ru_stime] {
                total += t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
            }
        }
    }
    total
}

/// Busy time of all CPUs since boot from /proc/stat (user, nice, system, irq, softirq, steal).
fn machine_busy_s() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let cpu = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .context("/proc/stat without a cpu line")?;
    let ticks: Vec<u64> = cpu
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let busy: u64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| ticks.get(i))
        .sum();
    // USER_HZ is 100 on every Linux this runs on.
    Ok(busy as f64 / 100.0)
}

struct Traced {
    run: Run,
    linger: Usage,
    incidents: u64,
    losses: u64,
}

/// One workload run with `linger live --json` tracing in the background.
fn traced_run(config: &Config, storm: &mut Storm, pair: u32) -> Result<Traced> {
    let out_path = config
        .out_dir
        .join(format!("storm-{}-{pair}.jsonl", config.workload.name()));
    let out =
        File::create(&out_path).with_context(|| format!("creating {}", out_path.display()))?;
    let mut linger = Command::new(&config.linger)
        .args(["live", "--json", "--duration", "120s"])
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", config.linger.display()))?;
    let mut stderr = BufReader::new(linger.stderr.take().context("linger stderr")?);
    wait_ready(&mut linger, &mut stderr)?;
    let pid = linger.id();
    let before = Usage::of(pid)?;
    let run = storm.measured(config.iterations)?;
    let used = Usage::of(pid)?.since(&before);
    // Let the last records reach the collector before asking it to stop.
    thread::sleep(Duration::from_millis(50));
    kill(Pid::from_raw(pid as i32), Signal::SIGINT)?;
    let status = linger.wait()?;
    let mut rest = String::new();
    stderr.read_to_string(&mut rest)?;
    ensure!(status.success(), "linger live failed ({status}): {rest}");
    let (incidents, losses) = count_output(&out_path)?;
    let want = if config.workload.kills() {
        u64::from(config.iterations)
    } else {
        0
    };
    ensure!(
        incidents == want,
        "linger reported {incidents} SIGKILL incidents from this benchmark, expected {want} \
         (output: {}; stderr: {rest})",
        out_path.display()
    );
    Ok(Traced {
        run,
        linger: used,
        incidents,
        losses,
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

/// SIGKILL incidents this process sent, and records the kernel dropped, in linger's output.
fn count_output(path: &Path) -> Result<(u64, u64)> {
    let me = u64::from(std::process::id());
    let (mut incidents, mut losses) = (0, 0);
    for line in BufReader::new(File::open(path)?).lines() {
        let v: Value = serde_json::from_str(&line?)?;
        match v["type"].as_str() {
            Some("incident")
                if v["signal"] == 9
                    && v["sender"]["pid"].as_u64() == Some(me)
                    && v["outcome"] == "exited" =>
            {
                incidents += 1
            }
            Some("loss") => losses += v["count"].as_u64().unwrap_or(0),
            _ => {}
        }
    }
    Ok((incidents, losses))
}

/// What a process has used so far, summed over its threads.
struct Usage {
    cpu_s: f64,
    /// Times it went to sleep and was woken again (voluntary context switches).
    wakeups: u64,
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

/// Other `linger live` processes running now (another tracer would slow the baseline too).
fn other_lingers() -> usize {
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
