//! Section 4: the cost of the teardown stack sampling, while nothing dies and while a
//! 64-thread GPU holder dies.

use std::fmt::Write;

use anyhow::Result;
use serde_json::Value;

use super::{
    plan::{Plan, GPU_DEVICE},
    results::Measured,
    rounds::{program, Rounds},
    stats::summarize,
    table::{num, Target},
};

pub fn section(
    md: &mut String,
    plan: &Plan,
    idle: &Measured,
    dying: &Measured,
    targets: &mut Vec<Target>,
) -> Result<()> {
    md.push_str("\n## 4. Teardown stack sampling\n\n");
    md.push_str(
        "linger samples the kernel stacks of dying GPU processes with a perf cpu-clock event on \
         every CPU (`--sample-hz`, default 4999), attached only while an incident awaits GPU \
         memory, and records where their threads block (sched_switch, always attached, \
         returning at once while nobody dies). `--sample-hz 0` never attaches the sampler.\n",
    );
    idle_part(md, plan, idle, targets)?;
    dying_part(md, plan, dying)?;
    Ok(())
}

fn idle_part(
    md: &mut String,
    plan: &Plan,
    idle: &Measured,
    targets: &mut Vec<Target>,
) -> Result<()> {
    let r = Rounds::new(idle)?.expect(&["base", "base", "live", "live --sample-hz 0"])?;
    md.push_str("\n### 4a. While nothing is dying\n\n");
    let _ = writeln!(
        md,
        "`spin`: {} × 1000 steps of xorshift arithmetic per run (no system call, no memory \
         traffic): what any CPU-bound program pays. Each of {} rounds runs four variants in \
         rotating order (ABCD, BCDA, ...): the baseline, the baseline again (the noise: two \
         untraced runs side by side), `linger live --json` and `linger live --json \
         --sample-hz 0`.\n",
        plan.spin,
        r.len()
    );
    md.push_str(
        "| Variant | Whole runs: ratio to the baseline (median) | Spread (min – max) | Fastest \
         tenth: ratio to the baseline (median) | Spread (min – max) | `linger live` CPU, % of \
         one core | `linger live` wake-ups per second | perf events `linger live` held after \
         the run |\n|---|---|---|---|---|---|---|---|\n",
    );
    let _ = writeln!(
        md,
        "| A: baseline ({:.1} ms; fastest tenth × 10: {:.1} ms) | 1 | | 1 | | | | |",
        r.part_summary(0, 0)?.median * 1e3,
        r.part_summary(0, 1)?.median * 1e3
    );
    let labels = [
        "B: baseline again",
        "C: `linger live`",
        "D: `linger live --sample-hz 0`",
    ];
    // [variant][part]
    let mut ratios = Vec::new();
    for (i, label) in labels.iter().enumerate() {
        let v = i + 1;
        let whole = r.ratio_summary(v, 0)?;
        let best = r.ratio_summary(v, 1)?;
        let tracer = if v >= 2 {
            let cpu = r.field(v, "linger_cpu_s")?;
            let wall = r.field(v, "wall_s")?;
            let wakeups = r.field(v, "linger_wakeups")?;
            let share: Vec<f64> = cpu.iter().zip(&wall).map(|(c, w)| 100.0 * c / w).collect();
            let rate: Vec<f64> = wakeups.iter().zip(&wall).map(|(n, w)| n / w).collect();
            let perf = r.field_summary(v, "linger_perf_events")?;
            format!(
                "{:.2} | {:.0} | {}",
                summarize(&share).map_or(f64::NAN, |s| s.median),
                summarize(&rate).map_or(f64::NAN, |s| s.median),
                super::table::range_int(&perf)
            )
        } else {
            " | | ".into()
        };
        let _ = writeln!(
            md,
            "| {label} | {:.3} | {:.3} – {:.3} | **{:.3}** | {:.3} – {:.3} | {tracer} |",
            whole.median, whole.min, whole.max, best.median, best.min, best.max
        );
        ratios.push([whole, best]);
    }
    let (noise, live, no_sampler) = (ratios[0][1], ratios[1][1], ratios[2][1]);
    let per_round: Vec<String> = r
        .orders()
        .zip(r.ratios(1, 1)?)
        .zip(r.ratios(2, 1)?.into_iter().zip(r.ratios(3, 1)?))
        .map(|((o, b), (c, d))| format!("{o}: {b:.3} / {c:.3} / {d:.3}"))
        .collect();
    let _ = writeln!(
        md,
        "\n*Fastest tenth*: each run is timed in ten slices too; interference from other jobs \
         only ever slows a slice down, so the fastest slice shows a cost paid all along (as \
         the always-on sampler's timer interrupts were) with less noise than whole runs. \
         Fastest-tenth ratios B / C / D of every round: {}.\n\n*Not measurable above noise* is \
         taken to mean: the median fastest-tenth ratio of `linger live` is no further from 1 \
         than the baseline-again ratios of the same rounds are ({:.3} – {:.3}).",
        per_round.join("; "),
        noise.min,
        noise.max
    );
    let _ = writeln!(md, "\nCommand:\n\n```sh\n{}\n```", idle.command);
    // No further from 1 than two untraced runs were from each other.
    let noise_width = (noise.min - 1.0).abs().max((noise.max - 1.0).abs());
    targets.push(Target {
        what: "Teardown sampling while nothing is dying: a CPU-bound program's slowdown with \
               `linger live` attached not measurable above noise"
            .into(),
        measured: format!(
            "{:.3} (fastest tenths, median of {} rounds; {:.3} – {:.3}); noise (untraced / \
             untraced) {:.3} – {:.3}; with `--sample-hz 0` {:.3}",
            live.median, live.n, live.min, live.max, noise.min, noise.max, no_sampler.median
        ),
        met: (live.median - 1.0).abs() <= noise_width,
    });
    Ok(())
}

