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
    HeldAtSearch,
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
            K::HeldAtSearch => Self::HeldAtSearch,
        }
    }
}

/// What a teardown sample saw (see `tracer_common::SampleKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleKind {
    OnCpu,
    BlockStart,
    BlockEnd,
    /// The thread's final switch: its exit is over.
    Exited,
    /// The thread seen outside the NVIDIA driver after it was last seen inside it
    /// `blocked_ns` earlier: its driver work ended in between.
    LeftDriver,
}

impl From<tracer_common::SampleKind> for SampleKind {
    fn from(k: tracer_common::SampleKind) -> Self {
        use tracer_common::SampleKind as K;
        match k {
            K::OnCpu => Self::OnCpu,
            K::BlockStart => Self::BlockStart,
            K::BlockEnd => Self::BlockEnd,
            K::Exited => Self::Exited,
            K::LeftDriver => Self::LeftDriver,
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

impl Event {
    /// An event of linger's own (a tick, an NVML reading, what /proc said): no task ran it.
    pub fn collector(ts_ns: u64, data: EventData) -> Self {
        Self {
            ts_ns,
            cpu: 0,
            pid: 0,
            tid: 0,
            data,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventData {
    SignalGenerate {
        sig: u32,
        code: i32,
        result: i32,
        group: bool,
        /// The target's whole group had begun its exit: a signal to a dying or dead process
        /// (false in recordings made before the kernel side said so).
        #[serde(default)]
        target_exiting: bool,
        target_pid: u32,
        target_tid: u32,
        target_threads: u32,
        /// SIGCHLD: the sender's group's thread count (0: not recorded). 1: the group's
        /// own zombie notification.
        #[serde(default)]
        sender_threads: u32,
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
        /// The system call's return (a negative errno on failure), or, seen from an NVIDIA
        /// library's call, the C library's (-1 on failure).
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
    /// A kernel stack of a dying GPU process's thread, or of a driver kthread working for it.
    TeardownSample {
        sample: SampleKind,
        /// Key of a [`EventData::Stack`]; negative when the kernel took no stack.
        stack_id: i32,
        /// The dying process the time belongs to.
        owner: u32,
        tid: u32,
        /// For `block_end`: how long the thread slept.
        blocked_ns: u64,
    },
    /// The dying process woke a driver kthread ("nv_queue", "UVM deferred release queue").
    KthreadWakeup {
        kthread_tid: u32,
        owner: u32,
        comm: String,
    },
    /// A kernel stack, symbolized where it was recorded, innermost frame first.
    Stack {
        id: i32,
        frames: Vec<String>,
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
    /// A process /proc would not list the descriptors of (permission, a hardened /proc): it
    /// may hold GPU files linger does not know of until it exits.
    FdsUnreadable {
        holder: u32,
    },
    /// What /proc said about a process while it was alive.
    ProcInfo(ProcInfo),
    /// One NVML reading of every GPU.
    Nvml {
        gpus: Vec<NvmlGpu>,
    },
    /// The kernel could not record this many things since the last report: records that did
    /// not fit in the ring buffer, or map inserts that failed (`what`). Reports come every
    /// `period_ns` at most, so a report covers that much time before it.
    Loss {
        count: u64,
        #[serde(default)]
        what: LossKind,
        #[serde(default = "unrecorded_loss_period")]
        period_ns: u64,
    },
    /// The kernel's OOM killer chose `pid`; its SIGKILL follows.
    OomVictim {
        pid: u32,
    },
    /// The collector itself (written once at start): its process is never an incident.
    Collector {
        pid: u32,
        /// Its /proc is not the host's (a pod without hostPID): processes in other PID
        /// namespaces are invisible to it, and to NVML's process list.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        partial_pid_view: bool,
    },
    /// The collector's clock advanced: lets time-based decisions replay exactly.
    Tick,
    /// Entry to or exit from a function on a GPU file's release path (driver hooks).
    DriverCall {
        func: DriverFunc,
        /// The return (`false`: the entry).
        exit: bool,
        hook: HookKind,
        /// The `struct file` address, as in `GpuFd`; 0 when unknown.
        file: u64,
        /// Kernel dev_t of that file; 0 when unknown.
        dev: u32,
        /// Entry of `nvidia_unlocked_ioctl`: the command; exit of a function returning a
        /// value: that value; else 0.
        value: i64,
        /// Exit: time since the entry on this thread; 0 when the entry was not seen.
        duration_ns: u64,
    },
    /// How driver teardown is watched (written once at start).
    Strategy(Strategy),
    /// The NVIDIA driver reported a GPU error (an Xid) on the device at PCI address `pci`.
    /// `message` is the driver's text after the number ("pid=1234, name=python3, channel
    /// ..."); the event's own pid is whoever ran the report, not the process it names.
    GpuXid {
        xid: u32,
        pci: String,
        message: String,
        /// The message was longer than what was kept.
        truncated: bool,
        source: XidSource,
    },
    /// The GPUs NVML lists (written once at start): Xids name a PCI address, incidents and
    /// metrics an index and UUID.
    Gpus {
        gpus: Vec<GpuInfo>,
    },
    /// A GPU holder's thread (the event's pid and tid) has slept uninterruptibly since
    /// `since_ns` with the NVIDIA driver on its kernel stack (`frames`, innermost first,
    /// named where it was recorded), for at least the collector's threshold.
    Stuck {
        since_ns: u64,
        comm: String,
        frames: Vec<String>,
        /// The sleep began before tracing did: `since_ns` is when the collector found it, and
        /// the frames are /proc's.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        before_start: bool,
    },
    /// That thread, stuck since `since_ns`, ran again or is gone.
    StuckCleared {
        since_ns: u64,
    },
}

/// Where a GPU error was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum XidSource {
    /// The driver's tracepoint nvidia/nvidia_dev_xid.
    Tracepoint,
    /// The kernel log (`NVRM: Xid ...` lines in /dev/kmsg), where the tracepoint is missing.
    Kmsg,
}

/// One GPU as NVML names it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    /// NVML's bus id ("00000000:3B:00.0").
    pub pci_bus_id: String,
    /// The minor number of its device file (`/dev/nvidiaN`); absent in traces recorded
    /// before linger read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
}

/// The loss period of recordings made before the loss event carried it: the collector read
/// the kernel's counters once a second.
pub const UNRECORDED_LOSS_PERIOD_NS: u64 = 1_000_000_000;

fn unrecorded_loss_period() -> u64 {
    UNRECORDED_LOSS_PERIOD_NS
}

/// What the kernel side lost (see `tracer_common::Loss`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum LossKind {
    /// Records that did not fit in the ring buffer.
    #[default]
    Ring,
    /// Processes to follow to their exit and reap (tracked-process map full).
    Tracked,
    /// GPU holders (holder map full): their ioctls, closes and exit walk.
    Holders,
    /// Dying GPU processes (their stack samples).
    Dying,
    /// Sleeps of dying processes' threads, and uninterruptible sleeps of GPU holders'.
    Blocked,
    /// Driver kthreads working for a dying process.
    Helpers,
    /// Kernel stacks (stack map full).
    Stacks,
    /// Walks of descriptor tables larger than `tracer_common::FD_WALK_MAX`: GPU files above it
    /// were not listed.
    FdWalk,
    /// Driver and library calls under way: not decoded or not timed at their return.
    Calls,
    /// The kernel stacks of GPU holders' uninterruptible sleeps (the stuck watch's map full):
    /// a stuck thread is still reported, its stack read from /proc or said lost.
    AsleepStacks,
    /// GPU holders' uninterruptible sleeps not recorded: those threads are not watched for
    /// being stuck.
    Asleep,
}

impl LossKind {
    /// Whether records lost this way may have named a holder of GPU files or a close of one
    /// (the teardown sampler's losses only thin its phases).
    pub fn hides_holders(self) -> bool {
        matches!(
            self,
            Self::Ring | Self::Tracked | Self::Holders | Self::FdWalk
        )
    }

    /// The name in JSON (`fd_walk`).
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default()
    }
}

impl From<tracer_common::Loss> for LossKind {
    fn from(l: tracer_common::Loss) -> Self {
        use tracer_common::Loss as K;
        match l {
            K::Ring => Self::Ring,
            K::Tracked => Self::Tracked,
            K::Holders => Self::Holders,
            K::Dying => Self::Dying,
            K::Blocked => Self::Blocked,
            K::Helpers => Self::Helpers,
            K::Stacks => Self::Stacks,
            K::FdWalk => Self::FdWalk,
            K::Calls => Self::Calls,
            K::AsleepStacks => Self::AsleepStacks,
            K::Asleep => Self::Asleep,
        }
    }
}

/// A function on a GPU file's release path (see `tracer_common::DriverFunc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverFunc {
    Fput,
    NvidiaClose,
    RmCleanupFilePrivate,
    UvmReleaseEntry,
    NvidiaCloseDeferred,
    NvidiaUnlockedIoctl,
    NvidiaOpen,
    UvmOpenEntry,
}

impl DriverFunc {
    /// The kernel symbol.
    pub fn symbol(self) -> &'static str {
        match self {
            Self::Fput => "__fput",
            Self::NvidiaClose => "nvidia_close",
            Self::RmCleanupFilePrivate => "rm_cleanup_file_private",
            Self::UvmReleaseEntry => "uvm_release_entry",
            Self::NvidiaCloseDeferred => "nvidia_close_deferred",
            Self::NvidiaUnlockedIoctl => "nvidia_unlocked_ioctl",
            Self::NvidiaOpen => "nvidia_open",
            Self::UvmOpenEntry => "uvm_open_entry",
        }
    }
}

impl From<tracer_common::DriverFunc> for DriverFunc {
    fn from(f: tracer_common::DriverFunc) -> Self {
        use tracer_common::DriverFunc as K;
        match f {
            K::Fput => Self::Fput,
            K::NvidiaClose => Self::NvidiaClose,
            K::RmCleanupFilePrivate => Self::RmCleanupFilePrivate,
            K::UvmReleaseEntry => Self::UvmReleaseEntry,
            K::NvidiaCloseDeferred => Self::NvidiaCloseDeferred,
            K::NvidiaUnlockedIoctl => Self::NvidiaUnlockedIoctl,
            K::NvidiaOpen => Self::NvidiaOpen,
            K::UvmOpenEntry => Self::UvmOpenEntry,
        }
    }
}

/// The kind of program that times a driver call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookKind {
    /// fentry/fexit (BPF trampolines).
    Fentry,
    /// kprobe/kretprobe.
    Kprobe,
}

/// Which driver hooks to use (`--driver-hooks`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DriverHooks {
    /// fentry where the kernel allows it, else kprobes, else none.
    #[default]
    Auto,
    Fentry,
    Kprobe,
    Off,
}

