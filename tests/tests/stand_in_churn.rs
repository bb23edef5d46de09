//! A busy node's churn on the stand-in GPU device (a node for /dev/full, declared with
//! --gpu-device): workers start jobs at once and SIGKILL (or SIGTERM) them after a while, some
//! with a forked child, a child sharing the descriptor table, or a receiver of the file over a
//! unix socket that keeps it a little longer. Each
//! worker notes when it killed what and when the last holder was gone, and every kill must
//! have its own incident naming those holders and a release inside what the worker saw. No
//! NVML here: the kernel's release is the answer (issue 32's truth, without a GPU).

use std::{
    collections::BTreeMap,
    thread,
    time::{Duration, Instant},
};

use linger_tests::{stand_in_device, FdScenario, Live, TempDir};
use nix::{
    errno::Errno,
    sys::signal::{kill, Signal},
    time::{clock_gettime, ClockId},
    unistd::Pid,
};
use serde_json::Value;

const SCENARIO: &str = env!("CARGO_BIN_EXE_linger-fd-scenario");
const WORKERS: u64 = 8;
const JOBS_PER_WORKER: u64 = 10;

/// The stream's clock.
fn boottime_ns() -> u64 {
    let t = clock_gettime(ClockId::CLOCK_BOOTTIME).expect("CLOCK_BOOTTIME");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// Opens the device (and dups it); nobody else holds it.
    Alone,
    /// A forked and exec'd child keeps the file.
    Fork,
    /// A process that got the file over a unix socket keeps it.
    Sent,
    /// A child made with CLONE_FILES (the same descriptor table) keeps it.
    SharedTable,
}

/// What a worker saw of one job.
#[derive(Debug)]
struct Truth {
    kind: Kind,
    victim: u32,
    /// The process that kept the file after the victim's death.
    holder: Option<u32>,
    /// Its memory came back between these two moments (boot-time ns): the last holder's
    /// kill, and when it was seen gone.
    back_after: u64,
    back_before: u64,
}

/// Polls until `pid` no longer exists (reaped by whoever is its parent).
fn gone(pid: u32) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    while kill(Pid::from_raw(pid as i32), None) != Err(Errno::ESRCH) {
        assert!(Instant::now() < deadline, "{pid} still there");
        thread::sleep(Duration::from_millis(1));
    }
    boottime_ns()
}

fn job(device: &std::path::Path, kind: Kind, signal: Signal, hold_ms: u64, keep_ms: u64) -> Truth {
    let name = match kind {
        Kind::Alone => "dup-close",
        Kind::Fork => "fork-holder",
        Kind::Sent => "send-fd",
        Kind::SharedTable => "shared-table",
    };
    let mut s = FdScenario::start(SCENARIO, device, name);
    let victim = s.pids[0];
    let holder = s.pids.get(1).copied();
    thread::sleep(Duration::from_millis(hold_ms));
    let killed = boottime_ns();
    s.end_with(signal);
    let Some(holder) = holder else {
        return Truth {
            kind,
            victim,
            holder: None,
            back_after: killed,
            back_before: boottime_ns(),
        };
    };
    thread::sleep(Duration::from_millis(keep_ms));
    let holder_killed = boottime_ns();
    kill(Pid::from_raw(holder as i32), Signal::SIGKILL).expect("kill the holder");
    Truth {
        kind,
        victim,
        holder: Some(holder),
        back_after: holder_killed,
        back_before: gone(holder),
    }
}

/// One worker's jobs, in a fixed pseudo-random order of kinds and times.
fn worker(device: &std::path::Path, seed: u64) -> Vec<Truth> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    (0..JOBS_PER_WORKER)
        .map(|_| {
            let kind = [
                Kind::Alone,
                Kind::Alone,
                Kind::Fork,
                Kind::Sent,
                Kind::SharedTable,
            ][next(5) as usize];
            let signal = [Signal::SIGKILL, Signal::SIGKILL, Signal::SIGTERM][next(3) as usize];
            job(device, kind, signal, 20 + next(300), 50 + next(250))
        })
        .collect()
}

/// The last word on each target: its incident, then its updates.
fn last_records(records: &[Value]) -> BTreeMap<u64, &Value> {
    let mut last = BTreeMap::new();
    for r in records {
        if r["type"] == "incident" || r["type"] == "incident_update" {
            if let Some(pid) = r["target"]["pid"].as_u64() {
                last.insert(pid, r);
            }
        }
    }
    last
}

#[test]
fn every_kill_of_a_churn_has_its_incident_holders_and_release() {
    let dir = TempDir::new("churn");
    let device = stand_in_device(dir.path());
    let mut live = Live::start([
        "--json",
        "--no-nvml",
        "--duration",
        "120s",
        "--linger-after",
        "5s",
        "--gpu-device",
        device.to_str().expect("a UTF-8 path"),
    ]);
    let truths: Vec<Truth> = thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let device = &device;
                s.spawn(move || worker(device, w))
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a worker panicked"))
            .collect()
    });
    // Time for the last updates, then a clean stop.
    thread::sleep(Duration::from_millis(500));
    live.child.signal(Signal::SIGINT);
    let mut records = Vec::new();
    while let Some(r) = live.next_record() {
        records.push(r);
    }
    let last = last_records(&records);
    let lost: Vec<&Value> = records.iter().filter(|r| r["type"] == "loss").collect();
    assert!(
        lost.iter().all(|l| l["what"] != "ring"),
        "ring drops: {lost:?}"
    );
    let kinds = |k: Kind| truths.iter().filter(|t| t.kind == k).count();
    assert!(
        [Kind::Alone, Kind::Fork, Kind::Sent, Kind::SharedTable]
            .iter()
            .all(|k| kinds(*k) > 0),
        "{truths:?}"
    );
    let mut wrong = Vec::new();
    for t in &truths {
        let Some(inc) = last.get(&(t.victim as u64)) else {
            wrong.push(format!("{t:?}: no incident"));
            continue;
        };
        let holders: Vec<(u64, &str)> = inc["holders"]
            .as_array()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        (
                            h["pid"].as_u64().unwrap_or(0),
                            h["how"].as_str().unwrap_or(""),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let (verdict, expected_holders) = match (t.kind, t.holder) {
            (Kind::Alone, _) | (_, None) => ("released", vec![]),
            (Kind::Fork, Some(h)) => ("shared_fd", vec![(h as u64, "fork")]),
            (Kind::Sent, Some(h)) => ("shared_fd", vec![(h as u64, "seen")]),
            (Kind::SharedTable, Some(h)) => ("shared_fd", vec![(h as u64, "shared_table")]),
        };
        let back = inc["gpu"]["t_memory_back_ns"].as_u64();
        let in_window = back.is_some_and(|b| b >= t.back_after && b <= t.back_before);
        if inc["verdict"]["kind"] != verdict
            || holders != expected_holders
            || inc["gpu"]["memory_back_by"] != "kernel"
            || !in_window
        {
            wrong.push(format!(
                "{t:?}: verdict {}, holders {holders:?}, back {back:?} by {}",
                inc["verdict"]["kind"], inc["gpu"]["memory_back_by"]
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} kills wrong:\n{}",
        wrong.len(),
        truths.len(),
        wrong.join("\n")
    );
}
