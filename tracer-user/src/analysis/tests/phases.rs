//! The dying thread's time split into teardown phases.

use crate::analysis::verdict::VerdictKind;
use crate::event::{EventData, FdOp, SampleKind};

use super::run::{fd, verdict, Run, FILE, GIB, MS, SHELL};

#[test]
fn waking_uvm_bottom_half_threads_is_not_a_deferred_close() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.nvml(1.0, 3 * GIB, &[(10, 2 * GIB)]);
    r.kill(SHELL, 10, 9, 100.0);
    r.die(10, &[FILE], 100.1, 9);
    for (t, comm) in [(110.0, "UVM GPU1 BH"), (120.0, "UVM GPU1 KC")] {
        r.feed(
            10,
            t,
            EventData::KthreadWakeup {
                kthread_tid: 77,
                owner: 10,
                comm: comm.into(),
            },
        );
    }
    r.nvml(230.0, GIB, &[]);
    r.zombie_and_reap(10, 231.0);
    r.tick(250.0);
    assert_eq!(verdict(r.last_of(10)), VerdictKind::Released);

    // UVM's deferred release queue is evidence.
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.nvml(1.0, 3 * GIB, &[(10, 2 * GIB)]);
    r.kill(SHELL, 10, 9, 100.0);
    r.die(10, &[FILE], 100.1, 9);
    r.feed(
        10,
        110.0,
        EventData::KthreadWakeup {
            kthread_tid: 78,
            owner: 10,
            comm: "UVM deferred re".into(),
        },
    );
    r.nvml(230.0, GIB, &[]);
    r.zombie_and_reap(10, 231.0);
    r.tick(250.0);
    assert_eq!(verdict(r.last_of(10)), VerdictKind::DeferredClose);
}

#[test]
fn phases_partition_the_dying_threads_time_with_lock_waits_their_own() {
    let mut r = Run::new();
    let stack = |id: i32, frames: &[&str]| EventData::Stack {
        id,
        frames: frames.iter().map(|f| f.to_string()).collect(),
    };
    r.holder(10, 0, 0.0);
    r.nvml(1.0, 3 * GIB, &[(10, 2 * GIB)]);
    r.kill(SHELL, 10, 9, 100.0);
    // Symbolized stacks follow the samples that first name them, while an incident is open.
    r.feed(
        0,
        100.0,
        stack(
            1,
            &[
                "_kgspRpcRecvPoll [nvidia]",
                "rpcRmApiFree_GSP [nvidia]",
                "rm_cleanup_file_private [nvidia]",
            ],
        ),
    );
    r.feed(
        0,
        100.0,
        stack(
            2,
            &[
                "schedule",
                "rwsem_down_write_slowpath",
                "down_write",
                "os_acquire_rwlock_write [nvidia]",
            ],
        ),
    );
    // The group-dead thread is 11; thread 12 ran in parallel (its time is not the interval's).
    r.feed_tid(
        10,
        12,
        100.05,
        EventData::TaskExit {
            exit_code: 9,
            group_dead: false,
            comm: "t".into(),
        },
    );
    r.feed(10, 100.1, fd(FdOp::HeldAtExit, 3, FILE));
    r.feed_tid(
        10,
        11,
        100.1,
        EventData::TaskExit {
            exit_code: 9,
            group_dead: true,
            comm: "t".into(),
        },
    );
    let sample = |tid, kind, stack_id, blocked_ns| EventData::TeardownSample {
        sample: kind,
        stack_id,
        owner: 10,
        tid,
        blocked_ns,
    };
    // Waiting 600 ms for another process's teardown, then 100 ms of its own.
    r.feed(10, 100.2, sample(11, SampleKind::BlockStart, 2, 0));
    r.feed(10, 700.2, sample(11, SampleKind::BlockEnd, 2, 600 * MS));
    r.feed(10, 800.2, sample(11, SampleKind::OnCpu, 1, 0));
    r.feed(10, 800.2, sample(12, SampleKind::OnCpu, 1, 0));
    r.nvml(800.5, GIB, &[]);
    r.zombie_and_reap(10, 801.0);
    r.tick(820.0);
    let inc = r.last_of(10);
    let sum: u64 = inc.phases.iter().map(|p| p.ns).sum();
    let interval = 801 * MS - 100_100_000;
    assert!(sum <= interval, "{sum} > {interval}");
    assert_eq!(inc.phases[0].name.label(), "lock wait");
    // The sleep, and the moment before it when the thread ran into the lock.
    assert!((600 * MS..=601 * MS).contains(&inc.phases[0].ns));
    let coverage = inc.phases_coverage.expect("coverage");
    assert!((0.99..=1.0).contains(&coverage), "{coverage}");
}
