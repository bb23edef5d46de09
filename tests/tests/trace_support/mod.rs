//! A real recording shared by the trace tests: `linger live --json --record` while children
//! are killed, so the live report and the trace come from one run.
#![allow(dead_code, reason = "each trace test file uses a part of it")]

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use nix::{sys::signal::Signal, unistd::Pid};

pub fn linger() -> PathBuf {
    PathBuf::from(std::env::var_os("LINGER_BIN").expect(
        "LINGER_BIN is not set: run the integration tests with `cargo xtask test` (as root)",
    ))
}

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

/// Records `extra` args (e.g. `--uncompressed`) for about 3.5 s while killing children: three
/// 4-thread ones at once, then one more 2.5 s later, so the trace spans several chunks.
pub fn record(name: &str, extra: &[&str]) -> Recording {
    let dir = TempDir::new(name);
    let trace = dir.0.join("run.lgr");
    let mut live = Command::new(linger())
        .args(["live", "--json", "--duration", "3500ms", "--record"])
        .arg(&trace)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting linger live");
    let mut stderr = BufReader::new(live.stderr.take().expect("piped"));
    let first = wait_for_line(&mut stderr, "tracing");
    let mut killed = Vec::new();
    let batch: Vec<Child> = (0..3).map(|_| target(4)).collect();
    killed.extend(batch.into_iter().map(kill));
    std::thread::sleep(Duration::from_millis(2500));
    killed.push(kill(target(2)));
    let mut live_json = String::new();
    live.stdout
        .take()
        .expect("piped")
        .read_to_string(&mut live_json)
        .expect("live's stdout");
    let mut live_stderr = first;
    stderr
        .read_to_string(&mut live_stderr)
        .expect("live's stderr");
    let status = live.wait().expect("linger live");
    assert!(status.success(), "linger live failed: {live_stderr}");
    Recording {
        trace,
        live_json,
        live_stderr,
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

/// A `linger __target` child, waited for until it says it is ready.
pub fn target(threads: u32) -> Child {
    let mut child = Command::new(linger())
        .args(["__target", "--threads", &threads.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting a target");
    let mut ready = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut ready)
        .expect("target's stdout");
    assert!(ready.starts_with("ready"), "target said {ready:?}");
    child
}

fn kill(mut child: Child) -> u32 {
    let pid = child.id();
    nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("kill");
    child.wait().expect("reaping the target");
    pid
}

/// Runs linger with `args`.
pub fn run(args: &[&str], file: &Path) -> Output {
    Command::new(linger())
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

/// Target pids of incidents that ended with the target reaped.
pub fn reaped_pids(json_lines: &str) -> Vec<u32> {
    incidents(json_lines)
        .iter()
        .filter(|v| !v["t_reaped_ns"].is_null())
        .filter_map(|v| v["target"]["pid"].as_u64().map(|p| p as u32))
        .collect()
}

/// A folder removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("linger-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a temp folder");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
