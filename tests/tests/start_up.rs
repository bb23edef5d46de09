//! Kills while `linger live` is still attaching its programs: the hooks come up one after the
//! other, so a kill seen by the first (signal generation) could miss its delivery, exit and reap,
//! which later ones record. Each incident must be whole or not be at all: never a verdict drawn
//! from the hooks that were there yet ("not delivered" about a process that died).

use std::{
    collections::BTreeSet,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use linger_tests::{list, require_root, text, Live};
use nix::sys::signal::Signal;
use serde_json::Value;

/// With the system call tracepoints, the reap is wait4's: every incident has it.
#[test]
fn kills_during_start_up_give_whole_incidents_only() {
    kills_during_start_up(&["--json", "--syscall-hooks"], true);
}

/// Without them, the reap is the task's free, whose tracepoint this kernel sometimes never
/// fires (docs/modes.md): an incident may then have none, and says it was not seen.
#[test]
fn kills_during_start_up_give_whole_incidents_only_reaps_seen_at_the_free() {
    kills_during_start_up(&["--json"], false);
}

fn kills_during_start_up(args: &[&str], every_reap_seen: bool) {
    require_root();
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(Mutex::new(Vec::<u32>::new()));
    // Spawn /bin/sleep, SIGKILL it, reap it, over and over, from before linger starts until
    // after it is ready.
    let storm = {
        let (stop, killed) = (stop.clone(), killed.clone());
        thread::spawn(move || {
            let tid = nix::unistd::gettid().as_raw();
            while !stop.load(Ordering::Relaxed) {
                let mut child = Command::new("/bin/sleep")
                    .arg("60")
                    .stdin(Stdio::null())
                    .spawn()
                    .expect("spawning /bin/sleep");
                child.kill().expect("SIGKILL to /bin/sleep");
                child.wait().expect("reaping /bin/sleep");
                killed.lock().expect("the kill list").push(child.id());
            }
            tid
        })
    };
    let mut live = Live::start(args);
    let before_ready = killed.lock().expect("the kill list").len();
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    // The storm thread's id: the other test of this file storms from this process too.
    let storm_tid = storm.join().expect("the storm thread");
    let killed = killed.lock().expect("the kill list").clone();
    // The kill under way when linger said it was ready may have been signalled before; every
    // one begun after it must be reported.
    let after_ready: BTreeSet<u32> = killed.iter().skip(before_ready + 1).copied().collect();
    assert!(
        before_ready > 0 && !after_ready.is_empty(),
        "the storm must run across the start ({before_ready} kills before ready, \
         {} after)",
        after_ready.len()
    );
    // An incident comes out once its process is reaped, or a second after its death if the
    // reap is not seen; the free comes an RCU grace period after the reap, in no particular
    // order across CPUs: wait for each incident rather than for the last kill's.
    let mut missing = after_ready.clone();
    while !missing.is_empty() {
        let Some(record) = live.next_record() else {
            break;
        };
        if record["type"] == "incident" {
            if let Some(pid) = record["target"]["pid"].as_u64() {
                missing.remove(&(pid as u32));
            }
        }
    }
    assert!(missing.is_empty(), "no incident for kills {missing:?}");
    live.child.signal(Signal::SIGINT);
    let out = live.finish();
    assert!(out.status.success(), "{out:#?}");

    let ours = |r: &&Value| r["sender"]["tid"] == storm_tid && r["signal_name"] == "SIGKILL";
    for inc in out.of_type("incident").into_iter().filter(ours) {
        assert_eq!(text(inc, "/outcome"), "exited", "{inc:#}");
        assert!(inc["verdict"].is_null(), "{inc:#}");
        assert_eq!(list(inc, "/deliveries").len(), 1, "{inc:#}");
        assert_eq!(list(inc, "/exits").len(), 1, "{inc:#}");
        assert!(inc["t_zombie_ns"].is_u64(), "{inc:#}");
        let reaped = inc["t_reaped_ns"].is_u64();
        assert!(reaped || !every_reap_seen, "{inc:#}");
        // A reap not seen names no reaper (`reap not seen yet` in the text).
        assert_eq!(reaped, !inc["reaper"].is_null(), "{inc:#}");
    }
}
