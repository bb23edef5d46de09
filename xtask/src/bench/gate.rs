//! Section 8: the gate's own cost. `linger wait --any-process` on the stand-in GPU device
//! while a process holds it: its CPU time per second of waiting, and how long after the
//! holder's SIGKILL it exits clean; on the machine as it is, and with idle processes added.

use std::fmt::Write;

use anyhow::{Context, Result};

use super::{
    plan::GPU_DEVICE,
    results::Measured,
    stats::{summarize, Summary},
    table::Target,
};

/// The gate's CPU while it waits, at most: 1 % of one CPU.
pub const CPU_TARGET_MS_PER_S: f64 = 10.0;
/// From the holder's death to the gate's exit, median, at most.
pub const REACTION_TARGET_MS: f64 = 50.0;

pub fn section(md: &mut String, gate: &Measured, targets: &mut Vec<Target>) -> Result<()> {
    let d = &gate.data;
    let seconds = d["seconds"].as_f64().context("gate: seconds")?;
    let extra = d["extra"].as_u64().context("gate: extra")?;
    md.push_str("\n## 8. The gate: `linger wait`'s own cost\n\n");
    let _ = writeln!(
        md,
        "`linger wait --any-process --gpu-device {GPU_DEVICE}` (no NVML here: the GPU files \
         decide) while a `sleep` holds the stand-in device: its CPU time (`/proc/PID/schedstat`'s run \
         time) over {seconds:.0} s of waiting after its first second, then, round after \
         round, the time from the holder's SIGKILL (and reap) to the gate's exit, clean. On \
         the machine's own processes, then with {extra} more idle ones (`sleep`, a few files \
         each) for a busier node's /proc.\n"
    );
    md.push_str("| Processes in /proc | CPU while waiting | Exit after the holder's death: median (min – max) |\n|---|---|---|\n");
    let configurations = d["configurations"]
        .as_array()
        .context("gate: configurations")?;
    for (i, c) in configurations.iter().enumerate() {
        let cpu = c["cpu_ms_per_s"].as_f64().context("gate: cpu")?;
        let reactions: Vec<f64> = c["reaction_ms"]
            .as_array()
            .context("gate: reactions")?
            .iter()
            .filter_map(serde_json::Value::as_f64)
            .collect();
        let Summary {
            median,
            min,
            max,
            n,
        } = summarize(&reactions).context("gate: no reaction timed")?;
        let _ = writeln!(
            md,
            "| {} | {cpu:.1} ms/s ({:.2} % of a CPU) | {median:.1} ms ({min:.1} – {max:.1}, {n} kills) |",
            c["processes"],
            cpu / 10.0
        );
        if i == 0 {
            targets.push(Target {
                what: format!(
                    "`linger wait` while waiting: at most {:.0} % of a CPU",
                    CPU_TARGET_MS_PER_S / 10.0
                ),
                measured: format!("{:.2} %", cpu / 10.0),
                met: cpu <= CPU_TARGET_MS_PER_S,
            });
            targets.push(Target {
                what: format!(
                    "`linger wait`: exits at most {REACTION_TARGET_MS:.0} ms after the last \
                     holder's death (median)"
                ),
                measured: format!("{median:.1} ms (median of {n}; {min:.1} – {max:.1})"),
                met: median <= REACTION_TARGET_MS,
            });
        }
    }
    let _ = writeln!(md, "\nCommand:\n\n```sh\n{}\n```", gate.command);
    Ok(())
}
