//! Helpers shared by the integration tests and benchmarks: the `linger` binary under test, the
//! processes it traces and the JSON lines it prints.
//!
//! Every child sits in a [`Guarded`], killed and reaped when dropped, so a failing test leaves no
//! process behind. Every wait is bounded by [`HANG_GUARD`]: a hung program fails the test instead
//! of hanging it. That bound only catches hangs; it asserts nothing about speed.

use std::{
    collections::BTreeSet,
    ffi::OsStr,
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, ExitStatus, Stdio},
    sync::mpsc::{self, Receiver, RecvTimeoutError},
    thread,
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

pub mod accuracy;
pub mod agent;
pub mod bench;
pub mod doctor;
pub mod fixtures;
pub mod gate;

/// Longest wait for a line or an exit before the test gives up on a hung child.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// What `linger live` prints on stderr once its programs are attached.
pub const READY: &str = "linger: tracing fatal signals (Ctrl-C to stop)";

/// The binary under test: `cargo xtask test` builds it and sets `LINGER_BIN`.
pub fn linger_bin() -> PathBuf {
    match std::env::var("LINGER_BIN") {
        Ok(path) => PathBuf::from(path),
        Err(_) => panic!(
            "LINGER_BIN is not set: run the integration tests with `cargo xtask test`, \
             which builds target/release/linger and points LINGER_BIN at it"
        ),
    }
}

pub fn linger() -> Command {
    Command::new(linger_bin())
}

/// A fresh folder `linger-NAME-PID` under the system's temporary one (what an earlier run left
/// under that name removed first), removed with all it holds when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("linger-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Self(dir)
    }

    /// [`TempDir::new`], that only its owner may enter (mode 0700).
    pub fn private(name: &str) -> Self {
        let dir = Self::new(name);
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap_or_else(|e| panic!("chmod 0700 {}: {e}", dir.path().display()));
        dir
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside it.
    pub fn join(&self, path: impl AsRef<Path>) -> PathBuf {
        self.0.join(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A stand-in GPU device: `dir/gpu0`, a char device node for /dev/full (1:7), which tests
/// declare with `--gpu-device`. Needs root.
pub fn stand_in_device(dir: &Path) -> PathBuf {
    let node = dir.join("gpu0");
    bench::stand_in_device(&node).unwrap_or_else(|e| panic!("stand-in device: {e:#}"));
    node
}

/// Tests that load eBPF programs need root; say so plainly instead of failing further on.
/// Where tests that could not build their environment say so: `cargo xtask test` prints it
/// at its end (the test runner hides a passing test's own output).
pub fn skips_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-skips.txt")
}

/// The calling test cannot build the environment it tests here (`reason`): under CI
/// (`CI=true`) that fails it; elsewhere it ends early, saying why in [`skips_file`].
pub fn cannot_run_here(reason: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    cannot_run(reason, ci, &skips_file());
}

fn cannot_run(reason: &str, ci: bool, skips: &Path) {
    if ci {
        panic!("{reason}: CI must give this test what it needs");
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let line = format!("{test}: {reason}\n");
    eprint!("not run: {line}");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(skips);
    if let Ok(mut file) = file {
        let _ = file.write_all(line.as_bytes());
    }
}

pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test loads eBPF programs and needs root: run `sudo cargo xtask test`"
    );
}

/// A child that is killed (SIGKILL) and reaped on drop, unless it was already waited for.
pub struct Guarded(pub Child);

impl Guarded {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Waits for the child to exit; it is this process that reaps it (wait4).
    pub fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + HANG_GUARD;
        loop {
            match self.0.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                Ok(None) => panic!("child {} did not exit within {HANG_GUARD:?}", self.pid()),
                Err(e) => panic!("waiting for child {}: {e}", self.pid()),
            }
        }
    }

    pub fn signal(&self, sig: Signal) {
        nix::sys::signal::kill(Pid::from_raw(self.pid() as i32), sig)
            .unwrap_or_else(|e| panic!("sending {sig} to {}: {e}", self.pid()));
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // Errors mean it is already gone, which is what we want.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child's output, read line by line on a thread so the child never blocks on a full pipe.
pub struct Lines {
    rx: Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    pub fn read(from: impl Read + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(from).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            rx,
            seen: Vec::new(),
        }
    }

    /// The next line, or None at the end of the output.
    pub fn next_line(&mut self) -> Option<String> {
        match self.rx.recv_timeout(HANG_GUARD) {
            Ok(line) => {
                self.seen.push(line.clone());
                Some(line)
            }
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => {
                panic!("no output within {HANG_GUARD:?}; so far: {:?}", self.seen)
            }
        }
    }

    /// Reads up to the end of the output; returns every line, earlier ones included.
    pub fn all(&mut self) -> Vec<String> {
        while self.next_line().is_some() {}
        self.seen.clone()
    }
}

