//! BENCHMARKS.md from the benchmarks' JSON results.

use std::fmt::Write;

use anyhow::{Context, Result};
use serde_json::Value;

use super::{
    stats::{summarize, Summary},
    Machine, Measured, Plan, Results, DEFAULT_RING, RING_TARGET_PER_S, STORM_TARGET,
};

pub struct Report {
    pub markdown: String,
    /// One line per target, for the terminal.
    pub verdicts: Vec<String>,
    pub all_met: bool,
}

struct Target {
    what: String,
    measured: String,
    met: bool,
}

pub fn render(machine: &Machine, plan: &Plan, results: &Results, quick: bool) -> Result<Report> {
    let mut targets = Vec::new();
    let mut body = String::new();
    storm_section(&mut body, plan, &results.storm, &mut targets)?;
    ring_section(&mut body, results, &mut targets)?;

    let mut md = String::new();
    md.push_str("# Benchmarks\n\n");
    md.push_str(
        "Written by `cargo xtask bench` (as root); do not edit by hand, run it again to \
         refresh. Every figure below comes from the one run described here, and each section \
         gives the exact command that produced it (run from the workspace root after \
         `cargo xtask build` and `cargo build --release -p linger-tests --bin linger-bench-storm --bin linger-bench-ring`).\n\n",
    );
    if quick {
        md.push_str(
            "**This is a `--quick` run: too few and too short runs for the figures to mean \
             much.**\n\n",
        );
    }
    md.push_str("| | |\n|---|---|\n");
    let _ = writeln!(md, "| Date | {} |", machine.date);
    let _ = writeln!(
        md,
        "| Machine | {} CPUs (`nproc`), {}{} |",
        machine.nproc,
        machine.cpu,
        if machine.virtualized {
            ", virtual machine"
        } else {
            ""
        }
    );
    let _ = writeln!(md, "| Kernel | {} (`uname -r`) |", machine.kernel);
    let _ = writeln!(md, "| Commit | {} |", machine.commit);
    let _ = writeln!(
        md,
        "| Load average (1, 5, 15 min) | {} before, {} after |",
        machine.load_before, machine.load_after
    );
    let _ = writeln!(
        md,
        "| Benchmark time | {:.0} s, builds not counted |\n",
        machine.duration_s
    );

    md.push_str("## Targets\n\n| Target | Measured | Result |\n|---|---|---|\n");
    for t in &targets {
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            t.what,
            t.measured,
            if t.met { "met" } else { "**missed**" }
        );
    }
    md.push_str(&method(plan));
    md.push_str(&body);

    let verdicts = targets
        .iter()
        .map(|t| {
            let verdict = if t.met { "met   " } else { "MISSED" };
            format!("{verdict} {}: {}", t.what, t.measured)
        })
        .collect();
    let all_met = targets.iter().all(|t| t.met);
    Ok(Report {
        markdown: md,
        verdicts,
        all_met,
    })
}

fn method(plan: &Plan) -> String {
    format!(
        "
## Method

- **Side by side.** The machine is shared and noisy, so no figure is compared with one from \
another day: a slowdown is the ratio of a traced run to the baseline run next to it, in one \
invocation. Baseline and traced runs are interleaved in pairs whose order alternates (AB, BA, AB, \
...), so a slow drift of the background load cancels; the tables give the median over pairs and \
the spread (lowest and highest).
- **Priority.** Every benchmark process renices itself to {nice} first; the workloads' children \
and the tracer the storm benchmark starts inherit it. Unrelated jobs on the machine (builds, \
other benchmarks) then take only the CPU time left over, though they still disturb caches and \
wake-up latencies: the storm tables show how busy the machine was.
- **Real use.** The tracer runs as users run it: a separate `linger live --json` process, started \
and attached before a traced run begins (its start-up is not timed) and stopped with SIGINT after \
it. Its output goes to a file, so that each traced run can be checked: it must contain exactly \
one SIGKILL incident from the benchmark for each kill sent, or the benchmark fails.
- **The collector path.** The ring buffer benchmark drains the ring with the live collector's own \
code: `KernelSource::readable()`, `drain()` (ring read and decode) and `poll_drops()` every \
`TICK` (20 ms), as `source::collect::run` does, counting events instead of correlating them.
- **Clocks.** Wall clock for the workloads (`Instant`), per-thread CPU time for the collector \
(`CLOCK_THREAD_CPUTIME_ID`), `/proc/PID/task/*/schedstat` and `voluntary_ctxt_switches` for \
`linger live`, `/proc/stat` for the whole machine.
",
        nice = plan.nice
    )
}

