//! One fixed header plus one `#[repr(C)]` payload per record kind.
//!
//! Clock: every `ts_ns` is `CLOCK_BOOTTIME` (`bpf_ktime_get_boot_ns`), which keeps counting across
//! suspend and matches `clock_gettime(CLOCK_BOOTTIME)` in user space, so kernel events and user
//! space samples (NVML, /proc) share one time line.

pub const COMM_LEN: usize = 16;

wire_struct! {
    /// Precedes every payload. `pid`/`tid` are the task running when the event fired (`current`):
    /// `pid` is the thread-group id (what user space calls the PID), `tid` the thread id.
    pub struct Header {
        kind: u16 = 0,
        /// Size of header plus payload in bytes.
        size: u16 = 2,
        cpu: u32 = 4,
        ts_ns: u64 = 8,
        pid: u32 = 16,
        tid: u32 = 20,
    }
    size 24
}

wire_struct! {
    /// `signal_generate`: `current` sends `sig` to `target_pid`/`target_tid`.
    pub struct SignalGenerate {
        sig: u32 = 0,
        /// `si_code`: <= 0 from user space (SI_USER, SI_TKILL, ...), 0x80 SI_KERNEL, > 0 a fault code.
        code: i32 = 4,
        /// TRACE_SIGNAL_*: 0 delivered, 1 ignored, 2 already pending, 3 overflow, 4 lose info.
        result: i32 = 8,
        /// [`SIGNAL_TO_GROUP`], [`SIGNAL_TARGET_EXITING`]. Recordings made before the second
        /// bit hold 0 or 1.
        flags: u32 = 12,
        target_pid: u32 = 16,
        target_tid: u32 = 20,
        /// `signal->nr_threads` of the target when the signal was generated.
        target_threads: u32 = 24,
        /// SIGCHLD only: `signal->nr_threads` of the sender's group (0: not read, as in
        /// recordings made before it was). 1 when the group's last thread tells the parent
        /// the group is a zombie; more when a thread hands a zombie child of its own to a
        /// subreaper while others of its group still exit.
        sender_threads: u32 = 28,
        /// Group leader comm of the sender and of the target.
        sender_comm: [u8; COMM_LEN] = 32,
        target_comm: [u8; COMM_LEN] = 48,
    }
    size 64
}

/// Sent to the whole thread group.
pub const SIGNAL_TO_GROUP: u32 = 1;
/// Every thread of the target's group had begun its exit (`signal->live` was 0): a signal to a
/// dying or dead process, which the kernel drops unless it is dumping core.
pub const SIGNAL_TARGET_EXITING: u32 = 2;

wire_struct! {
    /// `signal_deliver`: the thread in the header dequeued `sig`.
    pub struct SignalDeliver {
        sig: u32 = 0,
        code: i32 = 4,
        /// `sa_handler`: 0 SIG_DFL, 1 SIG_IGN, otherwise a user handler address.
        handler: u64 = 8,
        sa_flags: u64 = 16,
    }
    size 24
}

wire_struct! {
    /// `sched_process_fork` of a new process (thread creation is not recorded).
    pub struct ProcessFork {
        child_pid: u32 = 0,
        /// [`FORK_FILES_SHARED`]: the child shares the parent's fd table (CLONE_FILES) instead of
        /// a copy.
        flags: u32 = 4,
        comm: [u8; COMM_LEN] = 8,
    }
    size 24
}

pub const FORK_FILES_SHARED: u32 = 1;

wire_struct! {
    /// `sched_process_exec`: the process in the header now runs a new image.
    pub struct ProcessExec {
        comm: [u8; COMM_LEN] = 0,
    }
    size 16
}

wire_struct! {
    /// `sched_process_exit` of the thread in the header.
    pub struct TaskExit {
        /// `task->exit_code`: the killing signal in the low 7 bits, or the exit status << 8.
        exit_code: u32 = 0,
        /// Non-zero when this is the last thread of the group.
        group_dead: u32 = 4,
        comm: [u8; COMM_LEN] = 8,
    }
    size 24
}

stable_ids! {
    /// How a dead process stopped existing.
    pub enum ReapHow: u32 {
        /// `wait4` or `waitid` in the header's process reported the pid's end.
        Wait = 1,
        /// The kernel freed the group leader's task (reaped by someone we did not see, or auto-reaped);
        /// this fires an RCU grace period after the real reap, so it is an upper bound.
        Freed = 2,
    }
}

