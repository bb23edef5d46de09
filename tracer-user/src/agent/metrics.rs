//! The agent's Prometheus metrics, fed by the live pipeline's records and events.
//!
//! Label names are dcgm-exporter's: every GPU-scoped series carries its identity labels (`gpu`,
//! `UUID`, `modelName`, `pci_bus_id`, `device`, `hostname`), and the memory series its workload
//! labels (`pod`, `namespace`, `container`, `pod_uid`, `hpc_job`), so PromQL joins a linger
//! series with `DCGM_FI_DEV_FB_USED` on `UUID`.

use std::{
    collections::{HashMap, VecDeque},
    sync::atomic::AtomicU64,
};

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
        info::Info,
    },
    registry::{Metric, Registry},
};

use super::labels::{
    BuildLabels, GpuLabels, IncidentLabels, MemoryLabels, PartLabel, TerminationLabels, WhatLabel,
    WorkloadLabels, XidLabels,
};
use super::{
    lingering::{Change, Lingering, Memory},
    node::Host,
};
use crate::{
    analysis::{gpu_errors, unheld::UnheldRecord, xid_catalog, Incident, Output as Record},
    event::{Event, EventData, GpuInfo, LossKind, NvmlGpu, XidSource},
    source::cost::{Cost, Part},
};

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

/// Registers `metric` under `name` and hands it back, for the metrics to update.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// The counters of failed writes, which their writers keep.
fn register_writes(registry: &mut Registry, writes: WriteErrors) {
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
}

/// The releases' times: in the histogram where the moment is known to 2 ms, else counted.
struct Releases {
    known: Family<TerminationLabels, Histogram>,
    bounded: Family<TerminationLabels, Counter>,
}

impl Releases {
    fn registered(r: &mut Registry) -> Self {
        Self {
            known: registered(
                r,
                "linger_release_duration_seconds",
                "From the fatal signal (or the exit) to the GPU memory back on the device",
                Family::new_with_constructor(
                    (|| Histogram::new(release_buckets())) as fn() -> Histogram,
                ),
            ),
            bounded: registered(
                r,
                "linger_release_bounded",
                "Releases whose moment linger knows only as a bound, not to 2 ms (a zombie \
                 transition, a final switch, an NVML reading): not in the release histogram",
                Family::default(),
            ),
        }
    }

    /// What `inc`'s record changed of its release, once.
    fn observe(&self, inc: &Incident, change: &Change) {
        let termination = TerminationLabels {
            termination: inc.termination.mode.label().into(),
        };
        if let Some(secs) = change.released_after_s {
            self.known.get_or_create(&termination).observe(secs);
        }
        if change.release_bounded {
            self.bounded.get_or_create(&termination).inc();
        }
    }
}

/// How long the same incidents must hold more than the GPU uses before a log line names them:
/// under churn NVML reads memory back a second or two before linger confirms an incident's
/// release, which the gauge shows meanwhile and no operator needs told.
const OVERCLAIM_LOGGED_AFTER_NS: u64 = 10_000_000_000;

/// The incidents holding more than a GPU uses, since when, and whether a line named them.
#[derive(Default)]
struct Overclaim {
    named: Vec<u64>,
    since_ns: u64,
    logged: bool,
}

/// GPUs busy with nobody: memory nobody holds, and work with no memory and no process.
struct UnownedGpus {
    no_holder: Family<GpuLabels, Gauge>,
    no_work: Family<GpuLabels, Gauge>,
}

impl UnownedGpus {
    fn registered(r: &mut Registry) -> Self {
        Self {
            no_holder: registered(
                r,
                "linger_gpu_busy_no_holder_bytes",
                "GPU memory in use for a minute or more that NVML lists no process for and no \
                 process seen here holds the GPU's files of (its `busy_no_holder` record says \
                 whether processes in other PID namespaces could, or a holder was maybe missed)",
                Family::default(),
            ),
            no_work: registered(
                r,
                "linger_gpu_utilized_without_work_percent",
                "Utilization of a GPU with no memory in use and no process for a minute or \
                 more: work a killed context left running (its `utilized_without_work` record \
                 says what clears it); 0 once it stops",
                Family::default(),
            ),
        }
    }

