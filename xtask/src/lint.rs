//! `cargo xtask lint`: rustfmt's check, then clippy on the host workspace with warnings as
//! errors (CI runs it before the tests, to fail early).

use std::process::Command;

use anyhow::{Context, Result};

use crate::{build, setup};

pub fn run() -> Result<()> {
    let root = build::workspace_root();
    ensure_components()?;
    // First, as it needs no build: a formatting slip fails in a second.
    setup::status(
        Command::new(cargo())
            .current_dir(&root)
            .args(["fmt", "--all", "--check"]),
    )
    .context("cargo fmt --all --check found unformatted code: run `cargo fmt --all`")?;
    // tracer-ebpf targets bpfel with nightly (tracer-user's build.rs builds it, and with it
    // the eBPF toolchain, which build::cargo installs first): the host workspace is the rest.
    setup::status(build::cargo()?.current_dir(&root).args([
        "clippy",
        "--locked",
        "--workspace",
        "--exclude",
        "tracer-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))
    .context("clippy found warnings")
}

fn cargo() -> std::ffi::OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// rustfmt and clippy come with rustup's default profile, not its minimal one: added to the
/// toolchain in use when missing.
fn ensure_components() -> Result<()> {
    let has = |sub: &str| {
        Command::new(cargo())
            .args([sub, "--version"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let missing: Vec<&str> = [("fmt", "rustfmt"), ("clippy", "clippy")]
        .into_iter()
        .filter(|(sub, _)| !has(sub))
        .map(|(_, component)| component)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: adding {} with rustup", missing.join(" and "));
    setup::status(
        Command::new("rustup")
            .args(["component", "add"])
            .args(&missing),
    )
    .context("adding rustfmt and clippy with rustup failed")
}