/// The driver hooks chosen at load time, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Strategy {
    pub requested: DriverHooks,
    /// How `__fput` of GPU files is timed; None: not at all (tracepoints and stack sampling
    /// only).
    pub fput: Option<HookKind>,
    /// NVIDIA driver functions timed by kprobes.
    pub driver_functions: Vec<String>,
    /// What was tried, in order, with the kernel's answers.
    pub reasons: Vec<String>,
    /// `--lean`: no system call tracepoint at all (no process pays for linger's syscall
    /// hooks); what cannot be seen then is in `unseen`.
    #[serde(default)]
    pub lean: bool,
    /// Opens and ioctls of GPU files come from the driver's own functions (kprobes), and no
    /// system call tracepoint is attached; what cannot be seen then is in `unseen`.
    #[serde(default)]
    pub by_driver: bool,
    /// Opens, closes and ioctls of GPU files come from uprobes on the PLT entries of these
    /// NVIDIA libraries, and no system call tracepoint is attached; what cannot be seen then
    /// is in `unseen`.
    #[serde(default)]
    pub libraries: Vec<String>,
    /// No NVIDIA driver was registered when tracing began (and no `--gpu-device` was
    /// declared): no GPU file could be opened, so no system call tracepoint was attached until
    /// the driver came (`reasons` says when).
    #[serde(default)]
    pub no_driver: bool,
    #[serde(default)]
    pub unseen: Vec<String>,
    /// Every hook the collector attached: `tp_btf/sched_process_fork`,
    /// `tracepoint/syscalls/sys_exit_openat`, ...
    #[serde(default)]
    pub hooks: Vec<String>,
    /// GPU errors come from the driver's tracepoint; otherwise from the kernel log.
    #[serde(default)]
    pub xid_tracepoint: bool,
}

