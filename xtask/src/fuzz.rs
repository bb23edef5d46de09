//! `cargo xtask fuzz [TARGET] [-- LIBFUZZER OPTIONS]`: a fuzz target of `fuzz/` (default
//! `whole_replay`) built with the pinned nightly and libFuzzer's coverage instrumentation (the
//! flags cargo-fuzz passes, so no cargo-fuzz is needed), then run on a corpus seeded with the
//! committed recordings cut into small whole recordings (`linger-fuzz-seeds`) and minimized
//! by libFuzzer's merge. Without options it runs 60 s (CI's short run), and says how many
//! executions that was and how many edges it reached of those the whole recordings reach. A
//! crash fails.

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

/// The largest input tried, and the size the recordings are cut to: a whole replay of 8 KiB
/// runs about 400 times a second here (one of a 256 KiB recording, twice), and the pieces
/// reach 94 % of the edges the whole recordings reach (4 KiB: 89 %; 16 KiB: 97 % at half the
/// speed; measured 2026-12-07).
pub const MAX_LEN: u64 = 8192;
/// At most this many pieces of one recording, spread over it (a long campaign's recording
/// cuts into hundreds).
const PIECES_PER_RECORDING: u32 = 200;
/// The whole recordings up to this size are the reference the pieces' edges are counted
/// against (41 of 45: the campaigns' two are a megabyte or more, a second or more each).
const REFERENCE_MAX_LEN: u64 = 256 * 1024;

pub fn run(args: &[String]) -> Result<()> {
    let (target, options) = match args.split_first() {
        Some((t, rest)) if !t.starts_with('-') => (t.as_str(), rest),
        _ => ("whole_replay", args),
    };
    let root = workspace_root();
    let bin = build(target)?;
    let work = root.join("target/fuzz");
    let corpus = work.join("corpus").join(target);
    seed(&root, &bin, &corpus)?;
    let mut libfuzzer = Command::new(&bin);
    libfuzzer.arg(&corpus).arg(format!("-max_len={MAX_LEN}"));
    let ci_minute = options.is_empty();
    if ci_minute {
        libfuzzer.args(["-max_total_time=60", "-print_final_stats=1"]);
    }
    let output = libfuzzer
        .args(options)
        .current_dir(&work)
        .stderr(std::process::Stdio::piped())
        .output()
        .context("running the fuzz target")?;
    let log = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = log.lines().rev().take(20).collect();
    for line in tail.iter().rev() {
        eprintln!("{line}");
    }
    if !output.status.success() {
        bail!(
            "the fuzz target {target} failed ({}): its crash file is in target/fuzz",
            output.status
        );
    }
    if ci_minute {
        let reference = reference_edges(&root, &bin)?;
        let runs = final_stat(&log, "number_of_executed_units").unwrap_or(0);
        let edges = done_field(&log, "cov:").unwrap_or(0);
        eprintln!(
            "xtask fuzz: {runs} executions in 60 s; {edges} edges, {:.0} % of the {reference} \
             the whole recordings reach",
            100.0 * edges as f64 / reference.max(1) as f64
        );
    }
    Ok(())
}

/// Fills `corpus` afresh: the committed recordings cut into pieces, then minimized by
/// libFuzzer's merge (the pieces that add coverage); returns how many pieces there were.
pub fn seed(root: &Path, bin: &Path, corpus: &Path) -> Result<usize> {
    let pieces = corpus.with_extension("pieces");
    for dir in [corpus, pieces.as_path()] {
        if dir.exists() {
            fs::remove_dir_all(dir)?;
        }
        fs::create_dir_all(dir)?;
    }
    let cutter = crate::build::test_bin("linger-fuzz-seeds", crate::build::Arch::Host)?;
    setup::status(
        Command::new(cutter)
            .arg(MAX_LEN.to_string())
            .arg(PIECES_PER_RECORDING.to_string())
            .arg(&pieces)
            .args(recordings(&root.join("tests/data"), u64::MAX)?),
    )
    .context("cutting the recordings into seeds")?;
    let count = fs::read_dir(&pieces)?.count();
    let merged = Command::new(bin)
        .args(["-merge=1", &format!("-max_len={MAX_LEN}")])
        .arg(corpus)
        .arg(&pieces)
        .current_dir(corpus.parent().unwrap_or(root))
        .output()
        .context("minimizing the corpus")?;
    if !merged.status.success() {
        bail!(
            "minimizing the corpus failed: {}",
            String::from_utf8_lossy(&merged.stderr)
        );
    }
    Ok(count)
}

/// The edges a run over the whole committed recordings (up to [`REFERENCE_MAX_LEN`]) reaches:
/// what the pieces' coverage is measured against.
pub fn reference_edges(root: &Path, bin: &Path) -> Result<u64> {
    let whole = root.join("target/fuzz/whole-recordings");
    if whole.exists() {
        fs::remove_dir_all(&whole)?;
    }
    fs::create_dir_all(&whole)?;
    for (i, path) in recordings(&root.join("tests/data"), REFERENCE_MAX_LEN)?
        .iter()
        .enumerate()
    {
        fs::copy(path, whole.join(i.to_string()))?;
    }
    let run = Command::new(bin)
        .arg(&whole)
        .args(["-runs=0", &format!("-max_len={REFERENCE_MAX_LEN}")])
        .current_dir(&whole)
        .output()
        .context("running the fuzz target on the whole recordings")?;
    done_field(&String::from_utf8_lossy(&run.stderr), "cov:")
        .context("the run over the whole recordings printed no coverage")
}

/// A figure of libFuzzer's last line ("#42\tDONE   cov: 11888 ft: 35458 ..."), by its label.
pub fn done_field(log: &str, name: &str) -> Option<u64> {
    let done = log
        .lines()
        .rev()
        .find(|l| l.split_whitespace().nth(1) == Some("DONE"))?;
    let mut words = done.split_whitespace();
    words.find(|w| *w == name)?;
    words.next()?.parse().ok()
}

/// One of libFuzzer's final stats (`-print_final_stats=1`: "stat::NAME: VALUE").
pub fn final_stat(log: &str, name: &str) -> Option<u64> {
    log.lines()
        .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
        .and_then(|v| v.trim().parse().ok())
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

/// Every committed recording (`.trace`, `.lgr`) of at most `max_len` bytes below `data`, in
/// a stable order.
fn recordings(data: &Path, max_len: u64) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut todo: Vec<PathBuf> = vec![data.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "trace" || e == "lgr")
                && fs::metadata(&path)?.len() <= max_len
            {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}
