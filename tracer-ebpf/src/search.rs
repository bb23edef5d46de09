//! Walks of processes user space asks about: when a dead holder's files keep references that
//! no known process accounts for (a descriptor received over a unix socket or taken with
//! pidfd_getfd is seen by no hook), each process holding GPU files is walked at its next
//! context switch, the one place its task is at hand without an iterator. The walk is a
//! program of its own, reached by a tail call from the scheduler hook: inlined there, the
//! verifier would have to check it with every teardown path.

use aya_ebpf::{
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, ProgramArray},
    programs::BtfTracePointContext,
};
use tracer_common::FdOp;

use crate::{emit::current_ids, files::walk, holders::add_holder, task::Task};

/// Processes to walk, by tgid (value unused). Filled by user space; an entry goes with its walk.
#[map]
static SEARCH: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);

/// Non-zero while SEARCH may have entries (user space sets it with them and clears it once
/// the map is empty): otherwise the scheduler hook returns after one array read.
#[map]
static SEARCH_HINT: Array<u32> = Array::with_max_entries(1, 0);

/// Slot 0: `search_walk`, put there by user space.
#[map]
static SEARCH_WALK: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// From sched_switch, as the task switching out: jumps to its walk if user space asked for
/// one (and returns when the jump cannot be made).
#[inline(always)]
pub fn walk_if_wanted(ctx: &BtfTracePointContext) {
    if !SEARCH_HINT.get(0).is_some_and(|n| *n != 0) {
        return;
    }
    let (tgid, _) = current_ids();
    // SAFETY: existence check only.
    if unsafe { SEARCH.get(tgid) }.is_none() {
        return;
    }
    // SAFETY: the slot holds a program of this one's type and attach point, or nothing.
    unsafe { SEARCH_WALK.tail_call(ctx, 0) };
}

/// The walk of the task switching out (tail-called from `teardown_switch`, never attached).
#[btf_tracepoint(function = "sched_switch")]
pub fn search_walk(ctx: BtfTracePointContext) -> i32 {
    let (tgid, _) = current_ids();
    let _ = SEARCH.remove(tgid);
    // `prev`, the task switching out: the running one.
    let prev = Task(ctx.arg::<*const u8>(1));
    // A group whose last thread is on its way out (counted out before its exit record, its
    // files closed after): a walk now would follow that record and bring the process back
    // as a holder, and adding it to the holders would outlive it.
    if prev.live_threads() == 0 {
        return 0;
    }
    walk(prev, FdOp::HeldAtSearch);
    // User space asks only about processes holding GPU files: their closes and their own
    // death are followed from now on.
    add_holder(tgid);
    0
}
