//! `linger agent`: the live pipeline for systemd and DaemonSets, with Prometheus metrics on
//! `--metrics-listen` and the incidents as JSON lines in `--state-dir`.

use std::{
    cell::RefCell,
    net::SocketAddr,
    path::PathBuf,
    rc::Rc,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use tracer_user::{
    agent::{
        http,
        metrics::{Build, Metrics, WriteErrors},
        node::{self, Host, HostLabel},
        self_metrics::SelfMetrics,
        web_config::{self, WebConfig},
        FlightOptions, FlightRecorder,
    },
    analysis::Output as Record,
    clock::boottime_ns,
    event::{Event, EventData, Mode, Strategy},
    live::{Companion, Live},
    output::IncidentLog,
    probe::xid,
    source::{gpu::GpuSources, nvml, procfs},
    stream::Tap,
    trace::TraceMeta,
};

use super::{duration, live};

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Options from a TOML file: each key a long option of this command (`metrics_listen =
    /// "0.0.0.0:9477"`, `lean = true`, `gpu_device = ["/dev/x"]`); options given on the
    /// command line win.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where Prometheus scrapes `/metrics` (and `/healthz`). Keep it on localhost unless
    /// `--web-config-file` (or a proxy in front of it) authenticates scrapers (docs/agent.md).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9477")]
    pub metrics_listen: SocketAddr,
    /// TLS and basic auth for the metrics endpoint, in the Prometheus exporter-toolkit's
    /// web-config format (`tls_server_config`, `basic_auth_users` with bcrypt hashes).
    #[arg(long, value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
    /// Connections the metrics endpoint keeps open at most; past it, a new one takes the
    /// place of the one that has waited longest for a request.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub metrics_max_connections: usize,
    /// Directory for the incident log (`incidents.jsonl`, rotated by size); without it
    /// incidents go to stdout as JSON lines.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Rotate the incident log when it would grow past this many bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub log_max_bytes: u64,
    /// Rotated incident logs kept.
    #[arg(long, default_value_t = 4)]
    pub log_keep: usize,
    /// How much of the past the flight recorder keeps in `DIR/flight` (with --state-dir);
    /// an incident that ends with any verdict but `released`, or lingers, gets a trace file
    /// of its window there.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration::parse)]
    pub keep: Duration,
    /// The flight recorder's segments take at most this many bytes (the oldest go first).
    #[arg(long, default_value_t = 256 << 20)]
    pub flight_max_bytes: u64,
    /// No flight recorder.
    #[arg(long)]
    pub no_flight: bool,
    /// The label naming the node (from `NODE_NAME`, else the host's name): dcgm-exporter's
    /// `hostname`, or `Hostname` as its releases before PR #655 named it.
    #[arg(long, value_enum, default_value_t = HostLabelArg::Hostname)]
    pub hostname_label: HostLabelArg,
    #[command(flatten)]
    pub live: live::Args,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum HostLabelArg {
    #[value(name = "hostname")]
    Hostname,
    #[value(name = "Hostname")]
    LegacyHostname,
}

/// NVML readings come every millisecond while memory is awaited; the unattributed figure is
/// worked out at most this often.
const UNATTRIBUTED_EVERY: Duration = Duration::from_millis(200);

pub fn run(mut args: Args) -> anyhow::Result<()> {
    args.live.json = true;
    let web = match &args.web_config_file {
        Some(path) => web_config::load(path).context("--web-config-file")?,
        None => WebConfig::default(),
    };
    let scheme = if web.tls.is_some() { "https" } else { "http" };
    let listener = std::net::TcpListener::bind(args.metrics_listen)
        .with_context(|| format!("listening on {} for metrics", args.metrics_listen))?;
    listener
        .set_nonblocking(true)
        .context("making the metrics listener non-blocking")?;
    let addr = listener.local_addr().unwrap_or(args.metrics_listen);
    // Before the capabilities go: reading the host's name may join PID 1's UTS namespace.
    let node = node::resolve(std::env::var("NODE_NAME").ok().as_deref());
    eprintln!("linger agent: node {:?} ({})", node.name, node.from);
    let host = Host {
        label: match args.hostname_label {
            HostLabelArg::Hostname => HostLabel::Hostname,
            HostLabelArg::LegacyHostname => HostLabel::LegacyHostname,
        },
        name: node.name,
    };
    let writes = WriteErrors::default();
    let reopen = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&reopen))
        .context("handling SIGHUP")?;
    let mut config = live::config(&args.live)?;
    // Incidents and recordings name the node as the series do, not the pod.
    config.node_name = Some(host.name.clone());
    let live = Live::load(config)?;
    let flight = match (&args.state_dir, args.no_flight) {
        (Some(dir), false) => Some(FlightPlan {
            dir: dir.clone(),
            options: FlightOptions {
                keep: args.keep,
                max_bytes: args.flight_max_bytes,
                redact_cmdline: args.live.recording.redact_cmdline,
            },
        }),
        _ => None,
    };
    let mut agent = Agent {
        host: Some(host),
        endpoint: Some((
            listener,
            http::Options {
                max_connections: args.metrics_max_connections,
                web,
            },
        )),
        own: Some(SelfMetrics::new(live.probes().program_fds())),
        writes: writes.clone(),
        metrics: None,
        unattributed_at: None,
        nvml: None,
        nvml_up: Vec::new(),
        flight_plan: flight,
        flight: None,
    };
    let ready = || eprintln!("linger agent: tracing; metrics on {scheme}://{addr}/metrics");
    match &args.state_dir {
        Some(dir) => {
            let mut log =
                IncidentLog::open(dir, args.log_max_bytes, args.log_keep, reopen, writes.log)?;
            eprintln!("linger agent: incidents to {}", log.path().display());
            live.run(ready, &mut log, &mut agent)?;
        }
        None => {
            live.run(ready, &mut std::io::stdout().lock(), &mut agent)?;
        }
    }
    Ok(())
}

