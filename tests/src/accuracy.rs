//! The H200 suite's accuracy table (BENCHMARKS-H200.md), made from the committed fixtures:
//! for every pass, what `linger live` printed on the H200 (`NAME.jsonl.zst`, the build that
//! recorded it) against the suite's own NVML poll (`truth.jsonl.zst`). The
//! `linger-h200-accuracy` program prints it; a test holds the document to it.

use std::{collections::BTreeMap, fmt::Write, path::Path};

use serde_json::Value;

use crate::fixtures::{json_lines, suite_passes};

/// The document's table stands between these lines.
pub const BEGIN: &str =
    "<!-- accuracy table: cargo run --release -p linger-tests --bin linger-h200-accuracy -->";
pub const END: &str = "<!-- end of the accuracy table -->";

/// A teardown this long after the group's death is `slow_teardown` (docs/incident-json.md).
const SLOW_TEARDOWN_NS: u64 = 1_000_000_000;
/// How close to the poll a release is the same release (tests/tests/h200_suite.rs).
const WITHIN_NS: u64 = 2_000_000;

/// One scenario of one pass: what the poll saw and what linger printed live.
struct Row {
    pass: String,
    scenario: String,
    /// The poll's release, after the signal (or the exit), in ms.
    truth_ms: String,
    verdict: String,
    mode: String,
    holders: String,
    /// linger's release minus the poll's, in ns (for the storm: the device's return).
    error_ns: Option<i64>,
    detail: String,
    right: bool,
}

/// The whole section: a summary line per pass, then a row per scenario.
pub fn table() -> String {
    let mut passes = suite_passes();
    // pass1, pass2, … pass14, then lean, lean2, …, then xid: the order they were run in.
    passes.sort_by_key(|d| {
        let name = d
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        let family = ["pass", "lean", "xid"]
            .iter()
            .position(|f| name.starts_with(f))
            .unwrap_or(3);
        let n: u32 = name
            .trim_start_matches(|c: char| c.is_alphabetic())
            .parse()
            .unwrap_or(1);
        (family, n)
    });
    let rows: Vec<Vec<Row>> = passes.iter().map(|d| pass_rows(d)).collect();
    let mut out = String::new();
    out.push_str("| pass | scenarios | verdict, mode and holders as the poll says | max \\|linger − poll\\| | recordings replayed in CI |\n|---|---|---|---|---|\n");
    for (dir, rows) in passes.iter().zip(&rows) {
        let right = rows.iter().filter(|r| r.right).count();
        let worst = rows
            .iter()
            .filter_map(|r| r.error_ns)
            .map(i64::unsigned_abs)
            .max();
        let kept: Vec<&str> = rows
            .iter()
            .filter(|r| dir.join(format!("{}.trace", r.scenario)).exists())
            .map(|r| r.scenario.as_str())
            .collect();
        let kept = match kept.len() {
            0 => "none".to_string(),
            n if n == rows.len() => "all".to_string(),
            _ => kept.join(", "),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {right} of {} | {} | {kept} |",
            rows[0].pass,
            rows.len(),
            rows.len(),
            worst.map_or("-".into(), |w| format!("{:.2} ms", w as f64 / 1e6)),
        );
    }
    let all: Vec<&Row> = rows.iter().flatten().collect();
    let worst = all
        .iter()
        .filter_map(|r| r.error_ns.map(|e| (e.unsigned_abs(), r)))
        .max_by_key(|(e, _)| *e);
    if let Some((e, r)) = worst {
        let _ = writeln!(
            out,
            "\n{} of {} answers as the poll says; the largest release error is {:.2} ms ({} {}).\n",
            all.iter().filter(|r| r.right).count(),
            all.len(),
            e as f64 / 1e6,
            r.pass,
            r.scenario
        );
    }
    out.push_str("| pass | scenario | truth: memory back after the signal (poll) | verdict | mode | holders | linger − truth |\n|---|---|---|---|---|---|---|\n");
    for r in all {
        let error = r
            .error_ns
            .map_or("-".into(), |e| format!("{:+.2} ms", e as f64 / 1e6));
        let flag = if r.right {
            ""
        } else {
            " (not as the poll says)"
        };
        let _ = writeln!(
            out,
            "| {} | {} | {}{} | {}{flag} | {} | {} | {error} |",
            r.pass, r.scenario, r.truth_ms, r.detail, r.verdict, r.mode, r.holders
        );
    }
    out
}

fn pass_rows(dir: &Path) -> Vec<Row> {
    let pass = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("?")
        .to_string();
    json_lines(&dir.join("truth.jsonl.zst"))
        .into_iter()
        .map(|truth| {
            let scenario = truth["scenario"].as_str().expect("scenario").to_string();
            let live = last_records(&json_lines(&dir.join(format!("{scenario}.jsonl.zst"))));
            row(pass.clone(), scenario, &truth, &live)
        })
        .collect()
}

