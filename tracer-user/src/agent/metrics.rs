//! The agent's Prometheus metrics, fed by the live pipeline's records and events.
//!
//! Label names are dcgm-exporter's (`gpu`, `UUID`, `modelName`, `Hostname`, `pod`, `namespace`,
//! `container`), so PromQL joins a linger series with `DCGM_FI_DEV_FB_USED` on them.

use std::{
    collections::{HashMap, VecDeque},
    sync::atomic::AtomicU64,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
        info::Info,
    },
    registry::Registry,
};

use super::lingering::{Lingering, Memory};
use crate::{
    analysis::{gpu_errors, Incident, Output as Record},
    event::{Event, EventData, GpuInfo, LossKind, NvmlGpu, XidSource},
    source::cost::{Cost, Part},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IncidentLabels {
    pub termination: String,
    pub verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TerminationLabels {
    pub termination: String,
}

/// Where lingering memory is and whose it was.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
#[expect(
    non_snake_case,
    reason = "dcgm-exporter's label names, so PromQL joins with its series"
)]
pub struct MemoryLabels {
    pub gpu: String,
    pub UUID: String,
    pub modelName: String,
    pub Hostname: String,
    pub pod: String,
    pub namespace: String,
    pub container: String,
    pub verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
#[expect(
    non_snake_case,
    reason = "dcgm-exporter's label names, so PromQL joins with its series"
)]
pub struct GpuLabels {
    pub gpu: String,
    pub UUID: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
#[expect(
    non_snake_case,
    reason = "dcgm-exporter's label names, so PromQL joins with its series"
)]
pub struct XidLabels {
    pub gpu: String,
    pub UUID: String,
    pub xid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuIndexLabel {
    pub gpu: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WhatLabel {
    pub what: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartLabel {
    pub part: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
    pub driver: String,
    pub kernel: String,
    pub strategy: String,
}

/// Counters of writes that failed, kept by their writers, and of the flight recorder's
/// incident traces deleted for its byte budget.
#[derive(Clone, Default)]
pub struct WriteErrors {
    pub log: Counter,
    pub flight: Counter,
    pub flight_dropped: Counter,
}

/// What the build-info series says about this agent.
pub struct Build {
    pub driver: String,
    pub kernel: String,
    pub strategy: String,
}

/// Release-time buckets in seconds: 10 ms to about 5.8 min, doubling.
fn release_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.01, 2.0, 16)
}

pub struct Metrics {
    incidents: Family<IncidentLabels, Counter>,
    release: Family<TerminationLabels, Histogram>,
    lingering_bytes: Family<MemoryLabels, Gauge>,
    lingering_incidents: Family<MemoryLabels, Gauge>,
    unattributed: Family<GpuLabels, Gauge>,
    collateral: Family<GpuIndexLabel, Counter>,
    gpu_errors: Family<XidLabels, Counter>,
    /// Xids come from the driver's tracepoint: their kernel-log lines are not new errors.
    xid_tracepoint: bool,
    lost: Family<WhatLabel, Counter>,
    nvml_errors: Counter,
    nvml_up: Family<GpuLabels, Gauge>,
    cpu: Family<PartLabel, Counter<f64, AtomicU64>>,
    /// The collector's CPU time by part, and how much of it the counters show already.
    cost: Cost,
    cost_shown: [u64; Part::ALL.len()],
    lingering: Lingering,
    gpus: HashMap<u32, GpuInfo>,
    hostname: String,
    /// The NVML error count last copied into `nvml_errors`.
    nvml_errors_seen: u64,
    /// Whether a pid is gone (or not visible here).
    dead_or_invisible: fn(u32) -> bool,
    /// The latest NVML reading, for the unattributed figure.
    last_reading: Vec<NvmlGpu>,
    /// Groups that died lately, (when, pid) in the order seen: their memory is an incident's
    /// before its first record says so. Pruned from the front, so a kill storm costs O(1) a
    /// death.
    recent_deaths: VecDeque<(u64, u32)>,
}

/// How long a death counts as explained before its incident is reported (the first record
/// comes within 1 s of a death, `slow_after`).
const RECENT_DEATH_NS: u64 = 5_000_000_000;

impl Metrics {
    /// The metrics and the registry to serve them from; `writes` counts the failed writes of
    /// the incident log and the flight recorder.
    pub fn new(
        build: Build,
        gpus: &[GpuInfo],
        hostname: String,
        writes: WriteErrors,
        cost: Cost,
        dead_or_invisible: fn(u32) -> bool,
    ) -> (Self, Registry) {
        let mut registry = Registry::default();
        let incidents = Family::<IncidentLabels, Counter>::default();
        registry.register(
            "linger_incidents",
            "Process deaths linger reported, by termination mode and first verdict",
            incidents.clone(),
        );
        let release = Family::<TerminationLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(release_buckets())) as fn() -> Histogram,
        );
        registry.register(
            "linger_release_duration_seconds",
            "From the fatal signal (or the exit) to the GPU memory back on the device",
            release.clone(),
        );
        let lingering_bytes = Family::<MemoryLabels, Gauge>::default();
        registry.register(
            "linger_gpu_memory_lingering_bytes",
            "GPU memory of dead (or SIGKILLed) processes not back yet, summed over their incidents",
            lingering_bytes.clone(),
        );
        let lingering_incidents = Family::<MemoryLabels, Gauge>::default();
        registry.register(
            "linger_lingering_incidents",
            "Incidents whose GPU memory is not back yet",
            lingering_incidents.clone(),
        );
        let unattributed = Family::<GpuLabels, Gauge>::default();
        registry.register(
            "linger_gpu_memory_unattributed_bytes",
            "GPU memory NVML accounts to pids that are dead or not visible, and that no open \
             incident explains",
            unattributed.clone(),
        );
        let collateral = Family::<GpuIndexLabel, Counter>::default();
        registry.register(
            "linger_collateral_allocations",
            "Allocations the driver refused other processes while a dead process's memory was held",
            collateral.clone(),
        );
        let gpu_errors = Family::<XidLabels, Counter>::default();
        registry.register(
            "linger_gpu_errors",
            "GPU errors (Xids) the NVIDIA driver reported",
            gpu_errors.clone(),
        );
        let lost = Family::<WhatLabel, Counter>::default();
        registry.register(
            "linger_lost_records",
            "What the kernel side could not record (ring buffer full, maps full)",
            lost.clone(),
        );
        let nvml_errors = Counter::default();
        registry.register(
            "linger_nvml_errors",
            "NVML calls that failed",
            nvml_errors.clone(),
        );
        let nvml_up = Family::<GpuLabels, Gauge>::default();
        registry.register(
            "linger_nvml_up",
            "1 when the last NVML reading of the GPU succeeded, 0 when it failed",
            nvml_up.clone(),
        );
        let cpu = Family::<PartLabel, Counter<f64, AtomicU64>>::default();
        registry.register(
            "linger_collector_cpu_seconds",
            "The agent's own CPU time, by part of its work (ring, record, enrich, stacks, \
             analysis, companion, search, nvml, nvml_processes, sampler, housekeeping)",
            cpu.clone(),
        );
        registry.register(
            "linger_log_write_errors",
            "Incident log lines that could not be written (disk full, unwritable)",
            writes.log,
        );
        registry.register(
            "linger_flight_recorder_errors",
            "Flight recorder segments or incident traces that could not be written",
            writes.flight,
        );
        registry.register(
            "linger_flight_recorder_dropped_traces",
            "Incident traces the flight recorder deleted, oldest first, to stay within \
             --flight-max-bytes",
            writes.flight_dropped,
        );
        registry.register(
            "linger_build",
            "The agent's version, the NVIDIA driver, the kernel and how linger traces here",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION").into(),
                driver: build.driver,
                kernel: build.kernel,
                strategy: build.strategy,
            }),
        );
        let metrics = Self {
            incidents,
            release,
            lingering_bytes,
            lingering_incidents,
            unattributed,
            collateral,
            gpu_errors,
            xid_tracepoint: false,
            lost,
            nvml_errors,
            nvml_up,
            cpu,
            cost,
            cost_shown: [0; Part::ALL.len()],
            lingering: Lingering::default(),
            gpus: gpus.iter().map(|g| (g.index, g.clone())).collect(),
            hostname,
            nvml_errors_seen: 0,
            dead_or_invisible,
            last_reading: Vec::new(),
            recent_deaths: VecDeque::new(),
        };
        (metrics, registry)
    }

    /// NVML's count of failed calls so far.
    pub fn nvml_errors_total(&mut self, total: u64) {
        let new = total.saturating_sub(self.nvml_errors_seen);
        if new > 0 {
            self.nvml_errors.inc_by(new);
            self.nvml_errors_seen = total;
        }
    }

    /// Whether each GPU's last NVML reading succeeded, by NVML index.
    pub fn nvml_up(&self, up: impl IntoIterator<Item = (u32, bool)>) {
        for (index, up) in up {
            self.nvml_up
                .get_or_create(&self.gpu_labels(index))
                .set(up.into());
        }
    }

    /// Brings the CPU-time counters up to the collector's cost so far.
    pub fn cpu_seconds(&mut self) {
        for (part, ns) in self.cost.totals() {
            let shown = &mut self.cost_shown[part as usize];
            if ns > *shown {
                self.cpu
                    .get_or_create(&PartLabel {
                        part: part.name().into(),
                    })
                    .inc_by((ns - *shown) as f64 / 1e9);
                *shown = ns;
            }
        }
    }

    /// An event of the stream; NVML readings are for [`Metrics::on_reading`].
    pub fn on_event(&mut self, e: &Event) {
        match &e.data {
            EventData::Loss { count, what } => {
                self.lost
                    .get_or_create(&WhatLabel {
                        what: loss_label(*what).into(),
                    })
                    .inc_by(*count);
            }
            EventData::TaskExit {
                group_dead: true, ..
            } => self.recent_deaths.push_back((e.ts_ns, e.pid)),
            EventData::Tick => self.forget_deaths_before(e.ts_ns),
            EventData::Strategy(st) => self.xid_tracepoint = st.xid_tracepoint,
            // The driver's log line repeats what its tracepoint reported.
            EventData::GpuXid {
                source: XidSource::Kmsg,
                ..
            } if self.xid_tracepoint => {}
            EventData::GpuXid { xid, pci, .. } => {
                let gpu = gpu_errors::device(self.gpus.values(), pci);
                self.gpu_errors
                    .get_or_create(&XidLabels {
                        gpu: gpu_label(gpu.map(|g| g.index)),
                        UUID: gpu.map(|g| g.uuid.clone()).unwrap_or_default(),
                        xid: xid.to_string(),
                    })
                    .inc();
            }
            _ => {}
        }
    }

    fn forget_deaths_before(&mut self, now_ns: u64) {
        while self
            .recent_deaths
            .front()
            .is_some_and(|(t, _)| now_ns.saturating_sub(*t) >= RECENT_DEATH_NS)
        {
            self.recent_deaths.pop_front();
        }
    }

    /// An NVML reading at `ts_ns`: the unattributed figure anew.
    pub fn on_reading(&mut self, ts_ns: u64, gpus: &[NvmlGpu]) {
        self.forget_deaths_before(ts_ns);
        self.last_reading = gpus.to_vec();
        self.unattributed();
    }

    pub fn on_record(&mut self, record: &Record) {
        let Record::Incident(inc) = record else {
            return;
        };
        if inc.record_type == "incident" {
            self.incidents
                .get_or_create(&IncidentLabels {
                    termination: inc.termination.mode.label().into(),
                    verdict: verdict_label(inc),
                })
                .inc();
        }
        let gpus = inc
            .gpu
            .iter()
            .flat_map(|g| std::iter::once(g.index).chain(g.gpus.iter().map(|p| p.index)));
        let labels: Vec<(Option<u32>, MemoryLabels)> =
            gpus.map(|i| (i, self.memory_labels(inc, i))).collect();
        let change = self.lingering.update(inc, |gpu| {
            labels
                .iter()
                .find(|(i, _)| *i == gpu)
                .map(|(_, l)| l.clone())
                .unwrap_or_default()
        });
        if let Some(secs) = change.released_after_s {
            self.release
                .get_or_create(&TerminationLabels {
                    termination: inc.termination.mode.label().into(),
                })
                .observe(secs);
        }
        if change.collateral > 0 {
            self.collateral
                .get_or_create(&GpuIndexLabel {
                    gpu: gpu_label(inc.gpu.as_ref().and_then(|g| g.index)),
                })
                .inc_by(change.collateral);
        }
        let changed = !change.touched.is_empty();
        for labels in change.touched {
            self.refresh(&labels);
        }
        if changed {
            self.unattributed();
        }
    }

    /// Sets (or removes, when no incident has them any more) the series of `labels`.
    fn refresh(&self, labels: &MemoryLabels) {
        match self.lingering.total(labels) {
            Some(Memory { bytes, incidents }) => {
                self.lingering_bytes.get_or_create(labels).set(bytes as i64);
                self.lingering_incidents
                    .get_or_create(labels)
                    .set(incidents as i64);
            }
            None => {
                self.lingering_bytes.remove(labels);
                self.lingering_incidents.remove(labels);
            }
        }
    }

    fn memory_labels(&self, inc: &Incident, index: Option<u32>) -> MemoryLabels {
        let gpu = index.and_then(|i| self.gpus.get(&i));
        let who = inc.target.workload.as_ref();
        MemoryLabels {
            gpu: gpu_label(index),
            UUID: gpu.map(|g| g.uuid.clone()).unwrap_or_default(),
            modelName: gpu.map(|g| g.model.clone()).unwrap_or_default(),
            Hostname: self.hostname.clone(),
            pod: who.and_then(|w| w.pod.clone()).unwrap_or_default(),
            namespace: who.and_then(|w| w.namespace.clone()).unwrap_or_default(),
            container: who.and_then(|w| w.container.clone()).unwrap_or_default(),
            verdict: verdict_label(inc),
        }
    }

    /// Memory NVML accounts to pids that are gone (or not visible here) and that no open
    /// incident (or one about to be reported) counts already: the article's "no such
    /// process" figure, from the latest reading.
    fn unattributed(&self) {
        for g in &self.last_reading {
            let bytes: u64 = g
                .processes
                .iter()
                .filter(|p| {
                    !self.lingering.is_target(p.pid)
                        && !self.recent_deaths.iter().any(|(_, pid)| *pid == p.pid)
                        && (self.dead_or_invisible)(p.pid)
                })
                .filter_map(|p| p.used)
                .sum();
            self.unattributed
                .get_or_create(&self.gpu_labels(g.index))
                .set(bytes as i64);
        }
    }

    fn gpu_labels(&self, index: u32) -> GpuLabels {
        GpuLabels {
            gpu: index.to_string(),
            UUID: self
                .gpus
                .get(&index)
                .map(|i| i.uuid.clone())
                .unwrap_or_default(),
        }
    }
}

