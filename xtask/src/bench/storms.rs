//! Section 1: process storms with `linger live` attached.

use std::fmt::Write;

use anyhow::{Context, Result};

use super::{
    plan::{Plan, STORM_TARGET},
    results::Measured,
    rounds::Rounds,
    stats::summarize,
    table::{range_int, Target},
};

/// The variants of every storm, in the order each round starts them: the second baseline
/// measures the noise.
pub const VARIANTS: [&str; 3] = ["base", "live", "base"];
/// A fourth variant of the kill-exec storm: the same hooks with programs that only count.
pub const SAME_HOOKS: &str = "cmd bpftrace scripts/bench/same-hooks.bt";
/// A fifth: linger with the system call tracepoints, as on a GPU node of this kernel whose
/// NVIDIA libraries are not found (this machine has no driver, so its default attaches none).
pub const SYSCALL_HOOKS: &str = "live --syscall-hooks";

pub fn section(
    md: &mut String,
    plan: &Plan,
    storms: &[Measured],
    targets: &mut Vec<Target>,
) -> Result<()> {
    md.push_str("\n## 1. Process storms: slowdown with `linger live` attached\n\n");
    let _ = writeln!(
        md,
        "Each run repeats one workload in a loop from a single-threaded process, timed by wall \
         clock; {} rounds per workload, after one untimed warm-up run, each round running a \
         baseline, a traced run and a second baseline (the *no-tracer band*: second baseline / \
         first, what the machine's noise alone makes of a ratio), in rotating order. `kill-exec` \
         also runs beside `{SAME_HOOKS}`: bpftrace on the hooks linger attaches here, each \
         program only counting (the cost of the hooks themselves, whoever traces), and under \
         `linger {}`: the system call tracepoints that a GPU node of this kernel without the \
         NVIDIA libraries gets (this machine has no NVIDIA driver, so its default attaches \
         none). The workloads:\n",
        plan.storm_rounds,
        SYSCALL_HOOKS.trim_start_matches("live ")
    );
    let _ = writeln!(
        md,
        "- `kill-threads`: fork() a child that starts {} threads in all and says so through a \
         pipe; SIGKILL it; waitpid() it. Each kill is an incident with {} thread exits and \
         signal deliveries, a SIGCHLD and a reap: the tracer's busiest path.",
        plan.storm_threads, plan.storm_threads
    );
    md.push_str(
        "- `kill-exec`: spawn `/bin/sleep 60` (fork and exec), SIGKILL it, waitpid() it.\n\
         - `spawn-true`: spawn `/bin/true` and wait for it: fork, exec and exit, no signal and \
         no incident (the tracer still records every fork, exec and process exit). Nothing in \
         the output shows that it traced this one, beyond the CPU time `linger live` spent.\n\
         - `kill-exec, pinned`: `kill-exec` with the workload (and the children it spawns) on \
         CPU 0 and `linger live` on the other CPUs, moved there once attached. On a 2-CPU \
         machine the unpinned storm also measures two processes sharing two CPUs: the kernel \
         places each new child, and the collector's wake-ups, wherever a CPU looks free. Pinned, \
         what is left is what the tracer costs the workload where a core is free for it, as on \
         a GPU node with dozens (its programs in the workload's path, and whatever the \
         collector's work on the other CPU costs through shared caches). It is not a target.\n\n",
    );
    md.push_str(TABLE_HEAD);
    let mut per_pair = String::new();
    for m in storms {
        let r = Rounds::new(m)?;
        let r = if r.variants().len() == VARIANTS.len() {
            r.expect(&VARIANTS)?
        } else {
            r.expect(&[VARIANTS.as_slice(), &[SAME_HOOKS, SYSCALL_HOOKS]].concat())?
        };
        let row = Row::new(&r)?;
        md.push_str(&row.markdown);
        let _ = writeln!(per_pair, "- `{}`: {}", r.label(), pairs(&r)?);
        let others = r.disturbed();
        if others > 0 {
            let _ = writeln!(
                per_pair,
                "  ({others} of these pairs ran while another `linger live` was running on the \
                 machine, which traced their baseline too)"
            );
        }
        if r.pinned() {
            // Where the cost comes from, not what a user of this machine sees: no target.
            continue;
        }
        targets.push(Target {
            what: format!(
                "`{}` storm: slowdown with `linger live` attached ≤ {STORM_TARGET}",
                r.workload()
            ),
            measured: format!(
                "{:.3} (median of {} pairs; {:.3} – {:.3})",
                row.ratio.median, row.ratio.n, row.ratio.min, row.ratio.max
            ),
            met: row.ratio.median <= STORM_TARGET,
        });
    }
    let cpus = storms
        .first()
        .and_then(|m| m.data["cpus"].as_f64())
        .unwrap_or(1.0);
    let _ = writeln!(md, "\n{}", footnote(cpus));
    md.push_str(&per_pair);
    md.push_str("\nCommands:\n\n```sh\n");
    for m in storms {
        let _ = writeln!(md, "{}", m.command);
    }
    md.push_str("```\n");
    Ok(())
}

