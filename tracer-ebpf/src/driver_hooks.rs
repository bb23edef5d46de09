//! Driver hooks, where the kernel allows them: the exact start and end of a GPU file's release.
//! `__fput` of a GPU file by fentry/fexit or kprobe/kretprobe, and the NVIDIA driver's own
//! functions by kprobe/kretprobe (aya 0.14 cannot attach fentry to module BTF). User space
//! attaches the set it chose (tracer-user probe/strategy.rs).

use aya_ebpf::{
    macros::{fentry, fexit, kprobe, kretprobe, map},
    maps::LruHashMap,
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext},
};
use tracer_common::{
    DriverCall, DriverFunc, Loss, CALL_ENTRY, CALL_EXIT, HOOK_FENTRY, HOOK_KPROBE,
};

use crate::{
    emit::{count_loss, current_ids, emit_at, now_ns},
    files::is_gpu_dev,
    task::{file_dev, file_private_data},
};

#[derive(Clone, Copy)]
pub struct Pending {
    ts: u64,
    pub file: u64,
    pub dev: u32,
}

/// Calls under way, by thread and function: a return probe sees no arguments, and a call
/// without a file argument takes the file of the close it runs in. LRU: an entry whose return
/// was missed (kretprobe instances exhausted) ages out instead of filling the map.
#[map]
static PENDING: LruHashMap<u64, Pending> = LruHashMap::with_max_entries(8192, 0);

/// The driver's per-open state (`file->private_data`) to its file, for a close the driver
/// defers to its kthread: `nvidia_close_deferred` is given only that state.
#[map]
static NV_PRIVATE: LruHashMap<u64, Pending> = LruHashMap::with_max_entries(4096, 0);

fn key(tid: u32, func: DriverFunc) -> u64 {
    (tid as u64) << 8 | func as u64
}

pub fn pending(tid: u32, func: DriverFunc) -> Option<Pending> {
    // SAFETY: the value is copied out at once.
    unsafe { PENDING.get(key(tid, func)) }.copied()
}

pub fn entry(func: DriverFunc, hook: u16, file: u64, dev: u32, value: i64) {
    let call = Pending {
        ts: now_ns(),
        file,
        dev,
    };
    if PENDING.insert(key(current_ids().1, func), call, 0).is_err() {
        count_loss(Loss::Calls);
    }
    emit_at::<DriverCall>(call.ts, |e| {
        e.func = func as u32;
        e.phase = CALL_ENTRY;
        e.hook = hook;
        e.file = file;
        e.dev = dev;
        e.value = value;
    });
}

/// `any_file`: also record an exit whose entry was not seen (driver functions, which only
/// ever run for GPU files); `__fput` exits without a GPU entry are everyone else's files.
pub fn exit(func: DriverFunc, hook: u16, value: i64, any_file: bool) {
    let tid = current_ids().1;
    let call = pending(tid, func);
    if call.is_some() {
        let _ = PENDING.remove(key(tid, func));
    } else if !any_file {
        return;
    }
    let now = now_ns();
    emit_at::<DriverCall>(now, |e| {
        e.func = func as u32;
        e.phase = CALL_EXIT;
        e.hook = hook;
        e.value = value;
        if let Some(c) = call {
            e.file = c.file;
            e.dev = c.dev;
            e.duration_ns = now.wrapping_sub(c.ts);
        }
    });
}

fn fput_entry(file: u64, hook: u16) {
    let dev = file_dev(file);
    if is_gpu_dev(dev) {
        entry(DriverFunc::Fput, hook, file, dev, 0);
    }
}

/// fentry `__fput(struct file *)`: the last reference to a file is gone.
#[fentry(function = "__fput")]
pub fn fput_fentry(ctx: FEntryContext) -> u32 {
    fput_entry(ctx.arg::<u64>(0), HOOK_FENTRY);
    0
}

#[fexit(function = "__fput")]
pub fn fput_fexit(_ctx: FExitContext) -> u32 {
    exit(DriverFunc::Fput, HOOK_FENTRY, 0, false);
    0
}

