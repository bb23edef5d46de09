//! `linger doctor`'s table of what linger asks the kernel, which hook answers each question on
//! this machine in the default mode and with `--lean`, and what that hook costs the processes
//! linger is not about.

use serde::Serialize;

use crate::event::{HookKind, Mode, Strategy};

#[derive(Debug, Serialize)]
pub struct Question {
    pub question: &'static str,
    /// The hooks that answer it in the default mode.
    pub default: String,
    /// The same with `--lean`.
    pub lean: String,
    /// Who pays for it.
    pub cost: &'static str,
}

/// How the reap is bounded without the wait4 tracepoint.
const REAP_BOUNDED: &str = "the parent the SIGCHLD went to (tp_btf/signal_generate) reaps, \
     after that zombie transition and by tp_btf/sched_process_free (an RCU grace period after \
     the reap)";

/// The GPU questions where no NVIDIA driver is registered.
const NO_DRIVER: &str = "nothing to see: no NVIDIA driver is registered, so no GPU file can be \
     opened (when it registers: its functions where kprobes work, else its libraries, else the \
     system call tracepoints)";

/// Every question, answered for the driver hooks `strategy` chose here.
pub fn table(strategy: &Strategy) -> Vec<Question> {
    // `--lean` is its own column: the default column is the mode chosen here otherwise.
    let mode = strategy.mode();
    let mut table = process_questions(mode);
    table.extend(gpu_file_questions(mode));
    table.extend(release_questions(strategy));
    table
}

/// Signals, exits and reaping.
fn process_questions(mode: Mode) -> Vec<Question> {
    // Where the driver's opens and ioctl entry are hooked, or else the NVIDIA libraries'
    // calls, they replace every system call tracepoint in the default mode.
    let no_syscall_hooks = matches!(mode, Mode::Driver | Mode::Libraries | Mode::NoDriver);
    let reaping_cost = if no_syscall_hooks {
        "fires once per process"
    } else {
        "a system call tracepoint: every system call of every process takes the slow path \
         while it is attached (the syscall tax, BENCHMARKS.md)"
    };
    vec![
        q(
            "fatal signals and their delivery",
            "tp_btf/signal_generate, tp_btf/signal_deliver",
            "the same",
            "fires on signals only",
        ),
        q(
            "thread exits, group death, exit status",
            "tp_btf/sched_process_exit",
            "the same",
            "every thread exit: one map lookup when nobody watches it",
        ),
        q(
            "reaping",
            if no_syscall_hooks {
                REAP_BOUNDED
            } else {
                "tracepoints syscalls/sys_exit_wait4 and sys_exit_waitid (the pid wait4 \
                 returned, or the child waitid's siginfo names), tp_btf/sched_process_free (an RCU grace period after the reap: an upper bound)"
            },
            REAP_BOUNDED,
            reaping_cost,
        ),
    ]
}

/// Who holds GPU files, and what their ioctls did.
fn gpu_file_questions(mode: Mode) -> Vec<Question> {
    let by = |driver, library, syscalls| ByMode {
        driver,
        library,
        syscalls,
    };
    let pick = |driver, library, syscalls| by(driver, library, syscalls).answer(mode);
    let pick_cost = |driver, library, syscalls| by(driver, library, syscalls).cost(mode);
    vec![
        q(
            "who holds GPU files",
            pick(
                "kprobes on nvidia_open and uvm_open_entry (the driver's opens); tp_btf fork, \
                 exec and exit walks; the start-up snapshot; closes unseen (__fput and the \
                 walks correct them)",
                "uprobes on the PLT entries of open*, dup* and close in libcuda and \
                 libnvidia-ml; tp_btf fork, exec and exit walks; the start-up snapshot; NVML's \
                 process list for opens outside them",
                "tracepoints syscalls/sys_exit_open*, _dup*, _fcntl, _close, _close_range \
                 (exits only); tp_btf fork, exec and exit walks; the start-up snapshot",
            ),
            "the start-up snapshot, NVML's process list (a /proc look at each new pid), tp_btf \
             fork, exec and exit walks",
            pick_cost(
                "the driver hooks fire for GPU files only",
                "a trap per call, in processes that load those libraries only",
                "system call tracepoints (the syscall tax); linger's programs run for those \
                 calls only and stop non-holders at one map lookup",
            ),
        ),
        q(
            "who holds a dead holder's files unseen (received over a unix socket, pidfd_getfd)",
            "the exit walk's reference counts; then a walk of each process holding GPU files \
             at its next tp_btf/sched_switch (a tail call)",
            "the same",
            "one array read per context switch; the walks run only after such a death",
        ),
        q(
            "GPU ioctls (allocation ledger, imports, refused allocations)",
            pick(
                "kprobe/kretprobe on nvidia_unlocked_ioctl (decoded at its return, timed)",
                "uprobe/uretprobe on the PLT entries of ioctl and syscall in libcuda and \
                 libnvidia-ml (decoded at the return)",
                "tracepoint syscalls/sys_exit_ioctl (no duration: no entry hook)",
            ),
            "not seen: imports from NVML's figures only, no ledger or collateral",
            pick_cost(
                "the driver hooks fire for GPU ioctls only",
                "two traps per ioctl, in processes that load those libraries only",
                "system call tracepoints (the syscall tax); non-holders stop at one map lookup",
            ),
        ),
    ]
}