/// `linger __target`: a process with a known number of threads for the tracer to watch die.
pub struct Target {
    pub child: Guarded,
    pub stdout: Lines,
    pub pid: u32,
}

impl Target {
    /// Starts one and waits until all its threads exist. `on_term`: default, survive or exit.
    pub fn start(threads: u32, on_term: &str) -> Self {
        Self::start_with(threads, on_term, &[])
    }

    /// [`Target::start`] with more arguments for `linger __target`.
    pub fn start_with(threads: u32, on_term: &str, more: &[&str]) -> Self {
        let child = linger()
            .args([
                "__target",
                "--threads",
                &threads.to_string(),
                "--on-term",
                on_term,
            ])
            .args(more)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting linger __target");
        let mut child = Guarded(child);
        let mut stdout = Lines::read(child.0.stdout.take().expect("piped stdout"));
        let ready = stdout.next_line().unwrap_or_default();
        let pid = child.pid();
        assert_eq!(ready, format!("ready {pid}"), "__target did not start");
        Self { child, stdout, pid }
    }

    /// Its threads' ids, as the kernel lists them now.
    pub fn tids(&self) -> BTreeSet<u32> {
        let dir = format!("/proc/{}/task", self.pid);
        std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {dir}: {e}"))
            .map(|entry| {
                let name = entry.expect("reading a task entry").file_name();
                name.to_string_lossy().parse().expect("task dirs are tids")
            })
            .collect()
    }
}

/// A running `linger live`.
pub struct Live {
    pub child: Guarded,
    stdout: Lines,
    stderr: Lines,
}

impl Live {
    /// Starts `linger live ARGS` and returns once it says its programs are attached.
    pub fn start<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Self {
        let mut child = Guarded(
            linger()
                .arg("live")
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("starting linger live"),
        );
        let stdout = Lines::read(child.0.stdout.take().expect("piped stdout"));
        let mut stderr = Lines::read(child.0.stderr.take().expect("piped stderr"));
        loop {
            match stderr.next_line() {
                Some(line) if line == READY => break,
                Some(_) => {}
                None => panic!(
                    "linger live ended before attaching ({:?}): {:?}",
                    child.wait(),
                    stderr.all()
                ),
            }
        }
        Self {
            child,
            stdout,
            stderr,
        }
    }

    /// Traces incidents of `pid` only and stops after the first one (or after 20 s).
    pub fn watch(pid: u32, survive_after: &str) -> Self {
        Self::watch_with(pid, survive_after, &[])
    }

    /// [`Live::watch`] with more arguments for `linger live`.
    pub fn watch_with(pid: u32, survive_after: &str, more: &[&str]) -> Self {
        let pid = pid.to_string();
        let args = [
            "--json",
            "--pid",
            &pid,
            "--count",
            "1",
            "--duration",
            "20s",
            "--survive-after",
            survive_after,
        ];
        Self::start(args.iter().chain(more))
    }

    /// The next line linger prints on stdout, parsed, while it runs; None once it ended.
    pub fn next_record(&mut self) -> Option<Value> {
        let line = self.stdout.next_line()?;
        Some(
            serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}")),
        )
    }

    /// The records linger prints until one of `record_type` about `pid` (its `target`), and
    /// that one; fails if linger ends first.
    pub fn until(&mut self, record_type: &str, pid: u32) -> (Value, Vec<Value>) {
        let mut seen = Vec::new();
        while let Some(record) = self.next_record() {
            if record["type"] == record_type && record["target"]["pid"] == pid {
                return (record, seen);
            }
            seen.push(record);
        }
        panic!("no {record_type} for pid {pid}: linger live ended");
    }

    /// Waits for linger to stop (on its own, or after a signal the test sent) and returns
    /// what it printed.
    pub fn finish(mut self) -> Output {
        let status = self.child.wait();
        let lines = self.stdout.all();
        let records = lines
            .iter()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"))
            })
            .collect();
        Output {
            status,
            records,
            lines,
            stderr: self.stderr.all().join("\n"),
        }
    }
}

/// What a finished `linger live` printed.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    /// Every stdout line, parsed.
    pub records: Vec<Value>,
    /// Every stdout line as printed.
    pub lines: Vec<String>,
    /// Every stderr line, the ready line included.
    pub stderr: String,
}

impl Output {
    pub fn of_type(&self, record_type: &str) -> Vec<&Value> {
        self.records
            .iter()
            .filter(|r| r["type"] == record_type)
            .collect()
    }

