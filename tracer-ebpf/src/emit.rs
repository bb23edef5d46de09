//! The ring buffer, the drop counter and the tracked-process set shared by all programs.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_boot_ns},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use tracer_common::{Header, Loss, Payload, Record};

/// `bpf_ringbuf_submit` flag: do not notify the consumer.
const BPF_RB_NO_WAKEUP: u64 = 1;
/// `bpf_ringbuf_submit` flag: notify the consumer even if it has unread records.
const BPF_RB_FORCE_WAKEUP: u64 = 2;

/// Resized by user space before load (`--ring-size`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

/// What the programs could not record, per CPU, by [`Loss`] slot: records that did not fit in
/// `EVENTS`, and map inserts that failed because a map was full.
#[map]
pub static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Loss::COUNT as u32, 0);

/// Thread groups that received a fatal signal, and GPU holders whose group died, until they are
/// reaped: their thread exits, signal deliveries, SIGCHLD to the parent and reap are recorded.
/// Value: unused.
#[map]
pub static TRACKED: HashMap<u32, u8> = HashMap::with_max_entries(16384, 0);

/// Set by user space once every program is attached. They attach one after another, so until
/// then a kill could be seen by signal generation and miss its delivery, exit and reap: no
/// death is followed before this, and none is then seen in part. Value: 0 or 1.
#[map]
static ARMED: Array<u32> = Array::with_max_entries(1, 0);

pub fn armed() -> bool {
    ARMED.get(0).is_some_and(|v| *v != 0)
}

pub fn is_tracked(tgid: u32) -> bool {
    // SAFETY: the value is a plain byte we never hold a reference to beyond this call.
    unsafe { TRACKED.get(tgid).is_some() }
}

/// Follows `tgid`'s thread exits, SIGCHLD and reap from now on; false (and counted) when the
/// map is full.
pub fn track(tgid: u32) -> bool {
    let ok = TRACKED.insert(tgid, 0, 0).is_ok();
    if !ok {
        count_loss(Loss::Tracked);
    }
    ok
}

/// CLOCK_BOOTTIME, the clock of every record.
pub fn now_ns() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_boot_ns() }
}

pub fn current_ids() -> (u32, u32) {
    let id = bpf_get_current_pid_tgid();
    ((id >> 32) as u32, id as u32)
}

/// Reserves a record, fills the header, lets `fill` write the payload and submits it. A full
/// ring buffer counts a drop instead.
#[inline(always)]
pub fn emit<T: Payload>(fill: impl FnOnce(&mut T)) {
    emit_waking::<T>(T::WAKE, fill)
}

/// [`emit`], choosing whether to wake the collector.
#[inline(always)]
pub fn emit_waking<T: Payload>(wake: bool, fill: impl FnOnce(&mut T)) {
    emit_full::<T>(wake, None, fill)
}

/// [`emit`] stamped `ts_ns`: a call's entry and exit records carry exactly the times its
/// duration is computed from.
#[inline(always)]
pub fn emit_at<T: Payload>(ts_ns: u64, fill: impl FnOnce(&mut T)) {
    emit_full::<T>(T::WAKE, Some(ts_ns), fill)
}

#[inline(always)]
fn emit_full<T: Payload>(wake: bool, ts_ns: Option<u64>, fill: impl FnOnce(&mut T)) {
    let Some(mut entry) = EVENTS.reserve::<Record<T>>(0) else {
        count_loss(Loss::Ring);
        return;
    };
    let (pid, tid) = current_ids();
    // SAFETY: the reservation is exactly size_of::<Record<T>>() bytes; every field of the header
    // is written, and `fill` writes every payload field after we zero it.
    unsafe {
        let rec = entry.as_mut_ptr();
        zero(rec as *mut u64, core::mem::size_of::<Record<T>>() / 8);
        (*rec).header = Header {
            kind: T::KIND as u16,
            size: core::mem::size_of::<Record<T>>() as u16,
            cpu: bpf_get_smp_processor_id(),
            ts_ns: ts_ns.unwrap_or_else(now_ns),
            pid,
            tid,
        };
        fill(&mut (*rec).payload);
    }
    entry.submit(submit_flags(wake));
}

/// Set by a quiet record, cleared by the next waking one.
#[map]
static QUIET_PENDING: Array<u32> = Array::with_max_entries(1, 0);

/// The kernel's default wakes the reader only if it had read everything before the record, so
/// quiet records pending would silence a waking one: then (only then) force the wakeup, which
/// costs an interrupt; otherwise let the kernel batch wakeups.
#[inline(always)]
fn submit_flags(wake: bool) -> u64 {
    let Some(pending) = QUIET_PENDING.get_ptr_mut(0) else {
        return if wake {
            BPF_RB_FORCE_WAKEUP
        } else {
            BPF_RB_NO_WAKEUP
        };
    };
    // SAFETY: a valid map value; racing CPUs can only cost one extra or one missed forced
    // wakeup, and the collector drains on its tick anyway.
    unsafe {
        if !wake {
            if *pending == 0 {
                *pending = 1;
            }
            return BPF_RB_NO_WAKEUP;
        }
        if *pending != 0 {
            *pending = 0;
            return BPF_RB_FORCE_WAKEUP;
        }
    }
    0
}

/// Counts one thing the programs could not record.
pub fn count_loss(what: Loss) {
    if let Some(n) = DROPS.get_ptr_mut(what as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while we run.
        unsafe { *n += 1 };
    }
}

/// Zeroes `words` u64s. `write_bytes` becomes a byte-at-a-time memset subprogram that older
/// verifiers (6.1) walk byte by byte, once per record of a loop, past their 1M-instruction
/// budget; volatile word stores stay a handful of instructions. Records are 8-byte multiples
/// (the header holds a u64).
#[inline(always)]
unsafe fn zero(p: *mut u64, words: usize) {
    for i in 0..words {
        // SAFETY: the caller passes a reservation of at least `words` u64s.
        unsafe { core::ptr::write_volatile(p.add(i), 0) };
    }
}