wire_struct! {
    /// A dead process was reaped.
    pub struct Reap {
        reaped_pid: u32 = 0,
        how: u32 = 4,
        /// Comm of the reaper process (its group leader's) for `Wait`.
        comm: [u8; COMM_LEN] = 8,
    }
    size 24
}

stable_ids! {
    /// What happened to a descriptor of a GPU file.
    pub enum FdOp: u32 {
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
        /// In the table of a process user space asked about (a dead holder's files had
        /// references nobody known held), walked at its next context switch.
        HeldAtSearch = 6,
    }
}

/// Flag bit of [`GpuFd::flags`]: the descriptor is close-on-exec.
pub const FD_CLOEXEC: u32 = 1;
/// Flag bit of [`GpuFd::flags`]: the walk stopped at [`FD_WALK_MAX`]; later descriptors were
/// not seen.
pub const FD_WALK_TRUNCATED: u32 = 2;
/// Descriptors a walk of a table looks at (as many as `ulimit -n 65536` allows).
pub const FD_WALK_MAX: u32 = 1 << 16;

wire_struct! {
    /// A descriptor of a GPU file in the header's process.
    pub struct GpuFd {
        op: u32 = 0,
        /// -1 without [`FD_WALK_TRUNCATED`]: an open seen by the driver's open hook, which runs
        /// before the descriptor is installed (its number comes with the next walk).
        fd: i32 = 4,
        /// The device number (`i_rdev`, kernel encoding: major << 20 | minor).
        dev: u32 = 8,
        flags: u32 = 12,
        /// Kernel address of the `struct file`: the identity shared by every holder of this open.
        file: u64 = 16,
        /// References to the file (descriptors in all tables, plus mmaps and in-flight uses).
        refcount: u64 = 24,
    }
    size 32
}

wire_struct! {
    /// `close_range(first, last, flags)` by a GPU holder.
    pub struct GpuCloseRange {
        first: u32 = 0,
        last: u32 = 4,
        flags: u32 = 8,
        _pad: u32 = 12,
    }
    size 16
}

wire_struct! {
    /// One ioctl on a GPU file, written when it returns. Fields after `file` are decoded from the
    /// driver's fixed-size parameter struct for the escapes that carry them, zero otherwise.
    pub struct GpuIoctl {
        fd: i32 = 0,
        /// The command as issued (for IOCTL_XFER_CMD: the inner command).
        cmd: u32 = 4,
        dev: u32 = 8,
        /// The syscall's return value (the driver's own status is `status`).
        ret: i32 = 12,
        duration_ns: u64 = 16,
        file: u64 = 24,
        /// hRoot / hClient.
        h_root: u32 = 32,
        h_parent: u32 = 36,
        /// The new, freed, mapped or shared object.
        h_object: u32 = 40,
        /// The class of a new object; for RM_DUP_OBJECT the duplicated object (hObjectSrc).
        h_class: u32 = 44,
        /// NV_STATUS written back by the driver (0 = NV_OK, 0x51 = NV_ERR_NO_MEMORY).
        status: u32 = 48,
        /// RM_CONTROL's command; for RM_DUP_OBJECT the source client (hClientSrc).
        ctrl_cmd: u32 = 52,
        /// Bytes: NV_MEMORY_ALLOCATION_PARAMS.size for memory classes, limit + 1 for
        /// RM_ALLOC_MEMORY, the length for RM_MAP_MEMORY. For an RM_ALLOC of NV01_DEVICE_0
        /// the device instance; for a GET_ID_INFO control the gpu id above the device
        /// instance (`driver::id_info_size`).
        size: u64 = 56,
    }
    size 64
}

stable_ids! {
    /// What a [`TeardownSample`] saw.
    pub enum SampleKind: u32 {
        /// The thread was on a CPU (perf cpu-clock sample).
        OnCpu = 1,
        /// The thread went to sleep (switched out not runnable); `stack_id` is where.
        BlockStart = 2,
        /// The thread ran again after `blocked_ns` asleep at `stack_id`.
        BlockEnd = 3,
        /// The thread's final switch (do_task_dead): its exit, the release of the files it
        /// was the last to hold included, is over. No stack.
        Exited = 4,
        /// The thread was seen outside the NVIDIA driver (an on-CPU sample or a switch-out,
        /// `stack_id` where, or -1) after it was last seen inside it `blocked_ns` earlier (a
        /// sample, a switch, or running again after a sleep there): its work in the driver
        /// ended in between.
        LeftDriver = 5,
    }
}