pub const TABLE_HEAD: &str = "| Workload | Iterations per run | Baseline, µs per iteration | \
Traced, µs per iteration | Slowdown (median) | Spread (min – max) | No-tracer band (median; \
min – max) | Workload CPU time, traced / baseline (median; no-tracer band) | Same hooks in \
bpftrace (median) | `linger live --syscall-hooks` (median) | `linger live` CPU, µs per \
iteration (% of one core) | `linger live` wake-ups per iteration | Machine busy, baseline / traced | Incidents per \
traced run | Dropped records |\n\
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";

/// What the storm tables' columns mean, and the list of pairs that follows.
pub fn footnote(cpus: f64) -> String {
    format!(
        "*Slowdown*: traced run time / baseline run time of the same pair. *Workload CPU \
         time*: the CPU time of the workload and its children (getrusage), traced / baseline: \
         what the tracer adds in the workload's own path (its programs, the hooks, the system \
         call slow path), without the time spent waiting for a CPU the collector held, which \
         the slowdown includes. *Machine busy*: the \
         share of all CPUs busy during a run (/proc/stat), whoever used them; the workload \
         alone keeps about one of the {cpus} CPUs busy, so a baseline figure well above {:.0} % \
         means other jobs were competing. *Wake-ups*: voluntary context switches of `linger \
         live`. Every round's slowdown, with the order its runs went in (A baseline, B traced, C \
         the second baseline, D bpftrace, E `--syscall-hooks`) and the machine busy during its baseline / traced \
         run:\n",
        100.0 / cpus
    )
}

/// One workload's row: baseline vs the first traced variant, whole runs.
pub struct Row {
    pub ratio: super::stats::Summary,
    pub markdown: String,
}

impl Row {
    pub fn new(r: &Rounds) -> Result<Self> {
        let iterations = super::table::num(r.data, "iterations")?;
        let us = |s: f64| s / iterations * 1e6;
        let base = r.part_summary(0, 0)?;
        let traced = r.part_summary(1, 0)?;
        let ratio = r.ratio_summary(1, 0)?;
        let band = r.ratio_summary(2, 0)?;
        let (same_hooks, syscall_hooks) = match r.variants().len() > VARIANTS.len() {
            true => (
                format!("{:.3}", r.ratio_summary(3, 0)?.median),
                format!("{:.3}", r.ratio_summary(4, 0)?.median),
            ),
            false => ("–".to_string(), "–".to_string()),
        };
        let work_cpu = r.field_ratio_summary(1, "cpu_s")?;
        let work_band = r.field_ratio_summary(2, "cpu_s")?;
        let cpu = r.field_summary(1, "linger_cpu_s")?;
        let walls = r.field(1, "wall_s")?;
        let cpus = r.field(1, "linger_cpu_s")?;
        let shares: Vec<f64> = cpus.iter().zip(&walls).map(|(c, w)| c / w).collect();
        let share = summarize(&shares).context("no rounds")?;
        let wakeups = r.field_summary(1, "linger_wakeups")?;
        let base_busy = r.field_summary(0, "busy")?;
        let traced_busy = r.field_summary(1, "busy")?;
        let incidents = r.field_summary(1, "incidents")?;
        let losses = r.field_summary(1, "losses")?;
        let kills = super::table::num(r.data, "kills_per_run")?;
        let markdown = format!(
            "| `{}` | {iterations} | {:.1} | {:.1} | **{:.3}** | {:.3} – {:.3} | {:.3}; {:.3} – \
             {:.3} | {:.3}; {:.3} | {same_hooks} | {syscall_hooks} | {:.1} ({:.0} %) | {:.1} | {:.0} % / {:.0} % | {} (kills: \
             {kills}) | {} |\n",
            r.label(),
            us(base.median),
            us(traced.median),
            ratio.median,
            ratio.min,
            ratio.max,
            band.median,
            band.min,
            band.max,
            work_cpu.median,
            work_band.median,
            us(cpu.median),
            share.median * 100.0,
            wakeups.median / iterations,
            base_busy.median * 100.0,
            traced_busy.median * 100.0,
            range_int(&incidents),
            range_int(&losses),
        );
        Ok(Self { ratio, markdown })
    }
}

/// Every pair's ratio, in run order, with the machine's busy share.
pub fn pairs(r: &Rounds) -> Result<String> {
    let ratios = r.ratios(1, 0)?;
    let base_busy = r.field(0, "busy")?;
    let traced_busy = r.field(1, "busy")?;
    Ok(r.orders()
        .zip(ratios)
        .zip(base_busy.iter().zip(&traced_busy))
        .map(|((order, ratio), (b, t))| {
            format!(
                "{ratio:.3} ({order}, busy {:.0}/{:.0} %)",
                b * 100.0,
                t * 100.0
            )
        })
        .collect::<Vec<_>>()
        .join(", "))
}
