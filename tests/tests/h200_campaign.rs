//! The H200 termination campaign (scripts/h200/campaign.py; docs/article-table.md), replayed:
//! each incident this linger makes of the campaign's recordings must be released when the
//! campaign's own 1 ms NVML poll says, with the verdict and termination mode the campaign
//! staged, and `linger stats` over the recordings must print what this test computes itself
//! from those incidents.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use linger_tests::fixtures::{h200, json_lines};
use serde_json::Value;

/// A release must match the campaign's poll this closely.
const WITHIN_NS: u64 = 2_000_000;
/// How often the campaign's next job retries its allocation (scripts/h200/campaign.py).
const NEXT_JOB_RETRY_NS: u64 = 20_000_000;
/// How close the poll's release is where the next job's allocation is in the same readings.
const NEXT_JOB_WITHIN_NS: u64 = 3_000_000;
const RUNS: [&str; 2] = ["a", "b"];

fn linger() -> String {
    std::env::var("LINGER_BIN").expect("LINGER_BIN is set by `cargo xtask test`")
}

fn campaign() -> PathBuf {
    h200().join("campaign")
}

/// The last record of each GPU incident `linger replay` makes of one run's recording, by
/// target pid; replayed once for all tests.
fn incidents(run: &str) -> &'static BTreeMap<u64, Value> {
    static RUNS_REPLAYED: OnceLock<BTreeMap<String, BTreeMap<u64, Value>>> = OnceLock::new();
    let all = RUNS_REPLAYED.get_or_init(|| {
        RUNS.iter()
            .map(|run| (run.to_string(), replayed(&campaign().join(run))))
            .collect()
    });
    &all[run]
}

