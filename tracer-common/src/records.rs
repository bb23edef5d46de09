//! One fixed header plus one `#[repr(C)]` payload per record kind.
//!
//! Clock: every `ts_ns` is `CLOCK_BOOTTIME` (`bpf_ktime_get_boot_ns`), which keeps counting across
//! suspend and matches `clock_gettime(CLOCK_BOOTTIME)` in user space, so kernel events and user
//! space samples (NVML, /proc) share one time line.

pub const COMM_LEN: usize = 16;

/// Stable record kind ids (never reuse a number).
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    SignalGenerate = 1,
    SignalDeliver = 2,
    ProcessFork = 3,
    ProcessExec = 4,
    TaskExit = 5,
    Reap = 6,
    GpuFd = 7,
    GpuCloseRange = 8,
    GpuIoctl = 9,
    TeardownSample = 10,
    KthreadWakeup = 11,
    DriverCall = 13,
    OomVictim = 14,
    /// Emitted only by the benchmark program to measure ring buffer throughput.
    BenchTick = 100,
}

impl Kind {
    pub fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => Self::SignalGenerate,
            2 => Self::SignalDeliver,
            3 => Self::ProcessFork,
            4 => Self::ProcessExec,
            5 => Self::TaskExit,
            6 => Self::Reap,
            7 => Self::GpuFd,
            8 => Self::GpuCloseRange,
            9 => Self::GpuIoctl,
            10 => Self::TeardownSample,
            11 => Self::KthreadWakeup,
            13 => Self::DriverCall,
            14 => Self::OomVictim,
            100 => Self::BenchTick,
            _ => return None,
        })
    }
}

/// Precedes every payload. `pid`/`tid` are the task running when the event fired (`current`):
/// `pid` is the thread-group id (what user space calls the PID), `tid` the thread id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Header {
    pub kind: u16,
    /// Size of header plus payload in bytes.
    pub size: u16,
    pub cpu: u32,
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
}

/// `signal_generate`: `current` sends `sig` to `target_pid`/`target_tid`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SignalGenerate {
    pub sig: u32,
    /// `si_code`: <= 0 from user space (SI_USER, SI_TKILL, ...), 0x80 SI_KERNEL, > 0 a fault code.
    pub code: i32,
    /// TRACE_SIGNAL_*: 0 delivered, 1 ignored, 2 already pending, 3 overflow, 4 lose info.
    pub result: i32,
    /// Non-zero when sent to the whole thread group.
    pub group: u32,
    pub target_pid: u32,
    pub target_tid: u32,
    /// `signal->nr_threads` of the target when the signal was generated.
    pub target_threads: u32,
    pub _pad: u32,
    /// Group leader comm of the sender and of the target.
    pub sender_comm: [u8; COMM_LEN],
    pub target_comm: [u8; COMM_LEN],
}

/// `signal_deliver`: the thread in the header dequeued `sig`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SignalDeliver {
    pub sig: u32,
    pub code: i32,
    /// `sa_handler`: 0 SIG_DFL, 1 SIG_IGN, otherwise a user handler address.
    pub handler: u64,
    pub sa_flags: u64,
}

/// `sched_process_fork` of a new process (thread creation is not recorded).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessFork {
    pub child_pid: u32,
    /// [`FORK_FILES_SHARED`]: the child shares the parent's fd table (CLONE_FILES) instead of
    /// a copy.
    pub flags: u32,
    pub comm: [u8; COMM_LEN],
}

pub const FORK_FILES_SHARED: u32 = 1;

/// `sched_process_exec`: the process in the header now runs a new image.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessExec {
    pub comm: [u8; COMM_LEN],
}

/// `sched_process_exit` of the thread in the header.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TaskExit {
    /// `task->exit_code`: the killing signal in the low 7 bits, or the exit status << 8.
    pub exit_code: u32,
    /// Non-zero when this is the last thread of the group.
    pub group_dead: u32,
    pub comm: [u8; COMM_LEN],
}

/// How a dead process stopped existing.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReapHow {
    /// `wait4` in the header's process returned the pid.
    Wait = 1,
    /// The kernel freed the group leader's task (reaped by someone we did not see, or auto-reaped);
    /// this fires an RCU grace period after the real reap, so it is an upper bound.
    Freed = 2,
}

/// A dead process was reaped.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Reap {
    pub reaped_pid: u32,
    pub how: u32,
    /// Comm of the reaper (the header's process) for `Wait`.
    pub comm: [u8; COMM_LEN],
}

