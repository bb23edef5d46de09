//! `linger stats` over the committed H200 recordings: its figures against the same figures
//! computed here, independently, from the incidents' JSON; damaged inputs are reported and
//! skipped.

use std::{collections::BTreeMap, path::PathBuf, process::Command};

use serde_json::Value;

fn linger() -> String {
    std::env::var("LINGER_BIN").expect("LINGER_BIN is set by `cargo xtask test`")
}

fn suite() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/h200/suite")
}

fn jsonl_files(dirs: &[&str]) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|d| std::fs::read_dir(suite().join(d)).expect("suite dir"))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .filter(|p| !p.ends_with("truth.jsonl"))
        .collect();
    files.sort();
    files
}

fn stats(args: &[&str], inputs: &[PathBuf]) -> (Value, String) {
    let out = Command::new(linger())
        .arg("stats")
        .args(args)
        .args(inputs)
        .output()
        .expect("linger stats");
    assert!(out.status.success(), "{out:?}");
    let json = serde_json::from_slice(&out.stdout).expect("one JSON object");
    (json, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Per termination mode: (count, mean release ms, share not back after 1 s), from the last
/// record of each GPU incident with memory of its own, a release time and no record losses.
fn expected(files: &[PathBuf]) -> BTreeMap<String, (u64, f64, f64)> {
    let mut last: BTreeMap<(u64, u64, u64), Value> = BTreeMap::new();
    for f in files {
        for line in std::fs::read_to_string(f).expect("jsonl").lines() {
            let r: Value = serde_json::from_str(line).expect("JSON");
            if !r["type"].as_str().unwrap_or("").starts_with("incident") {
                continue;
            }
            let key = (
                r["id"].as_u64().expect("id"),
                r["t_signal_ns"].as_u64().expect("t"),
                r["target"]["pid"].as_u64().expect("pid"),
            );
            last.insert(key, r);
        }
    }
    let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in last.values() {
        let share = r["gpu"]["share_bytes"].as_u64().unwrap_or(0);
        let back = r["gpu"]["t_memory_back_ns"].as_u64();
        let lost = r["losses"]
            .as_array()
            .is_some_and(|l| l.iter().any(|x| x["what"] != "stacks"));
        let (Some(back), true, false) = (back, share > 0, lost) else {
            continue;
        };
        let ms = (back - r["t_signal_ns"].as_u64().expect("t")) as f64 / 1e6;
        by.entry(r["termination"]["mode"].as_str().expect("mode").into())
            .or_default()
            .push(ms);
    }
    by.into_iter()
        .map(|(mode, v)| {
            let n = v.len() as f64;
            let over = v.iter().filter(|&&m| m > 1000.0).count() as f64;
            (mode, (v.len() as u64, v.iter().sum::<f64>() / n, over / n))
        })
        .collect()
}

#[test]
fn the_table_matches_an_independent_count_of_the_incidents() {
    let files = jsonl_files(&["pass5", "pass6", "lean2"]);
    let (report, stderr) = stats(&["--json"], &files);
    assert!(stderr.is_empty(), "{stderr}");
    let want = expected(&files);
    let groups = report["groups"].as_array().expect("groups");
    assert!(
        groups.len() >= 5,
        "five termination modes or more: {report}"
    );
    assert_eq!(groups.len(), want.len(), "{report}");
    for g in groups {
        let mode = g["group"].as_str().expect("group");
        let (n, mean, over_1s) = want[mode];
        assert_eq!(g["count"], n, "{mode}");
        let got = g["release_ms"]["mean"].as_f64().expect("mean");
        assert!((got - mean).abs() < 1e-6, "{mode}: {got} vs {mean}");
        let residue = g["residue_1s"]["share"].as_f64().expect("residue");
        assert!(
            (residue - over_1s).abs() < 1e-9,
            "{mode}: {residue} vs {over_1s}"
        );
        for k in ["sd", "p50", "p95", "max"] {
            assert!(g["release_ms"][k].is_number(), "{mode} {k}");
        }
        assert!(g["collateral_share"].is_number() && g["residue_30s"]["share"].is_number());
    }
}

#[test]
fn a_trace_and_its_live_output_count_each_incident_once() {
    let dir = suite().join("pass6");
    let (both, _) = stats(&["--json"], std::slice::from_ref(&dir));
    let (logs, _) = stats(&["--json"], &jsonl_files(&["pass6"]));
    let total = |r: &Value| -> u64 {
        r["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .map(|g| g["count"].as_u64().expect("count"))
            .sum()
    };
    assert_eq!(total(&both), total(&logs));
    assert!(total(&logs) >= 14, "{logs}");
}

#[test]
fn damaged_inputs_are_reported_and_skipped() {
    let tmp = std::env::temp_dir().join(format!("linger-stats-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let good = suite().join("pass6/forked-holder.jsonl");
    let text = std::fs::read_to_string(&good).expect("log");
    // A log cut mid-line, and a trace file cut in half.
    let cut = tmp.join("cut.jsonl");
    std::fs::write(&cut, &text[..text.len() - 40]).expect("cut log");
    let trace = std::fs::read(suite().join("pass6/forked-holder.trace")).expect("trace");
    let half = tmp.join("half.trace");
    std::fs::write(&half, &trace[..trace.len() / 2]).expect("half trace");
    let junk = tmp.join("junk.trace");
    std::fs::write(&junk, b"not a trace at all").expect("junk");
    let (report, stderr) = stats(&["--json"], &[cut, half, junk]);
    assert!(
        stderr.contains("cut.jsonl: 1 line(s) that are not JSON"),
        "{stderr}"
    );
    assert!(stderr.contains("junk.trace"), "{stderr}");
    assert!(stderr.contains("half.trace"), "{stderr}");
    assert_eq!(
        report["skipped"].as_array().map(Vec::len),
        Some(3),
        "{report}"
    );
    assert!(!report["groups"].as_array().expect("groups").is_empty());
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn the_svg_has_a_dot_per_incident_and_never_overwrites_unasked() {
    let tmp = std::env::temp_dir().join(format!("linger-stats-svg-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let svg = tmp.join("release.svg");
    let _ = std::fs::remove_file(&svg);
    let files = jsonl_files(&["pass6"]);
    let mut args = vec!["--json", "--svg", svg.to_str().expect("UTF-8")];
    let (report, _) = stats(&args, &files);
    let text = std::fs::read_to_string(&svg).expect("the SVG");
    let dots: u64 = report["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["count"].as_u64().expect("count"))
        .sum();
    assert_eq!(text.matches("<circle").count() as u64, dots);
    let again = Command::new(linger())
        .arg("stats")
        .args(&args)
        .args(&files)
        .output()
        .expect("linger stats");
    assert!(
        !again.status.success(),
        "an existing file is kept without --force"
    );
    args.push("--force");
    let (_, _) = stats(&args, &files);
    let _ = std::fs::remove_dir_all(&tmp);
}
