//! The H200 termination campaign (scripts/h200/campaign.py; docs/article-table.md), replayed:
//! `linger stats` over its recordings must print what this test computes itself from the
//! incidents' JSON, and each incident's release must match the campaign's own 1 ms NVML poll.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

/// A release must match the campaign's poll this closely.
const WITHIN_NS: u64 = 3_000_000;

fn linger() -> String {
    std::env::var("LINGER_BIN").expect("LINGER_BIN is set by `cargo xtask test`")
}

fn campaign() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/h200/campaign")
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

/// The last record of each GPU incident of one run's live output, by target pid.
fn incidents(run: &str) -> BTreeMap<u64, Value> {
    lines(&campaign().join(run).join("incidents.jsonl"))
        .into_iter()
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
    for run in ["a", "b"] {
        let incs = incidents(run);
        for t in lines(&campaign().join(run).join("truth.jsonl")) {
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
            let inc = &incs[&pid];
            let back = inc["gpu"]["t_memory_back_ns"].as_u64().expect("back");
            assert_eq!(
                inc["termination"]["mode"], t["expect"],
                "{run}/{mode}: {inc}"
            );
            // In run a the next job's allocation hid the return from the poll's idle level;
            // its success is then the bound: it could only fit once the memory was back.
            let truth = match (mode, t["victim_share"].is_null()) {
                ("next-job-waits", true) => {
                    let got = t["next_t_got_ns"].as_u64().expect("next job's allocation");
                    assert!(back <= got, "{run}/{mode}: back after the next job fit");
                    got
                }
                _ => t["t_back_ns"].as_u64().expect("t_back_ns"),
            };
            assert!(
                back.abs_diff(truth) <= WITHIN_NS,
                "{run}/{mode} {} GiB: {:.2} ms from the poll",
                t["gib"],
                (back as f64 - truth as f64) / 1e6
            );
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
    // of their own (the traces replayed by stats hold the same incidents: counted once).
    let mut by: BTreeMap<String, (Vec<f64>, u64)> = BTreeMap::new();
    for run in ["a", "b"] {
        for inc in incidents(run).values() {
            let share = inc["gpu"]["share_bytes"].as_u64().unwrap_or(0);
            if share == 0 {
                continue;
            }
            let back = inc["gpu"]["t_memory_back_ns"].as_u64().expect("back");
            let ms = (back - inc["t_signal_ns"].as_u64().expect("t")) as f64 / 1e6;
            let e = by
                .entry(inc["termination"]["mode"].as_str().expect("mode").into())
                .or_default();
            e.0.push(ms);
            e.1 += u64::from(inc["collateral"].as_array().is_some_and(|c| !c.is_empty()));
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
        let (mut v, collateral) = by[mode].clone();
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let r = &g["release_ms"];
        assert_eq!(g["count"], v.len(), "{mode}");
        for (k, want) in [
            ("mean", mean),
            ("sd", sd),
            ("p50", rank(&v, 0.5)),
            ("p95", rank(&v, 0.95)),
            ("max", v[v.len() - 1]),
        ] {
            let got = r[k].as_f64().expect(k);
            assert!((got - want).abs() < 1e-6, "{mode} {k}: {got} vs {want}");
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
