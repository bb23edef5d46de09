//! `cargo xtask fuzz [TARGET] [-- LIBFUZZER OPTIONS]`: a fuzz target of `fuzz/` (default
//! `whole_replay`) built with the pinned nightly and libFuzzer's coverage instrumentation (the
//! flags cargo-fuzz passes, so no cargo-fuzz is needed), then run on a corpus seeded with every
//! committed recording. Without options it runs 60 s (CI's short run); `-runs=10000000` is the
//! bench's. libFuzzer's last lines (executions, coverage) are printed; a crash fails.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{build::workspace_root, setup};

/// libFuzzer's coverage instrumentation, as cargo-fuzz passes it.
const SANCOV: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "--cfg",
    "fuzzing",
    "-Cdebug-assertions",
    "-Coverflow-checks",
];

/// The largest input tried, and of the committed recordings those up to it seed the corpus
/// (39 of 49, every kind of scenario among them): a whole replay of a megabyte takes about a
/// second here, of 256 KiB a fraction of that.
const MAX_LEN: u64 = 256 * 1024;

pub fn run(args: &[String]) -> Result<()> {
    let (target, options) = match args.split_first() {
        Some((t, rest)) if !t.starts_with('-') => (t.as_str(), rest),
        _ => ("whole_replay", args),
    };
    let root = workspace_root();
    let bin = build(target)?;
    let corpus = root.join("target/fuzz/corpus").join(target);
    seed(&root.join("tests/data"), &corpus)?;
    let mut libfuzzer = Command::new(&bin);
    libfuzzer.arg(&corpus).arg(format!("-max_len={MAX_LEN}"));
    if options.is_empty() {
        libfuzzer.arg("-max_total_time=60");
    }
    libfuzzer
        .args(options)
        .current_dir(root.join("target/fuzz"));
    let status = libfuzzer.status().context("running the fuzz target")?;
    if !status.success() {
        bail!("the fuzz target {target} failed ({status}): its crash file is in target/fuzz");
    }
    Ok(())
}

/// Builds the fuzz target `target` with libFuzzer's instrumentation; returns its path.
pub fn build(target: &str) -> Result<PathBuf> {
    setup::run()?;
    let fuzz = workspace_root().join("fuzz");
    let triple = "x86_64-unknown-linux-gnu";
    setup::status(
        Command::new("rustup")
            .args([
                "run",
                setup::EBPF_NIGHTLY,
                "cargo",
                "build",
                "--locked",
                "--release",
            ])
            .args(["--target", triple, "--bin", target])
            .arg("--manifest-path")
            .arg(fuzz.join("Cargo.toml"))
            .env("RUSTFLAGS", SANCOV.join(" ")),
    )
    .context("building the fuzz target")?;
    Ok(fuzz
        .join("target")
        .join(triple)
        .join("release")
        .join(target))
}

/// Copies every committed recording (`.trace`, `.lgr`) of at most [`MAX_LEN`] bytes below
/// `data` into `corpus`.
pub fn seed(data: &Path, corpus: &Path) -> Result<()> {
    fs::create_dir_all(corpus)?;
    let mut todo: Vec<PathBuf> = vec![data.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "trace" || e == "lgr")
                && fs::metadata(&path)?.len() <= MAX_LEN
            {
                let name = path
                    .strip_prefix(data)
                    .unwrap_or(&path)
                    .to_string_lossy()
                    .replace('/', "_");
                fs::copy(&path, corpus.join(name))?;
            }
        }
    }
    Ok(())
}
