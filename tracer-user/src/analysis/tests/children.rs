//! Forked children that die before their parent, or beside it: who holds the files then, and
//! when their incidents settle (the orders a busy node's churn showed on an H100).

use crate::analysis::{holders::How, incident::Source, verdict::VerdictKind};
use crate::event::{EventData, FdOp};

use super::run::{back, fd, verdict, Run, FILE, GIB, MS, SHELL};

/// A child SIGKILLed while its parent, which allocated the memory, lives: its walk counts one
/// reference more than the two tables hold (a poll under way in one of the parent's threads).
/// Its incident names the parent, claims nothing of its own, searches for nobody, and settles
/// only when the parent's memory is back, at the parent's moment.
#[test]
fn a_child_killed_before_its_parent_names_it_and_settles_with_its_memory() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.fork(10, 11, 1.0);
    r.nvml(2.0, 5 * GIB, &[(10, 4 * GIB)]);
    r.kill(SHELL, 11, 9, 500.0);
    r.die_with(11, 3, 500.1, 9);
    r.zombie_and_reap(11, 500.3);
    r.nvml(501.0, 5 * GIB, &[(10, 4 * GIB)]);
    r.tick(600.0);
    let child = r.last_of(11).clone();
    assert_eq!(verdict(&child), VerdictKind::SharedFd);
    assert_eq!(child.holders.len(), 1);
    assert_eq!(child.holders[0].pid, 10);
    let gpu = child.gpu.as_ref().expect("gpu");
    assert_eq!(gpu.share_bytes, 0, "the memory is its parent's");
    assert_eq!(gpu.share_from, "owners", "nothing lingers because of it");
    assert_eq!(
        gpu.unaccounted_references, 0,
        "the parent may hold the extra one"
    );
    assert!(!child.settled && back(&child).is_none());
    assert!(!r.c.take_search_request(), "nobody to search for");
    r.kill(SHELL, 10, 9, 2000.0);
    r.die_with(10, 1, 2000.1, 9);
    r.nvml(2100.0, GIB, &[]);
    r.zombie_and_reap(10, 2100.5);
    r.nvml(2101.0, GIB, &[]);
    r.tick(2200.0);
    let parent = r.last_of(10).clone();
    let child = r.last_of(11);
    assert_eq!(child.record_type, "incident_update");
    assert!(child.settled, "{child:?}");
    assert!(back(&parent).is_some_and(|t| t >= 2000 * MS));
    assert_eq!(back(child), back(&parent), "back with its parent's memory");
}

/// A process NVML lists for the first time is read from /proc: the snapshot names its files
/// by group, and must not replace the files linger already knows, or a child dying beside it
/// would seem to hold files nobody known holds.
#[test]
fn a_snapshot_of_a_known_holder_keeps_its_files() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.fork(10, 11, 1.0);
    for holder in [10, 11] {
        let snapshot = EventData::SnapshotFd {
            holder,
            fd: 3,
            dev: 195 << 20,
            cloexec: false,
            group: 7,
        };
        r.feed(0, 2.0, snapshot);
    }
    r.kill(SHELL, 11, 9, 500.0);
    r.die_with(11, 2, 500.1, 9);
    r.zombie_and_reap(11, 500.3);
    r.tick(600.0);
    let child = r.last_of(11);
    assert_eq!(
        child.holders.iter().map(|h| h.pid).collect::<Vec<_>>(),
        [10]
    );
    assert_eq!(child.holders[0].how, How::Open { t_ns: 0 });
    assert_eq!(
        child.gpu.as_ref().map(|g| g.unaccounted_references),
        Some(0)
    );
}

