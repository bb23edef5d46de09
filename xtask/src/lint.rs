//! `cargo xtask lint`: rustfmt's check, the size of the library's files, no import circle
//! between the product's files, then clippy on the host workspace and on the eBPF crate (for each architecture it is built for) with warnings
//! as errors, functions over clippy.toml's 120 lines among them (CI runs it before the tests,
//! to fail early).

mod circles;
mod rust_paths;

use std::{path::Path, process::Command};

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
    file_sizes(&root.join("tracer-user/src"))?;
    circles::check(&root)?;
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
        // Its threshold is clippy.toml's: lines of code, comments and blank lines aside.
        "-D",
        "clippy::too_many_lines",
    ]))
    .context("clippy found warnings")?;
    ebpf_clippy(&root)
}

/// The code that runs in the kernel, linted as the kernel gets it: the pinned nightly, the
/// bpfel target, `core` built from source, once per `bpf_target_arch` (kprobe and uprobe
/// arguments are read per architecture). Its own target directory: the host's is not reused.
fn ebpf_clippy(root: &Path) -> Result<()> {
    let toolchain = setup::EBPF_NIGHTLY;
    let listed = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", toolchain])
        .output()
        .context("rustup component list")?;
    if !String::from_utf8_lossy(&listed.stdout)
        .lines()
        .any(|l| l.starts_with("clippy"))
    {
        eprintln!("xtask: adding clippy to {toolchain}");
        setup::status(Command::new("rustup").args([
            "component",
            "add",
            "clippy",
            "--toolchain",
            toolchain,
        ]))?;
    }
    for arch in ["x86_64", "aarch64"] {
        setup::status(
            Command::new("rustup")
                .current_dir(root)
                .args(["run", toolchain, "cargo", "clippy", "--locked", "--package"])
                .arg("tracer-ebpf")
                .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
                .args(["--", "-D", "warnings", "-D", "clippy::too_many_lines"])
                .env("CARGO_TARGET_DIR", root.join("target/ebpf-clippy"))
                .env("RUSTFLAGS", format!("--cfg bpf_target_arch=\"{arch}\"")),
        )
        .with_context(|| format!("clippy found warnings in tracer-ebpf ({arch})"))?;
    }
    Ok(())
}

/// The longest a file of the library may be: one job a file.
const MAX_FILE_LINES: usize = 700;
/// The longest a command's file may be: the commands parse options and print, the logic
/// lives in the library.
const MAX_CLI_FILE_LINES: usize = 250;

/// Every `.rs` file below `dir` within [`MAX_FILE_LINES`], and below its `cli/` within
/// [`MAX_CLI_FILE_LINES`].
fn file_sizes(dir: &Path) -> Result<()> {
    let mut long = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let lines = std::fs::read_to_string(&path)?.lines().count();
                let cli = path.components().any(|c| c.as_os_str() == "cli");
                let most = if cli {
                    MAX_CLI_FILE_LINES
                } else {
                    MAX_FILE_LINES
                };
                if lines > most {
                    long.push(format!(
                        "{} ({lines} lines, at most {most})",
                        path.display()
                    ));
                }
            }
        }
    }
    if !long.is_empty() {
        anyhow::bail!(
            "files too long (split them by job; commands keep only options and printing): {}",
            long.join(", ")
        );
    }
    Ok(())
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