/// What happened to a descriptor of a GPU file.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdOp {
    /// open/openat/openat2 returned `fd`.
    Open = 1,
    /// dup/dup2/dup3/fcntl(F_DUPFD*) returned `fd`.
    Dup = 2,
    /// close(fd) was called (the record is written before the close happens).
    Close = 3,
    /// Still in the table when the group died (one record per descriptor).
    HeldAtExit = 4,
    /// Still in the table after exec dropped the close-on-exec ones.
    HeldAtExec = 5,
}

impl FdOp {
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Open,
            2 => Self::Dup,
            3 => Self::Close,
            4 => Self::HeldAtExit,
            5 => Self::HeldAtExec,
            _ => return None,
        })
    }
}

/// Flag bit of [`GpuFd::flags`]: the descriptor is close-on-exec.
pub const FD_CLOEXEC: u32 = 1;
/// Flag bit of [`GpuFd::flags`]: the walk stopped at its limit; later descriptors were not seen.
pub const FD_WALK_TRUNCATED: u32 = 2;

/// A descriptor of a GPU file in the header's process.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GpuFd {
    pub op: u32,
    /// -1 without [`FD_WALK_TRUNCATED`]: an open seen by the driver's open hook, which runs
    /// before the descriptor is installed (its number comes with the next walk).
    pub fd: i32,
    /// The device number (`i_rdev`, kernel encoding: major << 20 | minor).
    pub dev: u32,
    pub flags: u32,
    /// Kernel address of the `struct file`: the identity shared by every holder of this open.
    pub file: u64,
    /// References to the file (descriptors in all tables, plus mmaps and in-flight uses).
    pub refcount: u64,
}

/// `close_range(first, last, flags)` by a GPU holder.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GpuCloseRange {
    pub first: u32,
    pub last: u32,
    pub flags: u32,
    pub _pad: u32,
}

/// One ioctl on a GPU file, written when it returns. Fields after `file` are decoded from the
/// driver's fixed-size parameter struct for the escapes that carry them, zero otherwise.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GpuIoctl {
    pub fd: i32,
    /// The command as issued (for IOCTL_XFER_CMD: the inner command).
    pub cmd: u32,
    pub dev: u32,
    /// The syscall's return value (the driver's own status is `status`).
    pub ret: i32,
    pub duration_ns: u64,
    pub file: u64,
    /// hRoot / hClient.
    pub h_root: u32,
    pub h_parent: u32,
    /// The new, freed, mapped or shared object.
    pub h_object: u32,
    /// The class of a new object; for RM_DUP_OBJECT the duplicated object (hObjectSrc).
    pub h_class: u32,
    /// NV_STATUS written back by the driver (0 = NV_OK, 0x51 = NV_ERR_NO_MEMORY).
    pub status: u32,
    /// RM_CONTROL's command; for RM_DUP_OBJECT the source client (hClientSrc).
    pub ctrl_cmd: u32,
    /// Bytes: NV_MEMORY_ALLOCATION_PARAMS.size for memory classes, limit + 1 for
    /// RM_ALLOC_MEMORY, the length for RM_MAP_MEMORY.
    pub size: u64,
}

/// What a [`TeardownSample`] saw.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleKind {
    /// The thread was on a CPU (perf cpu-clock sample).
    OnCpu = 1,
    /// The thread went to sleep (switched out not runnable); `stack_id` is where.
    BlockStart = 2,
    /// The thread ran again after `blocked_ns` asleep at `stack_id`.
    BlockEnd = 3,
}

impl SampleKind {
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::OnCpu,
            2 => Self::BlockStart,
            3 => Self::BlockEnd,
            _ => return None,
        })
    }
}

/// A kernel stack of a thread of a dying GPU process (or of a driver kthread it woke).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TeardownSample {
    pub kind: u32,
    /// Id in the STACKS map; negative when the kernel could not take the stack.
    pub stack_id: i32,
    /// The dying process this time belongs to.
    pub owner: u32,
    /// The thread sampled (for BlockEnd not the running task of the header).
    pub tid: u32,
    pub blocked_ns: u64,
}

/// The dying process woke a driver kthread (deferred close or release work).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KthreadWakeup {
    pub kthread_tid: u32,
    pub owner: u32,
    pub comm: [u8; COMM_LEN],
}

/// Kernel functions on the release path of a GPU file, timed by the driver hooks. Stable ids.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverFunc {
    /// `__fput(struct file *)` of a GPU file: the whole release, driver included.
    Fput = 1,
    /// `nvidia_close(struct inode *, struct file *)`: the driver's release of /dev/nvidia*.
    NvidiaClose = 2,
    /// `rm_cleanup_file_private(sp, nv, nvfp)`: the RM frees the file's clients (and memory).
    RmCleanupFilePrivate = 3,
    /// `uvm_release_entry(struct inode *, struct file *)`: release of /dev/nvidia-uvm.
    UvmReleaseEntry = 4,
    /// `nvidia_close_deferred(void *nvlfp)`: a close the driver handed to its kthread.
    NvidiaCloseDeferred = 5,
    /// `nvidia_unlocked_ioctl(struct file *, cmd, arg)`.
    NvidiaUnlockedIoctl = 6,
    /// `nvidia_open(struct inode *, struct file *)`: an open of /dev/nvidia*.
    NvidiaOpen = 7,
    /// `uvm_open_entry(struct inode *, struct file *)`: an open of /dev/nvidia-uvm.
    UvmOpenEntry = 8,
}

