//! Opens and ioctls of /dev/nvidia* answered by the driver's own functions, where kprobes are
//! allowed: they run for GPU work only, so no process pays for them in its other system calls.
//! User space sets [`DRIVER_ANSWERS`] when it attached these instead of the system call
//! tracepoints; until then the programs only time the calls.

use aya_ebpf::{
    macros::{kprobe, kretprobe, map},
    maps::{Array, LruHashMap},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    driver::{ioc_type, NVIDIA_MAJOR, NV_IOCTL_MAGIC},
    DriverFunc, FdOp, GpuFd, GpuIoctl, Loss, HOOK_KPROBE,
};

use crate::{
    driver_hooks::{exit, file_entry, pending},
    emit::{count_loss, current_ids, emit},
    files::is_self,
    holders::add_holder,
    ioctl::decode_rm,
    task::file_refcount,
};

/// Slot 0 is 1 once user space relies on these hooks for opens and ioctls.
#[map]
pub static DRIVER_ANSWERS: Array<u32> = Array::with_max_entries(1, 0);

/// The command and argument of GPU ioctls under way, by thread: the return probe sees neither.
#[map]
static IOCTL_ARGS: LruHashMap<u32, [u64; 2]> = LruHashMap::with_max_entries(8192, 0);

fn answers() -> bool {
    DRIVER_ANSWERS.get(0).is_some_and(|v| *v == 1)
}

fn open_entry(func: DriverFunc, ctx: &ProbeContext) {
    file_entry(func, ctx.arg::<u64>(1).unwrap_or(0), 0);
}

/// A successful open makes the caller a holder of the file; its descriptor number is not
/// installed yet (-1: the next walk of its table gives it).
fn open_exit(func: DriverFunc, ctx: &RetProbeContext) {
    let (tgid, tid) = current_ids();
    let call = pending(tid, func);
    let ret = ctx.ret::<i32>();
    exit(func, HOOK_KPROBE, ret as i64, true);
    let Some(call) = call.filter(|c| c.file != 0) else {
        return;
    };
    if ret != 0 || !answers() || is_self(tgid) {
        return;
    }
    add_holder(tgid);
    emit::<GpuFd>(|e| {
        e.op = FdOp::Open as u32;
        e.fd = -1;
        e.dev = call.dev;
        e.file = call.file;
        e.refcount = file_refcount(call.file);
    });
}

/// `nvidia_open(struct inode *, struct file *)`.
#[kprobe]
pub fn nvidia_open_kprobe(ctx: ProbeContext) -> u32 {
    open_entry(DriverFunc::NvidiaOpen, &ctx);
    0
}

#[kretprobe]
pub fn nvidia_open_kretprobe(ctx: RetProbeContext) -> u32 {
    open_exit(DriverFunc::NvidiaOpen, &ctx);
    0
}

/// `uvm_open_entry(struct inode *, struct file *)`.
#[kprobe]
pub fn uvm_open_entry_kprobe(ctx: ProbeContext) -> u32 {
    open_entry(DriverFunc::UvmOpenEntry, &ctx);
    0
}

#[kretprobe]
pub fn uvm_open_entry_kretprobe(ctx: RetProbeContext) -> u32 {
    open_exit(DriverFunc::UvmOpenEntry, &ctx);
    0
}

/// `nvidia_unlocked_ioctl(struct file *, unsigned int cmd, unsigned long arg)`.
#[kprobe]
pub fn nvidia_unlocked_ioctl_kprobe(ctx: ProbeContext) -> u32 {
    let file = ctx.arg::<u64>(0).unwrap_or(0);
    let cmd = ctx.arg::<u32>(1).unwrap_or(0);
    file_entry(DriverFunc::NvidiaUnlockedIoctl, file, cmd as i64);
    if answers() {
        let arg = ctx.arg::<u64>(2).unwrap_or(0);
        if IOCTL_ARGS
            .insert(current_ids().1, [cmd as u64, arg], 0)
            .is_err()
        {
            count_loss(Loss::Calls);
        }
    }
    0
}

/// The driver has written its status and new handles back by now: the ledger's record.
#[kretprobe]
pub fn nvidia_unlocked_ioctl_kretprobe(ctx: RetProbeContext) -> u32 {
    let tid = current_ids().1;
    let call = pending(tid, DriverFunc::NvidiaUnlockedIoctl);
    let ret = ctx.ret::<i64>();
    exit(DriverFunc::NvidiaUnlockedIoctl, HOOK_KPROBE, ret, true);
    // SAFETY: the value is copied out at once.
    let Some([cmd, arg]) = (unsafe { IOCTL_ARGS.get(tid) }).copied() else {
        return 0;
    };
    let _ = IOCTL_ARGS.remove(tid);
    let Some(call) = call else {
        return 0;
    };
    let cmd = cmd as u32;
    emit::<GpuIoctl>(|e| {
        e.fd = -1;
        e.cmd = cmd;
        e.dev = call.dev;
        e.ret = ret as i32;
        e.file = call.file;
        if call.dev >> 20 == NVIDIA_MAJOR && ioc_type(cmd) == NV_IOCTL_MAGIC {
            decode_rm(e, cmd, arg);
        }
    });
    0
}