/// A killed job's leader leaves before its last thread and hands its zombie children to a
/// subreaper: the SIGCHLD that tells it comes from the job, from a thread other than the one
/// that ends the group, before the job's files are released. It is not the job's zombie.
#[test]
fn a_sigchld_from_another_thread_of_a_dying_group_is_not_its_zombie() {
    let mut r = killed_group_ended_by_thread_12();
    r.kill(10, SHELL, 17, 100.1);
    r.feed_tid(10, 12, 230.0, sigchld());
    r.feed(SHELL, 230.1, reap(10));
    r.tick(300.0);
    let gpu = r.last_of(10).gpu.clone().expect("gpu");
    assert_eq!(gpu.t_memory_back_ns, Some(230 * MS));
    assert_eq!(gpu.memory_back_by, Some(Source::Kernel));
}

/// Holder 10 SIGKILLed at 100 ms, its thread 12 ending the group with the file's walk.
fn killed_group_ended_by_thread_12() -> Run {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.kill(SHELL, 10, 9, 100.0);
    r.feed_tid(10, 12, 100.05, fd(FdOp::HeldAtExit, 3, FILE));
    let exit = EventData::TaskExit {
        exit_code: 9,
        group_dead: true,
        comm: "python3".into(),
    };
    r.feed_tid(10, 12, 100.05, exit);
    r
}

fn sigchld() -> EventData {
    sigchld_with(0)
}

/// A SIGCHLD whose sender's group had `sender_threads` threads (0: a recording without it).
fn sigchld_with(sender_threads: u32) -> EventData {
    EventData::SignalGenerate {
        sig: 17,
        code: 2,
        result: 0,
        group: true,
        target_exiting: false,
        target_pid: SHELL,
        target_tid: SHELL,
        target_threads: 1,
        sender_threads,
        sender_comm: "python3".into(),
        target_comm: "bash".into(),
    }
}

/// A parent and its child killed together, the child's group dead first: the parent's files
/// stay open in the dying child until the child's exit closes them, 64 ms later, and the
/// memory comes back then. The parent's incident names the child as a holder that was dying
/// itself, and its verdict is the teardown's, not `shared_fd`.
#[test]
fn a_child_killed_beside_its_parent_holds_its_files_until_its_own_exit() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.fork(10, 11, 1.0);
    r.kill(SHELL, 10, 9, 100.0);
    r.kill(SHELL, 11, 9, 100.01);
    r.die_with(11, 2, 100.05, 9);
    r.die_with(10, 2, 100.08, 9);
    r.kill(10, SHELL, 17, 100.15);
    r.feed(SHELL, 100.2, reap(10));
    r.kill(11, SHELL, 17, 164.0);
    r.feed(SHELL, 164.1, reap(11));
    r.tick(400.0);
    let parent = r.last_of(10);
    assert_eq!(verdict(parent), VerdictKind::Released, "{parent:?}");
    assert_eq!(parent.holders.len(), 1);
    assert_eq!(
        parent.holders[0].t_dead_ns,
        Some((100.05 * MS as f64) as u64)
    );
    assert_eq!(back(parent), Some(164 * MS));
}

fn reap(pid: u32) -> EventData {
    EventData::Reap {
        reaped_pid: pid,
        by_wait: true,
        comm: "bash".into(),
    }
}

/// The thread that ends a group (the last to begin its exit) need not be the last to leave:
/// here the leader, slower through its exit, closes the files and tells the parent. Its
/// SIGCHLD with one thread left is the zombie; the one before, with three, handed a child on.
#[test]
fn the_group_s_last_thread_tells_its_zombie_whichever_thread_ended_it() {
    let mut r = killed_group_ended_by_thread_12();
    r.feed_tid(10, 10, 150.0, sigchld_with(3));
    r.feed_tid(10, 10, 243.0, sigchld_with(1));
    r.feed(SHELL, 243.2, reap(10));
    r.tick(300.0);
    let inc = r.last_of(10);
    assert_eq!(inc.t_zombie_ns, Some(243 * MS));
    let gpu = inc.gpu.clone().expect("gpu");
    assert_eq!(gpu.t_memory_back_ns, Some(243 * MS));
    assert_eq!(gpu.memory_back_by, Some(Source::Kernel));
}
