//! What `linger live` printed on the GPU machine in the committed suite passes, beyond the
//! incidents the accuracy table judges: a GPU job that lived past `--stuck-after` and was then
//! stopped (SIGSTOP) and killed is never reported stuck in the driver, and an Xid carries the
//! action NVIDIA's catalog gives it (issue 51). Where such a scenario's recording is kept, its
//! replay by this build prints what live printed.

use std::{path::PathBuf, process::Command};

use linger_tests::fixtures::{json_lines, suite_passes};
use serde_json::Value;

/// Every pass directory with its truth, and each scenario's truth line.
fn scenarios() -> Vec<(PathBuf, Value)> {
    suite_passes()
        .into_iter()
        .flat_map(|dir| {
            json_lines(&dir.join("truth.jsonl.zst"))
                .into_iter()
                .map(move |truth| (dir.clone(), truth))
        })
        .collect()
}

/// What linger printed live for one scenario of one pass.
fn live(dir: &std::path::Path, truth: &Value) -> Vec<Value> {
    let name = truth["scenario"].as_str().expect("scenario");
    json_lines(&dir.join(format!("{name}.jsonl.zst")))
}

#[test]
fn a_stopped_gpu_job_is_never_called_stuck_in_the_driver() {
    let mut judged = 0;
    for (dir, truth) in scenarios() {
        if truth["expect"]["stuck"] != false {
            continue;
        }
        let victim = &truth["victims"][0];
        let at = |key: &str| {
            victim[key]
                .as_u64()
                .unwrap_or_else(|| panic!("{key}: {victim}"))
        };
        let stopped_s = (at("t_kill_ns") - at("t_stop_ns")) as f64 / 1e9;
        assert!(
            stopped_s > 10.0,
            "{}: stopped only {stopped_s} s",
            dir.display()
        );
        let lines = live(&dir, &truth);
        let stuck: Vec<&Value> = lines.iter().filter(|l| l["type"] == "stuck").collect();
        assert!(stuck.is_empty(), "{}: {stuck:?}", dir.display());
        let incident = lines
            .iter()
            .rfind(|l| l["type"] == "incident" && l["target"]["pid"] == victim["pid"])
            .unwrap_or_else(|| panic!("{}: no incident of the stopped job", dir.display()));
        assert_eq!(incident["verdict"]["kind"], "released", "{}", dir.display());
        judged += 1;
    }
    // The passes of 2026-12-07 (pass20, lean10) ran it, in both modes.
    assert!(
        judged >= 2,
        "only {judged} stopped-job scenario(s) committed"
    );
}

#[test]
fn an_xid_carries_its_catalog_action_live() {
    let mut judged = 0;
    for (dir, truth) in scenarios() {
        if truth["expect"]["xid"] != true {
            continue;
        }
        let lines = live(&dir, &truth);
        for incident in lines.iter().filter(|l| l["type"] == "incident") {
            let Some(error) = incident["gpu_errors"].get(0) else {
                continue;
            };
            // Builds before the catalog (issue 51) printed no action.
            if error.get("action").is_none() {
                continue;
            }
            assert_eq!(error["xid"], 31, "{}", dir.display());
            assert_eq!(error["action"], "RESTART_APP", "{}", dir.display());
            let hint = incident["verdict"]["hint"].as_str().unwrap_or_default();
            assert!(
                hint.starts_with("NVIDIA's catalog for Xid 31: restart the application"),
                "{}: {hint}",
                dir.display()
            );
            judged += 1;
        }
    }
    assert!(
        judged >= 4,
        "only {judged} live Xid incident(s) with an action"
    );
}

#[test]
fn the_kept_recordings_of_these_scenarios_replay_to_what_live_printed() {
    let all = scenarios();
    // Passes run by a build with the stuck watch and the Xid catalog (those with the stopped
    // job): older ones print less live than this build replays (h200_suite.rs CHANGED).
    let current: Vec<&PathBuf> = all
        .iter()
        .filter(|(_, truth)| truth["expect"]["stuck"] == false)
        .map(|(dir, _)| dir)
        .collect();
    let mut replayed = 0;
    for (dir, truth) in &all {
        let expect = &truth["expect"];
        if !current.contains(&dir) || (expect["stuck"] != false && expect["xid"] != true) {
            continue;
        }
        let name = truth["scenario"].as_str().expect("scenario");
        let trace = dir.join(format!("{name}.trace"));
        if !trace.exists() {
            continue;
        }
        let linger = std::env::var("LINGER_BIN").expect("LINGER_BIN is set by `cargo xtask test`");
        let out = Command::new(linger)
            .args(["replay", "--json"])
            .arg(&trace)
            .output()
            .expect("run linger replay");
        assert!(out.status.success(), "{}", trace.display());
        let mut replay: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .collect();
        let printed: Vec<Value> = live(dir, truth)
            .into_iter()
            .filter(|l| l["type"] != "event")
            .collect();
        // What this build adds that the live build predates.
        for (r, p) in replay.iter_mut().zip(&printed) {
            linger_tests::without_newer_window(r, p);
        }
        assert_eq!(replay, printed, "{}", trace.display());
        replayed += 1;
    }
    // pass20's stopped job and Xid fault.
    assert!(replayed >= 2, "only {replayed} recording(s) replayed");
}
