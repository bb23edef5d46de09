//! A real recording shared by the trace tests: `linger live --json --record` while children
//! are killed, so the live report and the trace come from one run.
#![allow(dead_code, reason = "each trace test file uses a part of it")]

use std::{
    collections::BTreeSet,
    ffi::OsString,
    io::BufRead,
    path::{Path, PathBuf},
    process::Output,
    time::{Duration, Instant},
};

use linger_tests::{linger, Live, Target, TempDir};
use nix::sys::signal::Signal;

/// How long a recording lasts at least: more than three of the writer's 1 s chunks.
const RECORDED: Duration = Duration::from_millis(3500);

/// What one recorded run left behind.
pub struct Recording {
    pub trace: PathBuf,
    /// `live --json` stdout.
    pub live_json: String,
    pub live_stderr: String,
    /// Pids of the children killed, in kill order (the last one a while after the others).
    pub killed: Vec<u32>,
    /// Keeps the folder of the trace alive.
    _dir: TempDir,
}

/// Records `extra` args (e.g. `--uncompressed`) for at least 3.5 s while killing children: three
/// 4-thread ones at once, then one more 2.5 s later, so the trace spans several chunks. linger is
/// stopped with SIGINT once every kill's incident came out, not after a fixed duration: without
/// the wait4 tracepoint an incident waits for the kernel to free the task, an RCU grace period
/// after the reap (hundreds of ms on a busy machine, and at times never: docs/modes.md), so a
/// fixed duration would cut the last one off by timing alone. A kill linger never reports still
/// fails the test, at the hang guard.
pub fn record(name: &str, extra: &[&str]) -> Recording {
    let dir = TempDir::new(name);
    let trace = dir.join("run.lgr");
    let mut args: Vec<OsString> = vec!["--json".into(), "--record".into(), trace.clone().into()];
    args.extend(extra.iter().map(OsString::from));
    let mut live = Live::start(args);
    let started = Instant::now();
    let batch: Vec<Target> = (0..3).map(|_| Target::start(4, "default")).collect();
    let mut killed: Vec<u32> = batch.into_iter().map(kill).collect();
    std::thread::sleep(Duration::from_millis(2500));
    killed.push(kill(Target::start(2, "default")));
    let mut unseen: BTreeSet<u32> = killed.iter().copied().collect();
    while !unseen.is_empty() {
        let Some(line) = live.next_record() else {
            break;
        };
        if line["type"] == "incident" {
            if let Some(pid) = line["target"]["pid"].as_u64() {
                unseen.remove(&(pid as u32));
            }
        }
    }
    std::thread::sleep(RECORDED.saturating_sub(started.elapsed()));
    live.child.signal(Signal::SIGINT);
    let out = live.finish();
    assert!(out.status.success(), "linger live failed: {}", out.stderr);
    Recording {
        trace,
        live_json: out.lines.iter().map(|l| format!("{l}\n")).collect(),
        live_stderr: out.stderr,
        killed,
        _dir: dir,
    }
}

/// Reads lines until one contains `word` (linger's "started" line); returns what was read.
pub fn wait_for_line(from: &mut impl BufRead, word: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(word) {
        let mut line = String::new();
        let n = from.read_line(&mut line).expect("reading linger's stderr");
        assert!(n > 0, "linger ended before saying {word:?}: {seen}");
        seen.push_str(&line);
    }
    seen
}

fn kill(mut target: Target) -> u32 {
    target.child.signal(Signal::SIGKILL);
    target.child.wait();
    target.pid
}

/// Runs linger with `args`.
pub fn run(args: &[&str], file: &Path) -> Output {
    linger()
        .args(args)
        .arg(file)
        .output()
        .expect("running linger")
}

/// The incident lines of JSON output, parsed.
pub fn incidents(json_lines: &str) -> Vec<serde_json::Value> {
    json_lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .filter(|v| v["type"] == "incident")
        .collect()
}

/// Target pids of the incidents.
pub fn incident_pids(json_lines: &str) -> Vec<u32> {
    incidents(json_lines)
        .iter()
        .filter_map(|v| v["target"]["pid"].as_u64().map(|p| p as u32))
        .collect()
}
