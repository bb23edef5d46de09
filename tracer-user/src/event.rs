//! The event stream every source produces and the analysis consumes.

use serde::{Deserialize, Serialize};

/// What happened to a GPU file descriptor (see `tracer_common::FdOp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FdOp {
    Open,
    Dup,
    Close,
    HeldAtExit,
    HeldAtExec,
}

impl From<tracer_common::FdOp> for FdOp {
    fn from(op: tracer_common::FdOp) -> Self {
        use tracer_common::FdOp as K;
        match op {
            K::Open => Self::Open,
            K::Dup => Self::Dup,
            K::Close => Self::Close,
            K::HeldAtExit => Self::HeldAtExit,
            K::HeldAtExec => Self::HeldAtExec,
        }
    }
}

/// One event: a kernel record, or something the collector itself observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// CLOCK_BOOTTIME nanoseconds.
    pub ts_ns: u64,
    pub cpu: u32,
    /// Thread group (process) id of the task that was running.
    pub pid: u32,
    pub tid: u32,
    pub data: EventData,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventData {
    SignalGenerate {
        sig: u32,
        code: i32,
        result: i32,
        group: bool,
        target_pid: u32,
        target_tid: u32,
        target_threads: u32,
        sender_comm: String,
        target_comm: String,
    },
    SignalDeliver {
        sig: u32,
        code: i32,
        handler: u64,
        sa_flags: u64,
    },
    Fork {
        child_pid: u32,
        /// The child shares the parent's fd table (CLONE_FILES) rather than a copy.
        files_shared: bool,
        comm: String,
    },
    Exec {
        comm: String,
    },
    TaskExit {
        exit_code: u32,
        group_dead: bool,
        comm: String,
    },
    Reap {
        reaped_pid: u32,
        /// The reaper waited for it (`true`), or the kernel freed it and the reaper is unknown.
        by_wait: bool,
        comm: String,
    },
    /// A descriptor of a GPU file in the event's process.
    GpuFd {
        op: FdOp,
        fd: i32,
        /// Kernel dev_t (major << 20 | minor).
        dev: u32,
        cloexec: bool,
        /// A walk marker: descriptors past the walk's limit were not listed.
        truncated: bool,
        /// Kernel address of the open file: the identity its holders share.
        file: u64,
        refcount: u64,
    },
    GpuCloseRange {
        first: u32,
        last: u32,
        flags: u32,
    },
    /// An ioctl on a GPU file, with the driver's parameters decoded where known.
    GpuIoctl {
        fd: i32,
        cmd: u32,
        dev: u32,
        ret: i32,
        duration_ns: u64,
        file: u64,
        h_root: u32,
        h_parent: u32,
        h_object: u32,
        h_class: u32,
        status: u32,
        ctrl_cmd: u32,
        size: u64,
    },
    BenchTick,
    /// Which char devices are GPU files (written once at start).
    GpuDevices {
        majors: Vec<u32>,
        devs: Vec<u32>,
    },
    /// A GPU file descriptor held when tracing began. Descriptors of the same open file share
    /// `group` (found with kcmp); the kernel address is learnt from later kernel records.
    SnapshotFd {
        holder: u32,
        fd: i32,
        dev: u32,
        cloexec: bool,
        group: u64,
    },
    /// What /proc said about a process while it was alive.
    ProcInfo(ProcInfo),
    /// One NVML reading of every GPU.
    Nvml {
        gpus: Vec<NvmlGpu>,
    },
    /// The kernel dropped this many records because the ring buffer was full.
    Loss {
        count: u64,
    },
    /// The collector's clock advanced: lets time-based decisions replay exactly.
    Tick,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    pub cmdline: String,
    /// The cgroup v2 path (or the first hierarchy's), which names the container.
    pub cgroup: String,
    /// The pid in the process's own pid namespace, when it differs.
    pub ns_pid: Option<u32>,
    /// Start time in clock ticks after boot (/proc/PID/stat field 22).
    pub start_ticks: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlGpu {
    pub index: u32,
    pub used: u64,
    pub total: u64,
    /// Compute and graphics processes with their memory, as NVML reports them (host pids).
    pub processes: Vec<NvmlProcess>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlProcess {
    pub pid: u32,
    /// None when NVML cannot tell (some modes hide per-process usage).
    pub used: Option<u64>,
}
