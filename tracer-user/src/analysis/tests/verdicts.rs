//! One death per verdict, each from the events that lead to it. `released`, `shared_fd`,
//! `imported`, `deferred_close` and `incomplete` are also reached by the situations of the
//! other files here; this one holds a test for each of the ten.

use crate::analysis::{incident::Incident, verdict::VerdictKind};
use crate::event::{EventData, LossKind, SampleKind};

use super::run::{Run, FILE, GIB, SHELL};

/// The verdict of pid 10's last record, and its evidence and hint as one text.
fn said(r: &Run) -> (VerdictKind, String) {
    let inc: &Incident = r.last_of(10);
    let v = inc.verdict.as_ref().expect("a verdict");
    (v.kind, format!("{} / {}", v.evidence.join("; "), v.hint))
}

/// pid 10 holds 8 GiB, NVML lists it, and it is SIGKILLed at 100 ms and dies at once.
fn killed_holder() -> Run {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.nvml(1.0, 9 * GIB, &[(10, 8 * GIB)]);
    r.kill(SHELL, 10, 9, 100.0);
    r.die(10, &[FILE], 100.1, 9);
    r
}

#[test]
fn released_when_the_memory_is_back_within_slow_after() {
    let mut r = killed_holder();
    r.zombie_and_reap(10, 120.0);
    r.nvml(130.0, GIB, &[]);
    r.tick(200.0);
    let (kind, text) = said(&r);
    assert_eq!(kind, VerdictKind::Released, "{text}");
    assert!(
        text.contains("nothing to do: the memory was back 30.0 ms after the kill"),
        "{text}"
    );
}

#[test]
fn slow_teardown_when_the_memory_came_back_after_slow_after() {
    let mut r = killed_holder();
    r.nvml(600.0, 9 * GIB, &[(10, 8 * GIB)]);
    r.nvml(1700.0, GIB, &[]);
    r.zombie_and_reap(10, 1700.5);
    r.tick(1800.0);
    let (kind, text) = said(&r);
    assert_eq!(kind, VerdictKind::SlowTeardown, "{text}");
    assert!(text.contains("teardown took 1600 ms"), "{text}");
}

/// The kernel released the files at 845 ms; NVML's next reading, queued behind the driver in a
/// storm, lands only at 1250 ms. At the slow threshold (1100 ms) nothing is said of a teardown
/// still under way: the first record waits for the reading, and says the memory was back.
#[test]
fn a_lagging_nvml_reading_after_the_release_is_not_a_slow_teardown() {
    let mut r = killed_holder();
    r.ioctls_traced();
    r.nvml(600.0, 9 * GIB, &[(10, 8 * GIB)]);
    r.zombie_and_reap(10, 845.0);
    r.tick(1150.0);
    assert!(r.incidents().is_empty(), "{:?}", r.incidents());
    r.nvml(1250.0, GIB, &[]);
    r.tick(1300.0);
    let first = r.incidents()[0];
    let v = first.verdict.as_ref().expect("a verdict");
    assert_eq!(v.kind, VerdictKind::Released, "{v:?}");
    let gpu = first.gpu.as_ref().expect("gpu");
    assert_eq!(gpu.t_memory_back_ns, Some(845_000_000));
}

#[test]
fn slow_teardown_while_nvml_still_lists_it_after_slow_after() {
    let mut r = killed_holder();
    r.nvml(600.0, 9 * GIB, &[(10, 8 * GIB)]);
    r.nvml(1150.0, 9 * GIB, &[(10, 8 * GIB)]);
    r.tick(1200.0);
    let (kind, text) = said(&r);
    assert_eq!(kind, VerdictKind::SlowTeardown, "{text}");
    assert!(text.contains("its teardown is still under way"), "{text}");
}

#[test]
fn shared_fd_when_a_forked_child_holds_its_files() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    let fork = EventData::Fork {
        child_pid: 11,
        files_shared: false,
        comm: "python3".into(),
    };
    r.feed(10, 1.0, fork);
    r.nvml(2.0, 9 * GIB, &[(10, 8 * GIB)]);
    r.kill(SHELL, 10, 9, 100.0);
    r.die(10, &[FILE], 100.1, 9);
    r.zombie_and_reap(10, 100.3);
    r.tick(200.0);
    let (kind, text) = said(&r);
    assert_eq!(kind, VerdictKind::SharedFd, "{text}");
    assert!(
        text.contains("python3[11] holds fds [3] (inherited at fork)"),
        "{text}"
    );
}