/// How opens, closes and ioctls of GPU files are seen: the strategy's mode. Recorded as the
/// strategy's flags (`lean`, `by_driver`, `libraries`, `no_driver`), read back by
/// [`Strategy::mode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// System call tracepoints: the default where nothing cheaper answers.
    Syscalls,
    /// `--lean`: no system call tracepoint at all.
    Lean,
    /// The driver's own open and ioctl functions (kprobes).
    Driver,
    /// Uprobes on the PLT entries of the NVIDIA libraries.
    Libraries,
    /// No NVIDIA driver registered yet: nothing attached for GPU files until it comes.
    NoDriver,
}

impl Mode {
    /// What this mode cannot see.
    pub fn unseen(self) -> &'static [&'static str] {
        match self {
            Self::Syscalls => &[],
            Self::Lean => &LEAN_UNSEEN,
            Self::Driver => &BY_DRIVER_UNSEEN,
            Self::Libraries => &BY_LIBRARY_UNSEEN,
            Self::NoDriver => &NO_DRIVER_UNSEEN,
        }
    }

    /// Whether GPU files' opens and closes come from somewhere other than the system calls
    /// and the driver: holders are then also learnt from NVML and the descriptor walks.
    pub fn holders_from_nvml(self) -> bool {
        matches!(self, Self::Lean | Self::Libraries)
    }
}