fn replayed(dir: &Path) -> BTreeMap<u64, Value> {
    let out = Command::new(linger())
        .args(["replay", "--json"])
        .arg(dir.join("campaign.trace"))
        .output()
        .expect("linger replay");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON line"))
        .filter(|r| {
            r["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("incident"))
        })
        .map(|r| (r["target"]["pid"].as_u64().expect("pid"), r))
        .collect()
}

/// Nearest-rank percentile of sorted values.
fn rank(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    sorted[((p * n as f64).ceil() as usize).clamp(1, n) - 1]
}

#[test]
fn every_run_is_released_when_the_campaigns_poll_says() {
    for run in RUNS {
        let incs = incidents(run);
        for t in json_lines(&campaign().join(run).join("truth.jsonl.zst")) {
            let mode = t["mode"].as_str().expect("mode");
            // A CUDA fault's run records the error the program saw; any other error is the
            // campaign's own.
            let fault = mode == "cuda-fault"
                && t["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("cudaErrorIllegalAddress"));
            assert!(
                fault || t["error"].is_null(),
                "{run}/{mode} failed on the H200: {t}"
            );
            let pid = t["pid"].as_u64().expect("pid");
            let inc = incs
                .get(&pid)
                .unwrap_or_else(|| panic!("{run}/{mode}: no incident of {pid}"));
            let back = inc["gpu"]["t_memory_back_ns"].as_u64().expect("back");
            assert_eq!(
                inc["termination"]["mode"], t["expect"],
                "{run}/{mode}: {inc}"
            );
            // The next job could only fit once the memory was back, and did at its next try
            // (one every NEXT_JOB_RETRY_NS). Its allocation lands in the poll's readings of
            // the release, so there the poll's own figure is good to NEXT_JOB_WITHIN_NS; in
            // run a it hid the return from the poll altogether.
            let within = if mode == "next-job-waits" {
                let got = t["next_t_got_ns"].as_u64().expect("next job's allocation");
                assert!(
                    back <= got && got - back <= NEXT_JOB_RETRY_NS + WITHIN_NS,
                    "{run}/{mode}: back {:.2} ms before the next job fit",
                    (got as f64 - back as f64) / 1e6
                );
                NEXT_JOB_WITHIN_NS
            } else {
                WITHIN_NS
            };
            let hidden = mode == "next-job-waits" && t["victim_share"].is_null();
            if !hidden {
                let truth = t["t_back_ns"].as_u64().expect("t_back_ns");
                assert!(
                    back.abs_diff(truth) <= within,
                    "{run}/{mode} {} GiB: {:.2} ms from the poll",
                    t["gib"],
                    (back as f64 - truth as f64) / 1e6
                );
            }
            let verdict = inc["verdict"]["kind"].as_str().expect("verdict");
            let want = if mode == "forked-holder" {
                "shared_fd"
            } else {
                "released"
            };
            assert_eq!(verdict, want, "{run}/{mode}");
            if mode == "next-job-waits" {
                let refused = inc["collateral"].as_array().expect("collateral");
                assert!(
                    refused.iter().all(|c| c["pid"] == t["next_job"]),
                    "{run}: collateral of the next job only: {refused:?}"
                );
                assert!(
                    !refused.is_empty(),
                    "{run}: the next job was refused after the kill"
                );
            }
            if mode == "cuda-fault" {
                assert_eq!(inc["gpu_errors"][0]["xid"], 31, "{run}: {inc}");
                assert_eq!(inc["gpu_errors"][0]["pid"], pid, "{run}: {inc}");
            }
        }
    }
}

#[test]
fn the_table_is_what_the_incidents_say() {
    let out = Command::new(linger())
        .args(["stats", "--json"])
        .arg(campaign())
        .output()
        .expect("linger stats");
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    // Independently: per termination mode, the release times of the incidents with memory
    // of their own.
    // (every release time, those known to 2 ms, collateral incidents)
    let mut by: BTreeMap<String, (Vec<f64>, Vec<f64>, u64)> = BTreeMap::new();
    for run in RUNS {
        for inc in incidents(run).values() {
            let share = inc["gpu"]["share_bytes"].as_u64().unwrap_or(0);
            if share == 0 {
                continue;
            }
            let back = inc["gpu"]["t_memory_back_ns"].as_u64().expect("back");
            let ms = (back - inc["t_signal_ns"].as_u64().expect("t")) as f64 / 1e6;
            // Known to 2 ms: placed that closely, or a window that narrow; else a bound.
            let placed = inc["gpu"]["memory_back_known_to_ns"]
                .as_u64()
                .is_some_and(|k| k <= 2_000_000);
            let narrow = inc["gpu"]["t_memory_held_until_ns"]
                .as_u64()
                .is_some_and(|h| back - h <= 2_000_000);
            let e = by
                .entry(inc["termination"]["mode"].as_str().expect("mode").into())
                .or_default();
            e.0.push(ms);
            if placed || narrow {
                e.1.push(ms);
            }
            e.2 += u64::from(inc["collateral"].as_array().is_some_and(|c| !c.is_empty()));
        }
    }
    let groups = report["groups"].as_array().expect("groups");
    let modes: Vec<&str> = groups.iter().filter_map(|g| g["group"].as_str()).collect();
    assert_eq!(modes, by.keys().map(String::as_str).collect::<Vec<_>>());
    assert!(
        modes.len() >= 5,
        "five termination modes or more: {modes:?}"
    );
    for g in groups {
        let mode = g["group"].as_str().expect("group");
        let (v, mut known, collateral) = by[mode].clone();
        known.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        assert_eq!(g["count"], v.len(), "{mode}");
        assert_eq!(g["release_bounded"], v.len() - known.len(), "{mode}");
        let r = &g["release_ms"];
        if known.is_empty() {
            assert!(r.is_null(), "{mode}: {r}");
        } else {
            let k_n = known.len() as f64;
            let mean = known.iter().sum::<f64>() / k_n;
            let sd = (known.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k_n - 1.0).max(1.0))
                .sqrt();
            for (k, want) in [
                ("mean", mean),
                ("sd", sd),
                ("p50", rank(&known, 0.5)),
                ("p95", rank(&known, 0.95)),
                ("max", known[known.len() - 1]),
            ] {
                let got = r[k].as_f64().expect(k);
                assert!((got - want).abs() < 1e-6, "{mode} {k}: {got} vs {want}");
            }
        }
        let over = |ms: f64| v.iter().filter(|&&x| x > ms).count() as f64 / n;
        let share = |k: &str| g[k]["share"].as_f64().expect(k);
        assert!((share("residue_1s") - over(1000.0)).abs() < 1e-9, "{mode}");
        assert!(
            (share("residue_30s") - over(30_000.0)).abs() < 1e-9,
            "{mode}"
        );
        let c = g["collateral_share"].as_f64().expect("collateral_share");
        assert!((c - collateral as f64 / n).abs() < 1e-9, "{mode}");
    }
}