#[test]
fn imported_when_nvml_charges_its_memory_to_another_process() {
    let mut r = killed_holder();
    r.holder(20, 1, 2.0);
    r.nvml(3.0, 10 * GIB, &[(10, 8 * GIB), (20, GIB)]);
    r.zombie_and_reap(10, 100.3);
    // Pid 10 leaves NVML's list while pid 20's figure rises by its 8 GiB; nothing else moves.
    r.nvml(101.0, 10 * GIB, &[(20, 9 * GIB)]);
    r.nvml(700.0, 10 * GIB, &[(20, 9 * GIB)]);
    r.tick(1200.0);
    let (kind, text) = said(&r);
    assert_eq!(kind, VerdictKind::Imported, "{text}");
    assert!(text.contains("[20] holds 8.0 GiB it imported"), "{text}");
}

#[test]
fn deferred_close_when_the_driver_queues_the_release_to_its_thread() {
    let mut r = killed_holder();
    let wakeup = EventData::KthreadWakeup {
        kthread_tid: 78,
        owner: 10,
        comm: "UVM deferred re".into(),
    };
    r.feed(10, 110.0, wakeup);
    r.nvml(230.0, GIB, &[]);
    r.zombie_and_reap(10, 231.0);
    r.tick(250.0);
    let (kind, text) = said(&r);
    assert_eq!(kind, VerdictKind::DeferredClose, "{text}");
    assert!(
        text.contains("memory back 129.9 ms after the group died"),
        "{text}"
    );
}

#[test]
fn stuck_in_driver_when_a_thread_sleeps_in_the_driver_past_linger_after() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.nvml(1.0, 9 * GIB, &[(10, 8 * GIB)]);
    let frames = [
        "os_acquire_mutex [nvidia]",
        "rm_ioctl [nvidia]",
        "__x64_sys_ioctl",
    ];
    let stack = EventData::Stack {
        id: 5,
        frames: frames.map(String::from).to_vec(),
    };
    r.kill(SHELL, 10, 9, 100.0);
    // The dying thread goes to sleep in the driver and never wakes.
    r.feed(10, 100.5, stack);
    let asleep = EventData::TeardownSample {
        sample: SampleKind::BlockStart,
        stack_id: 5,
        owner: 10,
        tid: 12,
        blocked_ns: 0,
    };
    r.feed_tid(10, 12, 100.5, asleep);
    // Run::new's linger_after is 10 s: the process is still not dead then.
    r.tick(10_200.0);
    let (kind, text) = said(&r);
    assert_eq!(kind, VerdictKind::StuckInDriver, "{text}");
    assert!(
        text.contains("thread 12 asleep in the driver for 10.1 s: os_acquire_mutex [nvidia]"),
        "{text}"
    );
}

#[test]
fn not_delivered_when_a_sigkilled_process_does_not_die_by_linger_after() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.kill(SHELL, 10, 9, 100.0);
    r.tick(10_200.0);
    let (kind, text) = said(&r);
    assert_eq!(kind, VerdictKind::NotDelivered, "{text}");
    assert!(
        text.contains("0 deliveries, 0 thread exits, no group death after 10.1 s"),
        "{text}"
    );
}

#[test]
fn pid_unresolved_when_nvml_lists_a_pid_no_traced_process_matches() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.nvml(1.0, 10 * GIB, &[(10, 8 * GIB), (999, GIB)]);
    r.kill(SHELL, 10, 9, 100.0);
    r.die(10, &[FILE], 100.1, 9);
    r.zombie_and_reap(10, 100.3);
    // Pid 10 is gone from the list, but the device's used memory stays.
    r.nvml(200.0, 10 * GIB, &[(999, GIB)]);
    r.nvml(1150.0, 10 * GIB, &[(999, GIB)]);
    r.tick(1200.0);
    let (kind, text) = said(&r);
    assert_eq!(kind, VerdictKind::PidUnresolved, "{text}");
    assert!(
        text.contains("NVML lists pid(s) [999] on the GPU"),
        "{text}"
    );
}

#[test]
fn unknown_holder_when_nvml_drops_it_but_the_memory_stays_in_use() {
    let mut r = killed_holder();
    r.zombie_and_reap(10, 100.3);
    r.nvml(200.0, 9 * GIB, &[]);
    r.nvml(1150.0, 9 * GIB, &[]);
    r.tick(1200.0);
    let (kind, text) = said(&r);
    assert_eq!(kind, VerdictKind::UnknownHolder, "{text}");
    assert!(
        text.contains(
            "NVML no longer lists pid 10, but the device's used memory has not come down"
        ),
        "{text}"
    );
}

#[test]
fn incomplete_when_records_that_may_name_a_holder_were_lost() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.kill(SHELL, 10, 9, 100.0);
    let lost = EventData::Loss {
        count: 12,
        what: LossKind::Holders,
        period_ns: 1_000_000_000,
    };
    r.feed(0, 100.05, lost);
    r.die(10, &[FILE], 100.1, 9);
    r.zombie_and_reap(10, 240.0);
    r.tick(300.0);
    let (kind, text) = said(&r);
    assert_eq!(kind, VerdictKind::Incomplete, "{text}");
    assert!(
        text.contains("the kernel lost records while this was traced (12 holders)"),
        "{text}"
    );
}
