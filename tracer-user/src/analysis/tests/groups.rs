//! Whole groups killed at once, as the field kills them (a process group, a cgroup, a pid
//! namespace torn down), in the orders an H100's churn showed: one incident per death, the
//! processes killed together victims rather than holders, and the release the last one's.

use crate::analysis::{correlate::Output, incident::Incident, verdict::VerdictKind};
use crate::event::EventData;

use super::run::{back, sigkill, verdict, Run, GIB, MS, SHELL, SI_KERNEL};

/// `pid`'s SIGCHLD to `parent` (its zombie), and the parent's reap.
fn zombie_reaped_by(r: &mut Run, pid: u32, parent: u32, t_ms: f64) {
    let sigchld = EventData::SignalGenerate {
        sig: 17,
        code: 2,
        result: 0,
        group: true,
        target_exiting: false,
        target_pid: parent,
        target_tid: parent,
        target_threads: 1,
        sender_threads: 1,
        sender_comm: "python3".into(),
        target_comm: "bash".into(),
    };
    r.feed(pid, t_ms, sigchld);
    let reap = EventData::Reap {
        reaped_pid: pid,
        by_wait: true,
        comm: "bash".into(),
    };
    r.feed(parent, t_ms + 0.05, reap);
}

/// A job (10, a holder of FILE) and its forked `children`, each keeping its files.
fn job_with(children: &[u32]) -> Run {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    for (i, child) in children.iter().enumerate() {
        r.fork(10, *child, 1.0 + i as f64 / 10.0);
    }
    r
}

/// Every record about `pid` that opened an incident (not its updates).
fn opened(r: &Run, pid: u32) -> Vec<&Incident> {
    r.incidents()
        .into_iter()
        .filter(|i| i.target.pid == pid && i.record_type == "incident")
        .collect()
}

/// No record names a process to kill that was dead (or killed) when it was written, nor says
/// `shared_fd` without a holder.
fn assert_no_dead_holder_named(r: &Run, dead: &[u32]) {
    for inc in r.incidents() {
        let Some(v) = &inc.verdict else { continue };
        for pid in dead {
            assert!(
                !v.hint.contains(&format!("kill {pid}")),
                "{} names {pid}, killed with it: {v:?}",
                inc.target.pid
            );
        }
        if v.kind == VerdictKind::SharedFd {
            assert!(
                !inc.holders.is_empty(),
                "shared_fd without a holder: {inc:?}"
            );
        }
    }
}

/// A job (10, which allocated 4 GiB) with a child (11) holding its files by fork, both
/// SIGKILLed by one killpg. The job's group dies first; its exit closes nothing of the memory
/// (the child holds the files), so it is a zombie at once and reaped while the child still
/// lives with its kill pending. The child dies 30 ms later and its exit frees the memory.
fn killpg_job_first(r: &mut Run) {
    r.nvml(2.0, 5 * GIB, &[(10, 4 * GIB)]);
    sigkill(r, SHELL, 10, 100.0, false, false);
    sigkill(r, SHELL, 11, 100.01, false, false);
    r.die_with(10, 2, 100.05, 9);
    zombie_reaped_by(r, 10, SHELL, 100.2);
    r.nvml(101.0, 5 * GIB, &[(10, 4 * GIB)]);
    r.tick(120.0);
    r.die_with(11, 1, 130.0, 9);
    r.nvml(161.0, 5 * GIB, &[(10, 4 * GIB)]);
    r.nvml(200.0, 5 * GIB, &[(10, 4 * GIB)]);
    zombie_reaped_by(r, 11, 10, 231.0);
    r.nvml(232.0, GIB, &[]);
    r.tick(400.0);
}