impl DriverFunc {
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Fput,
            2 => Self::NvidiaClose,
            3 => Self::RmCleanupFilePrivate,
            4 => Self::UvmReleaseEntry,
            5 => Self::NvidiaCloseDeferred,
            6 => Self::NvidiaUnlockedIoctl,
            7 => Self::NvidiaOpen,
            8 => Self::UvmOpenEntry,
            _ => return None,
        })
    }
}

/// [`DriverCall::phase`].
pub const CALL_ENTRY: u16 = 1;
pub const CALL_EXIT: u16 = 2;

/// [`DriverCall::hook`]: which kind of program saw the call.
pub const HOOK_FENTRY: u16 = 1;
pub const HOOK_KPROBE: u16 = 2;

/// Entry to or exit from a [`DriverFunc`], on the thread in the header.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DriverCall {
    pub func: u32,
    pub phase: u16,
    pub hook: u16,
    /// Kernel address of the `struct file` (as in [`GpuFd::file`]); for functions without a
    /// file argument, that of the enclosing close on this thread; 0 when unknown.
    pub file: u64,
    /// `i_rdev` of that file (kernel encoding), 0 when unknown.
    pub dev: u32,
    pub _pad: u32,
    /// Entry of `nvidia_unlocked_ioctl`: the command. Exit of a function returning int/long:
    /// its return value, sign-extended. Otherwise 0.
    pub value: i64,
    /// Exit: nanoseconds since the matching entry on this thread; 0 when the entry was not
    /// seen (the call began before the hooks were attached).
    pub duration_ns: u64,
}

/// The kernel's OOM killer chose `pid` (tracepoint oom/mark_victim); its SIGKILL follows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OomVictim {
    pub pid: u32,
    pub _pad: u32,
}

/// Slots of the per-CPU loss counter map: slot 0 counts records that did not fit in the ring
/// buffer, the others map inserts that failed because the map was full (what was then not
/// followed). Stable numbers.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    Ring = 0,
    /// A signalled process or a dead GPU holder: its threads' exits and its reap.
    Tracked = 1,
    /// A GPU holder: its ioctls, closes and exit walk.
    Holders = 2,
    /// A dying GPU process: its stack samples.
    Dying = 3,
    /// A sleeping thread of a dying process: the sleep's length.
    Blocked = 4,
    /// A driver kthread woken by a dying process: its samples.
    Helpers = 5,
    /// A kernel stack that did not fit in the stack map.
    Stacks = 6,
}

impl Loss {
    pub const COUNT: u32 = 7;

    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Ring,
            1 => Self::Tracked,
            2 => Self::Holders,
            3 => Self::Dying,
            4 => Self::Blocked,
            5 => Self::Helpers,
            6 => Self::Stacks,
            _ => return None,
        })
    }
}

/// Filler record of a typical size, written only by the benchmark program.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BenchTick {
    pub seq: u64,
    pub _pad: [u64; 3],
}

/// A header and its payload, laid out exactly as in the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Record<T> {
    pub header: Header,
    pub payload: T,
}

/// Payload types and their kind ids.
pub trait Payload: Copy + 'static {
    const KIND: Kind;
    /// Whether writing one wakes the collector at once. Bulk records (ioctls, samples, forks)
    /// do not: the collector drains them on its next tick, which keeps a wakeup and a context
    /// switch off every traced ioctl.
    const WAKE: bool;
}

macro_rules! payloads {
    ($wake:literal: $($t:ident),*) => {
        $(impl Payload for $t { const KIND: Kind = Kind::$t; const WAKE: bool = $wake; })*
    };
}
payloads!(
    true: SignalGenerate,
    SignalDeliver,
    TaskExit,
    Reap,
    KthreadWakeup,
    OomVictim,
    BenchTick
);
payloads!(
    false: ProcessFork,
    ProcessExec,
    GpuFd,
    GpuCloseRange,
    GpuIoctl,
    TeardownSample,
    DriverCall
);

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: plain-old-data structs of integers and byte arrays, no padding holes that
    // carry meaning; the kernel side writes them in full.
    unsafe impl aya::Pod for Header {}
}
