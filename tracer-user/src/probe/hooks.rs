//! The hook table: the programs `Probes::load` attaches in every mode, each with its hook and
//! the gate that decides whether this kernel gets it, and the system call tracepoints of
//! [`Mode::Syscalls`](crate::event::Mode). The hooks chosen by trying live with their choice:
//! the driver's (`strategy.rs`), the NVIDIA libraries' (`library.rs`), the GPU-error tracepoint
//! (`xid.rs`), the search (`search.rs`) and the stack sampler (`sampling.rs`).

use super::{attach::Hook, tracefs};

/// Whether an entry is attached on this kernel.
#[derive(Clone, Copy, Debug)]
pub enum Gate {
    Always,
    /// Where `sched_process_exit` passes `group_dead` (6.16 on) or not: one exit program
    /// for each.
    GroupDead(bool),
    /// Where the kernel has the tracepoint (it may be configured out).
    Present,
}

/// One program and where it goes.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub program: &'static str,
    pub hook: Hook<'static>,
    pub gate: Gate,
}

/// What the gates are decided from.
pub struct Kernel {
    pub group_dead: bool,
}

impl Entry {
    const fn btf(program: &'static str, tracepoint: &'static str, gate: Gate) -> Self {
        Self {
            program,
            hook: Hook::TpBtf(tracepoint),
            gate,
        }
    }

    pub fn open(&self, kernel: &Kernel) -> bool {
        match (self.gate, self.hook) {
            (Gate::Always, _) => true,
            (Gate::GroupDead(has), _) => has == kernel.group_dead,
            (Gate::Present, Hook::Tracepoint { category, name }) => {
                tracefs::has_event(category, name)
            }
            (Gate::Present, _) => true,
        }
    }
}

/// Signals, the life of processes, and the OOM killer's victims (fires only when it kills).
pub const PROCESSES: [Entry; 8] = [
    Entry::btf("signal_generate", "signal_generate", Gate::Always),
    Entry::btf("process_fork", "sched_process_fork", Gate::Always),
    Entry::btf("process_exec", "sched_process_exec", Gate::Always),
    Entry::btf(
        "task_exit_group_dead",
        "sched_process_exit",
        Gate::GroupDead(true),
    ),
    Entry::btf(
        "task_exit_legacy",
        "sched_process_exit",
        Gate::GroupDead(false),
    ),
    Entry::btf("process_free", "sched_process_free", Gate::Always),
    Entry::btf("signal_deliver", "signal_deliver", Gate::Always),
    Entry {
        program: "oom_victim",
        hook: Hook::Tracepoint {
            category: "oom",
            name: "mark_victim",
        },
        gate: Gate::Present,
    },
];

/// Where a dying process's threads sleep and who wakes them: the teardown's phases. Attached
/// after the search's slot is filled (see `Probes::load`).
pub const SCHEDULER: [Entry; 2] = [
    Entry::btf("teardown_switch", "sched_switch", Gate::Always),
    Entry::btf("teardown_wakeup", "sched_wakeup", Gate::Always),
];

/// The system call tracepoints that see GPU files' opens, dups, closes and ioctls, and reaps,
/// each program with the syscalls it serves. Exits only: an entry hook would be a second
/// tracepoint call on every system call of every process.
pub const SYSCALLS: [(&str, &[&str]); 6] = [
    ("wait4_exit", &["sys_exit_wait4"]),
    ("waitid_exit", &["sys_exit_waitid"]),
    (
        "fd_installed",
        &[
            "sys_exit_open",
            "sys_exit_openat",
            "sys_exit_openat2",
            "sys_exit_dup",
            "sys_exit_dup2",
            "sys_exit_dup3",
        ],
    ),
    ("fcntl_exit", &["sys_exit_fcntl"]),
    ("fd_close", &["sys_exit_close"]),
    ("fd_close_range", &["sys_exit_close_range"]),
];

/// The ioctl tracepoint, with the others unless `--no-ioctls`.
pub const SYSCALL_IOCTLS: (&str, &[&str]) = ("ioctl_exit", &["sys_exit_ioctl"]);

/// The ring buffer benchmark's clock, attached for `bench_pid` only.
pub const BENCH: Entry = Entry {
    program: "bench_tick",
    hook: Hook::Tracepoint {
        category: "syscalls",
        name: "sys_enter_getppid",
    },
    gate: Gate::Always,
};
