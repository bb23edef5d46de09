//! Section 3: ioctl storms with `linger live` attached, on a descriptor that is not a GPU file
//! and on the stand-in GPU device.

use std::fmt::Write;

use anyhow::{ensure, Context, Result};

use super::{
    plan::{Plan, GPU_DEVICE, IOCTL_TARGET},
    results::Measured,
    rounds::{program, Rounds},
    stats::{summarize, Summary},
    table::{num, range_int, Target},
};

/// The `ioctl` storm's variants: the system call tracepoints, which this machine's default
/// (no NVIDIA driver) does not attach.
pub const PLAIN_VARIANTS: [&str; 2] = ["base", "live --syscall-hooks"];

pub fn section(
    md: &mut String,
    plan: &Plan,
    ioctl: &Measured,
    gpu: &Measured,
    targets: &mut Vec<Target>,
) -> Result<()> {
    let plain = Rounds::new(ioctl)?.expect(&PLAIN_VARIANTS)?;
    let gpu_r = Rounds::new(gpu)?.expect(&["base", "live"])?;
    md.push_str("\n## 3. ioctl storms: the cost per call with `linger live` attached\n\n");
    let _ = writeln!(
        md,
        "A single-threaded process calls ioctl(FIONREAD) in a tight loop; each run times two \
         parts of N calls one after the other. {} pairs of runs per workload (baseline, traced \
         by `linger live --json`), in alternating order as in section 1, after an untimed \
         warm-up run. `ioctl` is traced with `--syscall-hooks`: this machine has no NVIDIA \
         driver, so its plain default attaches no system call tracepoint, and the storm \
         measures the tracepoints' programs (the default where a driver is registered and \
         neither its functions nor its libraries can be hooked); `ioctl-gpu`'s declared device \
         brings them anyway.\n\n\
         - `ioctl`: the process holds no GPU file. Part 1: N = {} ioctls on the read end of an \
         empty pipe. Part 2: as many getppid() calls, a system call linger does not hook: what \
         any system call pays while linger's system call tracepoints are attached.\n\
         - `ioctl-gpu`: the process holds a stand-in GPU device, `{GPU_DEVICE}`, a char device \
         node for /dev/full (1:7, made with mknod) that `linger live --gpu-device {GPU_DEVICE}` \
         treats as a GPU file: every ioctl on it is a GPU ioctl, remembered at entry, decoded at \
         exit and written to the ring as a record (/dev/full answers ENOTTY, so the driver's \
         own work is nil and the figure is the tracer's). Part 1: N = {} ioctls on the device. \
         Part 2: as many on a pipe, by this GPU holder.\n",
        plain.len(),
        plan.ioctls,
        plan.gpu_ioctls
    );
    md.push_str(
        "| Calls | Process | Baseline, ns per call | Traced, ns per call | Added, ns per call \
         (median) | Slowdown (median) | Spread (min – max) |\n|---|---|---|---|---|---|---|\n",
    );
    let rows = [
        (&plain, 0, "ioctl(FIONREAD) on a pipe", "holds no GPU file"),
        (&plain, 1, "getppid() (not hooked)", "holds no GPU file"),
        (
            &gpu_r,
            0,
            "ioctl(FIONREAD) on the stand-in GPU device: decoded and recorded",
            "holds the device",
        ),
        (&gpu_r, 1, "ioctl(FIONREAD) on a pipe", "holds the device"),
    ];
    let mut figures = Vec::new();
    for (r, part, calls, process) in rows {
        let f = Figure::new(r, part)?;
        let _ = writeln!(
            md,
            "| {calls} | {process} | {:.0} | {:.0} | {:.0} | **{:.3}** | {:.3} – {:.3} |",
            f.base_ns, f.traced_ns, f.added_ns.median, f.ratio.median, f.ratio.min, f.ratio.max
        );
        figures.push(f);
    }
    let cpu = |r: &Rounds| -> Result<(Summary, Summary)> {
        Ok((
            r.field_summary(1, "linger_cpu_s")?,
            r.field_summary(1, "losses")?,
        ))
    };
    let (plain_cpu, plain_losses) = cpu(&plain)?;
    let (gpu_cpu, gpu_losses) = cpu(&gpu_r)?;
    let _ = writeln!(
        md,
        "\n*Added*: (traced − baseline) / N, per pair. `linger live` used {:.1} ms of CPU per \
         traced `ioctl` run (median; it has nothing to record) and {:.1} ms per traced \
         `ioctl-gpu` run, {:.0} ns per GPU ioctl: draining, decoding and following each record \
         on the collector's ticks (bulk records wake nobody). Records dropped per traced run \
         (ring full): `ioctl` {}, `ioctl-gpu` {}.",
        plain_cpu.median * 1e3,
        gpu_cpu.median * 1e3,
        gpu_cpu.median * 1e9 / num(gpu_r.data, "iterations")?,
        range_int(&plain_losses),
        range_int(&gpu_losses),
    );
    let _ = writeln!(
        md,
        "\nPer pair (ratio of part 1, order): `ioctl`: {}; `ioctl-gpu`: {}.",
        per_pair(&plain)?,
        per_pair(&gpu_r)?
    );
    where_time_goes(md, &plain, &gpu_r, &figures)?;
    let _ = writeln!(
        md,
        "\nCommands:\n\n```sh\n{}\n{}\n```",
        ioctl.command, gpu.command
    );

    let f = &figures[0];
    targets.push(Target {
        what: format!(
            "ioctl storm on a descriptor that is not a GPU file: slowdown with `linger live` \
             attached ≤ {IOCTL_TARGET}"
        ),
        measured: format!(
            "{:.3} (median of {} pairs; {:.3} – {:.3}), +{:.0} ns per ioctl",
            f.ratio.median, f.ratio.n, f.ratio.min, f.ratio.max, f.added_ns.median
        ),
        met: f.ratio.median <= IOCTL_TARGET,
    });
    Ok(())
}

