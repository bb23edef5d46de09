//! When a dying process's work in the NVIDIA driver ended, on kernels where no hook can time
//! the driver's release (no kprobes, no fentry): each sight of one of its threads (an on-CPU
//! sample, a switch out, a switch back in after a sleep in the driver) is tested against the
//! driver modules' code, and the first sight outside it after one inside is recorded with the
//! gap between the two. The free of its memory ended in that gap; the rest of the exit (other
//! files, `exit_notify`) can outlast it by tens of ms under churn.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::bpf_get_stack,
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray},
    EbpfContext,
};
use tracer_common::{
    driver_text::{TextRange, DRIVER_STACK_FRAMES, DRIVER_TEXT_RANGES},
    Loss, SampleKind, TeardownSample,
};

use crate::emit::{count_loss, emit, now_ns};

/// The driver modules' code, filled by user space from /proc/kallsyms.
#[map]
static DRIVER_TEXT: Array<TextRange> = Array::with_max_entries(DRIVER_TEXT_RANGES, 0);

/// Room for one stack per CPU: too large for the program's own stack.
#[map]
static FRAMES: PerCpuArray<[u64; DRIVER_STACK_FRAMES]> = PerCpuArray::with_max_entries(1, 0);

/// Threads of dying processes last seen inside the driver → when. An LRU: a thread whose
/// stack could not be read at its final switch leaves its entry behind.
#[map]
static IN_DRIVER: LruHashMap<u32, u64> = LruHashMap::with_max_entries(8192, 0);

/// Whether the current thread's kernel stack holds a driver frame; None when it could not be
/// read.
fn in_driver<C: EbpfContext>(ctx: &C) -> Option<bool> {
    let frames = FRAMES.get_ptr_mut(0)?;
    let size = (DRIVER_STACK_FRAMES * 8) as u32;
    // SAFETY: the buffer is a per-CPU map value of exactly `size` bytes.
    let n = unsafe { bpf_get_stack(ctx.as_ptr(), frames as *mut c_void, size, 0) };
    if n < 0 {
        return None;
    }
    let depth = (n as usize / 8).min(DRIVER_STACK_FRAMES);
    let mut ranges = [TextRange::default(); DRIVER_TEXT_RANGES as usize];
    for (i, r) in ranges.iter_mut().enumerate() {
        if let Some(t) = DRIVER_TEXT.get(i as u32) {
            *r = *t;
        }
    }
    for i in 0..DRIVER_STACK_FRAMES {
        if i >= depth {
            break;
        }
        // SAFETY: `i` is within the map value.
        let addr = unsafe { (*frames)[i] };
        if ranges.iter().any(|r| addr >= r.start && addr < r.end) {
            return Some(true);
        }
    }
    Some(false)
}

/// A sight of thread `tid` of dying process `owner`, running now (`ctx`'s current task):
/// remembered while inside the driver; the first one outside after that is recorded.
pub fn sighted<C: EbpfContext>(ctx: &C, owner: u32, tid: u32, stack_id: i32) {
    let Some(inside) = in_driver(ctx) else {
        return;
    };
    let now = now_ns();
    if inside {
        if IN_DRIVER.insert(tid, now, 0).is_err() {
            count_loss(Loss::Dying);
        }
        return;
    }
    // SAFETY: the value is copied out before the entry is removed.
    let Some(last_in) = (unsafe { IN_DRIVER.get(tid) }).copied() else {
        return;
    };
    let _ = IN_DRIVER.remove(tid);
    emit::<TeardownSample>(|e| {
        e.kind = SampleKind::LeftDriver as u32;
        e.stack_id = stack_id;
        e.owner = owner;
        e.tid = tid;
        e.blocked_ns = now.wrapping_sub(last_in);
    });
}

/// Thread `tid` runs again: if it went to sleep inside the driver, it is inside it now.
pub fn resumed(tid: u32) {
    if let Some(at) = IN_DRIVER.get_ptr_mut(tid) {
        // SAFETY: a valid map value; a plain store.
        unsafe { *at = now_ns() };
    }
}

/// Thread `tid`'s final switch: it is seen no more.
pub fn forget(tid: u32) {
    let _ = IN_DRIVER.remove(tid);
}
