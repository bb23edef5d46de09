//! Signal generation and delivery.

use aya_ebpf::{
    macros::{btf_tracepoint, map},
    maps::Array,
    programs::BtfTracePointContext,
};
use aya_log_ebpf::{debug, warn};
use tracer_common::{SignalDeliver, SignalGenerate, SIGNAL_TARGET_EXITING, SIGNAL_TO_GROUP};

use crate::{
    dying::start_dying,
    emit::{armed, current_ids, emit_waking, is_tracked, now_ns, track},
    files::{lean, urgent},
    holders::is_holder,
    task::{read, Task},
};

const SIGCHLD: u32 = 17;
const SI_USER: i32 = 0;
const SI_KERNEL: i32 = 0x80;

/// `--lean`: when a fatal signal last woke the collector.
#[map]
static LEAN_WOKE: Array<u64> = Array::with_max_entries(1, 0);
/// `--lean` wakes the collector for a fatal signal at most this often (its tick): one wake-up
/// starts NVML's fast readings, and a storm's other kills would each cost the sender an
/// interrupt and the collector a batch.
const LEAN_WAKE_GAP_NS: u64 = 20_000_000;

/// Whether this fatal signal wakes the collector under `--lean`.
fn lean_wake() -> bool {
    if !lean() {
        return false;
    }
    let Some(last) = LEAN_WOKE.get_ptr_mut(0) else {
        return true;
    };
    let now = now_ns();
    // SAFETY: a valid map value; a race between CPUs costs at most one extra wake-up.
    unsafe {
        if now.saturating_sub(*last) < LEAN_WAKE_GAP_NS {
            return false;
        }
        *last = now;
    }
    true
}

/// Bit n set: signal n opens an incident. Set by user space.
#[unsafe(no_mangle)]
static FATAL_SIGNALS: u64 = 0;

fn is_fatal(sig: u32) -> bool {
    // SAFETY: read-only global filled before load.
    let mask = unsafe { core::ptr::read_volatile(&FATAL_SIGNALS) };
    sig < 64 && mask & (1u64 << sig) != 0
}

/// `si_code` as the kernel's own tracepoint reports it: the two special `info` values stand for
/// a signal from user space without info and a privileged kernel signal.
fn si_code(info: *const u8) -> i32 {
    match info as usize {
        0 => SI_USER,
        1 => SI_KERNEL,
        // SAFETY: checked read; si_code sits after si_signo and si_errno in kernel_siginfo.
        _ => unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(info.add(8) as *const i32) }
            .unwrap_or(SI_USER),
    }
}

/// tp_btf signal_generate(int sig, struct kernel_siginfo *info, struct task_struct *task,
/// int group, int result).
#[btf_tracepoint(function = "signal_generate")]
pub fn signal_generate(ctx: BtfTracePointContext) -> i32 {
    let sig: i32 = ctx.arg(0);
    let sig = sig as u32;
    let (sender_pid, _) = current_ids();
    let fatal = is_fatal(sig);
    // SIGCHLD matters only when a tracked process tells its parent it is a zombie.
    if !fatal && !(sig == SIGCHLD && is_tracked(sender_pid)) {
        return 0;
    }
    if !armed() {
        return 0;
    }
    let info: *const u8 = ctx.arg(1);
    let target = Task(ctx.arg::<*const u8>(2));
    let group: i32 = ctx.arg(3);
    let result: i32 = ctx.arg(4);
    let target_pid = target.tgid();
    if fatal {
        if is_holder(target_pid) {
            // Its teardown is what the stack sampling is for.
            start_dying(target_pid);
        }
        if !track(target_pid) {
            warn!(
                &ctx,
                "tracked-process map full: threads of pid {} are not followed", target_pid
            );
        } else {
            debug!(
                &ctx,
                "signal {} to pid {}: following its exit", sig, target_pid
            );
        }
    }
    // A kill of a group already on its way out (a pid namespace's init killing what is left,
    // itself included; a second kill of the same job) is no death of its own.
    let exiting = fatal && target.live_threads() == 0;
    let sender = Task::current();
    let about = if fatal { target_pid } else { sender_pid };
    emit_waking::<SignalGenerate>(urgent(about) || (fatal && lean_wake()), |e| {
        e.sig = sig;
        e.code = si_code(info);
        e.result = result;
        e.flags = if group != 0 { SIGNAL_TO_GROUP } else { 0 }
            | if exiting { SIGNAL_TARGET_EXITING } else { 0 };
        e.target_pid = target_pid;
        e.target_tid = target.pid();
        e.target_threads = target.nr_threads();
        if sig == SIGCHLD {
            e.sender_threads = sender.nr_threads();
        }
        e.sender_comm = sender.group_leader().comm();
        e.target_comm = target.group_leader().comm();
    });
    0
}

/// tp_btf signal_deliver(int sig, struct kernel_siginfo *info, struct k_sigaction *ka). A BTF
/// tracepoint builds no trace record before the first test, for any signal delivered on the
/// machine (the bystanders' included).
#[btf_tracepoint(function = "signal_deliver")]
pub fn signal_deliver(ctx: BtfTracePointContext) -> i32 {
    let (pid, _) = current_ids();
    if !is_tracked(pid) {
        return 0;
    }
    let sig: i32 = ctx.arg(0);
    let info: *const u8 = ctx.arg(1);
    let ka: *const u8 = ctx.arg(2);
    // struct k_sigaction opens with struct sigaction: sa_handler, then sa_flags (x86-64), the
    // fields the classic tracepoint reports; a failed read gives zeros.
    let handler: u64 = read(ka, 0);
    let sa_flags: u64 = read(ka, 8);
    emit_waking::<SignalDeliver>(urgent(pid), |e| {
        e.sig = sig as u32;
        e.code = si_code(info);
        e.handler = handler;
        e.sa_flags = sa_flags;
    });
    0
}