/// One part of one workload, baseline vs traced.
struct Figure {
    base_ns: f64,
    traced_ns: f64,
    added_ns: Summary,
    ratio: Summary,
}

impl Figure {
    fn new(r: &Rounds, part: usize) -> Result<Self> {
        let n = num(r.data, "iterations")?;
        let base = r.part(0, part)?;
        let traced = r.part(1, part)?;
        let added: Vec<f64> = traced
            .iter()
            .zip(&base)
            .map(|(t, b)| (t - b) / n * 1e9)
            .collect();
        Ok(Self {
            base_ns: r.part_summary(0, part)?.median / n * 1e9,
            traced_ns: r.part_summary(1, part)?.median / n * 1e9,
            added_ns: summarize(&added).context("no rounds")?,
            ratio: r.ratio_summary(1, part)?,
        })
    }
}

fn per_pair(r: &Rounds) -> Result<String> {
    Ok(r.orders()
        .zip(r.ratios(1, 0)?)
        .map(|(order, ratio)| format!("{ratio:.3} ({order})"))
        .collect::<Vec<_>>()
        .join(", "))
}

/// Splits the added cost with the kernel's accounting of linger's programs in the check runs.
fn where_time_goes(md: &mut String, plain: &Rounds, gpu: &Rounds, f: &[Figure]) -> Result<()> {
    md.push_str("\n### 3b. Where the time goes\n\n");
    md.push_str(
        "Before the pairs, each workload ran part 1 once more under its traced variant's \
         `linger live` with the kernel's accounting of eBPF program runs on (`kernel.bpf_stats_enabled`, restored \
         after; it adds a clock read to every program run, so these times are upper bounds), \
         and `ioctl-gpu` with `--events`, to count what was recorded.\n\n",
    );
    let programs = |check: &serde_json::Value| -> String {
        ["ioctl_enter", "ioctl_exit"]
            .iter()
            .filter_map(|name| {
                let (ns, runs) = program(check, name)?;
                Some(format!("`{name}` {ns:.0} ns per run ({runs} runs)"))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let sum = |check: &serde_json::Value| -> f64 {
        ["ioctl_enter", "ioctl_exit"]
            .iter()
            .filter_map(|name| program(check, name).map(|p| p.0))
            .sum()
    };
    let (pc, gc) = (plain.check(), gpu.check());
    for (workload, check) in [("ioctl", pc), ("ioctl-gpu", gc)] {
        ensure!(
            !programs(check).is_empty(),
            "the {workload} check run accounted no run of ioctl_enter or ioctl_exit"
        );
    }
    let _ = writeln!(
        md,
        "- **Not a GPU file** (+{:.0} ns per ioctl): {}. It runs on every ioctl of every \
         process (there is no entry program): it looks the process up in the GPU holders' \
         hash map and stops there; {:.0} ns as accounted. What every system call \
         pays while linger has any syscall tracepoint attached (the kernel's slower system \
         call path), seen alone in getppid(), is +{:.0} ns ({:.3}).",
        f[0].added_ns.median,
        programs(pc),
        sum(pc),
        f[1].added_ns.median,
        f[1].ratio.median,
    );
    let _ = writeln!(
        md,
        "- **A GPU ioctl** (+{:.0} ns per ioctl): {}; {:.0} ns as accounted. It finds \
         the holder, reads the descriptor table (fd → file → device, with \
         bpf_probe_read), decodes the driver's parameter struct and reserves, fills and \
         submits a {}-byte ring record. The \
         check run recorded {} GPU ioctls of the benchmark process for {} made.",
        f[2].added_ns.median,
        programs(gc),
        sum(gc),
        gc["gpu_ioctl_record_bytes"].as_u64().unwrap_or(0),
        gc["gpu_ioctls"].as_u64().unwrap_or(0),
        gc["iterations"].as_u64().unwrap_or(0),
    );
    let _ = writeln!(
        md,
        "- **A GPU holder's other ioctls** (+{:.0} ns per ioctl): the holder passes the first \
         map lookup, so `ioctl_exit` reads its descriptor table to find that the descriptor \
         is no GPU file.",
        f[3].added_ns.median
    );
    Ok(())
}