/// Figure 1: slowdown of process storms with `linger live` attached.
fn storm_section(
    md: &mut String,
    plan: &Plan,
    storms: &[Measured],
    targets: &mut Vec<Target>,
) -> Result<()> {
    md.push_str("\n## 1. Process storms: slowdown with `linger live` attached\n\n");
    let _ = writeln!(
        md,
        "Each run repeats one workload in a loop from a single-threaded process, timed by wall \
         clock; {} pairs of runs (one baseline, one traced) per workload, after one untimed \
         warm-up run. The workloads:\n",
        plan.storm_pairs
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
         the output shows that it traced this one, beyond the CPU time `linger live` spent.\n\n",
    );
    md.push_str(
        "| Workload | Iterations per run | Baseline, µs per iteration | Traced, µs per \
         iteration | Slowdown (median) | Spread (min – max) | `linger live` CPU, µs per \
         iteration (% of one core) | `linger live` wake-ups per iteration | Machine busy, \
         baseline / traced | Incidents per traced run | Dropped records |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut per_pair = String::new();
    for m in storms {
        let d = &m.data;
        let workload = d["workload"].as_str().unwrap_or("?");
        let iterations = num(d, "iterations")?;
        let pairs = d["pairs"]
            .as_array()
            .context("storm result without pairs")?;
        let col = |key: &str| -> Result<Summary> { summary(pairs, key) };
        let per_pair_of = |f: &dyn Fn(&Value) -> Result<f64>| -> Result<Summary> {
            let v: Vec<f64> = pairs.iter().map(f).collect::<Result<_>>()?;
            summarize(&v).context("no pairs")
        };
        let base = col("base_s")?;
        let traced = col("traced_s")?;
        let ratio = col("ratio")?;
        let cpu = col("linger_cpu_s")?;
        let share = per_pair_of(&|p| Ok(num(p, "linger_cpu_s")? / num(p, "traced_s")?))?;
        let wakeups = col("linger_wakeups")?;
        let base_busy = col("base_busy")?;
        let traced_busy = col("traced_busy")?;
        let incidents = col("incidents")?;
        let losses = col("losses")?;
        let kills = num(d, "kills_per_run")?;
        let us = |s: f64| s / iterations * 1e6;
        let _ = writeln!(
            md,
            "| `{workload}` | {iterations} | {:.1} | {:.1} | **{:.3}** | {:.3} – {:.3} | {:.1} \
             ({:.0} %) | {:.1} | {:.0} % / {:.0} % | {} (kills: {kills}) | {} |",
            us(base.median),
            us(traced.median),
            ratio.median,
            ratio.min,
            ratio.max,
            us(cpu.median),
            share.median * 100.0,
            wakeups.median / iterations,
            base_busy.median * 100.0,
            traced_busy.median * 100.0,
            range_int(&incidents),
            range_int(&losses),
        );
        let ratios: Vec<String> = pairs
            .iter()
            .map(|p| {
                let f = |k: &str| p[k].as_f64().unwrap_or(f64::NAN);
                format!(
                    "{:.3} ({}, busy {:.0}/{:.0} %)",
                    f("ratio"),
                    p["order"].as_str().unwrap_or("?"),
                    f("base_busy") * 100.0,
                    f("traced_busy") * 100.0,
                )
            })
            .collect();
        let _ = writeln!(per_pair, "- `{workload}`: {}", ratios.join(", "));
        let others = pairs
            .iter()
            .filter(|p| p["other_lingers"].as_u64().unwrap_or(0) > 0)
            .count();
        if others > 0 {
            let _ = writeln!(
                per_pair,
                "  ({others} of these pairs ran while another `linger live` was running on the \
                 machine, which traced their baseline too)"
            );
        }
        targets.push(Target {
            what: format!(
                "`{workload}` storm: slowdown with `linger live` attached ≤ {STORM_TARGET}"
            ),
            measured: format!(
                "{:.3} (median of {} pairs; {:.3} – {:.3})",
                ratio.median, ratio.n, ratio.min, ratio.max
            ),
            met: ratio.median <= STORM_TARGET,
        });
    }
    let cpus = storms
        .first()
        .and_then(|m| m.data["cpus"].as_f64())
        .unwrap_or(1.0);
    let _ = writeln!(
        md,
        "\n*Slowdown*: traced run time / baseline run time of the same pair. *Machine busy*: \
         the share of all CPUs busy during a run (/proc/stat), whoever used them; the workload \
         alone keeps about one of the {cpus} CPUs busy, so a baseline figure well above {:.0} % \
         means other jobs were competing. *Wake-ups*: voluntary context switches of `linger \
         live`. Every pair, in run order (A baseline, B traced), with the machine busy during \
         its baseline / traced run:\n",
        100.0 / cpus
    );
    md.push_str(&per_pair);
    md.push_str("\nCommands:\n\n```sh\n");
    for m in storms {
        let _ = writeln!(md, "{}", m.command);
    }
    md.push_str("```\n");
    Ok(())
}

/// Figure 2: ring buffer throughput into the collector, and its side figures.
fn ring_section(md: &mut String, results: &Results, targets: &mut Vec<Target>) -> Result<()> {
    let sweep = results.sweep.as_ref().context("no sweep result")?;
    let syscall = results.syscall.as_ref().context("no syscall result")?;
    let decode = results.decode.as_ref().context("no decode result")?;
    let runs = sweep.data["runs"]
        .as_array()
        .context("sweep result without runs")?;
    let seconds = num(&sweep.data, "seconds")?;

    md.push_str("\n## 2. Ring buffer throughput into the collector\n\n");
    let _ = writeln!(
        md,
        "The eBPF program `bench_tick` writes one 56-byte record (64 bytes in the ring with its \
         header) per getppid() call of the benchmark process. Generator threads of that process \
         call getppid() for {seconds} s per run, paced to a target rate (checking the clock \
         every 32 calls and spinning when ahead) or flat out (`max`; `@2`: two generator \
         threads, which with the collector's thread is more than the 2 CPUs can run at once). \
         The main thread drains the ring as the live collector does. Each ring size is loaded \
         once; the rates then take turns, round after round. *Offered*: calls per second of \
         the generators; *delivered*: records that reached the collector per second, until the \
         last one arrived; *backlog*: how long after the generators stopped records were still \
         arriving.\n"
    );

    let groups = group_runs(runs);
    md.push_str(
        "| Ring size | Rate | Offered, M/s | Delivered, M/s (median, min – max) | Rounds with \
         drops | Dropped per run, median (worst run, % of records) | Backlog, ms (max) | Collector CPU, % of one core | \
         Collector CPU, ns per record | Records per wake-up |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut rows = Vec::new();
    for (ring, label, group) in &groups {
        let row = SweepRow::new(*ring, label, group)?;
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} ({:.2} – {:.2}) | {} of {} | {} ({:.2} %) | {:.1} | {:.0} \
             | {:.0} | {:.1} |",
            size(*ring),
            label,
            row.offered.median / 1e6,
            row.delivered.median / 1e6,
            row.delivered.min / 1e6,
            row.delivered.max / 1e6,
            row.rounds_with_drops,
            row.delivered.n,
            row.drops_median,
            row.drop_pct_max,
            row.lag_ms_max,
            row.cpu_pct.median,
            row.cpu_ns_per_record.median,
            row.per_wakeup.median,
        );
        rows.push(row);
    }

    md.push_str(
        "\nBy ring size (a row counts as drop-free when no round of it dropped a record):\n\n",
    );
    md.push_str(
        "| Ring size | Records it holds | Highest drop-free rate, delivered M/s | Drops begin \
         at |\n|---|---|---|---|\n",
    );
    let mut default_best: Option<Option<&SweepRow>> = None;
    let mut ring_sizes: Vec<u32> = rows.iter().map(|r| r.ring).collect();
    ring_sizes.dedup();
    for ring in ring_sizes {
        let of_ring: Vec<&SweepRow> = rows.iter().filter(|r| r.ring == ring).collect();
        let best = of_ring
            .iter()
            .filter(|r| r.rounds_with_drops == 0)
            .max_by(|a, b| a.delivered.median.total_cmp(&b.delivered.median));
        let first_drop = of_ring
            .iter()
            .filter(|r| r.rounds_with_drops > 0)
            .min_by(|a, b| a.offered.median.total_cmp(&b.offered.median));
        if ring == DEFAULT_RING {
            default_best = Some(best.copied());
        }
        let _ = writeln!(
            md,
            "| {}{} | {} | {} | {} |",
            size(ring),
            if ring == DEFAULT_RING {
                " (default)"
            } else {
                ""
            },
            ring / 64,
            best.map_or("none".into(), |b| format!(
                "{:.2} (rate {})",
                b.delivered.median / 1e6,
                b.label
            )),
            first_drop.map_or(
                "no drops up to the highest rate offered".into(),
                |r| format!(
                    "rate {} (offered {:.2} M/s)",
                    r.label,
                    r.offered.median / 1e6
                )
            ),
        );
    }
    if let Some(best) = default_best {
        // A generator paced to 2 M/s delivers a hair under it: 1 % of slack.
        let rate = best.map_or(0.0, |b| b.delivered.median);
        targets.push(Target {
            what: format!(
                "Ring buffer into the collector: ≥ {} M records/s with zero drops (default {} ring)",
                RING_TARGET_PER_S / 1e6,
                size(DEFAULT_RING)
            ),
            measured: best.map_or("drops at every rate".into(), |b| {
                format!(
                    "{:.2} M/s with no drop in {} rounds (rate {})",
                    rate / 1e6,
                    b.delivered.n,
                    b.label
                )
            }),
            met: rate >= 0.99 * RING_TARGET_PER_S,
        });
    }
    let _ = writeln!(md, "\nCommand:\n\n```sh\n{}\n```", sweep.command);

    let kernel = syscall_table(md, syscall)?;
    let decode_ns = decode_table(md, decode)?;
    where_time_goes(md, &rows, kernel, decode_ns);
    Ok(())
}

