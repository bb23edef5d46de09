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
    pub _pad: u32,
    pub comm: [u8; COMM_LEN],
}

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
}

macro_rules! payloads {
    ($($t:ident),*) => { $(impl Payload for $t { const KIND: Kind = Kind::$t; })* };
}
payloads!(
    SignalGenerate,
    SignalDeliver,
    ProcessFork,
    ProcessExec,
    TaskExit,
    Reap,
    BenchTick
);

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: plain-old-data structs of integers and byte arrays, no padding holes that
    // carry meaning; the kernel side writes them in full.
    unsafe impl aya::Pod for Header {}
}
