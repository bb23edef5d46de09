//! Building and running linger with the eBPF toolchain on PATH.

use std::{env, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};

use crate::setup;

/// A `cargo` command with bpf-linker first on PATH. xtask's builds and tests through it pass
/// `--locked`: a stale Cargo.lock fails them instead of being rewritten.
pub fn cargo() -> Result<Command> {
    let bin = setup::run()?;
    let mut paths = vec![bin];
    paths.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.env("PATH", env::join_paths(paths)?);
    Ok(cmd)
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// Builds target/release/linger and returns its path.
pub fn linger() -> Result<PathBuf> {
    setup::status(cargo()?.args([
        "build",
        "--locked",
        "--release",
        "--package",
        "tracer-user",
        "--bin",
        "linger",
    ]))?;
    Ok(workspace_root().join("target/release/linger"))
}

/// Builds the integration test binary tests/tests/NAME.rs and returns its path (cargo names
/// it by a hash of its build, which only cargo's own report tells).
pub fn integration_test(name: &str) -> Result<PathBuf> {
    let out = cargo()?
        .args([
            "test",
            "--locked",
            "--release",
            "--package",
            "linger-tests",
            "--no-run",
            "--message-format=json",
            "--test",
            name,
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the {name} test failed: {}", out.status);
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .with_context(|| format!("cargo built no {name} test binary"))
}

/// Builds one program of the linger-tests package and returns its path.
pub fn test_bin(name: &str) -> Result<PathBuf> {
    setup::status(cargo()?.args([
        "build",
        "--locked",
        "--release",
        "--package",
        "linger-tests",
        "--bin",
        name,
    ]))?;
    Ok(workspace_root().join("target/release").join(name))
}

pub fn run(args: &[String]) -> Result<()> {
    let bin = linger()?;
    setup::status(Command::new(bin).args(args))
}