    fn observe(&self, u: &UnheldRecord, gpu: GpuLabels) {
        if u.head.record_type == "utilized_without_work" {
            let pct = if u.cleared {
                0
            } else {
                u.utilization_pct.unwrap_or_default()
            };
            self.no_work.get_or_create(&gpu).set(i64::from(pct));
        } else {
            let bytes = if u.cleared { 0 } else { u.used_bytes as i64 };
            self.no_holder.get_or_create(&gpu).set(bytes);
        }
    }
}

pub struct Metrics {
    incidents: Family<IncidentLabels, Counter>,
    releases: Releases,
    lingering_bytes: Family<MemoryLabels, Gauge>,
    lingering_incidents: Family<MemoryLabels, Gauge>,
    overclaimed: Family<GpuLabels, Gauge>,
    /// Per GPU, the incidents holding more than it uses now, and since when (none: empty).
    overclaims: HashMap<String, Overclaim>,
    /// The latest NVML reading's time.
    reading_ns: u64,
    unattributed: Family<GpuLabels, Gauge>,
    collateral: Family<GpuLabels, Counter>,
    gpu_errors: Family<XidLabels, Counter>,
    stuck_threads: Gauge,
    unowned: UnownedGpus,
    /// Xids come from the driver's tracepoint: their kernel-log lines are not new errors.
    xid_tracepoint: bool,
    lost: Family<WhatLabel, Counter>,
    nvml_errors: Counter,
    nvml_up: Family<GpuLabels, Gauge>,
    cpu: Family<PartLabel, Counter<f64, AtomicU64>>,
    /// The collector's CPU time by part, and how much of it the counters show already.
    cost: Cost,
    cost_shown: [u64; Part::ALL.len()],
    /// Each part's series once it has one: brought up to date every tick, looked up once.
    cpu_series: [Option<Counter<f64, AtomicU64>>; Part::ALL.len()],
    lingering: Lingering,
    gpus: HashMap<u32, GpuInfo>,
    host: Host,
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
        host: Host,
        writes: WriteErrors,
        cost: Cost,
        dead_or_invisible: fn(u32) -> bool,
    ) -> (Self, Registry) {
        let mut registry = Registry::default();
        let r = &mut registry;
        let metrics = Self {
            incidents: registered(
                r,
                "linger_incidents",
                "Process deaths linger reported, by termination mode and first verdict",
                Family::default(),
            ),
            releases: Releases::registered(r),
            lingering_bytes: registered(
                r,
                "linger_gpu_memory_lingering_bytes",
                "GPU memory of dead (or SIGKILLed) processes not back yet, summed over their \
                 incidents",
                Family::default(),
            ),
            lingering_incidents: registered(
                r,
                "linger_lingering_incidents",
                "Incidents whose GPU memory is not back yet",
                Family::default(),
            ),
            overclaimed: registered(
                r,
                "linger_gpu_memory_overclaimed_bytes",
                "GPU memory the open incidents hold beyond the device's used memory by NVML's \
                 latest reading: a double count or a share estimated too high (the log names \
                 the incidents)",
                Family::default(),
            ),
            overclaims: HashMap::new(),
            reading_ns: 0,
            unattributed: registered(
                r,
                "linger_gpu_memory_unattributed_bytes",
                "GPU memory NVML accounts to pids that are dead or not visible, and that no open \
                 incident explains",
                Family::default(),
            ),
            collateral: registered(
                r,
                "linger_collateral_allocations",
                "Allocations the driver refused other processes while a dead process's memory \
                 was held",
                Family::default(),
            ),
            gpu_errors: registered(
                r,
                "linger_gpu_errors",
                "GPU errors (Xids) the NVIDIA driver reported",
                Family::default(),
            ),
            stuck_threads: registered(
                r,
                "linger_stuck_threads",
                "Threads of GPU processes asleep uninterruptibly in the NVIDIA driver past \
                 --stuck-after (their `stuck` records say where)",
                Gauge::default(),
            ),
            unowned: UnownedGpus::registered(r),
            xid_tracepoint: false,
            lost: registered(
                r,
                "linger_lost_records",
                "What the kernel side could not record (ring buffer full, maps full)",
                Family::default(),
            ),
            nvml_errors: registered(
                r,
                "linger_nvml_errors",
                "NVML calls that failed",
                Counter::default(),
            ),
            nvml_up: registered(
                r,
                "linger_nvml_up",
                "1 when the last NVML reading of the GPU succeeded, 0 when it failed",
                Family::default(),
            ),
            cpu: registered(
                r,
                "linger_collector_cpu_seconds",
                "The agent's own CPU time, by part of its work (ring, record, enrich, stacks, \
                 analysis, companion, search, nvml, nvml_processes, sampler, housekeeping)",
                Family::default(),
            ),
            cost,
            cost_shown: [0; Part::ALL.len()],
            cpu_series: Default::default(),
            lingering: Lingering::default(),
            gpus: gpus.iter().map(|g| (g.index, g.clone())).collect(),
            host: host.clone(),
            nvml_errors_seen: 0,
            dead_or_invisible,
            last_reading: Vec::new(),
            recent_deaths: VecDeque::new(),
        };
        register_writes(r, writes);
        r.register(
            "linger_build",
            "The agent's version, the NVIDIA driver, the kernel and how linger traces here",
            Info::new(BuildLabels {
                host,
                version: env!("CARGO_PKG_VERSION").into(),
                driver: build.driver,
                kernel: build.kernel,
                strategy: build.strategy,
            }),
        );
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
                .get_or_create(&self.gpu_labels(Some(index)))
                .set(up.into());
        }
    }

    /// Brings the CPU-time counters up to the collector's cost so far.
    pub fn cpu_seconds(&mut self) {
        for (part, ns) in self.cost.totals() {
            let shown = &mut self.cost_shown[part as usize];
            if ns > *shown {
                let cpu = &self.cpu;
                self.cpu_series[part as usize]
                    .get_or_insert_with(|| {
                        cpu.get_or_create(&PartLabel {
                            part: part.name().into(),
                        })
                        .clone()
                    })
                    .inc_by((ns - *shown) as f64 / 1e9);
                *shown = ns;
            }
        }
    }

    /// An event of the stream; NVML readings are for [`Metrics::on_reading`].
    pub fn on_event(&mut self, e: &Event) {
        match &e.data {
            EventData::Loss { count, what, .. } => {
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
            EventData::GpuXid {
                xid, pci, message, ..
            } => {
                let gpu = gpu_errors::device(self.gpus.values(), pci).map(|g| g.index);
                self.gpu_errors
                    .get_or_create(&XidLabels {
                        gpu: self.gpu_labels(gpu),
                        xid: xid.to_string(),
                        action: xid_catalog::action(*xid, message)
                            .unwrap_or_default()
                            .to_string(),
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
        self.reading_ns = ts_ns;
        self.unattributed();
        for g in gpus {
            self.refresh_gpu(&g.index.to_string());
        }
    }

    pub fn on_record(&mut self, record: &Record) {
        match record {
            Record::Stuck(stuck) if stuck.cleared => {
                self.stuck_threads.dec();
            }
            Record::Stuck(_) => {
                self.stuck_threads.inc();
            }
            Record::Unheld(u) => self.unowned.observe(u, self.gpu_labels(Some(u.gpu))),
            _ => {}
        }
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
        self.releases.observe(inc, &change);
        if change.collateral > 0 {
            self.collateral
                .get_or_create(&self.gpu_labels(inc.gpu.as_ref().and_then(|g| g.index)))
                .inc_by(change.collateral);
        }
        let changed = !change.touched.is_empty();
        let mut gpus: Vec<String> = change.touched.iter().map(|l| l.gpu.gpu.clone()).collect();
        gpus.sort();
        gpus.dedup();
        for labels in change.touched {
            self.refresh(&labels);
        }
        for gpu in gpus {
            self.refresh_gpu(&gpu);
        }
        if changed {
            self.unattributed();
        }
    }

    /// The lingering series of GPU `gpu` (its index label), as its incidents hold them. The
    /// shares are estimates (a ledger's, a figure NVML gave before the death): where they add up
    /// to more than the device's used memory by NVML's latest reading (a double count, or an
    /// estimate too high), the excess is a gauge of its own and a log line names the incidents.
    fn refresh_gpu(&mut self, gpu: &str) {
        for l in &self.lingering.labels_on(gpu) {
            self.refresh(l);
        }
        let claims = self.lingering.claims_on(gpu);
        let held: u64 = claims.iter().map(|(_, _, bytes)| bytes).sum();
        let used = self
            .last_reading
            .iter()
            .find(|g| g.index.to_string() == gpu)
            .map(|g| g.used);
        let excess = used.map_or(0, |used| held.saturating_sub(used));
        let labels = self.gpu_labels(gpu.parse().ok());
        self.overclaimed.get_or_create(&labels).set(excess as i64);
        let named: Vec<u64> = claims.iter().map(|(id, _, _)| *id).collect();
        let named = if excess > 0 { named } else { Vec::new() };
        let now = self.reading_ns;
        let o = self.overclaims.entry(gpu.to_string()).or_default();
        if o.named != named {
            *o = Overclaim {
                named,
                since_ns: now,
                logged: false,
            };
        }
        // The same incidents past the confirmation lag: worth a line, once.
        let lasting = now.saturating_sub(o.since_ns) >= OVERCLAIM_LOGGED_AFTER_NS;
        if o.logged || o.named.is_empty() || !lasting {
            return;
        }
        o.logged = true;
        let who: Vec<String> = claims
            .iter()
            .map(|(id, pid, bytes)| format!("incident {id} (pid {pid}) {bytes}"))
            .collect();
        log::warn!(
            "GPU {gpu}: for {:.0} s open incidents have held more than the GPU uses ({held} \
             bytes, {excess} more than the {} NVML reads in use): a double count, or a share \
             estimated too high: {} (linger_gpu_memory_overclaimed_bytes)",
            (now - o.since_ns) as f64 / 1e9,
            used.unwrap_or_default(),
            who.join(", ")
        );
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
        MemoryLabels {
            gpu: self.gpu_labels(index),
            workload: WorkloadLabels::of(inc.target.workload.as_ref()),
            verdict: verdict_label(inc),
        }
    }

    /// The identity labels of GPU `index` (empty but the host where NVML does not list it).
    fn gpu_labels(&self, index: Option<u32>) -> GpuLabels {
        let gpu = index.and_then(|i| self.gpus.get(&i));
        let of = |f: fn(&GpuInfo) -> String| gpu.map(f).unwrap_or_default();
        GpuLabels {
            gpu: gpu_label(index),
            UUID: of(|g| g.uuid.clone()),
            modelName: of(|g| g.model.clone()),
            pci_bus_id: of(|g| g.pci_bus_id.clone()),
            device: of(|g| g.minor.map(|m| format!("nvidia{m}")).unwrap_or_default()),
            host: self.host.clone(),
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
            let labels = self.gpu_labels(Some(g.index));
            self.unattributed.get_or_create(&labels).set(bytes as i64);
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
        LossKind::Calls => "calls",
        LossKind::AsleepStacks => "asleep_stacks",
        LossKind::Asleep => "asleep",
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
