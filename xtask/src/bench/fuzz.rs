//! Section 9: the whole replay (reader, correlator, every sink) under libFuzzer, as a campaign
//! of a fixed number of executions from a fresh corpus seeded as CI's minute is (the committed
//! recordings cut into small whole recordings, minimized): one job per CPU, each its own
//! process with its own share of the runs, sharing the corpus. Its edges are counted against
//! those a run over the whole recordings reaches.

use std::{fmt::Write, fs, path::Path, process::Command, time::Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::{results::Measured, table::Target};
use crate::fuzz::{done_field, final_stat, MAX_LEN};

/// The campaign's size that the target asks for, without a finding: whole replays of inputs
/// up to [`MAX_LEN`], some 400 a second a core here.
pub const RUNS_TARGET: u64 = 400_000;
/// The share of the whole recordings' edges the campaign must reach.
pub const EDGES_TARGET: f64 = 0.8;
pub const TARGET: &str = "whole_replay";

/// Runs `runs` executions of the fuzz target `bin` (built with the benchmarks) in all, split
/// over `jobs` processes.
pub fn campaign(root: &Path, bin: &Path, runs: u64, jobs: u64) -> Result<Measured> {
    let work = root.join("target/bench/fuzz");
    let corpus = work.join("corpus");
    if work.exists() {
        fs::remove_dir_all(&work)?;
    }
    let pieces = crate::fuzz::seed(root, bin, &corpus)?;
    let seeds = fs::read_dir(&corpus)?.count();
    let reference = crate::fuzz::reference_edges(root, bin)?;
    let per_job = runs.div_ceil(jobs);
    let options = [
        format!("-max_len={MAX_LEN}"),
        format!("-runs={per_job}"),
        format!("-jobs={jobs}"),
        format!("-workers={jobs}"),
        "-print_final_stats=1".to_string(),
    ];
    let command = format!(
        "cd target/bench/fuzz && ../../../fuzz/target/x86_64-unknown-linux-gnu/release/{TARGET} \
         corpus {}  # built by `cargo xtask fuzz`; corpus/ seeded as `cargo xtask fuzz` seeds it",
        options.join(" ")
    );
    eprintln!("\nxtask bench: {command}");
    let started = Instant::now();
    // A job's finding ends it with an error status: the logs and crash files below say so.
    Command::new(bin)
        .arg(&corpus)
        .args(&options)
        .current_dir(&work)
        .status()
        .context("running the fuzz target")?;
    let wall_s = started.elapsed().as_secs_f64();
    let jobs_seen: Vec<Value> = (0..jobs)
        .map(|job| job_log(&work.join(format!("fuzz-{job}.log"))))
        .collect::<Result<_>>()?;
    let findings: Vec<String> = fs::read_dir(&work)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            ["crash-", "timeout-", "oom-", "leak-"]
                .iter()
                .any(|p| name.starts_with(p))
        })
        .collect();
    let data = json!({
        "pieces": pieces,
        "reference_edges": reference,
        "seeds": seeds,
        "max_len": MAX_LEN,
        "runs_per_job": per_job,
        "wall_s": wall_s,
        "jobs": jobs_seen,
        "findings": findings,
    });
    Ok(Measured { command, data })
}

/// What one job's log says at its end: runs, seconds, coverage, features, speed and memory.
fn job_log(path: &Path) -> Result<Value> {
    let log = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let stat = |name: &str| final_stat(&log, name);
    let seconds = log
        .lines()
        .find_map(|l| l.strip_prefix("Done "))
        .and_then(|rest| rest.split(" runs in ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|s| s.parse::<u64>().ok());
    Ok(json!({
        "runs": stat("number_of_executed_units"),
        "seconds": seconds,
        "exec_per_s": stat("average_exec_per_sec"),
        "peak_rss_mb": stat("peak_rss_mb"),
        "cov": done_field(&log, "cov:"),
        "ft": done_field(&log, "ft:"),
        "finished": done_field(&log, "cov:").is_some(),
    }))
}

pub fn section(md: &mut String, fuzz: &Measured, targets: &mut Vec<Target>) -> Result<()> {
    let d = &fuzz.data;
    let jobs = d["jobs"].as_array().context("fuzz: jobs")?;
    let findings = d["findings"].as_array().context("fuzz: findings")?;
    md.push_str("\n## 9. The whole replay under libFuzzer\n\n");
    let _ = writeln!(
        md,
        "The fuzz target `whole_replay` (`fuzz/`: any bytes through the trace reader, the \
         correlator with the recording's own options, the text and JSON reports, Perfetto, \
         folded stacks and the flamegraph, the stats table), built with libFuzzer's coverage \
         instrumentation by the pinned nightly, from a fresh corpus: the committed recordings \
         cut into {} whole recordings of at most {} bytes, minimized to {}; {} jobs of {} runs, \
         {:.0} s in all. The whole recordings (up to 256 KiB) reach {} edges.\n",
        d["pieces"],
        d["max_len"],
        d["seeds"],
        jobs.len(),
        d["runs_per_job"],
        d["wall_s"].as_f64().unwrap_or(0.0),
        d["reference_edges"]
    );
    md.push_str("| Job | Runs | Seconds | Runs/s | Coverage (edges) | Features | Peak RSS |\n|---|---|---|---|---|---|---|\n");
    let mut total = 0;
    let mut stopped = 0;
    let mut edges = 0;
    for (i, job) in jobs.iter().enumerate() {
        total += job["runs"].as_u64().context("fuzz: runs")?;
        edges = edges.max(job["cov"].as_u64().unwrap_or(0));
        // A job stops early at its first finding, without its last coverage line.
        let finished = job["finished"] == true;
        stopped += u64::from(!finished);
        let _ = writeln!(
            md,
            "| {i}{} | {} | {} | {} | {} | {} | {} MB |",
            if finished { "" } else { " (stopped)" },
            shown(&job["runs"]),
            shown(&job["seconds"]),
            shown(&job["exec_per_s"]),
            shown(&job["cov"]),
            shown(&job["ft"]),
            shown(&job["peak_rss_mb"])
        );
    }
    let _ = writeln!(
        md,
        "\n{total} executions; findings (crash, timeout, out-of-memory or leak files): {}.",
        if findings.is_empty() {
            "none".to_string()
        } else {
            findings
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    let reference = d["reference_edges"]
        .as_u64()
        .context("fuzz: reference_edges")?;
    let share = edges as f64 / reference.max(1) as f64;
    targets.push(Target {
        what: format!(
            "The whole replay under libFuzzer: at least {RUNS_TARGET} executions without a \
             finding, reaching {:.0} % of the edges the whole recordings reach",
            EDGES_TARGET * 100.0
        ),
        measured: format!(
            "{total} executions, {} findings, {stopped} jobs stopped early; {edges} edges of \
             {reference} ({:.0} %)",
            findings.len(),
            share * 100.0
        ),
        met: total >= RUNS_TARGET && findings.is_empty() && stopped == 0 && share >= EDGES_TARGET,
    });
    let _ = writeln!(md, "\nCommand:\n\n```sh\n{}\n```", fuzz.command);
    Ok(())
}

/// A figure of a job's log, or a dash where the log (of a job stopped early) has none.
fn shown(figure: &Value) -> String {
    figure
        .as_u64()
        .map_or_else(|| "–".to_string(), |n| n.to_string())
}
