//! Section 7: the agent's soak. `linger agent` while a long run of plain processes is
//! SIGKILLed: its resident memory along the way, and whether it counted every kill.

use std::fmt::Write;

use anyhow::{Context, Result};

use super::{results::Measured, table::Target};

/// The agent's resident memory must stay under this, whatever it runs for.
pub const RSS_LIMIT_KIB: u64 = 64 << 10;

pub fn section(md: &mut String, soak: &Measured, targets: &mut Vec<Target>) -> Result<()> {
    let d = &soak.data;
    let kills = d["kills"].as_u64().context("soak: kills")?;
    let counted = d["incidents_counted"].as_u64().context("soak: counted")?;
    let lost = d["lost_records"].as_u64().context("soak: lost")?;
    let samples: Vec<(u64, u64)> = d["samples"]
        .as_array()
        .context("soak: samples")?
        .iter()
        .filter_map(|s| Some((s["kills"].as_u64()?, s["rss_kib"].as_u64()?)))
        .collect();
    let first = samples.first().map_or(0, |s| s.1);
    let max = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let seconds = d["seconds"].as_f64().unwrap_or(0.0);
    md.push_str("\n## 7. The agent over a long run of kills\n\n");
    let _ = writeln!(
        md,
        "`linger agent` (metrics on 127.0.0.1, the incident log in a state directory rotated \
         at 16 MiB) while one process spawns `/bin/sleep`, SIGKILLs and reaps it, {kills} times \
         in {seconds:.0} s. The agent's resident memory (VmRSS) along the way, and at the end \
         what its own `/metrics` counted: `linger_incidents_total{{termination=\"kill\"}}` \
         {counted} (other kills on the machine would add to it), \
         `linger_lost_records_total` {lost}.\n"
    );
    md.push_str("| Kills so far | Agent RSS |\n|---|---|\n");
    for (k, rss) in &samples {
        let _ = writeln!(md, "| {k} | {:.1} MiB |", *rss as f64 / 1024.0);
    }
    let _ = writeln!(md, "\nCommand:\n\n```sh\n{}\n```", soak.command);
    targets.push(Target {
        what: format!(
            "`linger agent` over {kills} kills: RSS flat and at most {} MiB, no incident lost",
            RSS_LIMIT_KIB >> 10
        ),
        measured: format!(
            "{:.1} → {:.1} MiB (max {:.1}); {counted} of {kills} counted, {lost} records lost",
            first as f64 / 1024.0,
            samples.last().map_or(0, |s| s.1) as f64 / 1024.0,
            max as f64 / 1024.0
        ),
        met: max <= RSS_LIMIT_KIB && max <= first + first / 10 && counted >= kills && lost == 0,
    });
    Ok(())
}
