//! `linger wait` as a gate, on a stand-in GPU device (a node for /dev/full, declared with
//! --gpu-device) and without NVML: real processes hold it, fork workers that leave their
//! session, and are killed.

use std::{
    path::Path,
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use linger_tests::{
    gate::{answer, kill_and_wait, one_at_a_time},
    linger, require_root, stand_in_device, FdScenario, TempDir,
};
use serde_json::Value;

const SCENARIO: &str = env!("CARGO_BIN_EXE_linger-fd-scenario");

/// `linger wait` on the stand-in device with `args`, reading no agent's log (an empty state
/// directory); its exit code and JSON answer.
fn gate(device: &Path, state: &TempDir, args: &[&str]) -> (Option<i32>, Value) {
    let out = gate_command(device, state, args)
        .output()
        .expect("running linger wait");
    answer(out)
}

fn gate_command(device: &Path, state: &TempDir, args: &[&str]) -> std::process::Command {
    let mut cmd = linger();
    cmd.arg("wait")
        .args(args)
        .arg("--gpu-device")
        .arg(device)
        .args(["--json", "--state-dir"])
        .arg(state.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The pids the answer names as holders, with their kind.
fn holders(answer: &Value) -> Vec<(u64, String)> {
    answer["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| {
            (
                h["pid"].as_u64().expect("pid"),
                h["kind"].as_str().expect("kind").to_string(),
            )
        })
        .collect()
}

#[test]
fn a_worker_that_left_the_session_keeps_the_gate_closed_until_it_dies() {
    require_root();
    let _alone = one_at_a_time();
    let dir = TempDir::new("gate-setsid");
    let state = TempDir::new("gate-setsid-state");
    let device = stand_in_device(dir.path());
    let mut s = FdScenario::start(SCENARIO, &device, "setsid-worker");
    let (parent, worker) = (s.pids[0], s.pids[1]);
    s.kill();
    let pid = parent.to_string();
    let args = ["--pid", &pid, "--timeout", "2s"];
    let (code, answer) = gate(&device, &state, &args);
    assert_eq!(code, Some(1), "{answer:#}");
    assert_eq!(answer["clean"], false);
    assert_eq!(answer["decided_by"], "files", "no NVML here: {answer:#}");
    assert_eq!(
        holders(&answer),
        vec![(u64::from(worker), "unattributed".to_string())],
        "{answer:#}"
    );
    assert_eq!(answer["holders"][0]["session"], worker, "it called setsid");
    let summary = answer["summary"].as_str().expect("summary");
    assert!(summary.contains(&format!("[{worker}]")), "{summary}");
    assert!(answer["waited_ms"].as_u64() >= Some(2000), "{answer:#}");
    kill_and_wait(worker);
    let (code, answer) = gate(&device, &state, &args);
    assert_eq!(code, Some(0), "{answer:#}");
    assert_eq!(answer["verdict"], "released");
}

#[test]
fn a_gate_started_before_the_kill_names_the_worker_as_the_jobs_and_no_one_else() {
    require_root();
    let _alone = one_at_a_time();
    let dir = TempDir::new("gate-before");
    let state = TempDir::new("gate-before-state");
    let device = stand_in_device(dir.path());
    // Another job's process on the same device, that the gate must not blame.
    let other = FdScenario::start(SCENARIO, &device, "held-before");
    let mut s = FdScenario::start(SCENARIO, &device, "setsid-worker");
    let (parent, worker) = (s.pids[0], s.pids[1]);
    let pid = parent.to_string();
    let running = gate_command(&device, &state, &["--pid", &pid, "--timeout", "3s"])
        .spawn()
        .expect("starting linger wait");
    // The gate's first look sees the parent alive, the worker its child.
    thread::sleep(Duration::from_millis(700));
    s.kill();
    let (code, answer) = answer(running.wait_with_output().expect("linger wait"));
    assert_eq!(code, Some(1), "{answer:#}");
    assert_eq!(
        holders(&answer),
        vec![(u64::from(worker), "live_holder".to_string())],
        "the worker only, not {}: {answer:#}",
        other.pids[0]
    );
    let h = &answer["holders"][0];
    assert_eq!(h["scope"], format!("child of {parent}"), "{answer:#}");
    assert!(
        h["how"].as_str().is_some_and(|how| how.contains("setsid")),
        "{answer:#}"
    );
    assert_eq!(answer["verdict"], "live_holder");
    kill_and_wait(worker);
}

#[test]
fn any_process_fails_on_a_live_holder_that_is_not_allowed() {
    require_root();
    let _alone = one_at_a_time();
    let dir = TempDir::new("gate-any");
    let state = TempDir::new("gate-any-state");
    let device = stand_in_device(dir.path());
    let holder = FdScenario::start(SCENARIO, &device, "held-before");
    let pid = holder.pids[0].to_string();
    let (code, answer) = gate(&device, &state, &["--any-process", "--timeout", "1s"]);
    assert_eq!(code, Some(1), "{answer:#}");
    assert_eq!(
        holders(&answer),
        vec![(u64::from(holder.pids[0]), "gpu_busy".to_string())],
        "{answer:#}"
    );
    assert_eq!(answer["verdict"], "gpu_busy");
    let (code, answer) = gate(
        &device,
        &state,
        &["--any-process", "--allow-pid", &pid, "--timeout", "1s"],
    );
    assert_eq!(code, Some(0), "allowed: {answer:#}");
}

/// A pod without hostPID is a pid namespace of its own: its /proc shows none of the other
/// pods' processes. The gate run there (`unshare --pid --fork --mount-proc`) with a holder
/// outside refuses to call the GPU clean (exit 3, saying why); with --allow-partial-view it
/// decides from what it sees, and says so; from the host's namespace it sees the holder.
#[test]
fn inside_a_pid_namespace_the_gate_refuses_to_call_a_gpu_clean() {
    require_root();
    let _alone = one_at_a_time();
    let dir = TempDir::new("gate-pidns");
    let state = TempDir::new("gate-pidns-state");
    let device = stand_in_device(dir.path());
    let holder = FdScenario::start(SCENARIO, &device, "held-before");
    let in_namespace = |extra: &[&str]| {
        let inner = gate_command(
            &device,
            &state,
            &[&["--any-process", "--timeout", "1s"], extra].concat(),
        );
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["--pid", "--fork", "--mount-proc", "--"])
            .arg(inner.get_program())
            .args(inner.get_args())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.output().expect("unshare")
    };
    let refused = in_namespace(&[]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(3), "{said}");
    assert!(
        said.contains("pid namespace") && said.contains("hostPID"),
        "{said}"
    );
    let (code, answer) = answer(in_namespace(&["--allow-partial-view"]));
    assert_eq!(code, Some(0), "it sees no holder: {answer:#}");
    let notes = answer["notes"].to_string();
    assert!(notes.contains("--allow-partial-view"), "{answer:#}");
    let (code, answer) = gate(&device, &state, &["--any-process", "--timeout", "1s"]);
    assert_eq!(code, Some(1), "the host's view: {answer:#}");
    assert_eq!(holders(&answer)[0].0, u64::from(holder.pids[0]));
}

/// `linger agent` on the stand-in device, its incident log in `state`, rotated at every
/// record; killed when dropped.
fn agent(device: &Path, state: &Path) -> linger_tests::Guarded {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut child = linger()
        .args(["agent", "--no-nvml", "--linger-after", "2s", "--gpu-device"])
        .arg(device)
        .args([
            "--metrics-listen",
            &format!("127.0.0.1:{port}"),
            "--state-dir",
        ])
        .arg(state)
        .args(["--log-max-bytes", "1", "--log-keep", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start linger agent");
    let stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let guard = linger_tests::Guarded(child);
    use std::io::BufRead;
    for line in stderr.lines().map_while(Result::ok) {
        if line.contains("tracing") {
            break;
        }
    }
    guard
}

#[test]
fn with_the_agents_log_the_gate_says_how_the_worker_got_the_files() {
    require_root();
    let _alone = one_at_a_time();
    let dir = TempDir::private("gate-agent");
    let device = stand_in_device(dir.path());
    let state = dir.join("state");
    std::fs::create_dir(&state).expect("state dir");
    let _agent = agent(&device, &state);
    let mut later = FdScenario::start(SCENARIO, &device, "held-before");
    let mut s = FdScenario::start(SCENARIO, &device, "setsid-worker");
    let (parent, worker) = (s.pids[0], s.pids[1]);
    s.kill();
    // The agent's incident names the worker as soon as it sees the files held elsewhere.
    let logged = |pid: u32| {
        let needle = format!("\"pid\":{pid},");
        let start = Instant::now();
        loop {
            let found: Vec<String> = std::fs::read_dir(&state)
                .expect("state dir")
                .flatten()
                .filter(|f| std::fs::read_to_string(f.path()).is_ok_and(|t| t.contains(&needle)))
                .map(|f| f.file_name().to_string_lossy().into_owned())
                .collect();
            if !found.is_empty() {
                return found;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "no incident of {pid}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    };
    logged(parent);
    // Another death's record rotates the log (at every record here): the worker's incident
    // is in a rotated file when the gate reads it.
    later.kill();
    logged(later.pids[0]);
    let files = logged(parent);
    assert!(
        files.iter().all(|f| f.starts_with("incidents.jsonl.")),
        "{files:?}"
    );
    // A damaged line among the agent's: skipped and counted, the rest still read.
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(state.join("incidents.jsonl"))
        .and_then(|mut f| f.write_all(b"{\"type\":\"incident\",\"bad\":\"\xff\"}\n"))
        .expect("a damaged line");
    let pid = parent.to_string();
    let out = linger()
        .args([
            "wait",
            "--pid",
            &pid,
            "--timeout",
            "1s",
            "--json",
            "--gpu-device",
        ])
        .arg(&device)
        .arg("--state-dir")
        .arg(&state)
        .output()
        .expect("linger wait");
    let (code, answer) = answer(out);
    assert_eq!(code, Some(1), "{answer:#}");
    assert_eq!(
        holders(&answer),
        vec![(u64::from(worker), "shared_fd".to_string())],
        "the agent's word, not a guess: {answer:#}"
    );
    let how = answer["holders"][0]["how"].as_str().expect("how");
    assert!(
        how.starts_with("fork") && how.contains("the agent's incident"),
        "{how}"
    );
    assert_eq!(answer["log"]["damaged"], 1, "{answer:#}");
    kill_and_wait(worker);
}