    /// The one incident whose target is `pid`; fails showing all the output otherwise.
    pub fn incident_of(&self, pid: u32) -> &Value {
        assert!(self.status.success(), "linger live failed: {self:#?}");
        let mut found = self
            .of_type("incident")
            .into_iter()
            .filter(|r| r["target"]["pid"] == pid);
        match (found.next(), found.next()) {
            (Some(incident), None) => incident,
            _ => panic!("expected exactly one incident for pid {pid}: {self:#?}"),
        }
    }
}

/// `value[pointer]` as an integer; fails naming the field and showing the record.
pub fn num(value: &Value, pointer: &str) -> u64 {
    value
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{pointer} is not an integer in {value:#}"))
}

/// `value[pointer]` as a string; fails naming the field and showing the record.
pub fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{pointer} is not a string in {value:#}"))
}

/// `value[pointer]` as an array; fails naming the field and showing the record.
pub fn list<'a>(value: &'a Value, pointer: &str) -> &'a [Value] {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_else(|| panic!("{pointer} is not an array in {value:#}"))
}

/// The timeline of an incident whose process died and was reaped, checked against what the
/// kernel guarantees. Signal generation comes first; each thread dequeues the signal before it
/// leaves the group's live count, so every delivery precedes the group-dead exit. Exits are
/// bounded by the zombie notification rather than the group-dead exit: a thread can leave the
/// live count, be preempted, and record its exit after the thread that ended the group.
/// How the default mode names the reaper here: with no NVIDIA driver registered, no
/// system call tracepoint is attached, so the reaper is the parent its SIGCHLD went to and the
/// reap has bounds (`parent`); with a driver, whichever the hooks chosen give.
pub fn default_reap_how() -> Option<&'static str> {
    let devices = std::fs::read_to_string("/proc/devices").unwrap_or_default();
    (!devices.contains("nvidia")).then_some("parent")
}

/// `pid` reaped the incident's process: seen returning from wait4 (`wait`, at `t_reaped_ns`),
/// or named as the parent its SIGCHLD went to (`parent`, reaped between `t_zombie_ns` and
/// `t_reaped_ns`, the kernel freeing the task), with its comm.
pub fn assert_reaped_by(incident: &Value, pid: u32, how: Option<&str>) {
    assert_eq!(num(incident, "/reaper/pid"), u64::from(pid), "{incident:#}");
    let me = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    assert_eq!(
        text(incident, "/reaper/comm"),
        me.trim_end(),
        "{incident:#}"
    );
    let seen = text(incident, "/reaper/how");
    if let Some(how) = how {
        assert_eq!(seen, how, "{incident:#}");
    }
    assert!(
        ["wait", "parent"].contains(&seen),
        "reaper seen as {seen:?}: {incident:#}"
    );
}

pub fn assert_exit_timeline(incident: &Value) {
    let t_signal = num(incident, "/t_signal_ns");
    let t_dead = num(incident, "/t_group_dead_ns");
    let t_zombie = num(incident, "/t_zombie_ns");
    let t_reaped = num(incident, "/t_reaped_ns");
    for d in list(incident, "/deliveries") {
        let t = num(d, "/t_ns");
        assert!(
            t_signal <= t && t <= t_dead,
            "delivery out of order: {incident:#}"
        );
    }
    let exits = list(incident, "/exits");
    for e in exits {
        let t = num(e, "/t_ns");
        assert!(
            t_signal <= t && t <= t_zombie,
            "exit out of order: {incident:#}"
        );
    }
    assert_eq!(
        exits.iter().filter(|e| num(e, "/t_ns") == t_dead).count(),
        1,
        "t_group_dead_ns must be one thread's exit: {incident:#}"
    );
    assert!(
        t_signal <= t_dead && t_dead <= t_zombie && t_zombie <= t_reaped,
        "signal, group death, zombie and reap out of order: {incident:#}"
    );
}

/// The thread ids of an incident's `exits`, checked to be distinct.
pub fn exit_tids(incident: &Value) -> BTreeSet<u32> {
    let exits = list(incident, "/exits");
    let tids: BTreeSet<u32> = exits.iter().map(|e| num(e, "/tid") as u32).collect();
    assert_eq!(
        tids.len(),
        exits.len(),
        "a thread exited twice: {incident:#}"
    );
    tids
}

/// A `linger-fd-scenario` process (`exe`, its path from the test's `CARGO_BIN_EXE_...`) on
/// `device`, and the pids on its `ready` line (its own first); every one of them is
/// SIGKILLed, and its own reaped, when this goes.
pub struct FdScenario {
    child: Child,
    out: BufReader<ChildStdout>,
    pub pids: Vec<u32>,
}

