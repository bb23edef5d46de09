//! The tracked tree's size budget: a call to the GPU machine carries the whole tracked tree
//! (at most 64 MiB), so fixtures must leave room for the next recordings.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::build::workspace_root;

/// The most the tracked files may add up to, in bytes.
const BUDGET: u64 = 25_000_000;

/// Fails, naming the largest files, when the tracked files add up to more than the budget.
pub fn check() -> Result<()> {
    let root = workspace_root();
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&root)
        .output()
        .context("git ls-files: the budget is checked in a git checkout")?;
    if !out.status.success() {
        bail!(
            "git ls-files: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut files: Vec<(u64, String)> = out
        .stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        // A tracked file deleted in the working tree carries nothing.
        .filter_map(|p| Some((std::fs::metadata(root.join(&p)).ok()?.len(), p)))
        .collect();
    let total: u64 = files.iter().map(|(n, _)| n).sum();
    if total <= BUDGET {
        eprintln!(
            "xtask: tracked files {:.1} MB of the {:.0} MB budget",
            total as f64 / 1e6,
            BUDGET as f64 / 1e6
        );
        return Ok(());
    }
    files.sort_unstable_by(|a, b| b.cmp(a));
    let largest: Vec<String> = files
        .iter()
        .take(8)
        .map(|(n, p)| format!("  {p} ({:.1} MB)", *n as f64 / 1e6))
        .collect();
    bail!(
        "the tracked files add up to {:.1} MB, over the {:.0} MB budget (a GPU machine's call \
         carries the whole tree); the largest:\n{}",
        total as f64 / 1e6,
        BUDGET as f64 / 1e6,
        largest.join("\n")
    )
}