struct Agent {
    /// The node the series name, until the metrics take it.
    host: Option<Host>,
    /// The metrics endpoint, until the metrics exist.
    endpoint: Option<(std::net::TcpListener, http::Options)>,
    /// The agent's own cost, served beside the metrics.
    own: Option<SelfMetrics>,
    writes: WriteErrors,
    metrics: Option<Metrics>,
    unattributed_at: Option<Instant>,
    nvml: Option<nvml::Health>,
    /// Each GPU's NVML health as last shown.
    nvml_up: Vec<bool>,
    flight_plan: Option<FlightPlan>,
    /// The stream's tap as well: told of incidents here.
    flight: Option<Rc<RefCell<FlightRecorder>>>,
}

/// Where the flight recorder goes, until the collector starts.
struct FlightPlan {
    dir: PathBuf,
    options: FlightOptions,
}

impl Companion for Agent {
    fn start(&mut self, gpu: &GpuSources, strategy: &Strategy, meta: &TraceMeta) {
        // Where GPU errors come from, and whether they name their process.
        for reason in strategy
            .reasons
            .iter()
            .filter(|r| r.starts_with(xid::REASONS))
        {
            eprintln!("linger agent: {reason}");
        }
        if let Some(plan) = self.flight_plan.take() {
            match FlightRecorder::open(
                &plan.dir,
                plan.options,
                meta.clone(),
                gpu.snapshotter(),
                self.writes.flight.clone(),
                self.writes.flight_dropped.clone(),
            ) {
                Ok(f) => {
                    eprintln!("linger agent: flight recorder in {}", f.dir().display());
                    self.flight = Some(Rc::new(RefCell::new(f)));
                }
                Err(e) => eprintln!("linger agent: no flight recorder: {e:#}"),
            }
        }
        let nvml = gpu.nvml_devices();
        let uname = nix::sys::utsname::uname().ok();
        let of_uname = |f: fn(&nix::sys::utsname::UtsName) -> &std::ffi::OsStr| {
            uname
                .as_ref()
                .map(|u| f(u).to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let build = Build {
            driver: nvml
                .as_ref()
                .map(|(d, _, _)| d.to_string())
                .unwrap_or_default(),
            kernel: of_uname(|u| u.release()),
            strategy: strategy_label(strategy).into(),
        };
        let gpus = nvml
            .as_ref()
            .map(|(_, g, _)| g.to_vec())
            .unwrap_or_default();
        let (metrics, mut registry) = Metrics::new(
            build,
            &gpus,
            self.host.take().unwrap_or_default(),
            self.writes.clone(),
            gpu.cost(),
            procfs::dead_or_invisible,
        );
        self.metrics = Some(metrics);
        if let Some(own) = self.own.take() {
            registry.register_collector(Box::new(own));
        }
        if let Some((listener, options)) = self.endpoint.take() {
            if let Err(e) = http::spawn(listener, Arc::new(registry), options) {
                eprintln!("linger agent: metrics endpoint: {e}");
            }
        }
        self.nvml = nvml.map(|(_, _, h)| h);
    }

    fn tap(&self) -> Option<Rc<RefCell<dyn Tap>>> {
        let f = Rc::clone(self.flight.as_ref()?);
        Some(f)
    }

    fn event(&mut self, e: &Event) {
        let Some(metrics) = self.metrics.as_mut() else {
            return;
        };
        match &e.data {
            EventData::Nvml { gpus } => {
                if self
                    .unattributed_at
                    .is_none_or(|t| t.elapsed() >= UNATTRIBUTED_EVERY)
                {
                    self.unattributed_at = Some(Instant::now());
                    metrics.on_reading(e.ts_ns, gpus);
                }
            }
            EventData::Tick => {
                if let Some(nvml) = &self.nvml {
                    metrics.nvml_errors_total(nvml.errors.load(Ordering::Relaxed));
                    let up: Vec<bool> = nvml.up.iter().map(|u| u.load(Ordering::Relaxed)).collect();
                    // Ticks come every 20 ms: the gauges are set when they change.
                    if up != self.nvml_up {
                        metrics.nvml_up((0..).zip(up.iter().copied()));
                        self.nvml_up = up;
                    }
                }
                metrics.cpu_seconds();
                metrics.on_event(e);
            }
            _ => metrics.on_event(e),
        }
    }

    fn record(&mut self, r: &Record) {
        if let Some(m) = self.metrics.as_mut() {
            m.on_record(r);
        }
        if let (Some(f), Record::Incident(inc)) = (&self.flight, r) {
            f.borrow_mut().incident(inc);
        }
    }

    fn finish(&mut self) {
        if let Some(f) = &self.flight {
            f.borrow_mut().finish(boottime_ns());
        }
    }
}

fn strategy_label(s: &Strategy) -> &'static str {
    match s.mode() {
        Mode::Lean => "lean",
        Mode::Driver => "driver",
        Mode::Libraries => "libraries",
        Mode::Syscalls | Mode::NoDriver => "syscalls",
    }
}
