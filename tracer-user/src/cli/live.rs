//! `linger live`: trace fatal signals until stopped.

use std::{
    cell::RefCell,
    io::Write,
    ops::ControlFlow,
    path::PathBuf,
    rc::Rc,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::Context;
use log::{debug, info, warn};
use tracer_user::{
    analysis::{
        incident::Node, memory::NvmlNeed, signals, CorrelatorConfig, Output as AnalysisOutput,
    },
    clock::{boottime_ns, WallAnchor},
    event::{DriverHooks, Event, EventData, Strategy},
    privileges,
    probe::{devices::GpuDevices, load::DEFAULT_FATAL_SIGNALS, strategy, xid, ProbeConfig, Probes},
    source::{
        collect::{self, Sink, Tap},
        cost::{Part, Stopwatch},
        gpu::GpuSources,
        kernel::KernelSource,
        kmsg, machine, nvml,
        pace::Pace,
        procfs, workload,
    },
    trace::TraceMeta,
};

use super::{
    duration, record,
    report::{Output, Report},
};

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
    pub recording: record::Options,
}

/// What runs beside the live pipeline and sees what it sees (the agent's metrics).
pub trait Companion {
    /// Once, on the collector's runtime, before the first event; `meta` describes the run
    /// as a recording would.
    fn start(&mut self, _gpu: &GpuSources, _strategy: &Strategy, _meta: &TraceMeta) {}
    /// After `start`: a tap that records the stream as `--record` does (the flight
    /// recorder), seeing kernel records before they are decoded.
    fn tap(&self) -> Option<Rc<RefCell<dyn Tap>>> {
        None
    }
    fn event(&mut self, _e: &Event) {}
    fn record(&mut self, _r: &AnalysisOutput) {}
    /// Once, after the last event.
    fn finish(&mut self) {}
}

impl Companion for () {}

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
    let probes = load(&args)?;
    let ready = || eprintln!("linger: tracing fatal signals (Ctrl-C to stop)");
    // Flushed after each batch of events (see `LiveSink`), not after each line.
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    trace(probes, &args, ready, &mut out, &mut ()).map(|_| ())
}

pub fn load(args: &Args) -> anyhow::Result<Probes> {
    let fatal_signals = if args.signals.is_empty() {
        DEFAULT_FATAL_SIGNALS.to_vec()
    } else {
        args.signals.iter().map(|&s| s as i32).collect()
    };
    Ok(Probes::load(&ProbeConfig {
        ring_size: args.ring_size,
        fatal_signals,
        bench_pid: None,
        gpu_devices: GpuDevices::discover(&args.gpu_devices)?,
        driver_hooks: args.driver_hooks,
        sample_hz: args.sample_hz,
        ioctls: !args.no_ioctls,
        lean: args.lean,
        syscall_hooks: args.syscall_hooks,
    })?)
}

