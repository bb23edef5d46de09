//! The NVIDIA user-space libraries' own calls (libcuda, libnvidia-ml): uprobes on the entries
//! of their procedure linkage tables for ioctl, syscall, open, dup and close. Only processes
//! that load those libraries trap, so where the driver's functions cannot be hooked the
//! ledger and the opens come without a system call tracepoint taxing every other process.
//! User space finds the entries (tracer-user probe/library.rs).

use aya_ebpf::{
    macros::{map, uprobe, uretprobe},
    maps::LruHashMap,
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{FdOp, GpuFd, Loss};

use crate::{
    emit::{count_loss, current_ids, emit},
    files::{gpu_file_at, installed, is_self},
    holders::{add_holder, is_holder},
    ioctl,
};

/// `syscall(SYS_ioctl, fd, cmd, arg)`: how libnvidia-ml issues its ioctls (x86_64's number;
/// arm64 has the generic table's).
#[cfg(not(bpf_target_arch = "aarch64"))]
const SYS_IOCTL: u64 = 16;
#[cfg(bpf_target_arch = "aarch64")]
const SYS_IOCTL: u64 = 29;

#[derive(Clone, Copy)]
struct Call {
    fd: u64,
    cmd: u64,
    arg: u64,
}

/// ioctls under way, by thread: the return probe sees only the result. LRU: a call whose
/// return was missed ages out.
#[map]
static LIB_IOCTLS: LruHashMap<u32, Call> = LruHashMap::with_max_entries(4096, 0);

fn begin(fd: Option<u64>, cmd: Option<u64>, arg: Option<u64>) {
    let (tgid, tid) = current_ids();
    if is_self(tgid) {
        return;
    }
    if let (Some(fd), Some(cmd), Some(arg)) = (fd, cmd, arg) {
        if LIB_IOCTLS.insert(tid, Call { fd, cmd, arg }, 0).is_err() {
            count_loss(Loss::Calls);
        }
    }
}

/// ioctl(fd, cmd, arg) called from the library.
#[uprobe]
pub fn lib_ioctl(ctx: ProbeContext) -> u32 {
    begin(ctx.arg(0), ctx.arg(1), ctx.arg(2));
    0
}

/// syscall(nr, ...) called from the library: its ioctls only.
#[uprobe]
pub fn lib_syscall(ctx: ProbeContext) -> u32 {
    if ctx.arg::<u64>(0) == Some(SYS_IOCTL) {
        begin(ctx.arg(1), ctx.arg(2), ctx.arg(3));
    }
    0
}

/// Return of either: the driver has written its status and new handles back.
#[uretprobe]
pub fn lib_ioctl_ret(ctx: RetProbeContext) -> u32 {
    let (tgid, tid) = current_ids();
    // SAFETY: the value is copied out at once.
    let Some(call) = (unsafe { LIB_IOCTLS.get(tid) }).copied() else {
        return 0;
    };
    let _ = LIB_IOCTLS.remove(tid);
    // A GPU file whose open was not seen (before linger started, or outside the library):
    // its process is a holder all the same.
    if ioctl::record(call.fd, call.cmd, call.arg, ctx.ret::<i64>()) && !is_holder(tgid) {
        add_holder(tgid);
    }
    0
}

/// Return of open/open64/openat: a new descriptor, recorded when it is a GPU file.
#[uretprobe]
pub fn lib_open_ret(ctx: RetProbeContext) -> u32 {
    let fd: i64 = ctx.ret();
    if fd >= 0 {
        installed(FdOp::Open, fd as u32);
    }
    0
}

/// Return of dup/dup2/dup3.
#[uretprobe]
pub fn lib_dup_ret(ctx: RetProbeContext) -> u32 {
    let fd: i64 = ctx.ret();
    if fd >= 0 {
        installed(FdOp::Dup, fd as u32);
    }
    0
}

/// close(fd) called from the library, by a GPU holder, of a GPU file: recorded at the call (a
/// close releases the descriptor even when it fails).
#[uprobe]
pub fn lib_close(ctx: ProbeContext) -> u32 {
    if !is_holder(current_ids().0) {
        return 0;
    }
    let Some(fd) = ctx.arg::<u64>(0) else {
        return 0;
    };
    if fd > i32::MAX as u64 || gpu_file_at(fd as u32).is_none() {
        return 0;
    }
    emit::<GpuFd>(|e| {
        e.op = FdOp::Close as u32;
        e.fd = fd as i32;
    });
    0
}