fn gpu_label(index: Option<u32>) -> String {
    index.map(|i| i.to_string()).unwrap_or_default()
}

fn verdict_label(inc: &Incident) -> String {
    inc.verdict
        .as_ref()
        .and_then(|v| serde_json::to_value(v.kind).ok())
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_else(|| "none".into())
}

fn loss_label(what: LossKind) -> &'static str {
    match what {
        LossKind::Ring => "ring",
        LossKind::Tracked => "tracked",
        LossKind::Holders => "holders",
        LossKind::Dying => "dying",
        LossKind::Blocked => "blocked",
        LossKind::Helpers => "helpers",
        LossKind::Stacks => "stacks",
        LossKind::FdWalk => "fd_walk",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::NvmlProcess;

    fn metrics() -> Metrics {
        let build = Build {
            driver: String::new(),
            kernel: String::new(),
            strategy: String::new(),
        };
        // Every pid counts as dead here.
        Metrics::new(
            build,
            &[],
            "node".into(),
            WriteErrors::default(),
            Cost::default(),
            |_| true,
        )
        .0
    }

    fn exit(pid: u32, ts_ns: u64) -> Event {
        Event {
            ts_ns,
            cpu: 0,
            pid,
            tid: pid,
            data: EventData::TaskExit {
                exit_code: 9,
                group_dead: true,
                comm: "x".into(),
            },
        }
    }

    fn reading(pid: u32) -> Vec<NvmlGpu> {
        vec![NvmlGpu {
            index: 0,
            used: 2 << 30,
            total: 80 << 30,
            processes: vec![NvmlProcess {
                pid,
                used: Some(1 << 30),
            }],
        }]
    }

    fn unattributed(m: &Metrics) -> i64 {
        let labels = GpuLabels {
            gpu: "0".into(),
            UUID: String::new(),
        };
        m.unattributed.get(&labels).map_or(-1, |g| g.get())
    }

    #[test]
    fn a_fresh_death_is_not_unattributed_and_old_deaths_are_forgotten() {
        let mut m = metrics();
        for pid in 0..100_000 {
            m.on_event(&exit(pid, 1_000));
        }
        m.on_reading(2_000, &reading(7));
        assert_eq!(unattributed(&m), 0, "its incident is on its way");
        let tick = Event::collector(RECENT_DEATH_NS + 1_000, EventData::Tick);
        m.on_event(&tick);
        assert!(
            m.recent_deaths.is_empty(),
            "a storm's deaths do not pile up"
        );
        m.on_reading(RECENT_DEATH_NS + 2_000, &reading(7));
        assert_eq!(unattributed(&m), 1 << 30, "nobody explains it any more");
    }

    #[test]
    fn nvml_up_says_whether_each_gpus_last_reading_succeeded() {
        let m = metrics();
        let up = |gpu: &str| {
            let labels = GpuLabels {
                gpu: gpu.into(),
                UUID: String::new(),
            };
            m.nvml_up.get(&labels).map(|g| g.get())
        };
        m.nvml_up([(0, true), (1, false)]);
        assert_eq!((up("0"), up("1")), (Some(1), Some(0)));
        m.nvml_up([(0, false), (1, true)]);
        assert_eq!((up("0"), up("1")), (Some(0), Some(1)));
    }

    #[test]
    fn every_xid_counts_once_with_the_gpu_nvml_names_at_its_bus() {
        let gpus = [GpuInfo {
            index: 3,
            uuid: "GPU-x".into(),
            model: "H200".into(),
            pci_bus_id: "00000000:3B:00.0".into(),
            minor: Some(0),
        }];
        let build = Build {
            driver: String::new(),
            kernel: String::new(),
            strategy: String::new(),
        };
        let mut m = Metrics::new(
            build,
            &gpus,
            "n".into(),
            WriteErrors::default(),
            Cost::default(),
            |_| true,
        )
        .0;
        let xid = |pci: &str, source| {
            Event::collector(
                1,
                EventData::GpuXid {
                    xid: 31,
                    pci: pci.into(),
                    message: String::new(),
                    truncated: false,
                    source,
                },
            )
        };
        let strategy = crate::event::Strategy {
            xid_tracepoint: true,
            ..Default::default()
        };
        m.on_event(&Event::collector(0, EventData::Strategy(strategy)));
        for _ in 0..2 {
            m.on_event(&xid("0000:3b:00.0", XidSource::Tracepoint));
            // Its log line.
            m.on_event(&xid("0000:3b:00", XidSource::Kmsg));
        }
        m.on_event(&xid("0000:99:00.0", XidSource::Tracepoint));
        let count = |gpu: &str, uuid: &str| {
            let labels = XidLabels {
                gpu: gpu.into(),
                UUID: uuid.into(),
                xid: "31".into(),
            };
            m.gpu_errors.get(&labels).map_or(0, |c| c.get())
        };
        assert_eq!(count("3", "GPU-x"), 2);
        assert_eq!(count("", ""), 1, "a device NVML does not list");
    }
}
