//! Building and running linger with the eBPF toolchain on PATH.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};

pub use crate::workspace::{cargo, workspace_root};
use crate::{cross, setup};

/// Which machine a build is for.
#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
pub enum Arch {
    /// This machine's.
    Host,
    /// arm64 (Grace hosts), with Debian's gcc-aarch64-linux-gnu.
    Aarch64,
}

/// `cargo SUBCOMMAND` building for `arch`.
fn cargo_for(arch: Arch, subcommand: &str) -> Result<Command> {
    match arch {
        Arch::Host => {
            let mut cargo = cargo()?;
            cargo.arg(subcommand);
            Ok(cargo)
        }
        Arch::Aarch64 => cross::cargo(subcommand),
    }
}

/// Where the release builds for `arch` land.
fn release_dir(arch: Arch) -> PathBuf {
    match arch {
        Arch::Host => workspace_root().join("target/release"),
        Arch::Aarch64 => workspace_root()
            .join("target")
            .join(cross::TARGET)
            .join("release"),
    }
}

/// A locked release build of the tests' package (its programs and integration tests).
pub const TESTS_PACKAGE: [&str; 4] = ["--locked", "--release", "--package", "linger-tests"];

/// Builds the release `linger` for `arch` and returns its path.
pub fn linger(arch: Arch) -> Result<PathBuf> {
    setup::status(cargo_for(arch, "build")?.args([
        "--locked",
        "--release",
        "--package",
        "tracer-user",
        "--bin",
        "linger",
    ]))?;
    Ok(release_dir(arch).join("linger"))
}

/// Builds the integration test binaries tests/tests/NAME.rs of `names`, in one cargo run (each
/// run would check the whole package again), and returns their paths in the same order (cargo
/// names them by a hash of their build, which only cargo's own report tells).
pub fn integration_tests(names: &[&str], arch: Arch) -> Result<Vec<PathBuf>> {
    let mut cargo = cargo_for(arch, "test")?;
    cargo
        .args(TESTS_PACKAGE)
        .args(["--no-run", "--message-format=json"]);
    for name in names {
        cargo.args(["--test", name]);
    }
    let out = cargo
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    let messages: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    if !out.status.success() {
        // With JSON output the compiler's diagnostics (a type error, the linker's "No space
        // left on device") reach only stdout: without them the failure says nothing.
        for rendered in messages
            .iter()
            .filter(|m| m["reason"] == "compiler-message")
            .filter_map(|m| m["message"]["rendered"].as_str())
        {
            eprint!("{rendered}");
        }
        bail!("building the tests {names:?} failed: {}", out.status);
    }
    let artifacts: Vec<&serde_json::Value> = messages
        .iter()
        .filter(|m| m["reason"] == "compiler-artifact")
        .collect();
    names
        .iter()
        .map(|name| {
            artifacts
                .iter()
                .find(|m| m["target"]["name"] == *name && m["target"]["kind"][0] == "test")
                .and_then(|m| m["executable"].as_str().map(PathBuf::from))
                .with_context(|| format!("cargo built no {name} test binary"))
        })
        .collect()
}

/// Builds one program of the linger-tests package for `arch` and returns its path.
pub fn test_bin(name: &str, arch: Arch) -> Result<PathBuf> {
    setup::status(
        cargo_for(arch, "build")?
            .args(TESTS_PACKAGE)
            .args(["--bin", name]),
    )?;
    Ok(release_dir(arch).join(name))
}

pub fn run(args: &[String]) -> Result<()> {
    let bin = linger(Arch::Host)?;
    setup::status(Command::new(bin).args(args))
}
