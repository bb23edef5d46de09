//! Signals, exits and forked holders: which deaths are incidents, and their updates.

use crate::analysis::{
    correlate::Output,
    incident::{Incident, Source},
    termination::Mode,
    verdict::VerdictKind,
};
use crate::event::{EventData, FdOp, LossKind, ProcInfo};

use super::run::{back, fd, verdict, Run, FILE, GIB, MS, SHELL};

#[test]
fn a_stop_escalated_by_timeout_is_one_incident_with_every_signal() {
    let mut r = Run::new();
    let (timeout, cmd) = (50, 51);
    r.holder(cmd, 0, 0.0);
    r.nvml(1.0, 3 * GIB, &[(cmd, 2 * GIB)]);
    // SIGTERM to the child, to the group (timeout itself handles it), ignored by the child.
    r.kill(timeout, cmd, 15, 12_000.0);
    r.kill(timeout, timeout, 15, 12_000.1);
    r.feed(
        timeout,
        12_000.2,
        EventData::SignalDeliver {
            sig: 15,
            code: 0,
            handler: 0x4000,
            sa_flags: 0,
        },
    );
    r.tick(13_100.0);
    // Both survivors are reported at once, not after the escalation window.
    let notices = r
        .out
        .iter()
        .filter(|o| matches!(o, Output::Signal(_)))
        .count();
    assert_eq!(notices, 2);
    r.kill(timeout, cmd, 9, 14_000.0);
    r.kill(timeout, timeout, 9, 14_000.1);
    r.die(timeout, &[], 14_000.2, 9);
    r.die(cmd, &[FILE], 14_000.3, 9);
    r.nvml(14_001.0, 3 * GIB, &[(cmd, 2 * GIB)]);
    r.nvml(14_140.0, GIB, &[]);
    r.zombie_and_reap(cmd, 14_141.0);
    r.zombie_and_reap(timeout, 14_001.0);
    r.tick(14_200.0);
    let incidents: Vec<&Incident> = r
        .incidents()
        .into_iter()
        .filter(|i| i.target.pid == cmd)
        .collect();
    assert_eq!(incidents.len(), 1);
    let t = &incidents[0].termination;
    assert_eq!(t.mode, Mode::Escalated);
    assert_eq!(t.signals.len(), 2);
    assert_eq!(t.grace_ns, Some(2_000 * MS));
    assert_eq!(incidents[0].signal_name, "SIGKILL");
    // timeout killed itself with its own kill(0, SIGKILL): its own doing.
    assert_eq!(r.last_of(timeout).termination.mode, Mode::Fault);
}

#[test]
fn a_gpu_process_that_exits_on_its_own_is_an_exit_incident() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.nvml(1.0, 3 * GIB, &[(10, 2 * GIB)]);
    r.die(10, &[FILE], 500.0, 0);
    r.nvml(501.0, 3 * GIB, &[(10, 2 * GIB)]);
    r.nvml(620.0, GIB, &[]);
    r.zombie_and_reap(10, 621.0);
    r.tick(640.0);
    let inc = r.last_of(10);
    assert_eq!(inc.termination.mode, Mode::Exit);
    assert_eq!(inc.signal, 0);
    assert!(inc.sender.is_none());
    assert_eq!(
        inc.t_signal_ns,
        500 * MS,
        "an exit counts from the group's death"
    );
    assert_eq!(back(inc), Some(620 * MS));
}

#[test]
fn lingers_own_signals_are_not_incidents() {
    let mut r = Run::new();
    r.feed(
        0,
        0.0,
        EventData::Collector {
            pid: 42,
            partial_pid_view: false,
        },
    );
    r.kill(SHELL, 42, 2, 10.0);
    r.tick(5_000.0);
    let mut out = Vec::new();
    r.c.finish(&mut out);
    assert!(r.out.is_empty() && out.is_empty(), "{:?} {out:?}", r.out);
}