/// Runs the live pipeline over loaded probes, writing incidents to `out`; returns how many.
pub fn trace(
    mut probes: Probes,
    args: &Args,
    ready: impl FnOnce(),
    out: &mut impl Write,
    companion: &mut impl Companion,
) -> anyhow::Result<usize> {
    let anchor = WallAnchor::now();
    let config = CorrelatorConfig {
        pids: args.pids.clone(),
        comms: args.comms.clone(),
        survive_after_ns: args.survive_after.as_nanos() as u64,
        linger_after_ns: args.linger_after.as_nanos() as u64,
        ..Default::default()
    };
    let mut recorder = record::start(args, &anchor, &config)?;
    // The kernel log names the process of a GPU error (the driver's tracepoint does not),
    // and has the errors where the tracepoint is missing; opening it may take CAP_SYSLOG:
    // before the capabilities go.
    let kmsg = kmsg::open();
    let kmsg_reason = xid::kmsg_reason(kmsg.as_ref().map(|_| ()), probes.strategy().xid_tracepoint);
    if kmsg.is_err() {
        warn!("{kmsg_reason}");
    }
    let kmsg = kmsg.ok();
    // Attached, and the trace file open: from here on only what the collector uses.
    privileges::drop_after_attach(args.sample_hz > 0)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let output = Output {
        json: args.json,
        events: args.events,
        count: args.count,
    };
    let machine = machine::read();
    let node = Node {
        host: machine.host,
        boot_id: machine.boot_id,
        driver: machine.driver,
    };
    let meta = record::meta(args, &anchor, &config);
    let mut report = Report::new(out, output, anchor, config, node);
    report.keep_written();
    // Who traces and how goes first in the stream, so replays know it too.
    let me = Event::collector(
        boottime_ns(),
        EventData::Collector {
            pid: std::process::id(),
        },
    );
    recorder.event(&me);
    let _ = report.on_event(&me);
    let mut strategy = probes.strategy().clone();
    strategy.reasons.push(kmsg_reason);
    let chosen = strategy.clone();
    info!("driver hooks: {}", strategy::describe(&strategy));
    for reason in &strategy.reasons {
        debug!("driver hooks: {reason}");
    }
    let strategy = Event::collector(boottime_ns(), EventData::Strategy(strategy));
    recorder.event(&strategy);
    let _ = report.on_event(&strategy);
    let devices = GpuDevices::discover(&args.gpu_devices)?;
    let mut gpu = GpuSources::start(
        &mut probes,
        &devices,
        !args.no_nvml,
        procfs::Describe {
            redact_cmdline: args.recording.redact_cmdline,
            names: workload::Names::new(&args.kubelet_logs),
        },
        // Opens made outside what is hooked: NVML's list names GPU processes too.
        chosen.lean || !chosen.libraries.is_empty(),
        kmsg,
    );
    let awaited = gpu.awaited();
    let idle = gpu.idle();
    let search = gpu.search_switch();
    let watch = gpu.watch();
    let source = runtime.block_on(async {
        watch.within(Part::Companion, || {
            companion.start(&gpu, &chosen, &meta);
            // Who traces and how: the stream's first events, which the companion sees too.
            companion.event(&me);
            companion.event(&strategy);
        });
        // The companion's recording is its own cost, not the trace file's.
        let mut side = companion
            .tap()
            .map(|t| collect::Timed::new(t, watch.clone(), Part::Companion));
        side.event(&me);
        side.event(&strategy);
        let mut tap = (&mut recorder, side);
        let source = KernelSource::new(probes)?;
        let source = collect::run_tapped(
            source,
            Some(&mut gpu),
            args.duration,
            &mut tap,
            // Once everything is attached, the holders at start are known and a Ctrl-C
            // would end the run cleanly.
            ready,
            LiveSink {
                report: &mut report,
                companion,
                awaited,
                idle,
                search,
                watch,
            },
        )
        .await?;
        anyhow::Ok(source)
    })?;
    companion.finish();
    record::finish(recorder, args, source.drops_total())?;
    let all = report.finish()?;
    if source.drops_total() > 0 {
        eprintln!(
            "linger: the kernel dropped {} record(s) because the ring buffer was full; \
             incidents may be incomplete (raise --ring-size)",
            source.drops_total()
        );
    }
    Ok(all)
}

/// The live stream's end: the report, the companion, and what the GPU side is told back.
struct LiveSink<'r, 'o, W: Write, C: Companion> {
    report: &'r mut Report<'o, W>,
    companion: &'r mut C,
    awaited: Arc<Pace>,
    idle: Arc<AtomicBool>,
    search: Arc<AtomicBool>,
    /// The companion's time is its own part of the collector's cost.
    watch: Stopwatch,
}

impl<W: Write, C: Companion> Sink for LiveSink<'_, '_, W, C> {
    fn event(&mut self, event: &Event) -> ControlFlow<()> {
        let flow = self.report.on_event(event);
        let written = self.report.take_written();
        self.watch.within(Part::Companion, || {
            self.companion.event(event);
            for record in written {
                self.companion.record(&record);
            }
        });
        self.idle.store(self.report.is_idle(), Ordering::Relaxed);
        if self.report.take_search_request() {
            self.search.store(true, Ordering::Relaxed);
        }
        flow
    }

    fn batch_done(&mut self) {
        // Once per batch: the answer walks every watch, thousands in a kill storm (one for
        // each victim not known to hold GPU files, where NVML may still list it), and a
        // batch takes a millisecond or two, against teardowns of over 100 ms.
        let period = match self.report.nvml_need() {
            NvmlNeed::Quiet => None,
            NvmlNeed::Await => Some(nvml::AWAIT_PERIOD),
            NvmlNeed::Confirm => Some(nvml::CONFIRM_PERIOD),
            NvmlNeed::Fast => Some(nvml::FAST_PERIOD),
        };
        self.awaited.set_period(period);
        self.report.flush();
    }
}
