//! Tests of who holds which GPU file (`holders.rs`).
use super::*;

fn ev(pid: u32, ts_ns: u64, data: EventData) -> Event {
    Event {
        ts_ns,
        cpu: 0,
        pid,
        tid: pid,
        data,
    }
}

/// `parent` forks `child` (a copied table) at `ts_ns`.
fn fork(parent: u32, child: u32, ts_ns: u64) -> Event {
    ev(
        parent,
        ts_ns,
        EventData::Fork {
            child_pid: child,
            files_shared: false,
            comm: "c".into(),
        },
    )
}

fn fd(op: FdOp, fd: i32, file: u64) -> EventData {
    EventData::GpuFd {
        op,
        fd,
        dev: 7,
        cloexec: false,
        truncated: false,
        file,
        refcount: 1,
    }
}

/// The event sequence of the fork-holder scenario as recorded by `linger live --events`.
#[test]
fn a_descriptor_inherited_then_kept_across_exec_stays_inherited() {
    let mut h = Holders::default();
    let file = 0xffff_0000_0000_1000;
    h.on_event(&ev(10, 1, fd(FdOp::Open, 3, file)));
    h.on_event(&fork(10, 11, 2));
    h.on_event(&ev(11, 3, EventData::Exec { comm: "c".into() }));
    h.on_event(&ev(11, 4, fd(FdOp::HeldAtExec, 3, file)));
    let holders = h.holders_of(&[file], 10);
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].how, How::Fork { from: 10, t_ns: 2 });
}

/// A parent dies between its child's exec and the exec's walk of the child's table: the
/// descriptors the exec keeps still count.
#[test]
fn an_exec_under_way_keeps_its_descriptors_until_the_walk_says_otherwise() {
    let mut h = Holders::default();
    let file = 0xffff_0000_0000_2000;
    h.on_event(&ev(10, 1, fd(FdOp::Open, 3, file)));
    h.on_event(&fork(10, 11, 2));
    h.on_event(&ev(11, 3, EventData::Exec { comm: "c".into() }));
    assert_eq!(h.holders_of(&[file], 10).len(), 1, "held during the walk");
    // The walk lists nothing: the descriptor was closed on exec after all.
    h.on_event(&ev(11, 4, EventData::BenchTick));
    assert!(h.holders_of(&[file], 10).is_empty());
}

/// A child that closed its inherited descriptors untraced (a C library close_range) and
/// then does nothing traced after its exec: the next record of another task from the CPU
/// its exec walk ran on ends the walk, records from other CPUs do not.
#[test]
fn an_exec_walk_ends_at_the_next_record_from_its_cpu() {
    let mut h = Holders::default();
    let file = 0xffff_0000_0000_2000;
    h.on_event(&ev(10, 1, fd(FdOp::Open, 3, file)));
    h.on_event(&fork(10, 11, 2));
    let on = |cpu, mut e: Event| {
        e.cpu = cpu;
        e
    };
    h.on_event(&on(3, ev(11, 3, EventData::Exec { comm: "c".into() })));
    h.on_event(&on(5, ev(12, 4, EventData::BenchTick)));
    assert_eq!(h.holders_of(&[file], 10).len(), 1, "another CPU's record");
    h.on_event(&on(3, ev(12, 5, EventData::BenchTick)));
    assert!(h.holders_of(&[file], 10).is_empty());
}

/// A walk's marker: it stopped at `FD_WALK_MAX`.
#[test]
fn a_search_walk_of_a_group_that_already_died_is_not_a_holder() {
    let mut h = Holders::default();
    let file = 0xffff_8000_0000_1000;
    h.on_event(&ev(10, 1, fd(FdOp::Open, 3, file)));
    h.on_event(&ev(10, 2, fd(FdOp::HeldAtExit, 3, file)));
    assert_eq!(h.group_died(10).len(), 1);
    // Caught by a search on its way out: its file would seem held for ever, and the
    // next open that reuses the address would seem held by it.
    h.on_event(&ev(10, 3, fd(FdOp::HeldAtSearch, 3, file)));
    assert!(h.process(10).is_none());
    assert!(h.holders_of(&[file], 0).is_empty());
    // The pid forked anew is another process, whose walks count.
    h.on_event(&fork(1, 10, 4));
    h.on_event(&ev(10, 5, fd(FdOp::HeldAtSearch, 3, file)));
    assert_eq!(h.holders_of(&[file], 0).len(), 1);
}