/// Per-record cost on the producing side: getppid() untraced vs with `bench_tick` attached.
/// Returns (ns added per record, flat-out traced rate).
fn syscall_table(md: &mut String, syscall: &Measured) -> Result<(f64, f64)> {
    let rounds = syscall.data["rounds"]
        .as_array()
        .context("syscall result without rounds")?;
    let base = summary(rounds, "untraced_per_s")?;
    let traced = summary(rounds, "traced_per_s")?;
    let ratios: Vec<f64> = rounds
        .iter()
        .map(|r| Ok(num(r, "untraced_per_s")? / num(r, "traced_per_s")?))
        .collect::<Result<_>>()?;
    let ratio = summarize(&ratios).context("no rounds")?;
    let added_ns = 1e9 / traced.median - 1e9 / base.median;
    let drops = summary(rounds, "drops")?;
    md.push_str("\n### 2b. Cost of a record on the producing side\n\n");
    md.push_str(
        "One generator thread calls getppid() flat out, with no program attached and then with \
         `bench_tick` attached and its records drained as above (64 MiB ring), alternating \
         (probes loaded and unloaded each round).\n\n\
         | Rounds | getppid() untraced, M/s | With a record per call, M/s | Slowdown (median, \
         min – max) | Added per record, ns | Dropped |\n|---|---|---|---|---|---|\n",
    );
    let _ = writeln!(
        md,
        "| {} | {:.2} | {:.2} | {:.2} ({:.2} – {:.2}) | {:.0} | {} |",
        base.n,
        base.median / 1e6,
        traced.median / 1e6,
        ratio.median,
        ratio.min,
        ratio.max,
        added_ns,
        range_int(&drops),
    );
    let _ = writeln!(md, "\nCommand:\n\n```sh\n{}\n```", syscall.command);
    Ok((added_ns, traced.median))
}

