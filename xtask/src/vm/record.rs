//! Which Debian kernels the VM test booted, against the ones `xtask/vm-kernels.txt` records:
//! Debian's archive serves the newest package of each series, so a run on another day may boot
//! another build; the test then says which kernel changed, and runs on it. Each line: the
//! guest's architecture, the matrix's series, the kernel's release and its image's SHA-256.

use std::{fs, path::Path, process::Command};

use anyhow::{Context, Result};

use super::{guest::Guest, kernels::Kernel};

/// The committed record, relative to the workspace.
const RECORDED: &str = "xtask/vm-kernels.txt";

/// One line of the record for `kernel`, booted as series `name` on `guest`.
pub fn line(guest: Guest, name: &str, kernel: &Kernel) -> Result<String> {
    let out = Command::new("sha256sum")
        .arg(&kernel.vmlinuz)
        .output()
        .context("sha256sum")?;
    let digest = String::from_utf8_lossy(&out.stdout);
    let digest = digest
        .split_whitespace()
        .next()
        .context("sha256sum's answer")?;
    Ok(format!(
        "{} {name} {} sha256:{digest}",
        guest.debian_arch(),
        kernel.release
    ))
}

/// Says which of `used` (lines of [`line`]) differ from the record in `root` (the workspace),
/// and writes them to `kernels-used-ARCH.txt` beside the kernels (`target/vm`, or its `arm64`
/// folder), for a new record.
pub fn compare(root: &Path, dir: &Path, guest: Guest, used: &[String]) {
    let recorded = fs::read_to_string(root.join(RECORDED)).unwrap_or_default();
    let key = |l: &str| l.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
    for line in used {
        let was = recorded
            .lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| key(l) == key(line));
        match was {
            Some(was) if was == line => {}
            Some(was) => eprintln!(
                "xtask vm: a kernel changed since {RECORDED}: was `{was}`, now `{line}` \
                 (Debian's archive moved on; the test runs on the new one)"
            ),
            None => eprintln!("xtask vm: {RECORDED} has no line for `{line}`"),
        }
    }
    let path = dir.join(format!("kernels-used-{}.txt", guest.debian_arch()));
    if let Err(e) = fs::write(&path, used.join("\n") + "\n") {
        eprintln!("xtask vm: writing {}: {e}", path.display());
    }
}