fn stopped(op: FdOp) -> EventData {
    EventData::GpuFd {
        op,
        fd: -1,
        dev: 0,
        cloexec: false,
        truncated: true,
        file: 0,
        refcount: 0,
    }
}

/// Walks of tables larger than they reach: an exec walk keeps what it could not see, an
/// exit walk adds it to what it saw, and what it did not list below its end is gone.
#[test]
fn a_walk_that_stopped_keeps_the_descriptors_above_its_end() {
    let mut h = Holders::default();
    let (low, high) = (0xffff_0000_0000_5000, 0xffff_0000_0000_6000);
    let top = FD_WALK_MAX as i32 + 7;
    h.on_event(&ev(10, 1, fd(FdOp::Open, 3, low)));
    h.on_event(&ev(10, 1, fd(FdOp::Dup, 4, low)));
    h.on_event(&ev(10, 1, fd(FdOp::Open, top, high)));
    h.on_event(&fork(10, 11, 2));
    h.on_event(&ev(11, 3, EventData::Exec { comm: "c".into() }));
    h.on_event(&ev(11, 4, fd(FdOp::HeldAtExec, 3, low)));
    h.on_event(&ev(11, 4, stopped(FdOp::HeldAtExec)));
    h.on_event(&ev(11, 5, EventData::BenchTick));
    let held = h.holders_of(&[low, high], 10);
    assert_eq!(
        held[0].fds,
        vec![3, top],
        "4 closed on exec, {top} not seen"
    );
    h.on_event(&ev(10, 6, fd(FdOp::HeldAtExit, 3, low)));
    h.on_event(&ev(10, 6, stopped(FdOp::HeldAtExit)));
    let died: Vec<i32> = h.group_died(10).iter().map(|f| f.fd).collect();
    assert_eq!(died, vec![3, top], "4 closed untraced, {top} not seen");
}

fn fput(file: u64) -> EventData {
    EventData::DriverCall {
        func: DriverFunc::Fput,
        exit: false,
        hook: crate::event::HookKind::Kprobe,
        file,
        dev: 7,
        value: 0,
        duration_ns: 0,
    }
}

/// The driver's open hook sees no descriptor number: two opens are both held, a child
/// inherits them, the exec walk numbers them, and `__fput` of one forgets it everywhere.
#[test]
fn driver_opens_are_held_until_a_walk_numbers_them_and_fput_forgets_them() {
    let mut h = Holders::default();
    let (a, b) = (0xffff_0000_0000_3000, 0xffff_0000_0000_4000);
    h.on_event(&ev(10, 1, fd(FdOp::Open, -1, a)));
    h.on_event(&ev(10, 2, fd(FdOp::Open, -1, b)));
    assert!(h.holds_gpu_files(10));
    h.on_event(&fork(10, 11, 3));
    let held = h.holders_of(&[a, b], 10);
    assert_eq!(held.len(), 1);
    assert!(held[0].fds.is_empty(), "no number is made up: {held:?}");
    h.on_event(&ev(11, 4, EventData::Exec { comm: "c".into() }));
    h.on_event(&ev(11, 5, fd(FdOp::HeldAtExec, 4, a)));
    h.on_event(&ev(11, 5, fd(FdOp::HeldAtExec, 5, b)));
    h.on_event(&ev(11, 6, EventData::BenchTick));
    let held = h.holders_of(&[a, b], 10);
    assert_eq!(held[0].fds, vec![4, 5]);
    assert_eq!(held[0].how, How::Fork { from: 10, t_ns: 3 });
    h.on_event(&ev(0, 7, fput(a)));
    assert_eq!(
        h.holders_of(&[a], 0).len(),
        0,
        "nobody holds a released file"
    );
    assert_eq!(
        h.holders_of(&[b], 0).len(),
        2,
        "the other file is still held"
    );
}
