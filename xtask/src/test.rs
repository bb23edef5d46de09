//! `cargo xtask test`: every test, against a freshly built linger, then the driver hooks on a
//! stock kernel in a VM; ends with one `tests: N passed, M failed` line for the whole run.

use std::{
    io::{BufRead, BufReader},
    process::Stdio,
};

use anyhow::{bail, Context, Result};

use crate::{apt, build, vm};

pub fn run(args: &[String]) -> Result<()> {
    let bin = build::linger(build::Arch::Host)?;
    // The agent's tests run a real Prometheus and promtool, from Debian's package.
    if ["prometheus", "promtool"]
        .iter()
        .any(|p| crate::setup::which(p).is_none())
    {
        apt::install(&["prometheus"])?;
    }
    // The Slurm kit's test runs a real single-node Slurm, from Debian's packages.
    if ["munged", "slurmctld", "slurmd"]
        .iter()
        .any(|p| !std::path::Path::new("/usr/sbin").join(p).exists())
    {
        apt::install(&["slurm-wlm", "munge"])?;
    }
    // The Kubernetes manifests' offline schema check, from PyPI into a virtual environment
    // whose python3 the tests find first; the overlays built by Debian's kubectl; the systemd
    // unit checked by systemd-analyze.
    let python = crate::python::env()?;
    let kubectl = crate::kubectl::debian()?;
    if crate::setup::which("systemd-analyze").is_none() {
        apt::install(&["systemd"])?;
    }
    // The Debian package, installed by its test into a clean Debian 12 root; the agent's
    // image, run by its test with the DaemonSet's security settings; their arm64 twins.
    let dist = crate::dist::run()?;
    // The arm64 image's test runs its binary under qemu's user mode.
    if crate::setup::which("qemu-aarch64-static").is_none() {
        apt::install(&["qemu-user-static"])?;
    }
    let debian_root = crate::debian::systemd_root()?;
    // Tests that cannot build their environment here say so in this file (tests/src/lib.rs).
    let skips = build::workspace_root().join("target/test-skips.txt");
    let _ = std::fs::remove_file(&skips);
    let mut cargo = build::cargo()?;
    // Every test binary runs even when an earlier one failed: all results are wanted. Locked:
    // a Cargo.lock that no longer matches the manifests fails rather than being rewritten.
    cargo
        .args([
            "test",
            "--locked",
            "--release",
            "--workspace",
            "--no-fail-fast",
        ])
        .args(args)
        .env("LINGER_BIN", bin)
        .env("LINGER_DEBIAN_KUBECTL", kubectl)
        .env("LINGER_DEB", dist.deb)
        .env("LINGER_IMAGE", dist.image)
        .env("LINGER_DEB_ARM64", dist.deb_arm64)
        .env("LINGER_IMAGE_ARM64", dist.image_arm64)
        .env("LINGER_DEBIAN_ROOT", debian_root)
        .env("PATH", front_of_path(&python)?);
    let counts = cargo_test(&mut cargo);
    if let Ok(said) = std::fs::read_to_string(&skips) {
        eprintln!("xtask test: tests that could not run here, and why:\n{said}");
    }
    // A filtered run (`cargo xtask test NAME`) is for iterating on cargo tests only.
    if !args.is_empty() {
        eprintln!("xtask test: the VM test does not run with a filter (cargo xtask vm runs it)");
        let (passed, failed) = counts?;
        return summary(passed, failed);
    }
    // The VM runs even when a cargo test failed: both results are wanted. A VM that could
    // not boot counts as one failed test.
    let vm = match vm::run(None, build::Arch::Host).context("the VM test (cargo xtask vm) failed") {
        Ok(counts) => counts,
        Err(e) => {
            eprintln!("xtask test: {e:#}");
            (0, 1)
        }
    };
    let (passed, failed) = counts?;
    summary(passed + vm.0, failed + vm.1)
}

/// PATH with `dir` first.
fn front_of_path(dir: &std::path::Path) -> Result<std::ffi::OsString> {
    let rest = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&rest));
    std::env::join_paths(dirs).context("PATH")
}

/// Runs cargo test, passing its output through, and adds up its `test result:` lines.
fn cargo_test(cmd: &mut std::process::Command) -> Result<(u64, u64)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let stdout = child.stdout.take().context("cargo test's output")?;
    let (mut passed, mut failed) = (0, 0);
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some(result) = line.strip_prefix("test result: ") {
            passed += count(result, " passed");
            failed += count(result, " failed");
        }
    }
    let status = child.wait()?;
    if !status.success() && failed == 0 {
        // Failed before running tests (a build error): say so rather than count nothing.
        bail!("cargo test exited with {status}");
    }
    Ok((passed, failed))
}

/// The number before `what` in `ok. 7 passed; 0 failed; ...`.
fn count(result: &str, what: &str) -> u64 {
    result
        .split(';')
        .find(|part| part.ends_with(what))
        .and_then(|part| part.trim_end_matches(what).split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn summary(passed: u64, failed: u64) -> Result<()> {
    println!("tests: {passed} passed, {failed} failed");
    if failed > 0 {
        bail!("{failed} test(s) failed");
    }
    Ok(())
}