#[test]
fn a_child_killed_in_the_same_killpg_is_a_victim_not_a_holder() {
    let mut r = job_with(&[11]);
    killpg_job_first(&mut r);
    assert_no_dead_holder_named(&r, &[11]);
    let job = r.last_of(10);
    assert_eq!(verdict(job), VerdictKind::Released, "{job:?}");
    // The child's release, read by NVML a millisecond later (no driver calls traced here).
    let at = |t: Option<u64>, ms: u64| t.is_some_and(|t| (ms * MS..=(ms + 1) * MS).contains(&t));
    assert!(at(back(job), 231), "{job:?}");
    assert_eq!(job.holders.len(), 1, "{:?}", job.holders);
    assert_eq!(job.holders[0].pid, 11);
    assert_eq!(job.holders[0].t_dead_ns, Some(130 * MS));
    assert_eq!(opened(&r, 10).len(), 1);
    let child = r.last_of(11);
    assert_ne!(verdict(child), VerdictKind::SharedFd, "{child:?}");
    assert_eq!(back(child), back(job), "{child:?}");
}

/// A `cgroup.kill` (or a supervisor's loop over a unit's pids) signals its processes one
/// after another: on a slow machine (arm64 under emulation, 2026-12-07) the job's exit was over
/// 1.5 ms before the kill reached its last child. That child is still killed with it.
#[test]
fn a_child_the_same_kill_reaches_after_the_job_s_exit_is_a_victim() {
    let mut r = job_with(&[11, 12]);
    r.nvml(2.0, 5 * GIB, &[(10, 4 * GIB)]);
    sigkill(&mut r, SHELL, 10, 100.0, false, false);
    r.die_with(10, 3, 100.05, 9);
    sigkill(&mut r, SHELL, 11, 100.1, false, false);
    zombie_reaped_by(&mut r, 10, SHELL, 100.2);
    sigkill(&mut r, SHELL, 12, 101.7, false, false);
    r.die_with(11, 2, 190.0, 9);
    r.die_with(12, 1, 195.0, 9);
    zombie_reaped_by(&mut r, 12, 1, 200.0);
    r.nvml(200.5, GIB, &[]);
    zombie_reaped_by(&mut r, 11, 1, 400.0);
    r.tick(600.0);
    assert_no_dead_holder_named(&r, &[11, 12]);
    let job = r.last_of(10);
    assert_eq!(verdict(job), VerdictKind::Released, "{job:?}");
    assert!(
        job.holders.iter().all(|h| h.t_killed_ns.is_some()),
        "{:?}",
        job.holders
    );
    assert_eq!(opened(&r, 10).len(), 1);
}

/// A child killed in the group kill that does not die (a thread blocked in the driver): once
/// the job's report is due, the child is named as a holder killed with it that has not died,
/// never as one to kill.
#[test]
fn a_child_killed_with_the_job_that_does_not_die_is_not_one_to_kill() {
    let mut r = job_with(&[11]);
    r.nvml(2.0, 5 * GIB, &[(10, 4 * GIB)]);
    sigkill(&mut r, SHELL, 10, 100.0, false, false);
    sigkill(&mut r, SHELL, 11, 100.01, false, false);
    r.die_with(10, 2, 100.05, 9);
    zombie_reaped_by(&mut r, 10, SHELL, 100.2);
    for t in (0..30).map(|i| 200.0 + 100.0 * f64::from(i)) {
        r.nvml(t, 5 * GIB, &[(10, 4 * GIB)]);
    }
    let job = r.last_of(10);
    assert_eq!(verdict(job), VerdictKind::SharedFd, "{job:?}");
    assert_eq!(job.holders[0].pid, 11);
    assert!(job.holders[0].t_killed_ns.is_some(), "{:?}", job.holders);
    let hint = &job.verdict.as_ref().expect("a verdict").hint;
    assert!(!hint.contains("kill 11"), "{hint}");
}

