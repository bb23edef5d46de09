//! GPU file holders, traced for real: a stand-in GPU device (a node for /dev/full, declared
//! with --gpu-device) opened, dup'ed, inherited, exec'ed and closed by real processes, which
//! the tests then SIGKILL.

use std::{
    ffi::OsStr,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use linger_tests::{linger, stand_in_device, FdScenario, Live, TempDir};
use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

const SCENARIO: &str = env!("CARGO_BIN_EXE_linger-fd-scenario");

/// `linger live --json --events` on the stand-in device.
fn live_on(device: &Path, extra: &[&str]) -> Live {
    let args = [
        "--json",
        "--events",
        "--no-nvml",
        "--duration",
        "20s",
        "--linger-after",
        "5s",
        "--gpu-device",
    ];
    Live::start(
        args.iter()
            .map(OsStr::new)
            .chain([device.as_os_str()])
            .chain(extra.iter().map(OsStr::new)),
    )
}

/// A scenario on the stand-in device.
struct Scenario;

impl Scenario {
    fn start(device: &Path, name: &str) -> FdScenario {
        FdScenario::start(SCENARIO, device, name)
    }
}

fn kill(pid: u32) {
    nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("kill");
}

/// The GPU descriptor records of `pid` among printed events, as (op, fd, file).
fn fd_events(events: &[Value], pid: u32) -> Vec<(String, i64, u64)> {
    events
        .iter()
        .filter(|v| v["type"] == "event" && v["event"]["pid"] == pid)
        .map(|v| &v["event"]["data"])
        .filter(|d| d["kind"] == "gpu_fd")
        .map(|d| {
            (
                d["op"].as_str().unwrap_or_default().to_string(),
                d["fd"].as_i64().unwrap_or(-1),
                d["file"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn held_fds(incident: &Value) -> Vec<i64> {
    let mut fds: Vec<i64> = incident["gpu"]["files"]
        .as_array()
        .expect("the incident has GPU files")
        .iter()
        .map(|f| f["fd"].as_i64().expect("fd"))
        .collect();
    fds.sort_unstable();
    fds
}

#[test]
fn open_dup_and_close_are_followed_to_the_exit() {
    let dir = TempDir::new("gpu-dup");
    let device = stand_in_device(dir.path());
    let mut live = live_on(&device, &[]);
    let mut s = Scenario::start(&device, "dup-close");
    let pid = s.pids[0];
    s.kill();
    let (incident, events) = live.until("incident", pid);
    let ops = fd_events(&events, pid);
    let opened: Vec<_> = ops.iter().filter(|(op, ..)| op == "open").collect();
    assert_eq!(opened.len(), 1, "one open: {ops:?}");
    let file = opened[0].2;
    let dups: Vec<i64> = ops
        .iter()
        .filter(|(op, ..)| op == "dup")
        .map(|o| o.1)
        .collect();
    assert_eq!(dups.len(), 3, "dup, dup2 and F_DUPFD_CLOEXEC: {ops:?}");
    assert!(
        dups.contains(&60),
        "F_DUPFD_CLOEXEC asked for 60 or above: {dups:?}"
    );
    let closed: Vec<i64> = ops
        .iter()
        .filter(|(op, ..)| op == "close")
        .map(|o| o.1)
        .collect();
    assert_eq!(closed.len(), 1, "{ops:?}");
    // Closes are recorded at the call's exit, when the descriptor is gone: by number only.
    assert!(
        ops.iter().filter(|o| o.0 != "close").all(|o| o.2 == file),
        "every descriptor is the same open file"
    );
    // At death: the open one and the two remaining dups, not the closed one.
    let mut expected: Vec<i64> = vec![opened[0].1];
    expected.extend(dups.iter().filter(|d| !closed.contains(d)));
    expected.sort_unstable();
    assert_eq!(held_fds(&incident), expected);
    assert_eq!(incident["holders"].as_array().map(Vec::len), Some(0));
    assert!(
        incident["gpu"]["t_files_released_ns"].as_u64() >= incident["t_group_dead_ns"].as_u64()
    );
}

#[test]
fn a_forked_child_keeps_the_file_until_it_dies() {
    let dir = TempDir::new("gpu-fork");
    let device = stand_in_device(dir.path());
    let mut live = live_on(&device, &[]);
    let mut s = Scenario::start(&device, "fork-holder");
    let (parent, child) = (s.pids[0], s.pids[1]);
    s.kill();
    // The parent is dead; its file lives on in the child, and linger says so at once: the
    // incident comes while the child still holds it.
    let (incident, mut events) = live.until("incident", parent);
    let mine: Vec<&Value> = events
        .iter()
        .filter(|v| {
            let e = &v["event"];
            e["pid"] == parent || e["pid"] == child || e["data"]["child_pid"] == child
        })
        .collect();
    assert!(
        incident["gpu"]["t_memory_back_ns"].is_null(),
        "{incident}\n{mine:#?}"
    );
    assert_eq!(incident["verdict"]["kind"], "shared_fd", "{incident}");
    let holders = incident["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 1, "{incident}");
    assert_eq!(holders[0]["pid"], child);
    assert_eq!(
        holders[0]["ppid"], parent,
        "ppid as recorded while the parent lived"
    );
    assert_eq!(holders[0]["how"], "fork", "{incident}\n{mine:#?}");
    assert_eq!(holders[0]["from"], parent);
    // Its own release of the files was its exit, long before the child's.
    let dead = incident["t_group_dead_ns"].as_u64().expect("group died");
    let own = incident["gpu"]["t_files_released_ns"]
        .as_u64()
        .expect("released");
    assert!(own >= dead, "{incident}");
    thread::sleep(Duration::from_millis(300));
    let t_child_kill = Instant::now();
    kill(child);
    // Without NVML, the memory is back by the kernel's account when its last holder let go.
    let (update, more) = live.until("incident_update", parent);
    let earlier = more
        .iter()
        .find(|v| v["type"] == "incident" && v["target"]["pid"] == child)
        .cloned();
    events.extend(more);
    let back = update["gpu"]["t_memory_back_ns"].as_u64().expect("back");
    assert_eq!(update["gpu"]["memory_back_by"], "kernel", "{update}");
    assert!(
        back > dead + 300_000_000,
        "back only when the child died: {update}"
    );
    assert_eq!(update["holders"][0]["t_released_ns"].as_u64(), Some(back));
    // The child's own death shows the same open file, now with nobody else holding it.
    let child_exit = fd_events(&events, child);
    let incident_child = earlier.unwrap_or_else(|| live.until("incident", child).0);
    assert!(t_child_kill.elapsed() < Duration::from_secs(15));
    assert_eq!(incident_child["holders"].as_array().map(Vec::len), Some(0));
    let parent_file = incident["gpu"]["files"][0]["file"].clone();
    assert_eq!(
        incident_child["gpu"]["files"][0]["file"], parent_file,
        "{child_exit:?}"
    );
}

/// No hook sees a descriptor arrive over a unix socket: the dead process's file references
/// say someone holds it, and the walk of the processes holding GPU files names who.
#[test]
fn a_process_that_received_the_file_over_a_socket_is_found() {
    let dir = TempDir::new("gpu-sent");
    let device = stand_in_device(dir.path());
    let mut live = live_on(&device, &[]);
    let mut s = Scenario::start(&device, "send-fd");
    let (sender, receiver) = (s.pids[0], s.pids[1]);
    s.kill();
    let (first, _) = live.until("incident", sender);
    assert_eq!(first["verdict"]["kind"], "shared_fd", "{first}");
    assert!(first["gpu"]["t_memory_back_ns"].is_null(), "{first}");
    // The receiver's one descriptor: one reference the sender's table does not account for,
    // unless the search was quicker than the report.
    let named = |r: &Value| {
        r["holders"]
            .as_array()
            .is_some_and(|h| h.iter().any(|h| h["pid"] == receiver))
    };
    let found = if named(&first) {
        first.clone()
    } else {
        assert_eq!(first["gpu"]["unaccounted_references"], 1, "{first}");
        live.until("incident_update", sender).0
    };
    assert!(named(&found), "{found}");
    let holder = &found["holders"][0];
    assert_eq!(holder["how"], "seen", "{found}");
    assert_eq!(found["gpu"]["unaccounted_references"], 0, "{found}");
    assert!(found["gpu"]["t_memory_back_ns"].is_null(), "{found}");
    // Its death gives the file back: the sender's memory is back then, by the kernel's word.
    kill(receiver);
    let (back, _) = live.until("incident_update", sender);
    assert_eq!(back["gpu"]["memory_back_by"], "kernel", "{back}");
}

#[test]
fn a_child_sharing_the_descriptor_table_is_a_holder() {
    let dir = TempDir::new("gpu-shared");
    let device = stand_in_device(dir.path());
    let mut live = live_on(&device, &[]);
    let mut s = Scenario::start(&device, "shared-table");
    let (parent, child) = (s.pids[0], s.pids[1]);
    s.kill();
    thread::sleep(Duration::from_millis(200));
    kill(child);
    let (incident, _) = live.until("incident", parent);
    let holders = incident["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 1, "{incident}");
    assert_eq!(holders[0]["pid"], child);
    assert_eq!(holders[0]["how"], "shared_table");
}

#[test]
fn exec_keeps_only_descriptors_without_close_on_exec() {
    let dir = TempDir::new("gpu-exec");
    let device = stand_in_device(dir.path());
    let mut live = live_on(&device, &[]);
    let mut s = Scenario::start(&device, "exec");
    let pid = s.pids[0];
    s.kill();
    let (incident, events) = live.until("incident", pid);
    let ops = fd_events(&events, pid);
    let opened: Vec<i64> = ops
        .iter()
        .filter(|(op, ..)| op == "open")
        .map(|o| o.1)
        .collect();
    let kept: Vec<i64> = ops
        .iter()
        .filter(|(op, ..)| op == "held_at_exec")
        .map(|o| o.1)
        .collect();
    assert_eq!(opened.len(), 2, "{ops:?}");
    assert_eq!(
        kept.len(),
        1,
        "only the descriptor without O_CLOEXEC survives: {ops:?}"
    );
    assert_eq!(held_fds(&incident), kept);
}

#[test]
fn a_process_that_closed_its_file_holds_nothing_when_killed() {
    let dir = TempDir::new("gpu-close");
    let device = stand_in_device(dir.path());
    let mut live = live_on(&device, &[]);
    let mut s = Scenario::start(&device, "close");
    let pid = s.pids[0];
    s.kill();
    let (incident, events) = live.until("incident", pid);
    let ops: Vec<String> = fd_events(&events, pid).into_iter().map(|o| o.0).collect();
    assert_eq!(ops, ["open", "close"]);
    assert!(incident["gpu"].is_null(), "{incident}");
}

#[test]
fn a_holder_from_before_tracing_began_is_known() {
    let dir = TempDir::new("gpu-before");
    let device = stand_in_device(dir.path());
    let mut s = Scenario::start(&device, "held-before");
    let pid = s.pids[0];
    let mut live = live_on(&device, &[]);
    s.kill();
    let (incident, events) = live.until("incident", pid);
    let snapshot = events.iter().any(|v| {
        let d = &v["event"]["data"];
        d["kind"] == "snapshot_fd" && d["holder"] == pid
    });
    assert!(snapshot, "the start-up snapshot lists it");
    // The kernel walked its table at death because user space seeded the holder set.
    assert_eq!(
        fd_events(&events, pid)
            .iter()
            .filter(|o| o.0 == "held_at_exit")
            .count(),
        1
    );
    assert_eq!(held_fds(&incident).len(), 1);
}

#[test]
fn holders_command_shows_processes_sharing_an_open_file() {
    let dir = TempDir::new("gpu-holders");
    let device = stand_in_device(dir.path());
    let s = Scenario::start(&device, "fork-holder");
    let out = linger()
        .args(["holders", "--json", "--gpu-device"])
        .arg(&device)
        .output()
        .expect("run linger holders");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let rows = report["holders"].as_array().expect("holders");
    let row = |pid: u32| {
        rows.iter()
            .find(|r| r["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} missing from {report}"))
    };
    let (parent, child) = (row(s.pids[0]), row(s.pids[1]));
    assert_eq!(child["ppid"], s.pids[0]);
    assert_eq!(
        parent["file_groups"], child["file_groups"],
        "the same open file"
    );
}

/// `--lean`: no system call tracepoint is attached; holders come from the start-up snapshot
/// and the exit walk, and a holder's death still names the process that keeps its file.
#[test]
fn lean_mode_attaches_no_syscall_hook_and_still_names_the_holder() {
    let dir = TempDir::new("gpu-lean");
    let device = stand_in_device(dir.path());
    let mut s = Scenario::start(&device, "fork-holder");
    let (parent, child) = (s.pids[0], s.pids[1]);
    let mut live = live_on(&device, &["--lean"]);
    s.kill();
    let (incident, events) = live.until("incident", parent);
    let strategy = events
        .iter()
        .map(|v| &v["event"]["data"])
        .find(|d| d["kind"] == "strategy")
        .expect("the strategy record");
    assert_eq!(strategy["lean"], true);
    let hooks: Vec<&str> = strategy["hooks"]
        .as_array()
        .expect("hooks")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(hooks.iter().all(|h| !h.contains("syscalls/")), "{hooks:?}");
    assert!(hooks.contains(&"tp_btf/sched_process_exit"), "{hooks:?}");
    assert_eq!(held_fds(&incident).len(), 1, "the exit walk saw its file");
    let holders = incident["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 1, "{incident}");
    assert_eq!(holders[0]["pid"], child);
    assert!(!incident["unseen"].as_array().expect("unseen").is_empty());
    kill(child);
    let (update, _) = live.until("incident_update", parent);
    assert!(
        update["gpu"]["t_memory_back_ns"].as_u64().is_some(),
        "{update}"
    );
}

/// A GPU file above descriptor 1500 (a large program opens sockets and files before CUDA), kept
/// by a child forked and exec'ed after linger started: the child's exec walk and the parent's
/// exit walk list every descriptor, not only the first few hundred.
fn a_holder_of_a_file_above_many_descriptors_is_named(name: &str, extra: &[&str]) {
    let dir = TempDir::new(name);
    let device = stand_in_device(dir.path());
    let mut s = FdScenario::start_with(SCENARIO, &device, &["many-fds", "1500"]);
    let mut live = live_on(&device, extra);
    s.go();
    let (parent, child) = (s.pids[0], s.pids[1]);
    s.kill();
    let (incident, events) = live.until("incident", parent);
    let holders = incident["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 1, "{incident}");
    assert_eq!(holders[0]["pid"], child, "{incident}");
    let walked: Vec<i64> = fd_events(&events, parent)
        .iter()
        .filter(|o| o.0 == "held_at_exit")
        .map(|o| o.1)
        .collect();
    assert!(
        matches!(walked[..], [fd] if fd > 1500),
        "the exit walk lists the file above the fillers: {walked:?}"
    );
    assert_eq!(incident["losses"], serde_json::json!([]), "{incident}");
}

#[test]
fn a_holder_of_a_file_above_descriptor_1500_is_named() {
    a_holder_of_a_file_above_many_descriptors_is_named("high", &[]);
}

#[test]
fn lean_mode_names_a_holder_of_a_file_above_descriptor_1500() {
    a_holder_of_a_file_above_many_descriptors_is_named("high-lean", &["--lean"]);
}