/// `decode()` alone; returns ns per BenchTick record.
fn decode_table(md: &mut String, decode: &Measured) -> Result<f64> {
    let d = &decode.data;
    md.push_str("\n### 2c. Decoding alone\n\n");
    md.push_str(
        "`tracer_user::source::decode::decode` over one in-memory record, again and again: a \
         BenchTick (what the ring benchmark carries) and a SignalGenerate (the largest real \
         record; decoding allocates its two comm strings).\n\n\
         | Record | Bytes | M records/s (median, min – max) | ns per record |\n|---|---|---|---|\n",
    );
    let mut tick_ns = f64::NAN;
    for (name, key, bytes) in [
        ("BenchTick", "bench_tick_per_s", "bench_tick"),
        ("SignalGenerate", "signal_generate_per_s", "signal_generate"),
    ] {
        let rates: Vec<f64> = d[key]
            .as_array()
            .context("decode result")?
            .iter()
            .filter_map(Value::as_f64)
            .collect();
        let s = summarize(&rates).context("no decode rounds")?;
        if key == "bench_tick_per_s" {
            tick_ns = 1e9 / s.median;
        }
        let _ = writeln!(
            md,
            "| {name} | {} | {:.1} ({:.1} – {:.1}) | {:.1} |",
            d["record_bytes"][bytes].as_u64().unwrap_or(0),
            s.median / 1e6,
            s.min / 1e6,
            s.max / 1e6,
            1e9 / s.median
        );
    }
    let _ = writeln!(md, "\nCommand:\n\n```sh\n{}\n```", decode.command);
    Ok(tick_ns)
}