/// A container's main process (pid 1 of its namespace) with a child holding its files,
/// SIGKILLed from the host. As it exits, the kernel kills what is left in its namespace, in
/// its context: the child (its last holder) and the dying init itself, whose group is already
/// dead. One incident for the init, released when the child's exit freed the memory; the
/// child a victim of the same teardown.
#[test]
fn a_pid_namespace_torn_down_is_one_termination() {
    let mut r = job_with(&[11]);
    r.nvml(2.0, 5 * GIB, &[(10, 4 * GIB)]);
    sigkill(&mut r, 1, 10, 100.0, false, false);
    r.die_with(10, 2, 100.05, 9);
    // zap_pid_ns_processes, run by the dying init: its namespace's processes, itself too.
    sigkill(&mut r, 10, 11, 100.3, true, false);
    sigkill(&mut r, 10, 10, 100.31, true, true);
    r.die_with(11, 1, 100.4, 9);
    zombie_reaped_by(&mut r, 11, 10, 240.0);
    r.nvml(241.0, GIB, &[]);
    zombie_reaped_by(&mut r, 10, 1, 241.0);
    r.nvml(242.0, GIB, &[]);
    r.tick(40_000.0);
    assert_eq!(opened(&r, 10).len(), 1, "{:?}", r.out);
    assert_no_dead_holder_named(&r, &[11]);
    let init = r.last_of(10);
    assert_eq!(verdict(init), VerdictKind::Released, "{init:?}");
    // Between the child's release and the init's zombie (the kernel's word without hooks).
    assert!(
        back(init).is_some_and(|t| (240 * MS..=241 * MS).contains(&t)),
        "{init:?}"
    );
    assert_eq!(init.termination.signals.len(), 2, "the zap's joins it");
    assert!(r.incidents().iter().all(|i| i
        .verdict
        .as_ref()
        .is_none_or(|v| v.kind != VerdictKind::NotDelivered)));
}

/// The same teardown recorded before the kernel's word on exiting targets: the zap's signal to
/// the dead init still joins its death, which is not reaped yet.
#[test]
fn a_signal_to_a_dead_unreaped_process_joins_its_death() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.nvml(2.0, 5 * GIB, &[(10, 4 * GIB)]);
    sigkill(&mut r, 1, 10, 100.0, false, false);
    r.die_with(10, 1, 100.05, 9);
    let mut zap = EventData::SignalGenerate {
        sig: 9,
        code: SI_KERNEL,
        result: 1,
        group: true,
        target_exiting: false,
        target_pid: 10,
        target_tid: 10,
        target_threads: 1,
        sender_threads: 0,
        sender_comm: "python3".into(),
        target_comm: "python3".into(),
    };
    r.feed(10, 240.0, zap.clone());
    zombie_reaped_by(&mut r, 10, 1, 240.1);
    r.nvml(241.0, GIB, &[]);
    r.tick(40_000.0);
    assert_eq!(opened(&r, 10).len(), 1, "{:?}", r.out);
    // A kill of a zombie nobody had a case for opens none.
    if let EventData::SignalGenerate { target_exiting, .. } = &mut zap {
        *target_exiting = true;
    }
    r.feed(SHELL, 40_001.0, zap);
    r.tick(80_000.0);
    assert_eq!(opened(&r, 10).len(), 1, "{:?}", r.out);
    let notices = r.out.iter().filter(|o| matches!(o, Output::Signal(_)));
    assert_eq!(notices.count(), 0);
}

/// A forked child that exits on its own within a millisecond of its parent's kill: its exit
/// record comes before the parent's, its close of the files after the parent's walk counted
/// its reference. The reference is the exiting child's, not an unseen holder's: the parent's
/// memory is back at its own release, and nobody is searched for.
#[test]
fn a_child_exiting_as_its_parent_is_killed_holds_nothing_unseen() {
    let mut r = job_with(&[11]);
    r.nvml(2.0, 5 * GIB, &[(10, 4 * GIB)]);
    sigkill(&mut r, SHELL, 10, 100.0, false, false);
    // The child's own exit (status 0): its walk sees its own reference.
    r.die_with(11, 1, 100.3, 0);
    r.die_with(10, 2, 100.4, 9);
    zombie_reaped_by(&mut r, 11, 10, 100.6);
    zombie_reaped_by(&mut r, 10, SHELL, 230.0);
    r.nvml(231.0, GIB, &[]);
    r.tick(2000.0);
    assert_no_dead_holder_named(&r, &[11]);
    let job = r.last_of(10);
    assert_eq!(verdict(job), VerdictKind::Released, "{job:?}");
    // Its own release, read by NVML a millisecond later.
    assert!(
        back(job).is_some_and(|t| (230 * MS..=231 * MS).contains(&t)),
        "{job:?}"
    );
    assert_eq!(job.gpu.as_ref().map(|g| g.unaccounted_references), Some(0));
}