#[kprobe]
pub fn fput_kprobe(ctx: ProbeContext) -> u32 {
    fput_entry(ctx.arg::<u64>(0).unwrap_or(0), HOOK_KPROBE);
    0
}

#[kretprobe]
pub fn fput_kretprobe(_ctx: RetProbeContext) -> u32 {
    exit(DriverFunc::Fput, HOOK_KPROBE, 0, false);
    0
}

pub fn file_entry(func: DriverFunc, file: u64, value: i64) {
    entry(func, HOOK_KPROBE, file, file_dev(file), value);
}

/// `nvidia_close(struct inode *, struct file *)`.
#[kprobe]
pub fn nvidia_close_kprobe(ctx: ProbeContext) -> u32 {
    let file = ctx.arg::<u64>(1).unwrap_or(0);
    let dev = file_dev(file);
    // The driver clears private_data before it may defer the rest of the close.
    let private = file_private_data(file);
    if private != 0 {
        let call = Pending {
            ts: now_ns(),
            file,
            dev,
        };
        if NV_PRIVATE.insert(private, call, 0).is_err() {
            count_loss(Loss::Calls);
        }
    }
    entry(DriverFunc::NvidiaClose, HOOK_KPROBE, file, dev, 0);
    0
}

#[kretprobe]
pub fn nvidia_close_kretprobe(ctx: RetProbeContext) -> u32 {
    exit(
        DriverFunc::NvidiaClose,
        HOOK_KPROBE,
        ctx.ret::<i32>() as i64,
        true,
    );
    0
}

/// `nvidia_close_deferred(void *nvlfp)` on the driver's kthread.
#[kprobe]
pub fn nvidia_close_deferred_kprobe(ctx: ProbeContext) -> u32 {
    let private = ctx.arg::<u64>(0).unwrap_or(0);
    // SAFETY: the value is copied out at once.
    let (file, dev) = match unsafe { NV_PRIVATE.get(private) }.copied() {
        Some(c) => (c.file, c.dev),
        None => (0, 0),
    };
    let _ = NV_PRIVATE.remove(private);
    entry(DriverFunc::NvidiaCloseDeferred, HOOK_KPROBE, file, dev, 0);
    0
}

#[kretprobe]
pub fn nvidia_close_deferred_kretprobe(_ctx: RetProbeContext) -> u32 {
    exit(DriverFunc::NvidiaCloseDeferred, HOOK_KPROBE, 0, true);
    0
}

/// `rm_cleanup_file_private(sp, nv, nvfp)`: no file argument; it runs inside a close.
#[kprobe]
pub fn rm_cleanup_file_private_kprobe(_ctx: ProbeContext) -> u32 {
    let tid = current_ids().1;
    let (file, dev) = match pending(tid, DriverFunc::NvidiaClose)
        .or_else(|| pending(tid, DriverFunc::NvidiaCloseDeferred))
    {
        Some(c) => (c.file, c.dev),
        None => (0, 0),
    };
    entry(DriverFunc::RmCleanupFilePrivate, HOOK_KPROBE, file, dev, 0);
    0
}

#[kretprobe]
pub fn rm_cleanup_file_private_kretprobe(_ctx: RetProbeContext) -> u32 {
    exit(DriverFunc::RmCleanupFilePrivate, HOOK_KPROBE, 0, true);
    0
}

/// `uvm_release_entry(struct inode *, struct file *)`.
#[kprobe]
pub fn uvm_release_entry_kprobe(ctx: ProbeContext) -> u32 {
    file_entry(
        DriverFunc::UvmReleaseEntry,
        ctx.arg::<u64>(1).unwrap_or(0),
        0,
    );
    0
}

#[kretprobe]
pub fn uvm_release_entry_kretprobe(ctx: RetProbeContext) -> u32 {
    exit(
        DriverFunc::UvmReleaseEntry,
        HOOK_KPROBE,
        ctx.ret::<i32>() as i64,
        true,
    );
    0
}
