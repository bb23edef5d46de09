//! `linger stats` over the committed H200 recordings: its figures against the same figures
//! computed here, independently, from the incidents' JSON; traces told by their contents
//! whatever their names; an incident in a trace and its live log counted once, from the trace,
//! and said so; damaged inputs and files of other kinds reported and skipped.

mod trace_support;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use linger_tests::{
    fixtures::{decompressed, h200},
    TempDir,
};
use serde_json::{json, Value};
use trace_support::record;

fn linger() -> String {
    std::env::var("LINGER_BIN").expect("LINGER_BIN is set by `cargo xtask test`")
}

fn suite() -> PathBuf {
    h200().join("suite")
}

/// The live logs of these passes (`NAME.jsonl.zst`) as `stats` reads them, plain JSON lines,
/// in `dir/PASS/NAME.jsonl`; in name order.
fn live_logs(dir: &Path, passes: &[&str]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for pass in passes {
        std::fs::create_dir_all(dir.join(pass)).expect("folder");
        for e in std::fs::read_dir(suite().join(pass))
            .expect("suite dir")
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(run) = name.strip_suffix(".jsonl.zst").filter(|r| *r != "truth") else {
                continue;
            };
            let to = dir.join(pass).join(format!("{run}.jsonl"));
            std::fs::write(&to, decompressed(&e.path())).expect("writing a log");
            files.push(to);
        }
    }
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

/// What `linger stats` must say of one termination mode.
struct Want {
    count: u64,
    /// The mean of the release times known to 2 ms; None without any.
    mean: Option<f64>,
    /// Of those counted, the release times that are only bounds.
    bounded: u64,
    /// The share not back after 1 s (bounds included).
    over_1s: f64,
}

/// Whether a record's release time is known to 2 ms: placed that closely by the kernel's
/// release (`memory_back_known_to_ns`), or in a window that narrow; else a bound.
fn known(gpu: &Value, back: u64) -> bool {
    let placed = gpu["memory_back_known_to_ns"]
        .as_u64()
        .is_some_and(|k| k <= 2_000_000);
    let narrow = gpu["t_memory_held_until_ns"]
        .as_u64()
        .is_some_and(|h| back.saturating_sub(h) <= 2_000_000);
    placed || narrow
}