/// A thread's final switch (its exit over).
fn exited(r: &mut Run, pid: u32, t_ms: f64) {
    let data = EventData::TeardownSample {
        sample: crate::event::SampleKind::Exited,
        stack_id: -1,
        owner: pid,
        tid: pid,
        blocked_ns: 0,
    };
    r.feed(pid, t_ms, data);
}

/// The children a dying pid namespace's init kills reap themselves (it ignores SIGCHLD): no
/// zombie, and their free may come an RCU grace period later or not at all while something
/// holds their task. The child's final switch is its exit's end: the init's memory is back
/// then.
#[test]
fn a_child_nobody_reaps_lets_go_at_its_final_switch() {
    let mut r = job_with(&[11]);
    sigkill(&mut r, 1, 10, 100.0, false, false);
    r.die_with(10, 2, 100.05, 9);
    sigkill(&mut r, 10, 11, 100.3, true, false);
    r.die_with(11, 1, 100.4, 9);
    exited(&mut r, 11, 100.6);
    zombie_reaped_by(&mut r, 10, 1, 101.0);
    r.tick(400.0);
    let init = r.last_of(10);
    assert_eq!(verdict(init), VerdictKind::Released, "{init:?}");
    assert_eq!(
        back(init),
        Some(101 * MS),
        "its own zombie, after the child's exit"
    );
    let child = r.last_of(11);
    let gpu = child.gpu.as_ref().expect("gpu");
    assert_eq!(gpu.t_files_released_ns, Some((100.6 * MS as f64) as u64));
    assert_eq!(
        gpu.files_released_by,
        Some(crate::analysis::incident::Source::Exited)
    );
}

/// Children of a job killed by `cgroup.kill` die one after another; the last one's exit walk
/// counts a reference of a sibling dead before it, whose release (from another CPU) comes
/// between that walk and the last one's group-dead record. That reference was the sibling's,
/// not an unseen holder's.
#[test]
fn a_reference_released_between_a_walk_and_its_death_is_no_unseen_holder() {
    let mut r = job_with(&[11, 12]);
    for pid in [10, 11, 12] {
        sigkill(&mut r, SHELL, pid, 100.0, false, false);
    }
    r.die_with(10, 3, 100.1, 9);
    zombie_reaped_by(&mut r, 10, SHELL, 100.2);
    r.die_with(12, 2, 100.3, 9);
    // 11's walk (2: its own and 12's), then 12's zombie, then 11's group-dead record.
    r.walk(11, 2, 100.5);
    zombie_reaped_by(&mut r, 12, 1, 100.55);
    r.group_dead(11, 100.6, 9);
    zombie_reaped_by(&mut r, 11, 1, 100.8);
    r.tick(400.0);
    assert_no_dead_holder_named(&r, &[11, 12]);
    for pid in [10, 11] {
        let inc = r.last_of(pid);
        assert_eq!(
            inc.gpu.as_ref().map(|g| g.unaccounted_references),
            Some(0),
            "{inc:?}"
        );
    }
    assert_eq!(verdict(r.last_of(10)), VerdictKind::Released);
    assert!(!r.c.take_search_request(), "nobody to search for");
}

