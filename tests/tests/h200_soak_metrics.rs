//! What BENCHMARKS-H200.md says of the agent over a whole soak ("169f545 on an H100: children
//! that leave before, with and after their jobs"), from the soak's committed scrapes of the
//! agent (a line a second: its CPU time, RSS and lingering gauge, and the kills so far) and
//! the soak's truth: the agent's CPU per kill in every full minute inside the band the table
//! states, its RSS flat, and the lingering gauge 0 at the first scrape 2 s after the last
//! release.

use linger_tests::fixtures::{h200, json_lines};
use serde_json::Value;

/// A committed run, and what the table claims of it.
struct Claim {
    /// Its files' prefix under tests/data/h200/soak.
    run: &'static str,
    /// The agent's CPU per kill in every full minute lies in this band (ms).
    cpu_per_kill_ms: (f64, f64),
}

const CLAIMS: &[Claim] = &[
    Claim {
        run: "children-8m-169f545",
        cpu_per_kill_ms: (5.7, 6.6),
    },
    Claim {
        run: "lean-children-8m-169f545",
        cpu_per_kill_ms: (5.7, 6.5),
    },
];

/// The gauge must be 0 this long after the last release.
const GAUGE_ZERO_BY_NS: u64 = 2_000_000_000;
/// The RSS of the last full minute is at most this much above the first's.
const RSS_GROWTH: f64 = 1.05;

fn field(row: &Value, name: &str) -> f64 {
    row[name]
        .as_f64()
        .unwrap_or_else(|| panic!("{name} in {row}"))
}

/// Per full minute from the first scrape: (kills, CPU seconds, RSS at its end).
fn minutes(rows: &[Value]) -> Vec<(f64, f64, f64)> {
    let t0 = field(&rows[0], "t_ns");
    let mut out = Vec::new();
    let mut start = &rows[0];
    for row in rows {
        if field(row, "t_ns") - field(start, "t_ns") >= 60e9 {
            out.push((
                field(row, "kills") - field(start, "kills"),
                field(row, "cpu_s") - field(start, "cpu_s"),
                field(row, "rss"),
            ));
            start = row;
        }
    }
    assert!(
        out.len() >= 7,
        "{} full minutes from {t0}: not an 8-minute run",
        out.len()
    );
    out
}

/// When the soak's last process was reaped.
fn last_release(truth: &[Value]) -> u64 {
    truth
        .iter()
        .filter_map(|r| r["reaped"].as_object())
        .flat_map(|reaped| reaped.values().filter_map(Value::as_u64))
        .max()
        .expect("reaps")
}

#[test]
fn the_soak_tables_cpu_rss_and_gauge_are_what_the_scrapes_say() {
    let dir = h200().join("soak");
    let truth = json_lines(&dir.join("children-8m-169f545-truth.jsonl.zst"));
    let last = last_release(&truth);
    for claim in CLAIMS {
        let rows: Vec<Value> = json_lines(&dir.join(format!("{}-metrics.jsonl.zst", claim.run)))
            .into_iter()
            .filter(|r| r.get("cpu_s").is_some())
            .collect();
        let minutes = minutes(&rows);
        let (low, high) = claim.cpu_per_kill_ms;
        for (n, (kills, cpu, _)) in minutes.iter().enumerate() {
            let per_kill = cpu / kills * 1e3;
            assert!(
                (low..=high).contains(&per_kill),
                "{}: minute {n}: {per_kill:.2} ms a kill, outside the table's {low}-{high}",
                claim.run
            );
        }
        let (first, end) = (minutes[0].2, minutes[minutes.len() - 1].2);
        assert!(
            end <= first * RSS_GROWTH,
            "{}: RSS {first} -> {end}",
            claim.run
        );
        let after = rows
            .iter()
            .find(|r| {
                r["t_ns"]
                    .as_u64()
                    .is_some_and(|t| t > last + GAUGE_ZERO_BY_NS)
            })
            .unwrap_or_else(|| panic!("{}: no scrape 2 s after the last release", claim.run));
        assert_eq!(field(after, "lingering"), 0.0, "{}: {after}", claim.run);
    }
}