/// The last record of each incident live printed, by target pid.
fn last_records(lines: &[Value]) -> BTreeMap<u64, Value> {
    lines
        .iter()
        .filter(|r| {
            r["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("incident"))
        })
        .filter_map(|r| Some((r["target"]["pid"].as_u64()?, r.clone())))
        .collect()
}

fn ns(v: &Value, pointer: &str) -> Option<u64> {
    v.pointer(pointer).and_then(Value::as_u64)
}

fn row(pass: String, scenario: String, truth: &Value, live: &BTreeMap<u64, Value>) -> Row {
    let victims = truth["victims"].as_array().cloned().unwrap_or_default();
    let first = victims.first().cloned().unwrap_or(Value::Null);
    let none = Value::Null;
    let inc = ns(&first, "/pid")
        .and_then(|p| live.get(&p))
        .unwrap_or(&none);
    let start = ns(inc, "/t_signal_ns").or_else(|| ns(inc, "/t_group_dead_ns"));
    let expect = &truth["expect"];
    let verdict = inc["verdict"]["kind"]
        .as_str()
        .unwrap_or("no incident")
        .to_string();
    let mode = inc["termination"]["mode"]
        .as_str()
        .unwrap_or("-")
        .to_string();
    let holders: Vec<String> = inc["holders"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| format!("{}:{}", h["pid"], h["how"].as_str().unwrap_or("?")))
        .collect();
    let want_holders: Vec<u64> = expect["holders"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
        .collect();
    let mut got_holders: Vec<u64> = inc["holders"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| ns(h, "/pid"))
        .collect();
    got_holders.sort();
    let mut want_sorted = want_holders.clone();
    want_sorted.sort();
    let mode_right = inc["termination"]["mode"] == expect["mode"];
    let (truth_ms, detail, error_ns, verdict_right) = if scenario == "kill-storm" {
        storm(truth, &victims, live, start)
    } else {
        let back = ns(&first, "/t_back_ns");
        let mine = ns(inc, "/gpu/t_memory_back_ns");
        let error = back.zip(mine).map(|(b, m)| m as i64 - b as i64);
        let truth_ms = match (back, start) {
            (Some(b), Some(s)) => format!("{:.1} ms", (b as f64 - s as f64) / 1e6),
            _ => "-".into(),
        };
        let allowed = allowed_verdicts(expect, back, ns(inc, "/t_group_dead_ns"));
        let right = allowed.contains(&verdict.as_str())
            && error.is_some_and(|e| e.unsigned_abs() <= WITHIN_NS);
        (truth_ms, String::new(), error, right)
    };
    Row {
        pass,
        scenario,
        truth_ms,
        verdict,
        mode,
        holders: if holders.is_empty() {
            "-".into()
        } else {
            holders.join(",")
        },
        error_ns,
        detail,
        right: verdict_right && mode_right && got_holders == want_sorted,
    }
}

/// The verdicts the poll allows: the expected one, except that memory back more than a second
/// after the group's death (without another holder) came back slowly (either, within the
/// poll's precision of that second).
fn allowed_verdicts(expect: &Value, back: Option<u64>, dead: Option<u64>) -> Vec<&str> {
    let want = expect["verdict"].as_str().unwrap_or("?");
    let (Some(back), Some(dead), "released") = (back, dead, want) else {
        return vec![want];
    };
    match back.saturating_sub(dead) {
        t if t + WITHIN_NS < SLOW_TEARDOWN_NS => vec!["released"],
        t if t > SLOW_TEARDOWN_NS + WITHIN_NS => vec!["slow_teardown"],
        _ => vec!["released", "slow_teardown"],
    }
}

/// The storm: each victim's own release against the suite's reap of it, and the device's
/// return against the poll.
fn storm(
    truth: &Value,
    victims: &[Value],
    live: &BTreeMap<u64, Value>,
    start: Option<u64>,
) -> (String, String, Option<i64>, bool) {
    let mut own = Vec::new();
    let mut backs = Vec::new();
    let mut released = 0;
    for v in victims {
        let Some(inc) = ns(v, "/pid").and_then(|p| live.get(&p)) else {
            continue;
        };
        released += usize::from(inc["verdict"]["kind"] == "released");
        if let (Some(mine), Some(reaped)) =
            (ns(inc, "/gpu/t_files_released_ns"), ns(v, "/t_reaped_ns"))
        {
            own.push((mine as i64 - reaped as i64) as f64 / 1e6);
        }
        backs.extend(ns(inc, "/gpu/t_memory_back_ns"));
    }
    own.sort_by(f64::total_cmp);
    let device = ns(truth, "/t_back_ns");
    let error = backs
        .iter()
        .max()
        .zip(device)
        .map(|(m, d)| *m as i64 - d as i64);
    let truth_ms = match (device, start) {
        (Some(d), Some(s)) => format!(
            "device back {:.1} ms after the first kill",
            (d as f64 - s as f64) / 1e6
        ),
        _ => "-".into(),
    };
    let detail = match (own.first(), own.last()) {
        (Some(lo), Some(hi)) => format!("; own release vs reap {lo:+.2}…{hi:+.2} ms"),
        _ => String::new(),
    };
    let right = released == victims.len()
        && own.len() == victims.len()
        && own.iter().all(|e| e.abs() * 1e6 <= WITHIN_NS as f64)
        && error.is_some_and(|e| e.unsigned_abs() <= WITHIN_NS);
    (
        truth_ms,
        format!("; {released} of {} released{detail}", victims.len()),
        error,
        right,
    )
}
