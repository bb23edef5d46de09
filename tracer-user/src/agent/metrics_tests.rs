//! Tests of the agent's metrics (`metrics.rs`).
use super::*;
use crate::{
    agent::node::HostLabel,
    event::{NvmlProcess, Workload},
};

/// Metrics of `gpus` on `host`, every pid counting as dead.
fn metrics_of(gpus: &[GpuInfo], host: Host) -> (Metrics, Registry) {
    let build = Build {
        driver: String::new(),
        kernel: String::new(),
        strategy: String::new(),
    };
    Metrics::new(
        build,
        gpus,
        host,
        WriteErrors::default(),
        Cost::default(),
        |_| true,
    )
}

fn metrics() -> Metrics {
    metrics_of(&[], Host::default()).0
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
        utilization: None,
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
    let labels = m.gpu_labels(Some(0));
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
fn a_gpu_nvml_failed_to_read_keeps_its_unattributed_figure() {
    let mut m = metrics();
    let tick = Event::collector(RECENT_DEATH_NS + 1_000, EventData::Tick);
    m.on_event(&tick);
    m.on_reading(RECENT_DEATH_NS + 2_000, &reading(7));
    assert_eq!(unattributed(&m), 1 << 30);
    // NVML failed on GPU 0: the reading leaves it out (source/nvml.rs), never empty.
    for t in 0..3 {
        m.on_reading(RECENT_DEATH_NS + 3_000 + t, &[]);
        assert_eq!(unattributed(&m), 1 << 30, "a failed reading is no reading");
    }
    m.on_reading(RECENT_DEATH_NS + 9_000, &reading(8));
    assert_eq!(unattributed(&m), 1 << 30, "NVML back: its own figure");
}

#[test]
fn nvml_up_says_whether_each_gpus_last_reading_succeeded() {
    let m = metrics();
    let up = |gpu: u32| m.nvml_up.get(&m.gpu_labels(Some(gpu))).map(|g| g.get());
    m.nvml_up([(0, true), (1, false)]);
    assert_eq!((up(0), up(1)), (Some(1), Some(0)));
    m.nvml_up([(0, false), (1, true)]);
    assert_eq!((up(0), up(1)), (Some(0), Some(1)));
}

fn h200_metrics(host: Host) -> (Metrics, Registry) {
    let gpus = [GpuInfo {
        index: 3,
        uuid: "GPU-x".into(),
        model: "NVIDIA H200".into(),
        pci_bus_id: "00000000:3B:00.0".into(),
        minor: Some(5),
    }];
    metrics_of(&gpus, host)
}

fn xid(pci: &str, source: XidSource) -> Event {
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
}

fn text(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("encoded");
    out
}

#[test]
fn every_xid_counts_once_with_the_gpu_nvml_names_at_its_bus() {
    let (mut m, _) = h200_metrics(Host::default());
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
    let count = |gpu: Option<u32>| {
        let labels = XidLabels {
            gpu: m.gpu_labels(gpu),
            xid: "31".into(),
            action: "RESTART_APP".into(),
        };
        m.gpu_errors.get(&labels).map_or(0, |c| c.get())
    };
    assert_eq!(count(Some(3)), 2);
    assert_eq!(count(None), 1, "a device NVML does not list");
}

#[test]
fn gpu_series_carry_dcgm_exporters_identity_labels_and_the_chosen_host_label() {
    let host = |label| Host {
        label,
        name: "n1".into(),
    };
    let (mut m, registry) = h200_metrics(host(HostLabel::Hostname));
    m.on_event(&xid("0000:3b:00.0", XidSource::Tracepoint));
    m.on_reading(
        1,
        &[NvmlGpu {
            utilization: None,
            index: 3,
            ..reading(7)[0].clone()
        }],
    );
    let identity = "gpu=\"3\",UUID=\"GPU-x\",modelName=\"NVIDIA H200\",\
                    pci_bus_id=\"00000000:3B:00.0\",device=\"nvidia5\",hostname=\"n1\"";
    let out = text(&registry);
    for series in [
        format!("linger_gpu_errors_total{{{identity},xid=\"31\",action=\"RESTART_APP\"}} 1"),
        format!("linger_gpu_memory_unattributed_bytes{{{identity}}} 1073741824"),
    ] {
        assert!(out.contains(&series), "{series} in\n{out}");
    }
    assert!(out.contains("linger_build_info{hostname=\"n1\","), "{out}");

    let (mut m, registry) = h200_metrics(host(HostLabel::LegacyHostname));
    m.on_event(&xid("0000:3b:00.0", XidSource::Tracepoint));
    let out = text(&registry);
    assert!(
        out.contains("device=\"nvidia5\",Hostname=\"n1\",xid="),
        "{out}"
    );
    assert!(!out.contains("hostname="), "{out}");
}

#[test]
fn workload_labels_name_the_pod_uid_and_the_slurm_job() {
    let w = Workload {
        pod_uid: Some("0b4f".into()),
        slurm_job: Some(4242),
        ..Default::default()
    };
    let labels = WorkloadLabels::of(Some(&w));
    assert_eq!(
        (labels.pod_uid.as_str(), labels.hpc_job.as_str()),
        ("0b4f", "4242")
    );
    assert_eq!(WorkloadLabels::of(None), WorkloadLabels::default());
}

/// An open incident on GPU 0 holding `share` bytes, or, with 0, a death whose memory its
/// live owners hold.
fn holding(id: u64, pid: u32, share: u64) -> Record {
    let target = crate::analysis::incident::Target {
        pid,
        comm: "python3".into(),
        threads: 1,
        workload: None,
    };
    let mut inc = Incident::new(id, target, 1_000_000_000);
    inc.gpu = Some(crate::analysis::incident::GpuImpact {
        index: Some(0),
        share_bytes: share,
        share_from: if share == 0 {
            crate::analysis::incident::HELD_BY_OWNERS
        } else {
            "nvml"
        },
        ..Default::default()
    });
    Record::Incident(Box::new(inc))
}

/// The incidents' shares are estimates: two of 60 GiB on an 80 GiB GPU whose used memory
/// NVML reads at 70 GiB are a double count or an estimate too high. The gauge says what the
/// incidents hold (120 GiB), the excess (50 GiB) is a gauge of its own and, once that lasts 10 s
/// (longer than NVML leads linger's confirmations under churn), the log names both incidents;
/// an incident with no memory of its own (a child whose live parent holds the files)
/// counts in neither series. Once NVML reads more in use, nothing is overclaimed.
#[test]
fn incidents_holding_more_than_the_gpu_uses_are_named_not_scaled() {
    const GIB: u64 = 1 << 30;
    let (mut m, registry) = h200_metrics(Host::default());
    let mut read = reading(1);
    read[0].used = 70 * GIB;
    m.on_reading(1, &read);
    m.on_record(&holding(1, 10, 60 * GIB));
    m.on_record(&holding(2, 11, 60 * GIB));
    m.on_record(&holding(3, 12, 0));
    let series = |name: &str| -> f64 {
        text(&registry)
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(
        series("linger_gpu_memory_lingering_bytes{"),
        (120 * GIB) as f64
    );
    assert_eq!(series("linger_lingering_incidents{"), 2.0);
    assert_eq!(
        series("linger_gpu_memory_overclaimed_bytes{"),
        (50 * GIB) as f64
    );
    let overclaim = |m: &Metrics| {
        let o = &m.overclaims["0"];
        (o.named.clone(), o.logged)
    };
    assert_eq!(overclaim(&m), (vec![1, 2], false));
    // The confirmation lag is not logged; the same incidents 10 s on are.
    m.on_reading(9_000_000_000, &read);
    assert_eq!(overclaim(&m), (vec![1, 2], false));
    m.on_reading(11_000_000_000, &read);
    assert_eq!(overclaim(&m), (vec![1, 2], true));
    read[0].used = 200 * GIB;
    m.on_reading(12_000_000_000, &read);
    assert_eq!(
        series("linger_gpu_memory_lingering_bytes{"),
        (120 * GIB) as f64
    );
    assert_eq!(series("linger_gpu_memory_overclaimed_bytes{"), 0.0);
    assert_eq!(overclaim(&m), (vec![], false));
}