/// A killpg of a job and two children, as the VM's 6.12 guest recorded it: each exit walk
/// comes well before its group-dead record, the last child's walk (3 references) before its
/// sibling's release and the job's death. Recounted at the last child's death, the references
/// are those of the sibling and the job, both still holding at that walk: none unseen.
#[test]
fn a_recount_at_a_holder_s_death_is_of_its_walk_s_moment() {
    let mut r = job_with(&[11, 12]);
    for pid in [12, 11, 10] {
        sigkill(&mut r, SHELL, pid, 100.0, false, false);
    }
    r.walk(12, 3, 101.0);
    r.walk(11, 3, 101.1);
    r.group_dead(11, 101.2, 9);
    zombie_reaped_by(&mut r, 11, 10, 101.3);
    r.walk(10, 2, 101.4);
    r.group_dead(10, 101.45, 9);
    r.group_dead(12, 101.5, 9);
    zombie_reaped_by(&mut r, 10, SHELL, 110.0);
    zombie_reaped_by(&mut r, 12, 1, 300.0);
    r.tick(600.0);
    assert_no_dead_holder_named(&r, &[11, 12]);
    let job = r.last_of(10);
    assert_eq!(verdict(job), VerdictKind::Released, "{job:?}");
    assert_eq!(job.gpu.as_ref().map(|g| g.unaccounted_references), Some(0));
    assert_eq!(back(job), Some(300 * MS));
    assert!(!r.c.take_search_request(), "nobody to search for");
}

/// The teardown of a pid namespace waits for every process of it to be released before its
/// init's exit goes on: the init's zombie bounds its children's releases, whose final
/// switches can come tens of ms later (30 ms on the VM's 6.12 guest under emulation).
#[test]
fn a_namespace_s_init_s_zombie_bounds_its_killed_children_s_release() {
    let mut r = job_with(&[11]);
    sigkill(&mut r, 1, 10, 100.0, false, false);
    r.die_with(10, 2, 100.05, 9);
    sigkill(&mut r, 10, 11, 100.3, true, false);
    r.die_with(11, 1, 100.4, 9);
    zombie_reaped_by(&mut r, 10, 1, 150.0);
    exited(&mut r, 11, 180.0);
    r.feed(
        0,
        200.0,
        EventData::Reap {
            reaped_pid: 11,
            by_wait: false,
            comm: "swapper/0".into(),
        },
    );
    r.tick(400.0);
    let init = r.last_of(10);
    assert_eq!(verdict(init), VerdictKind::Released, "{init:?}");
    assert_eq!(back(init), Some(150 * MS), "{init:?}");
}

/// linger started after the job forked (its opens and forks unseen): the group killed at once
/// dies one by one, each exit walk counting the references the others still hold. Each later
/// death's walk accounts for those references: the memory is back with the last one's release,
/// and no record says `shared_fd` without a holder (a CI run at 5a5d232, one test's linger
/// started amid another's group kill).
#[test]
fn a_group_linger_saw_none_of_the_forks_of_is_found_holding_at_its_deaths() {
    let mut r = Run::new();
    for (i, pid) in [10, 11, 12].into_iter().enumerate() {
        sigkill(&mut r, SHELL, pid, 100.0 + i as f64 / 100.0, false, false);
    }
    r.die_with(11, 3, 100.5, 9);
    zombie_reaped_by(&mut r, 11, 10, 100.6);
    r.die_with(10, 2, 101.0, 9);
    zombie_reaped_by(&mut r, 10, SHELL, 101.1);
    r.die_with(12, 1, 101.5, 9);
    zombie_reaped_by(&mut r, 12, 1, 101.8);
    r.tick(600.0);
    assert_no_dead_holder_named(&r, &[10, 11, 12]);
    for pid in [10, 11] {
        let inc = r.last_of(pid);
        assert_eq!(verdict(inc), VerdictKind::Released, "{inc:?}");
        let last = back(r.last_of(12));
        assert!(last.is_some() && back(inc) == last, "{pid}: {inc:?}");
    }
}
