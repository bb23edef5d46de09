//! The workloads: what one run does, and which parts of it are timed.

use std::{
    fs::{File, OpenOptions},
    hint::black_box,
    io::{BufRead, BufReader},
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::PathBuf,
    process::{Command, Stdio},
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
    unistd::{fork, getppid, pause, pipe, read, write, ForkResult, Pid},
};
use serde_json::{json, Value};

use crate::{tracer::perf_events, Config};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Workload {
    /// fork() a child that starts `threads - 1` more threads, SIGKILL it, reap it.
    KillThreads,
    /// Spawn `/bin/sleep 60` (fork + exec), SIGKILL it, reap it.
    KillExec,
    /// Spawn `/bin/true` and wait for it: fork, exec, exit, no signal.
    SpawnTrue,
    /// ioctl(FIONREAD) on a pipe, by a process that holds no GPU file; then as many getppid().
    Ioctl,
    /// ioctl(FIONREAD) on the stand-in GPU device this process holds; then on a pipe.
    IoctlGpu,
    /// Arithmetic only: no system call, no memory traffic. Also timed in 10 slices: the
    /// fastest, times 10, is the second part.
    Spin,
    /// Start `linger-bench-dying` (`threads` threads, holding the stand-in GPU device), SIGKILL
    /// it and time the kill until waitpid() returns it.
    Dying,
    /// System calls of a process that never touches a GPU, four parts of N each: getppid();
    /// a 1-byte read of /dev/zero and write to /dev/null (`dd bs=1`); a 1-byte round trip
    /// through two pipes to a child process and back (two context switches); a 4 KiB pread of
    /// a file in the page cache.
    Syscalls,
}

/// Arithmetic steps in one `spin` iteration.
const SPIN_STEPS: u64 = 1000;
/// A `spin` run is timed in this many slices too.
const SPIN_SLICES: u64 = 10;
/// Pause between a `dying` child's start and its kill, so each kill starts from quiet.
const DYING_GAP: Duration = Duration::from_millis(30);

impl Workload {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "kill-threads" => Self::KillThreads,
            "kill-exec" => Self::KillExec,
            "spawn-true" => Self::SpawnTrue,
            "ioctl" => Self::Ioctl,
            "ioctl-gpu" => Self::IoctlGpu,
            "spin" => Self::Spin,
            "dying" => Self::Dying,
            "syscalls" => Self::Syscalls,
            _ => bail!(
                "unknown workload {s:?} (kill-threads, kill-exec, spawn-true, ioctl, ioctl-gpu, \
                 spin, dying, syscalls)"
            ),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::KillThreads => "kill-threads",
            Self::KillExec => "kill-exec",
            Self::SpawnTrue => "spawn-true",
            Self::Ioctl => "ioctl",
            Self::IoctlGpu => "ioctl-gpu",
            Self::Spin => "spin",
            Self::Dying => "dying",
            Self::Syscalls => "syscalls",
        }
    }

    /// What each run times, in `parts_s` order: the whole run, or its halves, or (`dying`) the
    /// median of its kills, or (`spin`) the whole run and its fastest tenth times ten.
    pub fn parts(self) -> &'static [&'static str] {
        match self {
            Self::Ioctl => &["ioctl", "getppid"],
            Self::IoctlGpu => &["gpu-ioctl", "other-ioctl"],
            Self::Dying => &["kill-to-reap"],
            Self::Spin => &["run", "best-slice"],
            Self::Syscalls => &["getppid", "rw-1byte", "pipe-pingpong", "read-4k"],
            _ => &["run"],
        }
    }

    pub fn kills(self) -> bool {
        matches!(self, Self::KillThreads | Self::KillExec | Self::Dying)
    }

    pub fn needs_gpu(self) -> bool {
        matches!(self, Self::IoctlGpu | Self::Dying)
    }
}

/// The syscall workload's ping-pong makes N / this round trips: each is two context switches,
/// about a hundred getppid()s long (xtask's section 6 divides by the same).
pub const PINGPONG_SHARE: u32 = 20;

/// The workload, with what it keeps between iterations.
pub struct Storm {
    workload: Workload,
    threads: u32,
    /// Children of `kill-threads` write one byte here once all their threads run.
    ready: (OwnedFd, OwnedFd),
    /// The read end is the `ioctl` workloads' non-GPU descriptor.
    pipe: (OwnedFd, OwnedFd),
    /// The stand-in GPU device, held open by `ioctl-gpu`.
    gpu: Option<File>,
    device: Option<PathBuf>,
    dying_exe: PathBuf,
    /// `linger live`, while a traced run goes on.
    tracer: Option<u32>,
    /// Runs of the ioctl workloads do their first part only (check runs).
    pub first_part_only: bool,
    /// `syscalls`: its files and its echoing child.
    syscalls: Option<SyscallParts>,
}

