//! `linger live`: trace fatal signals until stopped.

use std::{path::PathBuf, time::Duration};

use tracer_user::{
    analysis::{signals, CorrelatorConfig},
    event::DriverHooks,
    live::{report::Output, Config, Live, Recording},
    probe::{devices::GpuDevices, ProbeConfig, DEFAULT_FATAL_SIGNALS},
    source::{procfs, workload},
};

use super::duration;

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Stop after this long (500ms, 10s, 2m); default: until Ctrl-C.
    #[arg(long, value_parser = duration::parse)]
    pub duration: Option<Duration>,
    /// One JSON object per incident (schema: docs/incident-json.md).
    #[arg(long)]
    pub json: bool,
    /// Only incidents of this target pid (repeatable).
    #[arg(long = "pid")]
    pub pids: Vec<u32>,
    /// Only incidents of targets with this command name (repeatable).
    #[arg(long = "comm")]
    pub comms: Vec<String>,
    /// Signals that open an incident (repeatable; 9, KILL or SIGKILL). Default: HUP INT QUIT ILL
    /// ABRT BUS FPE KILL SEGV TERM.
    #[arg(long = "signal", value_parser = parse_signal)]
    pub signals: Vec<u32>,
    /// Also print every event as a JSON line (`{"type":"event",...}`), for digging deeper.
    #[arg(long)]
    pub events: bool,
    /// Stop after this many incidents.
    #[arg(long)]
    pub count: Option<usize>,
    /// A process still alive this long after a catchable signal survived it.
    #[arg(long, value_parser = duration::parse, default_value = "1s")]
    pub survive_after: Duration,
    /// Treat this char device as a GPU file too (repeatable); the NVIDIA devices always are.
    #[arg(long = "gpu-device", value_name = "PATH")]
    pub gpu_devices: Vec<PathBuf>,
    /// GPU memory not back this long after its process died is reported as lingering.
    #[arg(long, value_parser = duration::parse, default_value = "30s")]
    pub linger_after: Duration,
    /// A GPU process's thread asleep uninterruptibly in the NVIDIA driver this long is
    /// reported stuck, and again once it moves on (0: not watched).
    #[arg(long, value_parser = duration::parse, default_value = "10s")]
    pub stuck_after: Duration,
    /// On-CPU kernel stack samples per second of dying GPU processes (0: none).
    #[arg(long, default_value_t = 4999)]
    pub sample_hz: u64,
    /// No system call tracepoint at all: no process on the machine pays for linger's system
    /// call hooks. No allocation ledger or collateral; holders from /proc, NVML, forks and the
    /// exec and exit walks (`linger doctor` says what else).
    #[arg(long)]
    pub lean: bool,
    /// Where the kernel allows no hook on the driver's functions, follow GPU opens, closes and
    /// ioctls through system call tracepoints (every process's system calls pay for them)
    /// rather than through uprobes on the NVIDIA libraries (only their users pay), which miss
    /// what a process does outside those libraries; and attach them from the start where no
    /// NVIDIA driver is registered yet (otherwise none until it registers).
    #[arg(long, conflicts_with = "lean")]
    pub syscall_hooks: bool,
    /// Do not follow GPU ioctls (no allocation ledger; holders and teardown still traced).
    #[arg(long)]
    pub no_ioctls: bool,
    /// Do not read GPU memory through NVML (kernel data only).

    #[arg(long)]
    pub no_nvml: bool,
    /// Kernel ring buffer size in bytes (a power of two, at least 4096).
    #[arg(long, default_value_t = 1 << 22, value_parser = parse_ring_size)]
    pub ring_size: u32,
    /// How to time the driver's release of GPU files: fentry/fexit or kprobes on __fput (and
    /// kprobes on the NVIDIA driver's functions); auto takes the first the kernel allows.
    #[arg(long, value_enum, default_value_t = DriverHooks::Auto)]
    pub driver_hooks: DriverHooks,
    /// Where the kubelet keeps its `pods/` and `containers/` log directories, which name the
    /// pods and containers of GPU processes.
    #[arg(long, value_name = "DIR", default_value = workload::KUBELET_LOGS)]
    pub kubelet_logs: PathBuf,
    #[command(flatten)]
    pub recording: RecordOptions,
}

/// Trace file options of `live` (and `record`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct RecordOptions {
    /// Also write everything traced to this trace file, for `linger replay` and `export`.
    #[arg(long = "record", value_name = "FILE")]
    pub path: Option<PathBuf>,
    /// Keep only the program of each command line in the trace, not its arguments.
    #[arg(long)]
    pub redact_cmdline: bool,
    /// Store trace chunks uncompressed: larger files, faster replay.
    #[arg(long)]
    pub uncompressed: bool,
    /// Replace the trace file if it exists: only a regular file of linger's own user, and
    /// never through a symbolic link (a new file takes its name).
    #[arg(long)]
    pub force: bool,
}

fn parse_signal(s: &str) -> Result<u32, String> {
    signals::parse(s).ok_or_else(|| format!("'{s}' is not a signal (try 9, KILL or SIGTERM)"))
}

fn parse_ring_size(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a byte count"))?;
    if n < 4096 || !n.is_power_of_two() {
        return Err(format!("{n} must be a power of two of at least 4096"));
    }
    Ok(n)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let live = Live::load(config(&args)?)?;
    let ready = || eprintln!("linger: tracing fatal signals (Ctrl-C to stop)");
    // Flushed after each batch of events, not after each line.
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    live.run(ready, &mut out, &mut ()).map(|_| ())
}

/// The live pipeline's configuration from the options; the GPU devices are discovered here,
/// once for the run.
pub fn config(args: &Args) -> anyhow::Result<Config> {
    let fatal_signals = if args.signals.is_empty() {
        DEFAULT_FATAL_SIGNALS.to_vec()
    } else {
        args.signals.iter().map(|&s| s as i32).collect()
    };
    let recording = args.recording.path.clone().map(|path| Recording {
        path,
        compressed: !args.recording.uncompressed,
        replace: args.recording.force,
    });
    Ok(Config {
        probes: ProbeConfig {
            ring_size: args.ring_size,
            fatal_signals,
            bench_pid: None,
            gpu_devices: GpuDevices::discover(&args.gpu_devices)?,
            driver_hooks: args.driver_hooks,
            sample_hz: args.sample_hz,
            ioctls: !args.no_ioctls,
            lean: args.lean,
            syscall_hooks: args.syscall_hooks,
            stuck_after_ns: args.stuck_after.as_nanos() as u64,
        },
        analysis: CorrelatorConfig {
            pids: args.pids.clone(),
            comms: args.comms.clone(),
            survive_after_ns: args.survive_after.as_nanos() as u64,
            linger_after_ns: args.linger_after.as_nanos() as u64,
            ..Default::default()
        },
        output: Output {
            json: args.json,
            events: args.events,
            count: args.count,
        },
        duration: args.duration,
        nvml: !args.no_nvml,
        describe: procfs::Describe {
            redact_cmdline: args.recording.redact_cmdline,
            names: workload::Names::new(&args.kubelet_logs),
        },
        recording,
        node_name: None,
    })
}
