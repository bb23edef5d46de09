//! BENCHMARKS.md from the benchmarks' JSON results.

use std::fmt::Write;

use anyhow::{Context, Result};
use serde_json::Value;

use super::{
    fuzz, gate, ioctl, ring,
    rounds::Rounds,
    sampling, soak,
    stats::{summarize, Summary},
    storms, tax, trace, Machine, Measured, Plan, Results, BINARIES,
};

pub struct Report {
    pub markdown: String,
    /// One line per target, for the terminal.
    pub verdicts: Vec<String>,
    pub all_met: bool,
}

pub struct Target {
    pub what: String,
    pub measured: String,
    pub met: bool,
}

pub fn render(machine: &Machine, plan: &Plan, results: &Results, quick: bool) -> Result<Report> {
    let mut targets = Vec::new();
    let mut body = String::new();
    storms::section(&mut body, plan, &results.storm, &mut targets)?;
    ring::section(&mut body, results, &mut targets)?;
    ioctl::section(
        &mut body,
        plan,
        &results.ioctl,
        &results.gpu_ioctl,
        &mut targets,
    )?;
    sampling::section(&mut body, plan, &results.idle, &results.dying, &mut targets)?;
    trace::section(
        &mut body,
        plan,
        &results.trace,
        &results.replay,
        &mut targets,
    )?;
    tax::section(&mut body, plan, &results.tax, &mut targets)?;
    soak::section(&mut body, &results.soak, &mut targets)?;
    gate::section(&mut body, &results.gate, &mut targets)?;
    fuzz::section(&mut body, &results.fuzz, &mut targets)?;

    let mut md = String::new();
    md.push_str("# Benchmarks\n\n");
    let bins: Vec<String> = BINARIES.iter().map(|b| format!("--bin {b}")).collect();
    let _ = writeln!(
        md,
        "Written by `cargo xtask bench` (as root); do not edit by hand, run it again to \
         refresh. Every figure below comes from the one run described here, and each section \
         gives the exact command that produced it (run from the workspace root after `cargo \
         xtask build` and `cargo build --release -p linger-tests {}`).\n",
        bins.join(" ")
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

    md.push_str(
        "Figures that need a GPU were measured on the H200 and are kept apart, with their \
         commands, in [BENCHMARKS-H200.md](BENCHMARKS-H200.md).\n\n",
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
    md.push_str(&changes(&results.storm)?);
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

/// The previous report's storm figures (a86e01f, measured at f0898ce): workload, slowdown,
/// `linger live` CPU µs and wake-ups per iteration.
const PREVIOUS_STORMS: [(&str, f64, f64, f64); 3] = [
    ("kill-threads", 1.071, 25.6, 0.0),
    ("kill-exec", 1.066, 16.9, 0.0),
    ("spawn-true", 0.979, 6.3, 0.1),
];

/// What changed since the previous report, for readers comparing the two.
fn changes(storms: &[Measured]) -> Result<String> {
    let mut md = String::from(
        "
## Since the previous report

The previous report (83c1aee) was measured at 84b2858 (2026-12-05 13:38 UTC) on a virtual \
machine of the same kind (2 CPUs, an AMD EPYC). Since then:

- **Machine**: another virtual machine of that kind (booted 2026-12-06 14:22 UTC). Figures tied \
to the rate of system calls (section 2b, the ring's offered rates, added ns per call) move with \
the machine; only the ratios measured side by side compare.
- **Tracer**: the scheduler program now also keeps GPU holders' uninterruptible sleeps for the \
stuck-thread watch: every context switch tests the state it switches out in, and only a GPU \
holder's uninterruptible sleep costs more (a lookup, its stack, an insert). With the system call \
tracepoints (`--syscall-hooks` here) a reap through waitid is seen at its exit too, and wait4 \
calls that report only stopped or continued children are left out. The agent names incidents \
by the node's name.
- **Benchmarks**: section 9, the whole replay under libFuzzer, is new; the commit is read, and \
everything measured built, before the first benchmark runs.
- **Storms**, previous report → this one (another machine: the slowdowns compare only roughly):
",
    );
    for m in storms {
        let r = Rounds::new(m)?;
        let Some(&(name, ratio, cpu, wakeups)) = PREVIOUS_STORMS
            .iter()
            .find(|p| p.0 == r.workload() && !r.pinned())
        else {
            continue;
        };
        let n = num(r.data, "iterations")?;
        let _ = writeln!(
            md,
            "  - `{name}`: slowdown {ratio:.3} → {:.3}; `linger live` CPU {cpu:.1} → {:.1} µs; \
             wake-ups {wakeups:.1} → {:.1}",
            r.ratio_summary(1, 0)?.median,
            r.field_summary(1, "linger_cpu_s")?.median / n * 1e6,
            r.field_summary(1, "linger_wakeups")?.median / n,
        );
    }
    Ok(md)
}

fn method(plan: &Plan) -> String {
    format!(
        "
## Method

- **Side by side.** The machine is shared and noisy, so no figure is compared with one from \
another day: a slowdown is the ratio of a traced run to the baseline run next to it, in one \
invocation. Baseline and traced runs are interleaved in rounds whose order rotates (AB, BA, ...; \
with three variants ABC, BCA, CAB, ...), so a slow drift of the background load cancels; the \
tables give the median over rounds and the spread (lowest and highest). Where it matters, a second \
untraced run in each round shows how far two identical runs differ.
- **Priority.** Every benchmark process renices itself to {nice} first; the workloads' children \
and the tracer the storm benchmark starts inherit it. Unrelated jobs on the machine (builds, \
other benchmarks) then take only the CPU time left over, though they still disturb caches and \
wake-up latencies: the storm tables show how busy the machine was.
- **Real use.** The tracer runs as users run it: a separate `linger live --json` process, started \
and attached before a traced run begins (its start-up is not timed) and stopped with SIGINT after \
it. Its output goes to a file, so that each traced run can be checked: it must contain exactly \
one SIGKILL incident from the benchmark for each kill sent (and, for GPU holders, one that saw \
the GPU file), or the benchmark fails. Extra measurements that would disturb the timing (every \
event printed with `--events`, the kernel's accounting of eBPF program time) are made in a \
separate untimed check run before the timed rounds.
- **The collector path.** The ring buffer benchmark drains the ring with the live collector's own \
code: `KernelSource::readable()`, `drain()` (ring read and decode) and `poll_losses()` every \
`TICK` (20 ms), as `source::collect::run` does, counting events instead of correlating them.
- **Clocks.** Wall clock for the workloads (`Instant`), per-thread CPU time for the collector \
(`CLOCK_THREAD_CPUTIME_ID`), `/proc/PID/task/*/schedstat` and `voluntary_ctxt_switches` for \
`linger live`, `/proc/stat` for the whole machine.
",
        nice = plan.nice
    )
}

pub fn num(v: &Value, key: &str) -> Result<f64> {
    v[key]
        .as_f64()
        .with_context(|| format!("benchmark result without a number `{key}`"))
}

pub fn summary(items: &[Value], key: &str) -> Result<Summary> {
    let v: Vec<f64> = items.iter().map(|i| num(i, key)).collect::<Result<_>>()?;
    summarize(&v).with_context(|| format!("no samples of `{key}`"))
}

/// `n`, or `lo – hi` when the samples differ.
pub fn range_int(s: &Summary) -> String {
    if s.min == s.max {
        format!("{:.0}", s.min)
    } else {
        format!("{:.0} – {:.0}", s.min, s.max)
    }
}