/// What the `syscalls` workload keeps open.
struct SyscallParts {
    zero: File,
    null: File,
    cached: File,
    /// To the echo child, and back from it.
    ping: OwnedFd,
    pong: OwnedFd,
    echo: Pid,
}

impl SyscallParts {
    fn new() -> Result<Self> {
        let path = std::env::temp_dir().join(format!("linger-bench-read-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 1 << 20])?;
        let cached = File::open(&path)?;
        let _ = std::fs::remove_file(&path);
        let (to_child, ping) = pipe()?;
        let (pong, from_child) = pipe()?;
        // SAFETY: single-threaded; the child only echoes bytes until its pipe closes and exits
        // with _exit, never returning into the parent's code.
        let echo = match unsafe { fork() }? {
            ForkResult::Child => {
                drop((ping, pong));
                let mut b = [0u8];
                while matches!(read(to_child.as_fd(), &mut b), Ok(1)) {
                    if write(&from_child, &b).is_err() {
                        break;
                    }
                }
                // SAFETY: leaves the child without the parent's destructors.
                unsafe { libc::_exit(0) }
            }
            ForkResult::Parent { child } => child,
        };
        Ok(Self {
            zero: File::open("/dev/zero")?,
            null: OpenOptions::new().write(true).open("/dev/null")?,
            cached,
            ping,
            pong,
            echo,
        })
    }

    /// The four parts, N calls each (the ping-pong N / PINGPONG_SHARE round trips, each a
    /// hundred getppid()s long): seconds per part.
    fn run(&self, n: u32) -> Result<Vec<f64>> {
        let time = |n: u32, f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            let t = Instant::now();
            for _ in 0..n {
                f()?;
            }
            Ok(t.elapsed().as_secs_f64())
        };
        let mut byte = [0u8];
        let mut page = [0u8; 4096];
        Ok(vec![
            time(n, &mut || {
                black_box(getppid());
                Ok(())
            })?,
            time(n, &mut || {
                ensure!(read(self.zero.as_fd(), &mut byte)? == 1, "short read");
                ensure!(write(&self.null, &byte)? == 1, "short write");
                Ok(())
            })?,
            time(n / PINGPONG_SHARE, &mut || {
                ensure!(write(&self.ping, b"p")? == 1, "ping");
                ensure!(read(self.pong.as_fd(), &mut byte)? == 1, "pong");
                Ok(())
            })?,
            time(n, &mut || {
                ensure!(
                    nix::sys::uio::pread(&self.cached, &mut page, 0)? == page.len(),
                    "short pread"
                );
                Ok(())
            })?,
        ])
    }
}

impl Drop for SyscallParts {
    fn drop(&mut self) {
        let _ = kill(self.echo, Signal::SIGKILL);
        let _ = waitpid(self.echo, None);
    }
}

/// One timed run of the workload.
pub struct Run {
    pub wall_s: f64,
    /// See [`Workload::parts`].
    pub parts_s: Vec<f64>,
    /// CPU time of this process and of the children it reaped during the run.
    pub cpu_s: f64,
    /// CPU time the whole machine spent busy during the run, all CPUs together.
    machine_busy_s: f64,
    /// Per-workload details (`dying`: every kill).
    pub extra: Option<Value>,
}

impl Run {
    /// The machine's busy time as a share of all its CPUs over the run.
    pub fn busy_share(&self) -> f64 {
        let cpus = thread::available_parallelism().map_or(1, |n| n.get());
        self.machine_busy_s / (self.wall_s * cpus as f64)
    }
}

impl Storm {
    pub fn new(config: &Config) -> Result<Self> {
        // Only `ioctl-gpu` holds the device itself; `dying` passes it on to its children.
        let gpu = match (&config.gpu_device, config.workload) {
            (Some(path), Workload::IoctlGpu) => Some(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .with_context(|| format!("opening {}", path.display()))?,
            ),
            _ => None,
        };
        let exe = std::env::current_exe()?;
        Ok(Self {
            workload: config.workload,
            threads: config.threads.max(1),
            ready: pipe()?,
            pipe: pipe()?,
            gpu,
            device: config.gpu_device.clone(),
            dying_exe: exe.with_file_name("linger-bench-dying"),
            tracer: None,
            first_part_only: false,
            syscalls: (config.workload == Workload::Syscalls)
                .then(SyscallParts::new)
                .transpose()?,
        })
    }

    pub fn set_tracer(&mut self, pid: Option<u32>) {
        self.tracer = pid;
    }

    pub fn measured(&mut self, iterations: u32) -> Result<Run> {
        let busy = machine_busy_s()?;
        let cpu = own_cpu_s();
        let start = Instant::now();
        let (parts_s, extra) = self.run(iterations, start)?;
        let wall_s = start.elapsed().as_secs_f64();
        Ok(Run {
            wall_s,
            parts_s,
            cpu_s: own_cpu_s() - cpu,
            machine_busy_s: machine_busy_s()? - busy,
            extra,
        })
    }

