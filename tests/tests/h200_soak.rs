//! The soak on the H200 and an H100 (scripts/h200/soak): a busy node's steady churn of GPU
//! jobs beside `linger agent --record`, replayed. The soak is every job's reaper and keeps its
//! own truth: a job's memory is back when the last process holding it (itself, a forked child,
//! a CUDA IPC importer) has been reaped. Every job that ended within the committed opening of
//! the run must have an incident with the verdict, the holders and the memory's return (within
//! 5 ms) that the truth gives: scripts/h200/soak/check.py's assertions, on the fixture CI
//! carries. With `--lean` (4 jobs at a time, one kill a second), a job's incident may say
//! `incomplete` instead where it names the processes whose NVML figures rose as the job left
//! NVML's list, as docs/modes.md says: without driver calls an import is told from another
//! job's allocation by NVML's figures alone.

use std::{collections::HashMap, path::Path, process::Command};

use linger_tests::fixtures::{h200, json_lines};
use serde_json::Value;
use tracer_user::trace::TraceReader;

/// A release must match the soak's reap this closely.
const WITHIN_NS: i64 = 5_000_000;
/// Past this after its death a teardown is `slow_teardown` (`slow_after`).
const SLOW_NS: i64 = 1_000_000_000;
/// Jobs are judged when they ended this long before the recording's cut: later ones' last
/// records may lie past it.
const MARGIN_NS: u64 = 5_000_000_000;
/// The committed runs (their directories), the opening of each cut by
/// `linger-trace-trim --until`, and whether the agent ran with `--lean`: `default`, 6 kills a
/// second by 16 workers on the H200 (b01b212, the first 60 s); `lean`, one kill a second by 4
/// workers on the H200 beside it (the same build, the first 200 s); `default-h100`, the default
/// mode at 6 kills a second on an H100 (e8409fb, the first 60 s).
const RUNS: &[(&str, bool)] = &[("default", false), ("lean", true), ("default-h100", false)];

fn linger() -> String {
    std::env::var("LINGER_BIN").expect("LINGER_BIN is set by `cargo xtask test`")
}