fn dying_part(md: &mut String, plan: &Plan, dying: &Measured) -> Result<()> {
    let r = Rounds::new(dying)?.expect(&["base", "live", "live --sample-hz 0"])?;
    let kills = num(r.data, "iterations")?;
    md.push_str("\n### 4b. While a 64-thread process dies\n\n");
    let _ = writeln!(
        md,
        "`dying`: a child (`linger-bench-dying`) opens the stand-in GPU device `{GPU_DEVICE}` \
         (declared with `--gpu-device`, so the child is a GPU holder and its SIGKILL opens an \
         incident that awaits GPU memory and turns the sampler on), starts {} threads in all \
         (parked) and says it is ready; 30 ms later it is SIGKILLed. Timed: kill() until \
         waitpid() returns it, reaped. {kills} kills per run, a run's figure is the median of \
         its kills; {} rounds of three variants in rotating order: the baseline, `linger live` \
         and `linger live --sample-hz 0` (no sampler). Under a tracer each kill waits until the \
         sampler of the previous one is off again (linger holds no perf event).\n",
        plan.dying_threads,
        r.len()
    );
    md.push_str(
        "| Variant | Kill → reaped, ms (median of runs) | Ratio to the baseline (median) | \
         Spread (min – max) | `linger live` CPU per kill, µs | `linger live` wake-ups per \
         kill | Kills with the sampler still on at the reap |\n|---|---|---|---|---|---|---|\n",
    );
    let base = r.part_summary(0, 0)?;
    let _ = writeln!(md, "| baseline | {:.3} | 1 | | | | |", base.median * 1e3);
    for (v, label) in [(1, "`linger live`"), (2, "`linger live --sample-hz 0`")] {
        let t = r.part_summary(v, 0)?;
        let ratio = r.ratio_summary(v, 0)?;
        let cpu = r.field_summary(v, "linger_cpu_s")?;
        let wakeups = r.field_summary(v, "linger_wakeups")?;
        let on: u64 = r
            .runs(v)
            .map(|run| run["extra"]["sampler_on_at_reap"].as_u64().unwrap_or(0))
            .sum();
        let _ = writeln!(
            md,
            "| {label} | {:.3} | **{:.3}** | {:.3} – {:.3} | {:.0} | {:.0} | {on} of {} |",
            t.median * 1e3,
            ratio.median,
            ratio.min,
            ratio.max,
            cpu.median / kills * 1e6,
            wakeups.median / kills,
            kills as usize * r.len()
        );
    }
    let per_round: Vec<String> = r
        .orders()
        .zip(r.ratios(1, 0)?.into_iter().zip(r.ratios(2, 0)?))
        .map(|(o, (b, c))| format!("{o}: {b:.3} / {c:.3}"))
        .collect();
    let _ = writeln!(
        md,
        "\nRatios of `linger live` / `--sample-hz 0` in every round: {}.",
        per_round.join("; ")
    );
    check_run(md, r.check(), plan.dying_threads);
    let on_cpu = r.check()["on_cpu_samples"].as_f64().unwrap_or(0.0)
        / r.check()["iterations"].as_f64().unwrap_or(f64::NAN);
    let cpus = r.data["cpus"].as_f64().unwrap_or(1.0);
    let _ = writeln!(
        md,
        "\nThe sampler is attached by `linger live` once it has read the kill's records and \
         opened the incident. These deaths last about {:.1} ms: a sampler on from the kill \
         would take up to about {:.0} on-CPU samples of each ({} Hz × {cpus} CPUs), the check run \
         got {on_cpu:.1}. So here the sampler mostly comes after the threads are gone; what the \
         kill pays under `linger live` is the rest of the tracing, as the `--sample-hz 0` row \
         shows.",
        base.median * 1e3,
        base.median * 4999.0 * cpus,
        4999
    );
    let _ = writeln!(md, "\nCommand:\n\n```sh\n{}\n```", dying.command);
    Ok(())
}