/// Per termination mode, from the last record of each GPU incident with memory of its own, a
/// release time and no record losses.
fn expected(files: &[PathBuf]) -> BTreeMap<String, Want> {
    let mut last: BTreeMap<(u64, u64, u64), Value> = BTreeMap::new();
    for f in files {
        for line in String::from_utf8(decompressed(f)).expect("UTF-8").lines() {
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
    // (every release time, those known)
    let mut by: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
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
        let e = by
            .entry(r["termination"]["mode"].as_str().expect("mode").into())
            .or_default();
        e.0.push(ms);
        if known(&r["gpu"], back) {
            e.1.push(ms);
        }
    }
    by.into_iter()
        .map(|(mode, (all, known))| {
            let n = all.len() as f64;
            let over = all.iter().filter(|&&m| m > 1000.0).count() as f64;
            let want = Want {
                count: all.len() as u64,
                mean: (!known.is_empty()).then(|| known.iter().sum::<f64>() / known.len() as f64),
                bounded: (all.len() - known.len()) as u64,
                over_1s: over / n,
            };
            (mode, want)
        })
        .collect()
}

/// `report`'s groups have the figures of `want` (from [`expected`]).
fn assert_figures(report: &Value, want: &BTreeMap<String, Want>) {
    let groups = report["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), want.len(), "{report}");
    for g in groups {
        let mode = g["group"].as_str().expect("group");
        let w = &want[mode];
        assert_eq!(g["count"], w.count, "{mode}");
        assert_eq!(g["release_bounded"], w.bounded, "{mode}");
        match w.mean {
            Some(mean) => {
                let got = g["release_ms"]["mean"].as_f64().expect("mean");
                assert!((got - mean).abs() < 1e-6, "{mode}: {got} vs {mean}");
                for k in ["sd", "p50", "p95", "max"] {
                    assert!(g["release_ms"][k].is_number(), "{mode} {k}");
                }
            }
            None => assert!(g["release_ms"].is_null(), "{mode}: {g}"),
        }
        let residue = g["residue_1s"]["share"].as_f64().expect("residue");
        assert!(
            (residue - w.over_1s).abs() < 1e-9,
            "{mode}: {residue} vs {}",
            w.over_1s
        );
        assert!(g["collateral_share"].is_number() && g["residue_30s"]["share"].is_number());
    }
}

/// Incidents in the table.
fn total(report: &Value) -> u64 {
    report["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["count"].as_u64().expect("count"))
        .sum()
}

/// A committed file of the suite copied into `dir` as `name`.
fn copy(from: &str, dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    std::fs::write(&to, decompressed(&suite().join(from))).expect("copying a suite file");
    to
}

#[test]
fn the_table_matches_an_independent_count_of_the_incidents() {
    let tmp = TempDir::new("stats-table");
    let files = live_logs(tmp.path(), &["pass5", "pass6", "lean2"]);
    let (report, stderr) = stats(&["--json"], &files);
    assert!(stderr.is_empty(), "{stderr}");
    let groups = report["groups"].as_array().expect("groups");
    assert!(
        groups.len() >= 5,
        "five termination modes or more: {report}"
    );
    assert_figures(&report, &expected(&files));
}

#[test]
fn a_trace_and_its_live_output_count_each_incident_once() {
    // The newest pass as the suite wrote it: each recording beside its live log.
    let tmp = TempDir::new("stats-pass");
    let logs_only = live_logs(tmp.path(), &["pass15"]);
    let dir = tmp.path().join("pass15");
    for log in &logs_only {
        let name = log.with_extension("trace");
        let name = name.file_name().expect("name").to_string_lossy();
        copy(&format!("pass15/{name}"), &dir, &name);
    }
    let (both, stderr) = stats(&["--json"], std::slice::from_ref(&dir));
    let (logs, _) = stats(&["--json"], &logs_only);
    assert_eq!(total(&both), total(&logs));
    assert!(total(&logs) >= 14, "{logs}");
    // Each live log's incidents were taken from its own trace's replay, and said so.
    let inputs = both["inputs"].as_array().expect("inputs");
    let mut logs_seen = 0;
    for log in inputs.iter().filter(|i| i["kind"] == "log") {
        let file = log["file"].as_str().expect("file");
        let trace = file.replace(".jsonl", ".trace");
        let n = log["duplicates"].as_u64().expect("duplicates");
        assert!(n > 0, "{log}");
        assert_eq!(log["counted"], 0, "{log}");
        assert_eq!(log["taken_from"], json!({ trace.clone(): n }), "{log}");
        assert!(
            stderr.contains(&format!(
                "{file}: {n} incident(s) also in {trace}; that trace's replay was used"
            )),
            "{stderr}"
        );
        logs_seen += 1;
    }
    assert_eq!(logs_seen, logs_only.len(), "{both}");
}

#[test]
fn a_trace_is_told_by_its_contents_whatever_its_name() {
    let tmp = TempDir::new("stats-names");
    // Named `*.lgr` as docs/trace-format.md has it, named nothing telling, and found in a
    // directory under a name no trace has.
    let lgr = copy("pass15/forked-holder.trace", tmp.path(), "x.lgr");
    let bare = copy("pass15/kill-storm.trace", tmp.path(), "recording");
    let found = tmp.path().join("found");
    std::fs::create_dir(&found).expect("folder");
    copy("pass15/oom.trace", &found, "run.data");
    for (input, run) in [(lgr, "forked-holder"), (bare, "kill-storm"), (found, "oom")] {
        let (report, stderr) = stats(&["--json"], std::slice::from_ref(&input));
        assert!(stderr.is_empty(), "{}: {stderr}", input.display());
        assert_eq!(report["inputs"][0]["kind"], "trace", "{report}");
        // The same run's incidents as this build replays them (its live output predates
        // `memory_back_known_to_ns`), counted here independently.
        let replayed = tmp.path().join(format!("{run}.jsonl"));
        let out = Command::new(linger())
            .args(["replay", "--json"])
            .arg(suite().join(format!("pass15/{run}.trace")))
            .output()
            .expect("linger replay");
        assert!(out.status.success(), "{out:?}");
        std::fs::write(&replayed, &out.stdout).expect("the replay");
        let want = expected(&[replayed]);
        assert!(!want.is_empty(), "{run}");
        assert_figures(&report, &want);
    }
}

#[test]
fn a_fresh_recording_named_lgr_is_read_as_a_trace() {
    // Real kills, recorded by this linger as `run.lgr`. With no GPU here, they are incidents
    // without GPU memory, which the table leaves out: their figures are checked on the H200
    // traces above.
    let rec = record("stats-lgr", &[]);
    assert_eq!(rec.trace.extension().and_then(|e| e.to_str()), Some("lgr"));
    let (report, stderr) = stats(&["--json"], std::slice::from_ref(&rec.trace));
    assert!(stderr.is_empty(), "{stderr}");
    assert_eq!(report["files"], 1, "{report}");
    assert_eq!(report["inputs"][0]["kind"], "trace", "{report}");
    assert_eq!(report["skipped"], json!([]), "{report}");
}

#[test]
fn files_that_are_neither_trace_nor_log_are_said_and_skipped() {
    let tmp = TempDir::new("stats-other");
    let text = tmp.path().join("notes.txt");
    std::fs::write(&text, "linger: tracing fatal signals\n").expect("text");
    let blob = tmp.path().join("blob");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    std::fs::write(&blob, bytes).expect("blob");
    // Named like a log, but empty.
    let empty = tmp.path().join("empty.jsonl");
    std::fs::write(&empty, "").expect("empty");
    let log = copy(
        "pass15/kill-storm.jsonl.zst",
        tmp.path(),
        "kill-storm.jsonl",
    );
    let want = expected(std::slice::from_ref(&log));
    // Named, and found in a directory: the same.
    for inputs in [
        vec![text, blob, empty, log.clone()],
        vec![tmp.path().to_path_buf()],
    ] {
        let (report, stderr) = stats(&["--json"], &inputs);
        for name in ["notes.txt", "blob", "empty.jsonl"] {
            let said = format!("{}: ", tmp.path().join(name).display());
            let line = stderr
                .lines()
                .find(|l| l.contains(&said))
                .unwrap_or_else(|| panic!("{name} not said: {stderr}"));
            assert!(
                line.ends_with("not a trace or an incident log: skipped"),
                "{line}"
            );
        }
        assert_eq!(
            report["skipped"].as_array().map(Vec::len),
            Some(3),
            "{report}"
        );
        assert_eq!(report["files"], 1, "{report}");
        assert_figures(&report, &want);
    }
}

#[test]
fn a_trace_and_its_live_log_count_once_from_the_trace_whatever_the_order() {
    let tmp = TempDir::new("stats-both");
    let trace = copy("pass15/kill-storm.trace", tmp.path(), "campaign.lgr");
    // The live log of the same run with every release 1 s later: the figures say whose
    // records were used.
    let log = tmp.path().join("incidents.jsonl");
    let live =
        String::from_utf8(decompressed(&suite().join("pass15/kill-storm.jsonl.zst"))).expect("log");
    let shifted: String = live
        .lines()
        .map(|l| {
            let mut r: Value = serde_json::from_str(l).expect("JSON");
            if let Some(back) = r["gpu"]["t_memory_back_ns"].as_u64() {
                r["gpu"]["t_memory_back_ns"] = (back + 1_000_000_000).into();
            }
            format!("{r}\n")
        })
        .collect();
    std::fs::write(&log, shifted).expect("log");
    let (alone, _) = stats(&["--json"], std::slice::from_ref(&trace));
    let (log_alone, _) = stats(&["--json"], std::slice::from_ref(&log));
    let n = total(&alone);
    assert!(n >= 10, "{alone}");
    assert_eq!(total(&log_alone), n);
    assert_ne!(alone["groups"], log_alone["groups"], "the shift shows");
    let (t, l) = (trace.display().to_string(), log.display().to_string());
    for inputs in [
        vec![trace.clone(), log.clone()],
        vec![log.clone(), trace.clone()],
        vec![tmp.path().to_path_buf()],
    ] {
        let (report, stderr) = stats(&["--json"], &inputs);
        assert_eq!(report["groups"], alone["groups"], "{inputs:?}");
        let mut by_file: Vec<&Value> = report["inputs"]
            .as_array()
            .expect("inputs")
            .iter()
            .collect();
        by_file.sort_by_key(|i| i["file"].as_str().map(String::from));
        assert_eq!(
            by_file,
            [
                &json!({"file": t, "kind": "trace", "counted": n, "duplicates": 0, "taken_from": {}}),
                &json!({"file": l, "kind": "log", "counted": 0, "duplicates": n, "taken_from": { t.clone(): n }}),
            ],
            "{inputs:?}"
        );
        assert!(
            stderr.contains(&format!(
                "{l}: {n} incident(s) also in {t}; that trace's replay was used"
            )),
            "{stderr}"
        );
    }
}

#[test]
fn damaged_inputs_are_reported_and_skipped() {
    let dir = TempDir::new("stats-damaged");
    let tmp = dir.path();
    let text = String::from_utf8(decompressed(
        &suite().join("pass15/forked-holder.jsonl.zst"),
    ))
    .expect("log");
    // A log cut mid-line, and a trace file cut in half.
    let cut = tmp.join("cut.jsonl");
    std::fs::write(&cut, &text[..text.len() - 40]).expect("cut log");
    let trace = std::fs::read(suite().join("pass15/forked-holder.trace")).expect("trace");
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
}

#[test]
fn the_svg_has_a_dot_per_known_release_and_never_overwrites_unasked() {
    let dir = TempDir::new("stats-svg");
    let tmp = dir.path();
    let svg = tmp.join("release.svg");
    let _ = std::fs::remove_file(&svg);
    // The campaign's recordings: most of their release times are known to 2 ms.
    let files = vec![h200().join("campaign")];
    let mut args = vec!["--json", "--svg", svg.to_str().expect("UTF-8")];
    let (report, _) = stats(&args, &files);
    let text = std::fs::read_to_string(&svg).expect("the SVG");
    // A dot per release time known to 2 ms (bounds are counted apart).
    let dots: u64 = report["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["count"].as_u64().expect("count") - g["release_bounded"].as_u64().expect("n"))
        .sum();
    assert!(dots > 0, "{report}");
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
}

/// Given nothing it can read, stats says so and exits 1: a script must tell "no incidents"
/// from "could not read".
#[test]
fn nothing_readable_is_an_error_not_an_empty_table() {
    let tmp = TempDir::new("stats-nothing");
    let text = tmp.path().join("notes.txt");
    std::fs::write(&text, "not a log\n").expect("text");
    let out = linger_tests::linger()
        .args(["stats", "--json"])
        .arg(&text)
        .output()
        .expect("linger stats");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no trace or incident log could be read"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "no table: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}
