//! Where a dying GPU process spends its time: kernel stacks sampled on CPU (perf cpu-clock)
//! and taken when it blocks, for its threads and for the driver kthreads it wakes. Works on
//! kernels without kprobes or fentry.

use aya_ebpf::{
    macros::{btf_tracepoint, map, perf_event},
    maps::{HashMap, StackTrace},
    programs::{tracing::StackIdContext, BtfTracePointContext, PerfEventContext},
};
use tracer_common::{KthreadWakeup, Loss, SampleKind, TeardownSample};

use crate::{
    asleep::note_if_holder_asleep,
    driver_text,
    dying::{anyone_dying, is_dying, DYING, ONCPU_TAKEN},
    emit::{count_loss, current_ids, emit, now_ns},
    search::walk_if_wanted,
    task::{switch_passes_prev_state, Task},
};

/// A teardown's first this many on-CPU samples are all kept; of the later ones, one in
/// `ONCPU_THIN`. A sample's weight is the time since its thread's previous one, so thinning
/// coarsens a long teardown's phases and flamegraph without losing time; a busy node's
/// churn of dying processes otherwise fills the ring with them.
const ONCPU_FULL: u32 = 64;
const ONCPU_THIN: u32 = 16;

/// Driver kthreads woken by a dying process → that process.
#[map]
static HELPERS: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// Kernel stacks, by id.
#[map]
static STACKS: StackTrace = StackTrace::with_max_entries(16384, 0);

#[derive(Clone, Copy)]
struct Blocked {
    since: u64,
    stack_id: i32,
    owner: u32,
}

/// Threads of interest asleep, by tid.
#[map]
static BLOCKED: HashMap<u32, Blocked> = HashMap::with_max_entries(8192, 0);

/// The dying process whose teardown the task (`tgid`, `tid`) works on, if any.
fn owner_of(tgid: u32, tid: u32) -> Option<u32> {
    // SAFETY: plain values copied out of the maps.
    unsafe {
        if DYING.get(tgid).is_some() {
            return Some(tgid);
        }
        let owner = *HELPERS.get(tid)?;
        if DYING.get(owner).is_some() {
            return Some(owner);
        }
    }
    // The process it helped is gone: forget the kthread.
    let _ = HELPERS.remove(tid);
    None
}

/// `prev_state` of a task's final switch in do_task_dead: it never runs again.
const TASK_DEAD: u32 = 0x80;

fn stack_id<C: StackIdContext>(ctx: &C) -> i32 {
    match ctx.get_stackid(&STACKS, 0) {
        Ok(id) => id as i32,
        Err(_) => {
            count_loss(Loss::Stacks);
            -1
        }
    }
}

#[perf_event]
pub fn teardown_oncpu(ctx: PerfEventContext) -> u32 {
    if !anyone_dying() {
        return 0;
    }
    let (tgid, tid) = current_ids();
    let Some(owner) = owner_of(tgid, tid) else {
        return 0;
    };
    if tgid == owner {
        driver_text::sighted(&ctx, owner, tid, -1);
    }
    if !keep_oncpu(owner) {
        return 0;
    }
    let stack_id = stack_id(&ctx);
    emit::<TeardownSample>(|e| {
        e.kind = SampleKind::OnCpu as u32;
        e.stack_id = stack_id;
        e.owner = owner;
        e.tid = tid;
    });
    0
}

/// Counts an on-CPU sample of `owner`'s teardown; whether to keep it (see `ONCPU_FULL`).
fn keep_oncpu(owner: u32) -> bool {
    let Some(n) = ONCPU_TAKEN.get_ptr_mut(owner) else {
        return true;
    };
    // SAFETY: a valid map value; a lost increment between CPUs only shifts the thinning.
    unsafe {
        let taken = *n;
        *n = taken.wrapping_add(1);
        taken < ONCPU_FULL || taken % ONCPU_THIN == 0
    }
}

