//! Tests of the flight recorder (`flight.rs`).
use std::{
    cell::Cell,
    ops::ControlFlow,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::PathBuf,
    rc::Rc,
    time::Duration,
};

use super::*;
use crate::{
    analysis::{
        incident::Target,
        verdict::{Verdict, VerdictKind},
    },
    source::replay::Replay,
};

const S: u64 = 1_000_000_000;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn state_dir(name: &str) -> Dir {
    let dir = std::env::temp_dir().join(format!("linger-flight-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir(&dir).expect("state dir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).expect("chmod");
    Dir(dir)
}

/// A recorder whose segments last 10 s (the least), with `max_bytes` for its files.
fn recorder(dir: &Path, max_bytes: u64) -> (FlightRecorder, Counter) {
    let dropped = Counter::default();
    let options = FlightOptions {
        keep: Duration::from_secs(60),
        max_bytes,
        redact_cmdline: true,
    };
    let f = FlightRecorder::open(
        dir,
        options,
        TraceMeta::default(),
        Box::new(Vec::new),
        Counter::default(),
        dropped.clone(),
    )
    .expect("flight recorder");
    (f, dropped)
}

fn tick(t: u64) -> Event {
    Event::collector(t, EventData::Tick)
}

fn held(id: u64, pid: u32, t_ns: u64) -> Incident {
    let target = Target {
        pid,
        comm: "job".into(),
        threads: 1,
        workload: None,
    };
    let mut inc = Incident::new(id, target, t_ns);
    inc.settled = true;
    inc.verdict = Some(Verdict {
        kind: VerdictKind::SharedFd,
        evidence: Vec::new(),
        hint: String::new(),
    });
    inc
}

fn ticks(text: &Path) -> Vec<u64> {
    let mut replay = Replay::open(text).expect("replay");
    let mut out = Vec::new();
    replay
        .run(
            |e| {
                if matches!(e.data, EventData::Tick) {
                    out.push(e.ts_ns);
                }
                ControlFlow::Continue(())
            },
            |_| {},
        )
        .expect("replay runs");
    out
}

#[test]
fn incidents_of_one_window_share_a_trace_of_every_segment_since_their_signal() {
    let dir = state_dir("share");
    let (mut f, _) = recorder(&dir.0, u64::MAX);
    f.event(&Event::collector(
        S,
        EventData::Collector {
            pid: 1,
            partial_pid_view: false,
        },
    ));
    let mut fed = Vec::new();
    let mut t = S;
    while t < 36 * S {
        if t == 33 * S {
            f.incident(&held(1, 100, 5 * S));
            f.incident(&held(2, 200, 25 * S));
        }
        f.event(&tick(t));
        fed.push(t);
        t += S / 10;
    }
    f.finish(t);
    let one = dir.0.join("flight/incident-1-100.trace");
    let two = dir.0.join("flight/incident-2-200.trace");
    let ino = |p: &Path| fs::metadata(p).expect("the incident's trace").ino();
    assert_eq!(ino(&one), ino(&two), "one file, two names");
    // From the segment its signal fell in (the first, at 1 s) to the one it was reported
    // in, each event once: the later segments' checkpoints are left out.
    assert_eq!(ticks(&one), fed);
}

#[test]
fn segments_closed_for_waiting_incidents_take_a_checkpoint_every_ten_seconds() {
    let dir = state_dir("continue");
    let scans = Rc::new(Cell::new(0));
    let counted = Rc::clone(&scans);
    let options = FlightOptions {
        keep: Duration::from_secs(600),
        max_bytes: u64::MAX,
        redact_cmdline: true,
    };
    let snapshot: Snapshot = Box::new(move || {
        counted.set(counted.get() + 1);
        Vec::new()
    });
    let (errors, dropped) = (Counter::default(), Counter::default());
    let mut f = FlightRecorder::open(
        &dir.0,
        options,
        TraceMeta::default(),
        snapshot,
        errors.clone(),
        dropped,
    )
    .expect("flight recorder");
    f.event(&Event::collector(
        S,
        EventData::Collector {
            pid: 1,
            partial_pid_view: false,
        },
    ));
    // An incident waits every second, so segments close every 5 s, over 40 s.
    let mut fed = Vec::new();
    let mut t = S;
    let mut id = 0;
    while t < 41 * S {
        if t.is_multiple_of(S) {
            id += 1;
            f.incident(&held(id, 100 + id as u32, t));
        }
        f.event(&tick(t));
        fed.push(t);
        t += S / 10;
    }
    f.finish(t);
    assert_eq!(errors.get(), 0);
    // Checkpoints at 1, 11, 21, 31 s; the segments at 6, 16, 26, 36 s continue them.
    assert_eq!(scans.get(), 4);
    // The incidents of 17-21 s wait for the segment of 16 s, which continues the one of
    // 11 s: their trace has the stream from that checkpoint to 21 s, each event once.
    let at_18 = dir.0.join("flight/incident-18-118.trace");
    let window: Vec<u64> = fed
        .iter()
        .copied()
        .filter(|t| (11 * S..21 * S).contains(t))
        .collect();
    assert_eq!(ticks(&at_18), window);
}

#[test]
fn incident_traces_count_in_the_byte_budget_and_the_oldest_go_first() {
    let dir = state_dir("budget");
    let (mut f, dropped) = recorder(&dir.0, 40_000);
    f.event(&Event::collector(
        S,
        EventData::Collector {
            pid: 1,
            partial_pid_view: false,
        },
    ));
    let nvml = |t| {
        Event::collector(
            t,
            EventData::Nvml {
                gpus: vec![crate::event::NvmlGpu {
                    utilization: None,
                    index: 0,
                    used: t,
                    total: 1 << 40,
                    processes: Vec::new(),
                }],
            },
        )
    };
    let mut t = S;
    let mut id = 0;
    while t < 120 * S {
        if t.is_multiple_of(10 * S) {
            id += 1;
            f.incident(&held(id, 100 + id as u32, t - S));
        }
        f.event(&nvml(t));
        f.event(&tick(t));
        t += S / 100;
    }
    let flight = dir.0.join("flight");
    let names: Vec<String> = fs::read_dir(&flight)
        .expect("flight dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let sizes: Vec<(String, u64)> = fs::read_dir(&flight)
        .expect("flight dir")
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, e.metadata().expect("size").len())
        })
        .collect();
    // The segment being written (the newest) counts once it closes.
    let newest = sizes
        .iter()
        .filter(|(n, _)| n.starts_with("segment-"))
        .max_by_key(|(n, _)| n.clone());
    let bytes = sizes.iter().map(|(_, b)| b).sum::<u64>() - newest.map_or(0, |(_, b)| *b);
    assert!(dropped.get() > 0, "{names:?}");
    assert!(
        !names.iter().any(|n| n == "incident-1-101.trace"),
        "{names:?}"
    );
    assert!(
        names
            .iter()
            .any(|n| n == &format!("incident-{}-{}.trace", id - 1, 100 + id - 1)),
        "the newest traces are kept: {names:?}"
    );
    assert!(bytes <= 40_000, "{bytes} bytes: {sizes:?}");
}
