//! SIGTERM to a multi-threaded child: without a handler it kills the group, with one the process
//! lives on or exits by itself. The records must follow what the child really did: an incident
//! for each death (mode `term`), a `signal` record for a signal it survived.

use std::{collections::BTreeSet, os::unix::process::ExitStatusExt};

use linger_tests::{
    assert_exit_timeline, assert_reaped_by, default_reap_how, exit_tids, list, num, require_root,
    text, Live, Target,
};
use nix::sys::signal::Signal;
use serde_json::Value;

struct Traced {
    target: Target,
    /// The child's threads just before the signal.
    tids: BTreeSet<u32>,
    incident: Value,
}

/// SIGTERMs a 3-thread `__target --on-term ON_TERM` under `linger live`, reaping it, and
/// returns its incident.
fn sigterm(on_term: &str, survive_after: &str) -> Traced {
    require_root();
    let mut target = Target::start(3, on_term);
    let tids = target.tids();
    let live = Live::watch(target.pid, survive_after);
    target.child.signal(Signal::SIGTERM);
    target.child.wait();
    let incident = live.finish().incident_of(target.pid).clone();
    assert_eq!(text(&incident, "/signal_name"), "SIGTERM");
    assert_eq!(text(&incident, "/termination/mode"), "term");
    assert_eq!(num(&incident, "/sender/pid"), u64::from(std::process::id()));
    assert_eq!(
        num(&incident, "/target/threads"),
        tids.len() as u64,
        "{incident:#}"
    );
    for d in list(&incident, "/deliveries") {
        assert!(tids.contains(&(num(d, "/tid") as u32)), "{incident:#}");
    }
    Traced {
        target,
        tids,
        incident,
    }
}

/// (signal, action) of each delivery.
fn deliveries(incident: &Value) -> Vec<(u64, &str)> {
    list(incident, "/deliveries")
        .iter()
        .map(|d| (num(d, "/sig"), text(d, "/action")))
        .collect()
}

/// The child is dead and this test reaped it.
fn assert_reaped_by_us(t: &Traced) {
    let inc = &t.incident;
    assert_eq!(text(inc, "/outcome"), "exited");
    assert_eq!(exit_tids(inc), t.tids, "{inc:#}");
    assert_exit_timeline(inc);
    assert_reaped_by(inc, std::process::id(), default_reap_how());
}

#[test]
fn sigterm_without_handler_kills_the_group() {
    // Generous survive window: only a handled signal may be called survived.
    let mut t = sigterm("default", "10s");
    assert_reaped_by_us(&t);
    let status = t.target.child.wait();
    assert_eq!(status.signal(), Some(15), "the child died of SIGTERM");
    assert_eq!(num(&t.incident, "/exit/signal"), 15, "{:#}", t.incident);
    let seen = deliveries(&t.incident);
    assert!(!seen.is_empty(), "{:#}", t.incident);
    assert!(
        seen.iter().all(|&(_, action)| action == "default"),
        "{:#}",
        t.incident
    );
}

#[test]
fn sigterm_with_handler_survives_and_is_reported_at_once() {
    require_root();
    let mut target = Target::start(3, "survive");
    let live = Live::start([
        "--json",
        "--pid",
        &target.pid.to_string(),
        "--duration",
        "3s",
        "--survive-after",
        "500ms",
    ]);
    target.child.signal(Signal::SIGTERM);
    let out = live.finish();
    assert!(out.status.success(), "{out:#?}");
    assert!(
        out.of_type("incident").is_empty(),
        "no death, no incident: {out:#?}"
    );
    let notices = out.of_type("signal");
    assert_eq!(notices.len(), 1, "{out:#?}");
    let n = notices[0];
    assert_eq!(num(n, "/target/pid"), u64::from(target.pid));
    assert_eq!(text(n, "/signal/name"), "SIGTERM");
    assert_eq!(text(n, "/signal/action"), "handler");
    assert_eq!(num(n, "/signal/sender/pid"), u64::from(std::process::id()));
    // Reported once the survive window passed, not at the end of the escalation window.
    assert!(
        (500_000_000..3_000_000_000).contains(&num(n, "/survived_ns")),
        "{n:#}"
    );
    // The child agrees: it ran its handler and is still alive.
    assert_eq!(
        target.stdout.next_line().as_deref(),
        Some("survived SIGTERM")
    );
    assert!(target.child.0.try_wait().expect("try_wait").is_none());
    target.child.signal(Signal::SIGKILL);
    target.child.wait();
}

#[test]
fn sigterm_with_handler_that_exits() {
    let mut t = sigterm("exit", "10s");
    assert_reaped_by_us(&t);
    let status = t.target.child.wait();
    assert_eq!(status.code(), Some(0), "the child exited by itself");
    assert_eq!(num(&t.incident, "/exit/status"), 0, "{:#}", t.incident);
    assert!(t.incident["exit"]["signal"].is_null(), "{:#}", t.incident);
    assert!(
        deliveries(&t.incident).contains(&(15, "handler")),
        "{:#}",
        t.incident
    );
}
