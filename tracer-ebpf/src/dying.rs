//! Which GPU processes are being torn down: from the fatal signal until freed. The scheduler
//! and sampling hooks (`teardown.rs`) and the file hooks (`files.rs`) ask it; the signal and
//! exit hooks start and end it.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap},
};
use tracer_common::Loss;

use crate::emit::{count_loss, now_ns};

/// Dying GPU processes (from the fatal signal until freed) → when they started dying.
#[map]
pub static DYING: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// On-CPU samples taken of each dying process so far (reset when it starts dying).
#[map]
pub static ONCPU_TAKEN: LruHashMap<u32, u32> = LruHashMap::with_max_entries(4096, 0);

/// Non-zero when DYING may have entries: the scheduler and sampling hooks return at once
/// otherwise. Set here when a process starts dying; user space clears it once DYING is empty
/// (and sets it again if it raced with a new entry).
#[map]
static DYING_HINT: Array<u32> = Array::with_max_entries(1, 0);

pub fn anyone_dying() -> bool {
    DYING_HINT.get(0).is_some_and(|n| *n != 0)
}

/// Whether `tgid` is a GPU process whose teardown is under way.
pub fn is_dying(tgid: u32) -> bool {
    // SAFETY: the value is not held beyond the lookup.
    anyone_dying() && unsafe { DYING.get(tgid).is_some() }
}

pub fn start_dying(tgid: u32) {
    // SAFETY: existence check only.
    if unsafe { DYING.get(tgid) }.is_none() {
        if DYING.insert(tgid, now_ns(), 0).is_err() {
            count_loss(Loss::Dying);
        }
        if ONCPU_TAKEN.insert(tgid, 0, 0).is_err() {
            count_loss(Loss::Dying);
        }
    }
    if let Some(hint) = DYING_HINT.get_ptr_mut(0) {
        // SAFETY: a valid map value; a plain store is atomic for a u32.
        unsafe { *hint = 1 };
    }
}

/// Called at every process's free: while nobody dies, a hash removal (bucket lock and all)
/// would be the whole cost of that hook for every process on the machine.
pub fn stop_dying(tgid: u32) {
    if anyone_dying() {
        let _ = DYING.remove(tgid);
    }
}