/// Splits the collector's cost per record at the default ring and 2 M/s (or the nearest row).
fn where_time_goes(md: &mut String, rows: &[SweepRow], kernel: (f64, f64), decode_ns: f64) {
    md.push_str("\n### 2d. Where the time goes\n\n");
    let (added_ns, traced_flat_out) = kernel;
    let _ = writeln!(
        md,
        "- **Producer.** Each record adds about {added_ns:.0} ns to the getppid() that makes it \
         (the syscall tracepoint, the program, reserving and submitting in the ring, and waking \
         the collector), so one generator thread offers at most about {:.2} M records/s; \
         beyond that (`@2`) two generators and the collector share the CPUs.",
        traced_flat_out / 1e6
    );
    let row = rows
        .iter()
        .filter(|r| r.ring == DEFAULT_RING)
        .min_by(|a, b| {
            let d = |r: &SweepRow| (r.offered.median - RING_TARGET_PER_S).abs();
            d(a).total_cmp(&d(b))
        });
    if let Some(r) = row {
        let drain = r.drain_ns_per_record.median;
        let _ = writeln!(
            md,
            "- **Collector**, at rate {} on the default ring: {:.0} ns of CPU per record in all. \
             Of that, {drain:.0} ns is spent inside `drain()` (ring read, decode, pushing the \
             event), of which decoding alone is about {decode_ns:.0} ns (2c); the other {:.0} ns \
             is the loop around it: waiting in epoll, tokio's reactor and the context switches \
             of about {:.0} thousand wake-ups per second, {:.1} records per wake-up.",
            r.label,
            r.cpu_ns_per_record.median,
            (r.cpu_ns_per_record.median - drain).max(0.0),
            r.wakeups_per_s.median / 1e3,
            r.per_wakeup.median,
        );
    }
    let first_drop = rows
        .iter()
        .filter(|r| r.rounds_with_drops > 0)
        .min_by(|a, b| a.offered.median.total_cmp(&b.offered.median));
    match first_drop {
        None => md.push_str("- **Drops**: no run dropped a record.\n"),
        Some(r) => {
            let records = f64::from(r.ring / 64);
            let _ = writeln!(
                md,
                "- **Drops** first appeared with the {} ring at rate {}, while the collector used \
                 {:.0} % of a CPU: a ring of {records:.0} records fills in {:.1} ms at {:.2} M/s, \
                 so any longer gap between two drains (a wake-up waiting for a CPU that another \
                 thread holds, the generators included) loses records even when the collector \
                 keeps up on average. Larger rings ride out longer gaps.\n",
                size(r.ring),
                r.label,
                r.cpu_pct.median,
                records / r.offered.median * 1e3,
                r.offered.median / 1e6,
            );
        }
    }
}

