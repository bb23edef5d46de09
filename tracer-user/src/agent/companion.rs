//! The agent beside the live pipeline: its metrics, their endpoint, the flight recorder and
//! its own cost, started once the collector knows the GPUs and its strategy, then told of
//! every event and record.

use std::{
    cell::RefCell,
    path::PathBuf,
    rc::Rc,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use super::{
    http,
    metrics::{Build, Metrics, WriteErrors},
    node::Host,
    self_metrics::SelfMetrics,
    FlightOptions, FlightRecorder,
};
use crate::{
    analysis::Output as Record,
    clock::boottime_ns,
    event::{Event, EventData, Mode, Strategy},
    live::Companion,
    probe::xid,
    source::{gpu::GpuSources, nvml, procfs},
    stream::Tap,
    trace::TraceMeta,
};

/// NVML readings come every millisecond while memory is awaited; the unattributed figure is
/// worked out at most this often.
const UNATTRIBUTED_EVERY: Duration = Duration::from_millis(200);

pub struct Agent {
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

impl Agent {
    /// An agent serving `host`'s series on `endpoint`, with its own cost (`own`), counting
    /// failed writes in `writes`, and a flight recorder where `flight_plan` says.
    pub fn new(
        host: Host,
        endpoint: (std::net::TcpListener, http::Options),
        own: SelfMetrics,
        writes: WriteErrors,
        flight_plan: Option<FlightPlan>,
    ) -> Self {
        Self {
            host: Some(host),
            endpoint: Some(endpoint),
            own: Some(own),
            writes,
            metrics: None,
            unattributed_at: None,
            nvml: None,
            nvml_up: Vec::new(),
            flight_plan,
            flight: None,
        }
    }
}

/// Where the flight recorder goes, until the collector starts.
pub struct FlightPlan {
    pub dir: PathBuf,
    pub options: FlightOptions,
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