/// The last record of each incident, by its target's pid (pids are reused: several).
fn incidents(replayed: &str) -> HashMap<u64, Vec<Value>> {
    let mut last: HashMap<u64, Value> = HashMap::new();
    for line in replayed.lines() {
        let r: Value = serde_json::from_str(line).expect("JSON line");
        if r["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("incident"))
        {
            last.insert(r["id"].as_u64().expect("id"), r);
        }
    }
    let mut by_pid: HashMap<u64, Vec<Value>> = HashMap::new();
    for r in last.into_values() {
        by_pid
            .entry(r["target"]["pid"].as_u64().expect("pid"))
            .or_default()
            .push(r);
    }
    by_pid
}

/// When the last holder of a job's memory was reaped.
fn t_back(job: &Value) -> u64 {
    job["reaped"]
        .as_object()
        .expect("reaps")
        .values()
        .filter_map(Value::as_u64)
        .max()
        .unwrap_or(0)
}

/// What is wrong with the answer to `job`, if anything.
fn judge(job: &Value, incidents: &HashMap<u64, Vec<Value>>, lean: bool) -> Option<String> {
    let pid = job["pid"].as_u64().expect("pid");
    let back = t_back(job);
    let start = job["t_start_ns"].as_u64().expect("start");
    let Some(inc) = incidents.get(&pid).and_then(|all| {
        all.iter().find(|i| {
            let dead = i["t_group_dead_ns"]
                .as_u64()
                .or_else(|| i["t_signal_ns"].as_u64())
                .unwrap_or(0);
            (start..=back).contains(&dead)
        })
    }) else {
        return Some("no incident".into());
    };
    let dead = inc["t_group_dead_ns"]
        .as_u64()
        .or_else(|| job["t_kill_ns"].as_u64())
        .unwrap_or(back) as i64;
    let want = match job["kind"].as_str().expect("kind") {
        "fork" => "shared_fd",
        "ipc" => "imported",
        _ => "released",
    };
    let took = back as i64 - dead;
    let allowed: &[&str] = match want {
        "released" if took > SLOW_NS + WITHIN_NS => &["slow_teardown"],
        "released" if took > SLOW_NS - WITHIN_NS => &["released", "slow_teardown"],
        _ => &[want],
    };
    let verdict = inc["verdict"]["kind"].as_str().unwrap_or("none");
    if lean && verdict == "incomplete" && names_risers(inc) {
        return None;
    }
    let mut holders: Vec<u64> = inc["holders"]
        .as_array()
        .map(|h| h.iter().filter_map(|h| h["pid"].as_u64()).collect())
        .unwrap_or_default();
    holders.sort_unstable();
    let mut truth: Vec<u64> = job["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .filter_map(|h| h["pid"].as_u64())
        .collect();
    truth.sort_unstable();
    let error = inc["gpu"]["t_memory_back_ns"]
        .as_u64()
        .map(|t| t as i64 - back as i64);
    let right = allowed.contains(&verdict)
        && holders == truth
        && error.is_some_and(|e| e.abs() <= WITHIN_NS);
    (!right).then(|| {
        format!(
            "{} job {pid}: {verdict} (want {allowed:?}), holders {holders:?} (want {truth:?}), \
             release {:?} ms off",
            job["kind"],
            error.map(|e| e as f64 / 1e6)
        )
    })
}

/// Whether an `incomplete` verdict names the processes whose NVML figures rose as the victim
/// left NVML's list: the one ambiguity `--lean` documents.
fn names_risers(inc: &Value) -> bool {
    inc["verdict"]["evidence"].as_array().is_some_and(|e| {
        e.iter()
            .filter_map(Value::as_str)
            .any(|e| e.contains("NVML's figures rose for") && e.contains("without driver calls"))
    })
}

fn check(run: &str, lean: bool) {
    let dir = h200().join("soak").join(run);
    let trace = dir.join("soak.lgr");
    let out = Command::new(linger())
        .args(["replay", "--json"])
        .arg(&trace)
        .output()
        .expect("linger replay");
    assert!(out.status.success(), "{out:?}");
    let incidents = incidents(&String::from_utf8_lossy(&out.stdout));
    let mut truth = json_lines(&dir.join("truth.jsonl.zst"));
    let summary = truth.pop().expect("the soak's summary line");
    let cut = recording_end(&trace);
    let jobs: Vec<&Value> = truth
        .iter()
        .filter(|j| j.get("failed").is_none() && j.get("t_start_ns").is_some())
        .filter(|j| t_back(j) + MARGIN_NS < cut)
        .collect();
    let wrong: Vec<String> = jobs
        .iter()
        .filter_map(|j| judge(j, &incidents, lean))
        .collect();
    let killed = jobs.iter().filter(|j| j.get("t_kill_ns").is_some()).count();
    assert!(
        killed >= 100,
        "{run}: {killed} kills before the cut ({summary})"
    );
    assert!(
        wrong.is_empty(),
        "{run}: {} of {} jobs answered wrong:\n{}",
        wrong.len(),
        jobs.len(),
        wrong.join("\n")
    );
}

/// The last record's time in a trace: where its recording was cut.
fn recording_end(trace: &Path) -> u64 {
    let file = std::fs::File::open(trace).expect("the soak's trace");
    let mut reader = TraceReader::new(std::io::BufReader::new(file)).expect("a trace");
    let mut end = 0;
    while let Some(chunk) = reader.next_chunk().expect("readable") {
        end = end.max(chunk.t_last_ns);
    }
    end
}

#[test]
fn every_job_of_the_soaks_opening_gets_the_answer_its_truth_gives() {
    for (run, lean) in RUNS {
        check(run, *lean);
    }
}