#[test]
fn lost_records_make_an_unconfirmed_release_incomplete() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.kill(SHELL, 10, 9, 100.0);
    r.feed(
        0,
        100.05,
        EventData::Loss {
            count: 12,
            what: LossKind::Holders,
            period_ns: 1_000_000_000,
        },
    );
    r.die(10, &[FILE], 100.1, 9);
    r.zombie_and_reap(10, 240.0);
    r.tick(300.0);
    let inc = r.last_of(10);
    assert_eq!(verdict(inc), VerdictKind::Incomplete);
    assert_eq!(inc.losses[0].what, LossKind::Holders);
}

#[test]
fn a_forked_holder_is_reported_at_once_and_updated_when_it_goes() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.feed(
        10,
        1.0,
        EventData::Fork {
            child_pid: 11,
            files_shared: false,
            comm: "python3".into(),
        },
    );
    // /proc is read after the parent died: it says ppid 1, the fork record knows better.
    r.feed(
        11,
        1.1,
        EventData::ProcInfo(ProcInfo {
            pid: 11,
            ppid: 1,
            comm: "python3".into(),
            ..Default::default()
        }),
    );
    r.nvml(2.0, 5 * GIB, &[(10, 4 * GIB)]);
    r.kill(SHELL, 10, 9, 1000.0);
    r.die(10, &[FILE], 1000.1, 9);
    r.zombie_and_reap(10, 1000.3);
    r.nvml(1001.0, 5 * GIB, &[(10, 4 * GIB)]);
    r.tick(1020.0);
    let first = r.last_of(10);
    assert_eq!(first.record_type, "incident");
    assert_eq!(verdict(first), VerdictKind::SharedFd);
    assert_eq!(first.holders[0].pid, 11);
    assert_eq!(first.holders[0].ppid, 10);
    assert!(back(first).is_none());
    // The child dies 7.8 s later: its own incident, and the parent's update.
    r.kill(SHELL, 11, 9, 8800.0);
    r.die(11, &[FILE], 8800.1, 9);
    r.nvml(8801.0, 5 * GIB, &[(10, 4 * GIB)]);
    r.nvml(8920.0, GIB, &[]);
    r.zombie_and_reap(11, 8921.0);
    r.tick(8940.0);
    let update = r.last_of(10);
    assert_eq!(update.record_type, "incident_update");
    assert_eq!(back(update), Some(8920 * MS));
    assert_eq!(update.holders[0].t_released_ns, Some(8921 * MS));
    let child = r.last_of(11);
    assert_eq!(
        back(child),
        Some(8920 * MS),
        "the child held the parent's memory"
    );
}

#[test]
fn without_nvml_the_kernel_side_release_is_the_answer_and_says_so() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.kill(SHELL, 10, 9, 100.0);
    r.die(10, &[FILE], 100.1, 9);
    r.zombie_and_reap(10, 230.0);
    r.tick(250.0);
    let gpu = r.last_of(10).gpu.clone().expect("gpu");
    assert_eq!(gpu.t_memory_back_ns, Some(230 * MS));
    assert_eq!(gpu.memory_back_by, Some(Source::Kernel));
}

#[test]
fn without_nvml_a_forked_holders_death_updates_its_parent() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.feed(
        10,
        1.0,
        EventData::Fork {
            child_pid: 11,
            files_shared: false,
            comm: "x".into(),
        },
    );
    r.feed(11, 2.0, EventData::Exec { comm: "x".into() });
    r.feed(11, 2.1, fd(FdOp::HeldAtExec, 3, FILE));
    r.kill(SHELL, 10, 9, 500.0);
    r.die(10, &[FILE], 500.1, 9);
    r.kill(10, 1, 17, 500.2);
    r.tick(600.0);
    assert_eq!(r.last_of(10).record_type, "incident");
    r.kill(SHELL, 11, 9, 900.0);
    r.die(11, &[FILE], 900.1, 9);
    r.kill(11, 1, 17, 900.2);
    r.tick(1000.0);
    let update = r.last_of(10);
    assert_eq!(update.record_type, "incident_update", "{:?}", r.out);
}