impl FdScenario {
    pub fn start(exe: &str, device: &std::path::Path, name: &str) -> Self {
        Self::start_with(exe, device, &[name])
    }

    /// A scenario and its arguments.
    pub fn start_with(exe: &str, device: &std::path::Path, args: &[&str]) -> Self {
        let mut child = Command::new(exe)
            .arg(device)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start scenario");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut s = Self {
            child,
            out,
            pids: Vec::new(),
        };
        s.pids = s.ready(args[0]);
        s
    }

    /// Lets a scenario waiting for its go (a line on its stdin) go on; its next `ready` line
    /// gives the pids from then on.
    pub fn go(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "go").expect("tell the scenario to go");
        self.pids = self.ready("after go");
    }

    fn ready(&mut self, name: &str) -> Vec<u32> {
        let mut line = String::new();
        self.out.read_line(&mut line).expect("ready line");
        line.strip_prefix("ready ")
            .unwrap_or_else(|| panic!("scenario {name} said {line:?}"))
            .split_whitespace()
            .map(|p| p.parse().expect("pid"))
            .collect()
    }

    /// SIGKILLs the scenario's own process and reaps it.
    pub fn kill(&mut self) {
        self.end_with(Signal::SIGKILL);
    }

    /// Sends `sig` (one that ends it) to the scenario's own process and reaps it.
    pub fn end_with(&mut self, sig: Signal) {
        nix::sys::signal::kill(Pid::from_raw(self.pids[0] as i32), sig).expect("kill");
        let _ = self.child.wait();
    }
}

impl Drop for FdScenario {
    fn drop(&mut self) {
        for &pid in &self.pids {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// What a replay by this build adds to a record that `logged` (printed by the build that
/// recorded it) predates: the window of the memory's return (`gpu.t_memory_held_until_ns`,
/// and the evidence line that states it), added 2026-12-06. Taken out of `replayed` where
/// `logged` has no such field, so that replay = live holds for older recordings.
pub fn without_newer_window(replayed: &mut Value, logged: &Value) {
    // How closely the moment is known (issue 58, 2026-12-07).
    if logged["gpu"].get("memory_back_known_to_ns").is_none() {
        if let Some(gpu) = replayed.get_mut("gpu").and_then(Value::as_object_mut) {
            gpu.remove("memory_back_known_to_ns");
        }
    }
    if logged["gpu"].get("t_memory_held_until_ns").is_some() {
        return;
    }
    if let Some(gpu) = replayed.get_mut("gpu").and_then(Value::as_object_mut) {
        gpu.remove("t_memory_held_until_ns");
        if let Some(Value::Array(lines)) = gpu.get_mut("evidence") {
            lines.retain(|l| !l.as_str().is_some_and(|l| l.starts_with("back between +")));
        }
    }
}

/// What a replay by this build says differently from `logged` (printed by the build that
/// recorded it) in a `shared_fd` record written once every holder had let go: its hint no
/// longer says to kill one of them, all being gone (issue 57, 2026-12-07). The replay must say
/// so; the logged hint is then taken, so that replay = live holds for older recordings.
pub fn without_older_hint(replayed: &mut Value, logged: &Value) {
    let holders = logged["holders"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let all_gone = !holders.is_empty() && holders.iter().all(|h| h["t_released_ns"].is_u64());
    let old = logged["verdict"]["hint"].as_str().unwrap_or("");
    if logged["verdict"]["kind"] != "shared_fd" || !all_gone || !old.contains(": kill ") {
        return;
    }
    let new = replayed["verdict"]["hint"].as_str().unwrap_or("");
    assert!(
        new.starts_with("the memory was freed when the last holder let go"),
        "the hint once every holder let go: {new}"
    );
    replayed["verdict"]["hint"] = logged["verdict"]["hint"].clone();
}

#[cfg(test)]
mod tests {
    /// Under CI a test that cannot run fails; elsewhere it says why in the skips file.
    #[test]
    fn a_test_that_cannot_run_fails_under_ci_and_says_why_elsewhere() {
        let dir = super::TempDir::new("skips");
        let skips = dir.join("skips.txt");
        let failed = std::panic::catch_unwind(|| super::cannot_run("no widget here", true, &skips));
        assert!(failed.is_err());
        assert!(!skips.exists());
        super::cannot_run("no widget here", false, &skips);
        let said = std::fs::read_to_string(&skips).expect("the skips file");
        assert!(said.contains("no widget here"), "{said}");
    }
}
