//! Section 9: the whole replay (reader, correlator, every sink) under libFuzzer, as a campaign
//! of a fixed number of executions from a fresh corpus seeded with the committed recordings:
//! one job per CPU, each its own process with its own share of the runs, sharing the corpus.

use std::{fmt::Write, fs, path::Path, process::Command, time::Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::{results::Measured, table::Target};

/// The campaign's size that the target asks for, without a finding.
pub const RUNS_TARGET: u64 = 10_000_000;
/// Inputs are cut to this length: a whole replay of small inputs runs thousands of times a
/// second, of the 256 KiB recordings a few times (CI's minute runs those whole).
pub const MAX_LEN: u64 = 4096;
pub const TARGET: &str = "whole_replay";

/// Runs `runs` executions of the fuzz target `bin` (built with the benchmarks) in all, split
/// over `jobs` processes.
pub fn campaign(root: &Path, bin: &Path, runs: u64, jobs: u64) -> Result<Measured> {
    let work = root.join("target/bench/fuzz");
    let corpus = work.join("corpus");
    if work.exists() {
        fs::remove_dir_all(&work)?;
    }
    crate::fuzz::seed(&root.join("tests/data"), &corpus)?;
    let seeds = fs::read_dir(&corpus)?.count();
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
         corpus {}  # built by `cargo xtask fuzz`; corpus/ seeded with tests/data's recordings",
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
    let stat = |name: &str| -> Option<u64> {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse().ok())
    };
    // "#5000000\tDONE   cov: 2572 ft: 11021 corp: 880/312Kb lim: 4096 exec/s: 3926 rss: 412Mb"
    let done = log
        .lines()
        .rev()
        .find(|l| l.split_whitespace().nth(1) == Some("DONE"));
    let field = |name: &str| -> Option<u64> {
        let mut words = done?.split_whitespace();
        words.find(|w| *w == name)?;
        words.next()?.parse().ok()
    };
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
        "cov": field("cov:"),
        "ft": field("ft:"),
        "finished": done.is_some(),
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
         instrumentation by the pinned nightly, from a fresh corpus of the {} committed \
         recordings, inputs cut to {} bytes; {} jobs of {} runs, {:.0} s in all.\n",
        d["seeds"],
        d["max_len"],
        jobs.len(),
        d["runs_per_job"],
        d["wall_s"].as_f64().unwrap_or(0.0)
    );
    md.push_str("| Job | Runs | Seconds | Runs/s | Coverage (edges) | Features | Peak RSS |\n|---|---|---|---|---|---|---|\n");
    let mut total = 0;
    let mut stopped = 0;
    for (i, job) in jobs.iter().enumerate() {
        total += job["runs"].as_u64().context("fuzz: runs")?;
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
    targets.push(Target {
        what: format!(
            "The whole replay under libFuzzer: at least {RUNS_TARGET} executions without a finding"
        ),
        measured: format!(
            "{total} executions, {} findings, {stopped} jobs stopped early",
            findings.len()
        ),
        met: total >= RUNS_TARGET && findings.is_empty() && stopped == 0,
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