/// tp_btf sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state): runs as `prev`.
#[btf_tracepoint(function = "sched_switch")]
pub fn teardown_switch(ctx: BtfTracePointContext) -> i32 {
    walk_if_wanted(&ctx);
    let prev_state: u32 = if switch_passes_prev_state() {
        ctx.arg(3)
    } else if ctx.arg::<u8>(0) != 0 {
        // Preempted: still runnable, as the tracepoint itself reports it before 5.18.
        0
    } else {
        Task(ctx.arg::<*const u8>(1)).state()
    };
    note_if_holder_asleep(&ctx, prev_state);
    if !anyone_dying() {
        return 0;
    }
    let (tgid, tid) = current_ids();
    if prev_state & TASK_DEAD != 0 {
        // Its exit is over: for a process nobody reaps (its parent ignores SIGCHLD, as a pid
        // namespace's dying init does), the only moment before its free an RCU grace later.
        if let Some(owner) = owner_of(tgid, tid) {
            if tgid == owner {
                driver_text::sighted(&ctx, owner, tid, -1);
                driver_text::forget(tid);
            }
            emit::<TeardownSample>(|e| {
                e.kind = SampleKind::Exited as u32;
                e.stack_id = -1;
                e.owner = owner;
                e.tid = tid;
            });
        }
    }
    // Preempted: where it was, for the end of its driver work (its own threads only: one
    // lookup, where `owner_of` would also look for, and forget, a driver kthread).
    if prev_state == 0 && is_dying(tgid) {
        driver_text::sighted(&ctx, tgid, tid, -1);
    }
    // Going to sleep (not merely preempted, nor dead for good): remember where.
    if prev_state != 0 && prev_state & TASK_DEAD == 0 {
        if let Some(owner) = owner_of(tgid, tid) {
            let stack_id = stack_id(&ctx);
            if tgid == owner {
                driver_text::sighted(&ctx, owner, tid, stack_id);
            }
            let since = now_ns();
            let blocked = Blocked {
                since,
                stack_id,
                owner,
            };
            if BLOCKED.insert(tid, blocked, 0).is_err() {
                count_loss(Loss::Blocked);
            }
            emit::<TeardownSample>(|e| {
                e.kind = SampleKind::BlockStart as u32;
                e.stack_id = stack_id;
                e.owner = owner;
                e.tid = tid;
            });
        }
    }
    let next = Task(ctx.arg::<*const u8>(2));
    let next_tid = next.pid();
    driver_text::resumed(next_tid);
    // SAFETY: the value is copied out before the entry is removed.
    if let Some(b) = unsafe { BLOCKED.get(next_tid) }.copied() {
        let _ = BLOCKED.remove(next_tid);
        emit::<TeardownSample>(|e| {
            e.kind = SampleKind::BlockEnd as u32;
            e.stack_id = b.stack_id;
            e.owner = b.owner;
            e.tid = next_tid;
            e.blocked_ns = now_ns().wrapping_sub(b.since);
        });
    }
    0
}

/// tp_btf sched_wakeup(struct task_struct *p): a dying process waking the driver's queue
/// kthreads ("nv_queue", "UVM ...") hands them its teardown.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn teardown_wakeup(ctx: BtfTracePointContext) -> i32 {
    if !anyone_dying() {
        return 0;
    }
    let (tgid, tid) = current_ids();
    let Some(owner) = owner_of(tgid, tid) else {
        return 0;
    };
    let woken = Task(ctx.arg::<*const u8>(0));
    let comm = woken.comm_word();
    let driver_kthread = has_prefix(comm, b"nv_queue") || has_prefix(comm, b"UVM ");
    if !driver_kthread || woken.tgid() == tgid {
        return 0;
    }
    let kthread_tid = woken.pid();
    if HELPERS.insert(kthread_tid, owner, 0).is_err() {
        count_loss(Loss::Helpers);
    }
    emit::<KthreadWakeup>(|e| {
        e.kthread_tid = kthread_tid;
        e.owner = owner;
        e.comm = comm.to_ne_bytes();
    });
    0
}

/// Whether a `comm` read as one word starts with `prefix`: a masked compare, where a byte
/// slice's would call `memcmp` (see `Task::comm_word`).
#[inline(always)]
fn has_prefix(comm: u128, prefix: &[u8]) -> bool {
    let mut want = [0u8; 16];
    let mut mask = [0u8; 16];
    let mut i = 0;
    while i < prefix.len() && i < 16 {
        want[i] = prefix[i];
        mask[i] = 0xff;
        i += 1;
    }
    comm & u128::from_ne_bytes(mask) == u128::from_ne_bytes(want)
}
