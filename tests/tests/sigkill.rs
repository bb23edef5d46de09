//! A multi-threaded child killed with SIGKILL by this test, which also reaps it: linger must name
//! this process as both sender and reaper, see every thread die and order the timeline.

use std::{collections::BTreeSet, os::unix::process::ExitStatusExt};

use linger_tests::{
    assert_exit_timeline, assert_reaped_by, default_reap_how, exit_tids, list, num, require_root,
    text, Live, Target,
};
use nix::sys::signal::Signal;

#[test]
fn sigkill_of_a_five_thread_child() {
    sigkill_of_a_five_thread_child_in(&[], default_reap_how());
}

/// With the system call tracepoints, wait4's return names the reaper and the reap's time.
#[test]
fn sigkill_reaped_through_the_wait4_tracepoint() {
    sigkill_of_a_five_thread_child_in(&["--syscall-hooks"], Some("wait"));
}

fn sigkill_of_a_five_thread_child_in(args: &[&str], reap_how: Option<&str>) {
    require_root();
    let mut target = Target::start(5, "default");
    let tids = target.tids();
    assert_eq!(tids.len(), 5, "__target --threads 5 runs 5 threads");
    let live = Live::watch_with(target.pid, "10s", args);

    target.child.signal(Signal::SIGKILL);
    let sender_tid = nix::unistd::gettid().as_raw() as u32;
    let status = target.child.wait();
    let out = live.finish();

    let me = std::process::id();
    let inc = out.incident_of(target.pid);
    assert_eq!(text(inc, "/signal_name"), "SIGKILL");
    assert_eq!(text(inc, "/origin"), "user");
    assert_eq!(num(inc, "/sender/pid"), u64::from(me), "{inc:#}");
    assert_eq!(num(inc, "/sender/tid"), u64::from(sender_tid), "{inc:#}");
    assert_eq!(num(inc, "/target/threads"), tids.len() as u64, "{inc:#}");

    // Every thread dequeues the kill and exits, each exactly once.
    assert_eq!(exit_tids(inc), tids, "{inc:#}");
    let delivered: BTreeSet<u32> = list(inc, "/deliveries")
        .iter()
        .map(|d| num(d, "/tid") as u32)
        .collect();
    assert_eq!(delivered, tids, "{inc:#}");
    for d in list(inc, "/deliveries") {
        assert_eq!(num(d, "/sig"), 9, "{inc:#}");
        assert_eq!(text(d, "/action"), "default", "{inc:#}");
    }

    assert_exit_timeline(inc);
    assert_eq!(text(inc, "/outcome"), "exited");
    // The exit status linger read in the kernel is the one wait() gave us.
    assert_eq!(status.signal(), Some(9), "the child died of SIGKILL");
    assert_eq!(num(inc, "/exit/signal"), 9, "{inc:#}");
    assert_reaped_by(inc, me, reap_how);
}

#[test]
fn ctrl_c_stops_linger_without_an_incident_about_itself() {
    require_root();
    let live = Live::start(["--json"]);
    let me = live.child.pid();
    live.child.signal(Signal::SIGINT);
    let out = live.finish();
    assert!(out.status.success(), "{out:#?}");
    let about_itself = out
        .records
        .iter()
        .filter(|r| r["target"]["pid"] == me)
        .count();
    assert_eq!(about_itself, 0, "{out:#?}");
}

#[test]
fn an_incident_is_printed_while_linger_runs() {
    require_root();
    let mut target = Target::start(1, "default");
    // No --count or --duration: the incident must come out while linger goes on (its
    // output is buffered per batch of records, and must not wait for the end).
    let mut live = Live::start(["--json", "--pid", &target.pid.to_string()]);
    target.child.signal(Signal::SIGKILL);
    target.child.wait();
    let incident = loop {
        let record = live
            .next_record()
            .expect("linger live ended before printing the incident");
        if record["type"] == "incident" && record["target"]["pid"] == target.pid {
            break record;
        }
    };
    assert_eq!(text(&incident, "/signal_name"), "SIGKILL", "{incident:#}");
    live.child.signal(Signal::SIGINT);
    let out = live.finish();
    assert!(out.status.success(), "{out:#?}");
}
