//! Process life cycle: fork, exec, every thread's exit, and the reap.

use aya_ebpf::{
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use tracer_common::{
    FdOp, OomVictim, ProcessExec, ProcessFork, Reap, ReapHow, TaskExit, FORK_FILES_SHARED,
};

use crate::{
    dying::{start_dying, stop_dying},
    emit::{armed, emit, emit_waking, is_tracked, track, TRACKED},
    files::{urgent, walk},
    holders::{add_holder, is_holder, HOLDERS},
    regs::{read_user, syscall_args},
    task::Task,
};

/// tp_btf sched_process_fork(struct task_struct *parent, struct task_struct *child).
#[btf_tracepoint(function = "sched_process_fork")]
pub fn process_fork(ctx: BtfTracePointContext) -> i32 {
    let parent = Task(ctx.arg::<*const u8>(0));
    let child = Task(ctx.arg::<*const u8>(1));
    let child_pid = child.tgid();
    // A new thread joins its creator's group; only new processes are recorded.
    if child_pid != child.pid() {
        return 0;
    }
    if is_holder(parent.tgid()) {
        // The child got a copy (or a share) of the parent's descriptors, GPU files included.
        add_holder(child_pid);
    }
    let shared = parent.files_ptr() == child.files_ptr();
    emit::<ProcessFork>(|e| {
        e.child_pid = child_pid;
        e.flags = if shared { FORK_FILES_SHARED } else { 0 };
        e.comm = child.comm();
    });
    0
}

/// tp_btf sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm).
#[btf_tracepoint(function = "sched_process_exec")]
pub fn process_exec(ctx: BtfTracePointContext) -> i32 {
    let task = Task(ctx.arg::<*const u8>(0));
    emit::<ProcessExec>(|e| e.comm = task.comm());
    if is_holder(task.tgid()) {
        // Close-on-exec descriptors are gone by now: list what the new image still holds.
        walk(task, FdOp::HeldAtExec);
    }
    0
}

fn task_exit(task: Task, group_dead: bool) {
    // Every process's last thread is recorded (it keeps the process table right); other
    // threads only for processes under a fatal signal.
    let tgid = task.tgid();
    if !group_dead && !is_tracked(tgid) {
        return;
    }
    if group_dead && is_holder(tgid) {
        // Before every program is attached, the death could be seen only in part.
        let whole = armed();
        if whole {
            // The fd table is still intact here (exit_files runs later): what the group held
            // when it died, and each file's references, tell who else keeps the memory.
            walk(task, FdOp::HeldAtExit);
        }
        let _ = HOLDERS.remove(tgid);
        if whole {
            // Its files are released before it becomes a zombie: follow it to its SIGCHLD
            // and reap, signalled or not, and sample its teardown.
            track(tgid);
            start_dying(tgid);
        }
    }
    // Exits of processes nobody signalled only keep the process table, and those of
    // processes without GPU files can wait for the next tick: no need to wake.
    emit_waking::<TaskExit>(is_tracked(tgid) && urgent(tgid), |e| {
        e.exit_code = task.exit_code();
        e.group_dead = group_dead as u32;
        e.comm = task.comm();
    });
}

/// tp_btf sched_process_exit(struct task_struct *p, bool group_dead) on kernels that pass
/// group_dead (6.16+).
#[btf_tracepoint(function = "sched_process_exit")]
pub fn task_exit_group_dead(ctx: BtfTracePointContext) -> i32 {
    let task = Task(ctx.arg::<*const u8>(0));
    let group_dead: u8 = ctx.arg(1);
    task_exit(task, group_dead != 0);
    0
}

/// tp_btf sched_process_exit(struct task_struct *p) on older kernels: it fires after the
/// thread left `signal->live`, so a zero count means this is the last one.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn task_exit_legacy(ctx: BtfTracePointContext) -> i32 {
    let task = Task(ctx.arg::<*const u8>(0));
    task_exit(task, task.live_threads() == 0);
    0
}