wire_struct! {
    /// A kernel stack of a thread of a dying GPU process (or of a driver kthread it woke).
    pub struct TeardownSample {
        kind: u32 = 0,
        /// Id in the STACKS map; negative when the kernel could not take the stack.
        stack_id: i32 = 4,
        /// The dying process this time belongs to.
        owner: u32 = 8,
        /// The thread sampled (for BlockEnd not the running task of the header).
        tid: u32 = 12,
        blocked_ns: u64 = 16,
    }
    size 24
}

wire_struct! {
    /// The dying process woke a driver kthread (deferred close or release work).
    pub struct KthreadWakeup {
        kthread_tid: u32 = 0,
        owner: u32 = 4,
        comm: [u8; COMM_LEN] = 8,
    }
    size 24
}

stable_ids! {
    /// Kernel functions on the release path of a GPU file, timed by the driver hooks. Stable ids.
    pub enum DriverFunc: u32 {
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
}

/// [`DriverCall::phase`].
pub const CALL_ENTRY: u16 = 1;
pub const CALL_EXIT: u16 = 2;

/// [`DriverCall::hook`]: which kind of program saw the call.
pub const HOOK_FENTRY: u16 = 1;
pub const HOOK_KPROBE: u16 = 2;

wire_struct! {
    /// Entry to or exit from a [`DriverFunc`], on the thread in the header.
    pub struct DriverCall {
        func: u32 = 0,
        phase: u16 = 4,
        hook: u16 = 6,
        /// Kernel address of the `struct file` (as in [`GpuFd::file`]); for functions without a
        /// file argument, that of the enclosing close on this thread; 0 when unknown.
        file: u64 = 8,
        /// `i_rdev` of that file (kernel encoding), 0 when unknown.
        dev: u32 = 16,
        _pad: u32 = 20,
        /// Entry of `nvidia_unlocked_ioctl`: the command. Exit of a function returning int/long:
        /// its return value, sign-extended. Otherwise 0.
        value: i64 = 24,
        /// Exit: nanoseconds since the matching entry on this thread; 0 when the entry was not
        /// seen (the call began before the hooks were attached).
        duration_ns: u64 = 32,
    }
    size 40
}

wire_struct! {
    /// The kernel's OOM killer chose `pid` (tracepoint oom/mark_victim); its SIGKILL follows.
    pub struct OomVictim {
        pid: u32 = 0,
        _pad: u32 = 4,
    }
    size 8
}

/// Bytes of a GPU error's message kept in [`GpuXid::msg`]; the driver's longer ones are cut.
pub const XID_MSG_LEN: usize = 192;
/// Bytes of the PCI device name ("0000:3b:00.0") kept in [`GpuXid::pci`].
pub const XID_PCI_LEN: usize = 16;

/// [`GpuXid::msg`]: bytes, in a type of its own because arrays this long have no `Default`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct XidText(pub [u8; XID_MSG_LEN]);

impl Default for XidText {
    fn default() -> Self {
        Self([0; XID_MSG_LEN])
    }
}

wire_struct! {
    /// The NVIDIA driver reported a GPU error (tracepoint nvidia/nvidia_dev_xid). The header's
    /// task is whoever ran the report (often an interrupt's or the driver's worker), not the
    /// process the message names.
    pub struct GpuXid {
        xid: u32 = 0,
        /// Length of the driver's message (it may be longer than [`GpuXid::msg`] holds).
        msg_len: u32 = 4,
        /// `pci_name()` of the device, NUL-padded.
        pci: [u8; XID_PCI_LEN] = 8,
        /// The message ("pid=1234, name=python3, channel 0x00000002, ..."), NUL-padded.
        msg: XidText = 24,
    }
    size 216
}

wire_struct! {
    /// Where the fields of nvidia_dev_xid sit in its tracepoint record, from its format file
    /// (the driver defines the event; its layout is not the kernel's to keep stable).
    pub struct XidLayout {
        /// Offsets of the `__data_loc` words of `dev` and `msg`, and of `error_code`.
        dev: u32 = 0,
        msg: u32 = 4,
        error_code: u32 = 8,
        _pad: u32 = 12,
    }
    size 16
}

stable_ids! {
    /// Slots of the per-CPU loss counter map: slot 0 counts records that did not fit in the ring
    /// buffer, the others map inserts that failed because the map was full (what was then not
    /// followed). Stable numbers.
    pub enum Loss: u32 {
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
        /// A walk of a descriptor table larger than [`FD_WALK_MAX`]: GPU files above it were
        /// not listed.
        FdWalk = 7,
        /// A driver or library call under way (its entry's arguments or time, kept for its
        /// return): the call is then not decoded or not timed.
        Calls = 8,
        /// A GPU holder's thread asleep uninterruptibly: its kernel stack (the stuck watch then
        /// reads it from /proc, or reports the thread without it).
        AsleepStacks = 9,
        /// A GPU holder's thread asleep uninterruptibly: the sleep itself (that thread is not
        /// watched for being stuck).
        Asleep = 10,
    }
}

wire_struct! {
    /// Filler record of a typical size, written only by the benchmark program.
    pub struct BenchTick {
        seq: u64 = 0,
        _pad: [u64; 3] = 8,
    }
    size 32
}

/// A header and its payload, laid out exactly as in the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Record<T> {
    pub header: Header,
    pub payload: T,
}