/// What the check run (`--events`, program accounting) saw per kill.
fn check_run(md: &mut String, check: &Value, threads: u32) {
    let kills = check["iterations"].as_f64().unwrap_or(f64::NAN);
    let per_kill = |key: &str| check[key].as_f64().unwrap_or(0.0) / kills;
    let mut programs: Vec<(String, f64, f64)> = check["programs"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|p| {
                    let name = p["name"].as_str()?;
                    let (ns, runs) = program(check, name)?;
                    Some((
                        name.to_string(),
                        runs as f64 / kills,
                        ns * runs as f64 / kills,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    programs.sort_by(|a, b| b.2.total_cmp(&a.2));
    let total: f64 = programs.iter().map(|p| p.2).sum();
    let top: Vec<String> = programs
        .iter()
        .take(5)
        .map(|(name, runs, ns)| format!("`{name}` {runs:.0} runs, {:.0} µs", ns / 1e3))
        .collect();
    let _ = writeln!(
        md,
        "\nWhere the time goes: an untimed check run under `linger live --events` with the \
         kernel's program accounting on ({kills:.0} kills of {threads} threads) recorded per \
         kill {:.1} on-CPU stack samples, {:.1} block starts and {:.1} block ends of the dying \
         threads, and linger's programs ran for {:.0} µs per kill in all (accounting \
         included), most in: {}. `teardown_switch` takes a kernel stack (and writes a block \
         start) each time a thread of the dying process leaves the CPU to sleep.",
        per_kill("on_cpu_samples"),
        per_kill("block_starts"),
        per_kill("block_ends"),
        total / 1e3,
        top.join(", ")
    );
    if per_kill("block_ends") == 0.0 && per_kill("block_starts") >= f64::from(threads) {
        let _ = writeln!(
            md,
            "No block ever ended: the block starts were the threads' last switches on their \
             way out (exiting), stacks of threads that never run again."
        );
    }
}
