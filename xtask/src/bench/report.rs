//! BENCHMARKS.md from the benchmarks' JSON results.

use std::fmt::Write;

use anyhow::Result;

use super::{
    fuzz, gate, ioctl,
    plan::{Plan, BINARIES},
    results::Results,
    ring, sampling, since, soak, storms, tax, trace,
};

pub struct Report {
    pub markdown: String,
    /// One line per target, for the terminal.
    pub verdicts: Vec<String>,
    pub all_met: bool,
}

/// Where and when the figures were taken.
pub struct Machine {
    pub nproc: usize,
    pub kernel: String,
    pub cpu: String,
    pub virtualized: bool,
    pub date: String,
    pub commit: String,
    pub load_before: String,
    pub load_after: String,
    pub duration_s: f64,
}

/// BENCHMARKS.md for `results`; `previous` is the report it replaces, compared with.
pub fn render(
    machine: &Machine,
    plan: &Plan,
    results: &Results,
    previous: Option<&str>,
    quick: bool,
) -> Result<Report> {
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
    // Read off the two reports' own header and Targets table: nothing here is kept by hand.
    md.push_str(&since::section(previous, &md));
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