impl Strategy {
    /// The mode its flags record (the only place they are read as one).
    pub fn mode(&self) -> Mode {
        if self.lean {
            Mode::Lean
        } else if !self.libraries.is_empty() {
            Mode::Libraries
        } else if self.no_driver {
            Mode::NoDriver
        } else if self.by_driver {
            Mode::Driver
        } else {
            Mode::Syscalls
        }
    }

    /// Records `mode` in the flags, with what it leaves unseen. The libraries of
    /// [`Mode::Libraries`] are those the library hooks pushed.
    pub fn enter(&mut self, mode: Mode) {
        self.lean = mode == Mode::Lean;
        self.by_driver = mode == Mode::Driver;
        self.no_driver = mode == Mode::NoDriver;
        self.unseen = mode.unseen().iter().map(|s| s.to_string()).collect();
    }
}

/// What every mode without the `wait4` tracepoint gives up.
pub const WAIT4_UNSEEN: &str = "wait4: the reaper is the parent the dead process's SIGCHLD went \
     to, and the reap lies between its zombie transition and the kernel freeing the task an RCU \
     grace period later";

/// What the mode without a system call tracepoint gives up where no NVIDIA driver is
/// registered: only the reap's exact time (no GPU file can exist).
pub const NO_DRIVER_UNSEEN: [&str; 1] = [WAIT4_UNSEEN];

/// What `--lean` gives up, and how the answer is still obtained.
pub const LEAN_UNSEEN: [&str; 4] = [
    "GPU ioctls: no allocation ledger, no collateral (refused allocations), imports known from NVML's figures only",
    "opens, dups and closes of GPU files: holders come from the start-up snapshot, NVML's process list (a /proc look at each new pid), forks, and the exec and exit walks of their descriptor tables",
    WAIT4_UNSEEN,
    "SIGKILLs of processes not yet known as GPU holders: timed from NVML readings started at the signal",
];

/// What the NVIDIA libraries' hooks do not see in place of the system call tracepoints.
pub const BY_LIBRARY_UNSEEN: [&str; 4] = [
    "opens, dups, closes and ioctls of GPU files made outside the NVIDIA libraries hooked: \
     a process that opens the device files itself, or loads a copy of the library linger did \
     not find (a cuda-compat libcuda outside /usr/local/cuda*/compat, or one only inside its \
     container's image), is found as --lean finds holders (NVML's process list, forks, exec \
     and exit walks), and its allocations are not in the ledger",
    "closes of GPU descriptors by the program itself (not the library): a process that closed \
     its descriptor while the file lives on elsewhere counts as holding it until its next \
     exec or exit walk",
    WAIT4_UNSEEN,
    "SIGKILLs of processes not yet known as GPU holders: timed from NVML readings started at \
     the signal",
];

/// What the driver's hooks do not see in place of the system call tracepoints.
pub const BY_DRIVER_UNSEEN: [&str; 2] = [
    "dups and closes of GPU descriptors: a process that closed its descriptor while the file \
     lives on elsewhere counts as holding it until its next exec or exit walk",
    WAIT4_UNSEEN,
];

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
    /// The pod, container or job its cgroup names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<Workload>,
}

/// Who a process ran for, from its cgroup path and the kubelet's log directories: fields the
/// node does not show are absent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// `containerd`, `cri-o` or `docker`, when the cgroup's name says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlGpu {
    pub index: u32,
    pub used: u64,
    pub total: u64,
    /// Compute and graphics processes with their memory, as NVML reports them (host pids).
    pub processes: Vec<NvmlProcess>,
    /// NVML's GPU utilization (percent of the last sample period a kernel ran), read only
    /// while the GPU has no memory in use and no process: what tells a GPU still running work
    /// nobody owns (see `analysis::unheld`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlProcess {
    pub pid: u32,
    /// None when NVML cannot tell (some modes hide per-process usage).
    pub used: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mode a strategy enters is the mode its recorded flags read back, with what it
    /// leaves unseen.
    #[test]
    fn a_mode_entered_reads_back_from_the_flags() {
        for mode in [
            Mode::Syscalls,
            Mode::Lean,
            Mode::Driver,
            Mode::Libraries,
            Mode::NoDriver,
        ] {
            let mut s = Strategy::default();
            if mode == Mode::Libraries {
                s.libraries.push("/usr/lib/libcuda.so.1".into());
            }
            s.enter(mode);
            assert_eq!(s.mode(), mode);
            assert_eq!(s.unseen.len(), mode.unseen().len());
            let json = serde_json::to_string(&s).expect("a strategy serializes");
            let back: Strategy = serde_json::from_str(&json).expect("and reads back");
            assert_eq!(back.mode(), mode, "{mode:?} did not survive a recording");
        }
    }
}
