//! GPU holders' threads that sleep uninterruptibly, for user space to find the ones stuck in
//! the driver. Only the switch out is seen (from the scheduler program every switch already
//! runs): a thread's latest such sleep replaces its entry, so one still asleep has slept since
//! its entry's time, and no program runs when threads wake. A bystander's switch costs a test
//! of its state; a D sleep, a lookup of its process among the holders.

use aya_ebpf::{
    macros::map,
    maps::{LruHashMap, StackTrace},
    programs::tracing::StackIdContext,
};
use tracer_common::{asleep::Asleep, Loss};

use crate::{
    emit::{count_loss, current_ids, now_ns},
    holders::is_holder,
    task::Task,
};

/// Holders' threads by tid → their latest uninterruptible sleep. LRU: entries of threads that
/// exited make room for new ones; user space removes those it finds gone.
#[map]
static HOLDERS_ASLEEP: LruHashMap<u32, Asleep> = LruHashMap::with_max_entries(8192, 0);

/// Their kernel stacks, apart from the teardown's (which user space empties when nobody dies).
#[map]
static ASLEEP_STACKS: StackTrace = StackTrace::with_max_entries(4096, 0);

const TASK_UNINTERRUPTIBLE: u32 = 0x2;
/// Idle kernel threads sleep as TASK_IDLE (uninterruptible without counting as load).
const TASK_NOLOAD: u32 = 0x400;

/// From `sched_switch`, as the task switching out in `prev_state`.
#[inline(always)]
pub fn note_if_holder_asleep<C: StackIdContext>(ctx: &C, prev_state: u32) {
    if prev_state & TASK_UNINTERRUPTIBLE == 0 || prev_state & TASK_NOLOAD != 0 {
        return;
    }
    let (tgid, tid) = current_ids();
    if !is_holder(tgid) {
        return;
    }
    let stack_id = match ctx.get_stackid(&ASLEEP_STACKS, 0) {
        Ok(id) => id as i32,
        Err(_) => {
            count_loss(Loss::AsleepStacks);
            -1
        }
    };
    let asleep = Asleep {
        since_ns: now_ns(),
        tgid,
        stack_id,
        switches: Task::current().voluntary_switches(),
    };
    if HOLDERS_ASLEEP.insert(tid, asleep, 0).is_err() {
        count_loss(Loss::Asleep);
    }
}