    fn run(&mut self, iterations: u32, start: Instant) -> Result<(Vec<f64>, Option<Value>)> {
        let since = |t: Instant| t.elapsed().as_secs_f64();
        match self.workload {
            Workload::Ioctl | Workload::IoctlGpu => {
                let pipe = self.pipe.0.as_raw_fd();
                let first = self.gpu.as_ref().map_or(pipe, |f| f.as_raw_fd());
                let t0 = Instant::now();
                ioctls(first, iterations);
                let first_s = since(t0);
                let t1 = Instant::now();
                if self.first_part_only {
                    return Ok((vec![first_s], None));
                }
                if self.workload == Workload::Ioctl {
                    for _ in 0..iterations {
                        black_box(getppid());
                    }
                } else {
                    ioctls(pipe, iterations);
                }
                Ok((vec![first_s, since(t1)], None))
            }
            Workload::Spin => {
                // Interference only ever slows a slice down: the fastest one shows what is
                // left once it is gone, like a cost paid everywhere (timer interrupts).
                let mut best = f64::MAX;
                for _ in 0..SPIN_SLICES {
                    let t = Instant::now();
                    spin(u64::from(iterations) * SPIN_STEPS / SPIN_SLICES);
                    best = best.min(since(t));
                }
                Ok((vec![since(start), best * SPIN_SLICES as f64], None))
            }
            Workload::Dying => self.dying(iterations),
            Workload::Syscalls => {
                let parts = self.syscalls.as_ref().context("syscalls parts")?;
                Ok((parts.run(iterations)?, None))
            }
            _ => {
                for _ in 0..iterations {
                    self.iteration()?;
                }
                Ok((vec![since(start)], None))
            }
        }
    }

    fn iteration(&mut self) -> Result<()> {
        match self.workload {
            Workload::KillThreads => self.kill_threads(),
            Workload::KillExec => {
                let child = Command::new("/bin/sleep").arg("60").spawn()?;
                let pid = Pid::from_raw(child.id() as i32);
                kill(pid, Signal::SIGKILL)?;
                expect_killed(pid)
            }
            Workload::SpawnTrue => {
                let status = Command::new("/bin/true").status()?;
                ensure!(status.success(), "/bin/true failed: {status}");
                Ok(())
            }
            other => bail!("{} has no plain iteration", other.name()),
        }
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

    /// `iterations` kills of a `linger-bench-dying` child, each timed from kill() until
    /// waitpid() returns. Under a tracer, each kill waits until the stack sampler of the
    /// previous one is off again.
    fn dying(&mut self, iterations: u32) -> Result<(Vec<f64>, Option<Value>)> {
        let device = self.device.as_ref().context("dying needs --gpu-device")?;
        let resting = self.tracer.map(perf_events);
        let mut latencies = Vec::new();
        let mut sampler_on_at_reap = 0;
        let mut max_wait_s: f64 = 0.0;
        for _ in 0..iterations {
            let mut child = Command::new(&self.dying_exe)
                .arg(device)
                .arg(self.threads.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .with_context(|| format!("starting {}", self.dying_exe.display()))?;
            let mut line = String::new();
            BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
            ensure!(line == "ready\n", "linger-bench-dying: {line:?}");
            let pid = Pid::from_raw(child.id() as i32);
            if let (Some(tracer), Some(resting)) = (self.tracer, resting) {
                let wait = Instant::now();
                while perf_events(tracer) > resting {
                    ensure!(
                        wait.elapsed() < Duration::from_secs(5),
                        "linger's stack sampler stayed on 5 s after the last kill"
                    );
                    thread::sleep(Duration::from_millis(1));
                }
                max_wait_s = max_wait_s.max(wait.elapsed().as_secs_f64());
            }
            thread::sleep(DYING_GAP);
            let t0 = Instant::now();
            kill(pid, Signal::SIGKILL)?;
            expect_killed(pid)?;
            latencies.push(t0.elapsed().as_secs_f64());
            if let (Some(tracer), Some(resting)) = (self.tracer, resting) {
                sampler_on_at_reap += usize::from(perf_events(tracer) > resting);
            }
        }
        let mut sorted = latencies.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN);
        let extra = json!({
            "latencies_s": latencies,
            "sampler_on_at_reap": self.tracer.map(|_| sampler_on_at_reap),
            "max_sampler_off_wait_s": self.tracer.map(|_| max_wait_s),
        });
        Ok((vec![median], Some(extra)))
    }
}

fn spin(steps: u64) {
    let mut x = black_box(0x9e37_79b9_7f4a_7c15u64);
    for _ in 0..steps {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    black_box(x);
}

fn ioctls(fd: i32, n: u32) {
    let mut bytes: libc::c_int = 0;
    for _ in 0..n {
        // SAFETY: FIONREAD writes one int to the pointer given.
        black_box(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut bytes) });
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