/// Where a teardown spends its time, and when the memory is back.
fn release_questions(strategy: &Strategy) -> Vec<Question> {
    let release = match strategy.fput {
        Some(HookKind::Fentry) => "fentry/fexit on __fput of GPU files (exact)",
        Some(HookKind::Kprobe) => "kprobe/kretprobe on __fput of GPU files (exact)",
        None => "the zombie transition (SIGCHLD), an upper bound",
    };
    let xids = if strategy.xid_tracepoint {
        "tracepoint nvidia/nvidia_dev_xid; the process it names from the driver's line in the \
         kernel log (/dev/kmsg)"
    } else {
        "the driver's lines in the kernel log (/dev/kmsg): no nvidia/nvidia_dev_xid tracepoint"
    };
    vec![
        q(
            "where a teardown spends its time",
            "tp_btf/sched_switch, tp_btf/sched_wakeup, perf_event cpu-clock stacks while a GPU \
             process dies",
            "the same",
            "the scheduler hooks cost one array read while nobody dies; sampling runs only while \
             a GPU process dies",
        ),
        q(
            "the victim's own release of its files",
            release,
            release,
            "the driver hooks fire for GPU files only",
        ),
        q(
            "memory back on the device",
            "NVML from linger's own thread: 1 ms while a release is awaited, else once a second",
            "NVML: 1 ms while awaited (also after any fatal signal, for 300 ms), else every \
             100 ms",
            "linger's own CPU (about 10 µs a reading)",
        ),
        q(
            "GPU errors (Xids) and the process each names",
            xids,
            xids,
            "fires on GPU errors only; the kernel log is read by linger's own thread",
        ),
        q(
            "what NVIDIA says to do about each Xid",
            "NVIDIA's Xid catalog, kept in linger (Xid 1-172): no hook",
            "the same",
            "none",
        ),
        q(
            "a GPU busy with no holder",
            "NVML's readings (memory in use, no process listed) against the holders of each \
             GPU's device file; where /proc is not the host's, processes in other PID \
             namespaces stay invisible",
            "the same",
            "none: readings linger takes anyway",
        ),
        q(
            "a GPU process's thread stuck in the driver, without a kill",
            "tp_btf/sched_switch: a GPU holder's thread switching out in uninterruptible sleep              leaves its time and kernel stack; once a second linger's thread looks at those past              --stuck-after in /proc",
            "the same",
            "every context switch tests its state (one more read of the task on kernels before              5.18); a GPU holder's uninterruptible sleep, a map lookup, a stack and an insert",
        ),
    ]
}

/// A GPU question's answers (or costs) in each mode: the driver's hooks, the libraries', the
/// system call tracepoints.
#[derive(Clone, Copy)]
struct ByMode {
    driver: &'static str,
    library: &'static str,
    syscalls: &'static str,
}

impl ByMode {
    /// The default column's answer in `mode` (none where no driver is registered).
    fn answer(self, mode: Mode) -> &'static str {
        match mode {
            Mode::Driver => self.driver,
            Mode::Libraries => self.library,
            Mode::NoDriver => NO_DRIVER,
            Mode::Syscalls | Mode::Lean => self.syscalls,
        }
    }

    /// The cost column: with no driver, nothing is attached for the GPU questions.
    fn cost(self, mode: Mode) -> &'static str {
        match mode {
            Mode::NoDriver => "none: no hook attached",
            _ => self.answer(mode),
        }
    }
}

fn q(question: &'static str, default: &str, lean: &str, cost: &'static str) -> Question {
    Question {
        question,
        default: default.to_string(),
        lean: lean.to_string(),
        cost,
    }
}