impl<T: Payload> Record<T> {
    /// A record as the programs write it, the header's kind and size from the table.
    pub fn new(cpu: u32, ts_ns: u64, pid: u32, tid: u32, payload: T) -> Self {
        Self {
            header: Header {
                kind: T::KIND as u16,
                size: core::mem::size_of::<Self>() as u16,
                cpu,
                ts_ns,
                pid,
                tid,
            },
            payload,
        }
    }

    /// Its bytes, as they sit in the ring buffer (for benchmarks and tests that make records).
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: repr(C) of a 24-byte header and a payload whose size is a multiple of 8,
        // neither with padding (asserted by the tables): every byte is initialized.
        unsafe {
            core::slice::from_raw_parts(
                (self as *const Self).cast::<u8>(),
                core::mem::size_of::<Self>(),
            )
        }
    }
}

/// A comm field holding `s` (cut at [`COMM_LEN`] bytes).
pub fn comm(s: &[u8]) -> [u8; COMM_LEN] {
    let mut c = [0u8; COMM_LEN];
    let n = s.len().min(COMM_LEN);
    c[..n].copy_from_slice(&s[..n]);
    c
}

/// A fixed-layout struct every bit pattern of which is a valid value, so its bytes can be read
/// back as it (see `wire_struct!`).
///
/// # Safety
/// Only for `#[repr(C)]` structs of integers and byte arrays.
pub unsafe trait Wire: Copy + Default + 'static {}

/// Payload types and their kind ids.
pub trait Payload: Wire {
    const KIND: Kind;
    /// Whether writing one wakes the collector at once. Bulk records (ioctls, samples, forks)
    /// do not: the collector drains them on its next tick, which keeps a wakeup and a context
    /// switch off every traced ioctl.
    const WAKE: bool;
}

records! {
    1 SignalGenerate wake: true,
    2 SignalDeliver wake: true,
    3 ProcessFork wake: false,
    4 ProcessExec wake: false,
    5 TaskExit wake: true,
    6 Reap wake: true,
    7 GpuFd wake: false,
    8 GpuCloseRange wake: false,
    9 GpuIoctl wake: false,
    10 TeardownSample wake: false,
    11 KthreadWakeup wake: true,
    // No 12: ids already handed out are never given a new meaning.
    13 DriverCall wake: false,
    14 OomVictim wake: true,
    15 GpuXid wake: true,
    /// Emitted only by the benchmark program to measure ring buffer throughput.
    100 BenchTick wake: true,
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: plain-old-data structs of integers and byte arrays, no padding holes that
    // carry meaning; the kernel side writes them in full.
    unsafe impl aya::Pod for Header {}
    unsafe impl aya::Pod for XidLayout {}
}