/// One (ring size, rate) of the sweep, over its rounds.
struct SweepRow {
    ring: u32,
    label: String,
    offered: Summary,
    delivered: Summary,
    rounds_with_drops: usize,
    drops_median: i64,
    drop_pct_max: f64,
    lag_ms_max: f64,
    cpu_pct: Summary,
    cpu_ns_per_record: Summary,
    drain_ns_per_record: Summary,
    per_wakeup: Summary,
    wakeups_per_s: Summary,
}

impl SweepRow {
    fn new(ring: u32, label: &str, runs: &[Value]) -> Result<Self> {
        let per_run = |f: &dyn Fn(&Value) -> Result<f64>| -> Result<Summary> {
            let v: Vec<f64> = runs.iter().map(f).collect::<Result<_>>()?;
            summarize(&v).context("no runs")
        };
        let drops = per_run(&|r| num(r, "drops"))?;
        let per_record = |key: &'static str| {
            move |r: &Value| Ok(num(r, key)? * 1e9 / num(r, "events")?.max(1.0))
        };
        Ok(Self {
            ring,
            label: label.to_string(),
            offered: per_run(&|r| num(r, "offered_per_s"))?,
            delivered: per_run(&|r| num(r, "delivered_per_s"))?,
            rounds_with_drops: runs
                .iter()
                .filter(|r| r["drops"].as_u64().unwrap_or(0) > 0)
                .count(),
            drops_median: drops.median.round() as i64,
            drop_pct_max: per_run(&|r| Ok(100.0 * num(r, "drops")? / num(r, "calls")?.max(1.0)))?
                .max,
            lag_ms_max: per_run(&|r| Ok(num(r, "lag_s")? * 1e3))?.max,
            cpu_pct: per_run(&|r| Ok(100.0 * num(r, "consumer_cpu_s")? / num(r, "gen_wall_s")?))?,
            cpu_ns_per_record: per_run(&per_record("consumer_cpu_s"))?,
            drain_ns_per_record: per_run(&per_record("drain_s"))?,
            per_wakeup: per_run(&|r| Ok(num(r, "events")? / num(r, "wakeups")?.max(1.0)))?,
            wakeups_per_s: per_run(&|r| Ok(num(r, "wakeups")? / num(r, "gen_wall_s")?))?,
        })
    }
}

/// Runs grouped by (ring size, rate), in the order they first appear.
fn group_runs(runs: &[Value]) -> Vec<(u32, String, Vec<Value>)> {
    let mut groups: Vec<(u32, String, Vec<Value>)> = Vec::new();
    for r in runs {
        let ring = r["ring_size"].as_u64().unwrap_or(0) as u32;
        let label = r["rate"].as_str().unwrap_or("?").to_string();
        match groups.iter_mut().find(|g| g.0 == ring && g.1 == label) {
            Some(g) => g.2.push(r.clone()),
            None => groups.push((ring, label, vec![r.clone()])),
        }
    }
    groups
}

fn num(v: &Value, key: &str) -> Result<f64> {
    v[key]
        .as_f64()
        .with_context(|| format!("benchmark result without a number `{key}`"))
}

fn summary(items: &[Value], key: &str) -> Result<Summary> {
    let v: Vec<f64> = items.iter().map(|i| num(i, key)).collect::<Result<_>>()?;
    summarize(&v).with_context(|| format!("no samples of `{key}`"))
}

/// `n`, or `lo – hi` when the samples differ.
fn range_int(s: &Summary) -> String {
    if s.min == s.max {
        format!("{:.0}", s.min)
    } else {
        format!("{:.0} – {:.0}", s.min, s.max)
    }
}

fn size(bytes: u32) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}
