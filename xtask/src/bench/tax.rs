//! Section 6: the syscall tax. What a process that never touches a GPU pays per system call
//! while linger runs, on its system call tracepoints and with `--lean`, beside `perf record` with one
//! system call tracepoint (the kernel's floor for any syscall tracepoint).

use std::fmt::Write;

use anyhow::Result;

use super::{plan::Plan, results::Measured, rounds::Rounds, table::Target};

/// The variants, in the order the benchmark runs them.
pub const VARIANTS: [&str; 5] = ["base", "base", PERF, "live --syscall-hooks", "live --lean"];
/// One system call tracepoint, exit only, recording nothing.
pub const PERF: &str = "cmd perf record -q -e syscalls:sys_exit_wait4 -o /dev/null -- sleep 600";
/// `--lean` within this of the baseline (the untimed noise band is shown beside it).
pub const LEAN_TARGET: f64 = 1.02;
/// The system call tracepoints' mode at most this many ns a getppid() above `perf`'s one
/// tracepoint.
pub const DEFAULT_OVER_PERF_NS: f64 = 10.0;

/// The ping-pong part makes N / this round trips (`PINGPONG_SHARE` of linger-bench-storm).
const PINGPONG_SHARE: u32 = 20;

const PARTS: [&str; 4] = [
    "getppid()",
    "`dd bs=1`: 1-byte read of /dev/zero + write to /dev/null",
    "pipe ping-pong with a child (2 context switches)",
    "4 KiB pread from the page cache",
];

pub fn section(
    md: &mut String,
    plan: &Plan,
    tax: &Measured,
    targets: &mut Vec<Target>,
) -> Result<()> {
    let r = Rounds::new(tax)?.expect(&VARIANTS)?;
    md.push_str("\n## 6. The syscall tax: what processes that never touch a GPU pay\n\n");
    let _ = writeln!(
        md,
        "One process that holds no GPU file times four parts of N = {} calls each (the \
         ping-pong N / {PINGPONG_SHARE} round trips), per run. \
         {} rounds; each runs five variants in rotating order: no tracer twice (the second \
         shows the noise band), `perf record` with one system call tracepoint (`{}`: every \
         system call goes through the kernel's tracing slow path while any such tracepoint is \
         attached; this is its floor), `linger live --syscall-hooks` (the system call \
         tracepoints: exits only, no entry hook; the default mode where an NVIDIA driver is \
         registered and neither its functions nor its libraries can be hooked), and `linger \
         live --lean` (no system call tracepoint at all). This machine has no NVIDIA driver, \
         so its plain default attaches none either, as `--lean`; the storms of section 1 \
         measure that. Figures: ns per call (median), and median slowdown against the \
         first baseline, round by round, with its range.\n",
        plan.tax_calls,
        r.len(),
        PERF.trim_start_matches("cmd ")
    );
    md.push_str(
        "| Calls | No tracer | Noise (no tracer again) | perf, 1 syscall tracepoint | linger \
         --syscall-hooks | linger --lean |\n|---|---|---|---|---|---|\n",
    );
    let mut getppid = (0.0, 0.0);
    let mut lean_worst: f64 = 0.0;
    let mut band_worst: f64 = 0.0;
    for (part, name) in PARTS.iter().enumerate() {
        let calls = if part == 2 {
            (plan.tax_calls / PINGPONG_SHARE) as f64
        } else {
            plan.tax_calls as f64
        };
        let base_ns = r.part_summary(0, part)?.median / calls * 1e9;
        let mut cells = vec![format!("{base_ns:.0} ns")];
        for v in 1..VARIANTS.len() {
            let ns = r.part_summary(v, part)?.median / calls * 1e9;
            let ratio = r.ratio_summary(v, part)?;
            cells.push(format!(
                "{ns:.0} ns, **{:.3}** ({:.3} – {:.3})",
                ratio.median, ratio.min, ratio.max
            ));
            if part == 0 && v == 2 {
                getppid.0 = added_ns(&r, v, part, calls)?;
            }
            if part == 0 && v == 3 {
                getppid.1 = added_ns(&r, v, part, calls)?;
            }
            if v == 4 && part != 2 {
                lean_worst = lean_worst.max(ratio.median);
            }
            if v == 1 && part != 2 {
                band_worst = band_worst.max(ratio.median);
            }
        }
        let _ = writeln!(md, "| {name} | {} |", cells.join(" | "));
    }
    let _ = writeln!(
        md,
        "\nAdded per getppid() (median of (traced − baseline) / N): `perf` {:+.1} ns, linger \
         --syscall-hooks {:+.1} ns. linger's programs run for none of these calls: what they \
         cost is the kernel's tracepoint calls, one per system call exit with the system call \
         tracepoints (an entry hook would be a second) and none with `--lean`. The ping-pong part is dominated by \
         the two context switches and their noise.\n\nOn stock kernels (kprobes or fentry \
         allowed: Debian's 5.10, 6.1 and 6.12 in `cargo xtask vm`) the default mode attaches \
         no system call tracepoint at all, as `--lean` here: the strategy record lists every \
         hook attached and the VM test checks that none is a system call's, so a process that \
         never touches a GPU runs no linger code on any system call there. No timing is given \
         for it: the VM runs under qemu's TCG (KVM hangs at boot on these machines), which \
         emulates every instruction, tens of times slower, so its ratios say nothing of real \
         hardware.\n\nCommand:\n\n```sh\n{}\n```",
        getppid.0, getppid.1, tax.command
    );
    targets.push(Target {
        what: format!(
            "`--lean`: getppid, `dd bs=1` and read slowdowns ≤ {LEAN_TARGET} (noise band \
             alongside)"
        ),
        measured: format!("worst median {lean_worst:.3}; no-tracer band {band_worst:.3}"),
        met: lean_worst <= LEAN_TARGET.max(band_worst),
    });
    targets.push(Target {
        what: format!(
            "system call tracepoints (`--syscall-hooks`): getppid at most \
             {DEFAULT_OVER_PERF_NS} ns above `perf` with one syscall tracepoint"
        ),
        measured: format!(
            "{:+.1} ns vs {:+.1} ns ({:+.1} ns)",
            getppid.1,
            getppid.0,
            getppid.1 - getppid.0
        ),
        met: getppid.1 - getppid.0 <= DEFAULT_OVER_PERF_NS,
    });
    Ok(())
}

fn added_ns(r: &Rounds, variant: usize, part: usize, calls: f64) -> Result<f64> {
    let base = r.part(0, part)?;
    let v = r.part(variant, part)?;
    let mut added: Vec<f64> = v
        .iter()
        .zip(&base)
        .map(|(v, b)| (v - b) / calls * 1e9)
        .collect();
    added.sort_by(f64::total_cmp);
    Ok(added[added.len() / 2])
}