/// Tracepoint syscalls/sys_exit_wait4: ret@16 is the pid reported, reaped unless the status
/// says it stopped or continued (WUNTRACED, WCONTINUED).
#[tracepoint(category = "syscalls", name = "sys_exit_wait4")]
pub fn wait4_exit(ctx: TracePointContext) -> i32 {
    // SAFETY: offset of `ret` in the stable sys_exit format.
    let ret = unsafe { ctx.read_at::<i64>(16) }.unwrap_or(-1);
    if ret <= 0 || !is_tracked(ret as u32) {
        return 0;
    }
    if let Some([_, status_at]) = syscall_args() {
        if status_at != 0 {
            let status: u32 = read_user(status_at);
            if status & 0xff == 0x7f || status == 0xffff {
                return 0;
            }
        }
    }
    reaped(ret as u32, ReapHow::Wait);
    0
}

/// waitid's WNOWAIT: the child is reported and left a zombie.
const WNOWAIT: u64 = 0x0100_0000;
/// `siginfo.si_code` of a child that ended (CLD_EXITED, CLD_KILLED, CLD_DUMPED); the others
/// report it stopped or continued.
const CLD_ENDED: [i32; 3] = [1, 2, 3];
/// Where the siginfo waitid fills keeps si_code and si_pid (64-bit layouts).
const SI_CODE_AT: u64 = 8;
const SI_PID_AT: u64 = 16;

/// Tracepoint syscalls/sys_exit_waitid: it returns 0 and names the child in the siginfo its
/// third argument points to. Service managers and Go (`os.Process.Wait` through a pidfd)
/// reap this way; without it their reaps are seen only at the task's free.
#[tracepoint(category = "syscalls", name = "sys_exit_waitid")]
pub fn waitid_exit(ctx: TracePointContext) -> i32 {
    // SAFETY: offset of `ret` in the stable sys_exit format.
    let ret = unsafe { ctx.read_at::<i64>(16) }.unwrap_or(-1);
    if ret != 0 {
        return 0;
    }
    let Some([_, _, info, options]) = syscall_args() else {
        return 0;
    };
    if info == 0 || options & WNOWAIT != 0 {
        return 0;
    }
    let pid: i32 = read_user(info + SI_PID_AT);
    if pid <= 0 || !is_tracked(pid as u32) {
        return 0;
    }
    if CLD_ENDED.contains(&read_user::<i32>(info + SI_CODE_AT)) {
        reaped(pid as u32, ReapHow::Wait);
    }
    0
}

/// tp_btf sched_process_free(struct task_struct *p): the leader's task is gone for good.
#[btf_tracepoint(function = "sched_process_free")]
pub fn process_free(ctx: BtfTracePointContext) -> i32 {
    let task = Task(ctx.arg::<*const u8>(0));
    let pid = task.pid();
    if pid != task.tgid() {
        return 0;
    }
    stop_dying(pid);
    if !is_tracked(pid) {
        return 0;
    }
    reaped(pid, ReapHow::Freed);
    0
}

/// Tracepoint oom/mark_victim: pid@8. The OOM killer's SIGKILL to that process follows.
#[tracepoint(category = "oom", name = "mark_victim")]
pub fn oom_victim(ctx: TracePointContext) -> i32 {
    // SAFETY: offset of `pid` in the stable mark_victim format.
    let pid = unsafe { ctx.read_at::<i32>(8) }.unwrap_or(0);
    emit::<OomVictim>(|e| e.pid = pid as u32);
    0
}

fn reaped(pid: u32, how: ReapHow) {
    // The first reap is the one that counts: after a wait, the task's free has nothing to add.
    let _ = TRACKED.remove(pid);
    emit_waking::<Reap>(urgent(pid), |e| {
        e.reaped_pid = pid;
        e.how = how as u32;
        // The process's name, as for a signal's sender: the waiting thread may have its own.
        e.comm = Task::current().group_leader().comm();
    });
}
