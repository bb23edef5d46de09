//! The moment a victim's memory came back on kernels where no hook times the driver's release:
//! its threads' first sight outside the driver after their last inside, not the end of its
//! exit, which other files' releases and `exit_notify` can drag out by tens of ms.

use crate::analysis::{incident::Source, verdict::VerdictKind};
use crate::event::{EventData, SampleKind};

use super::run::{back, sigkill, verdict, Run, FILE, GIB, MS, SHELL};

/// Stack 1: inside the RM's free of the victim's clients; stack 2: another file's release.
fn with_stacks(r: &mut Run) {
    for (id, frames) in [
        (
            1,
            &[
                "msleep",
                "rm_cleanup_file_private [nvidia]",
                "nvidia_close [nvidia]",
            ][..],
        ),
        (2, &["msleep", "slow_release [linger_slow]", "__fput"][..]),
    ] {
        let frames = frames.iter().map(|f| f.to_string()).collect();
        r.feed(0, 100.0, EventData::Stack { id, frames });
    }
}

fn sample(r: &mut Run, t_ms: f64, kind: SampleKind, stack_id: i32, blocked_ms: f64) {
    sample_of(r, 10, t_ms, kind, stack_id, blocked_ms);
}

fn sample_of(r: &mut Run, pid: u32, t_ms: f64, kind: SampleKind, stack: i32, blocked_ms: f64) {
    let data = EventData::TeardownSample {
        sample: kind,
        stack_id: stack,
        owner: pid,
        tid: pid,
        blocked_ns: (blocked_ms * MS as f64) as u64,
    };
    r.feed(pid, t_ms, data);
}

/// A job killed at 100 ms whose exit slept 200 ms in the RM's free (stack 1) and ran out of the
/// driver at 300.05 ms, then slept 30 ms in another file's release before its zombie.
fn killed_with_a_slow_exit(r: &mut Run) {
    r.holder(10, 0, 1.0);
    r.kill(SHELL, 10, 9, 100.0);
    with_stacks(r);
    r.die(10, &[FILE], 100.1, 9);
    slow_exit(r, 10);
}

/// `pid`'s exit from 100.2 ms: the driver's release of its file (200 ms asleep in it), out of
/// the driver at 300.05 ms, then 30 ms in another file's release.
fn slow_exit(r: &mut Run, pid: u32) {
    slow_exit_with(r, pid, 1);
}

/// [`slow_exit`], its sleep in the driver's release sampled with stack `inside` (-1: lost).
fn slow_exit_with(r: &mut Run, pid: u32, inside: i32) {
    sample_of(r, pid, 100.2, SampleKind::BlockStart, inside, 0.0);
    sample_of(r, pid, 300.0, SampleKind::BlockEnd, inside, 199.8);
    sample_of(r, pid, 300.05, SampleKind::LeftDriver, 2, 0.05);
    sample_of(r, pid, 300.05, SampleKind::BlockStart, 2, 0.0);
    sample_of(r, pid, 330.0, SampleKind::BlockEnd, 2, 29.95);
}

#[test]
fn the_release_is_the_leaving_of_the_driver_not_the_exit_s_end() {
    let mut r = Run::new();
    killed_with_a_slow_exit(&mut r);
    r.zombie_and_reap(10, 330.1);
    r.tick(400.0);
    let inc = r.last_of(10);
    assert_eq!(verdict(inc), VerdictKind::Released, "{inc:?}");
    let gpu = inc.gpu.as_ref().expect("gpu");
    assert_eq!(gpu.files_released_by, Some(Source::LeftDriver), "{inc:?}");
    assert_eq!(gpu.t_files_released_ns, Some(300_050_000));
    assert_eq!(back(inc), Some(300_050_000), "{inc:?}");
    // Known to the time since its last sight inside: the figures use it.
    assert_eq!(gpu.memory_back_known_to_ns, Some(50_000), "{inc:?}");
    assert_eq!(gpu.known_moment(), back(inc));
}

/// A thread seen inside the driver after the last leaving recorded (a free no sight ended,
/// or a driver kthread doing the close) leaves the moment to the exit's end.
#[test]
fn a_sight_inside_the_driver_after_the_leaving_keeps_the_exit_s_end() {
    let mut r = Run::new();
    killed_with_a_slow_exit(&mut r);
    sample(&mut r, 331.0, SampleKind::OnCpu, 1, 0.0);
    r.zombie_and_reap(10, 332.0);
    r.tick(400.0);
    let inc = r.last_of(10);
    let gpu = inc.gpu.as_ref().expect("gpu");
    assert_eq!(gpu.files_released_by, Some(Source::Zombie), "{inc:?}");
    assert_eq!(back(inc), Some(332 * MS), "{inc:?}");
    // A bound, from the last sight inside the RM's free (1 ms before it).
    assert_eq!(gpu.memory_back_known_to_ns, None, "{inc:?}");
    assert_eq!(gpu.t_memory_held_until_ns, Some(331 * MS), "{inc:?}");
}

/// Job 10 holding 4 GiB, with child 11 forked holding its file, SIGKILLed at 100 ms (its driver
/// calls traced: the kernel's release is the moment once NVML confirms it).
fn job_with_child() -> Run {
    let mut r = Run::new();
    r.ioctls_traced();
    r.holder(10, 0, 1.0);
    r.fork(10, 11, 2.0);
    r.nvml(3.0, 5 * GIB, &[(10, 4 * GIB)]);
    r.kill(SHELL, 10, 9, 100.0);
    r
}

/// [`job_with_child`] as a container's init and its child: the init dies first, the kernel
/// kills the child in the namespace's teardown, and the child's exit is [`slow_exit_with`] its
/// sleep in the driver sampled with stack `inside`; the init's zombie comes at 331 ms.
fn init_killed_with_child(inside: i32) -> Run {
    let mut r = job_with_child();
    with_stacks(&mut r);
    r.die_with(10, 2, 100.05, 9);
    // The kernel's kill of what is left of the namespace, in the dying init's context.
    sigkill(&mut r, 10, 11, 100.06, true, false);
    r.die_with(11, 1, 100.1, 9);
    slow_exit_with(&mut r, 11, inside);
    r.zombie_and_reap(10, 331.0);
    sample_of(&mut r, 11, 331.5, SampleKind::Exited, -1, 0.0);
    r.nvml(332.0, GIB, &[]);
    r.tick(600.0);
    r
}

/// A container's init killed with a child holding its file: the child's exit runs the driver's
/// release (so every other reference, the init's among them, was gone), then goes on; the
/// init's zombie comes only after the child's exit is over. The memory is back as the child
/// leaves the driver, not at the init's zombie.
#[test]
fn the_driver_s_release_by_the_last_holder_is_the_moment_whatever_the_others_bounds() {
    let r = init_killed_with_child(1);
    let init = r.last_of(10);
    assert_eq!(verdict(init), VerdictKind::Released, "{init:?}");
    assert_eq!(back(init), Some(300_050_000), "{init:?}");
}

/// The same, the kernel having lost the stacks of the child's sleep in the driver (a full
/// stack map under churn: 7 of 661 pid namespace kills 40 ms late in a loaded CI rehearsal,
/// 2026-12-07): its exit walk showed it the last holder of the file, so the driver's release
/// ran in its exit, and its leaving of the driver during the exit is that release's end.
#[test]
fn the_last_holder_s_leaving_is_the_moment_without_the_stacks_of_its_sleep() {
    let r = init_killed_with_child(-1);
    let init = r.last_of(10);
    assert_eq!(back(init), Some(300_050_000), "{init:?}");
}

/// Where the driver's functions are hooked, the moment is the end of its release inside the
/// last `__fput` of a GPU file: the rest of `__fput` was preempted for 8.5 ms in the VM
/// (6.12 guest, kprobes, 2026-12-07) after the stand-in's free.
#[test]
fn with_driver_hooks_the_moment_is_the_driver_s_release_not_the_fput_s_end() {
    use crate::event::{DriverFunc, HookKind};
    let mut r = Run::new();
    r.holder(10, 0, 1.0);
    r.kill(SHELL, 10, 9, 100.0);
    r.die(10, &[FILE], 100.1, 9);
    let call = |func, took_ms: f64| EventData::DriverCall {
        func,
        exit: true,
        hook: HookKind::Kprobe,
        file: FILE,
        dev: 195 << 20,
        value: 0,
        duration_ns: (took_ms * MS as f64) as u64,
    };
    r.feed(10, 300.0, call(DriverFunc::NvidiaClose, 199.5));
    r.feed(10, 308.5, call(DriverFunc::Fput, 208.2));
    r.zombie_and_reap(10, 340.0);
    r.tick(400.0);
    let inc = r.last_of(10);
    let gpu = inc.gpu.as_ref().expect("gpu");
    assert_eq!(gpu.files_released_by, Some(Source::Fput), "{inc:?}");
    assert_eq!(gpu.t_files_released_ns, Some(300 * MS), "{inc:?}");
    assert_eq!(back(inc), Some(300 * MS), "{inc:?}");
    assert_eq!(gpu.memory_back_known_to_ns, Some(0), "exact: {inc:?}");
}

/// The kernel could not keep the stack of the sleep in the driver (a full stack map, bursts
/// of churn in the VM): the program still told inside from outside, and its last sight inside
/// came during the exit, which enters the driver only to release files and unmap.
#[test]
fn a_leaving_during_the_exit_counts_without_the_stack_of_the_sight_inside() {
    let mut r = Run::new();
    r.holder(10, 0, 1.0);
    r.kill(SHELL, 10, 9, 100.0);
    r.die(10, &[FILE], 100.1, 9);
    sample(&mut r, 100.2, SampleKind::BlockStart, -1, 0.0);
    sample(&mut r, 300.0, SampleKind::BlockEnd, -1, 199.8);
    sample(&mut r, 300.05, SampleKind::LeftDriver, -1, 0.05);
    r.zombie_and_reap(10, 330.1);
    r.tick(400.0);
    let inc = r.last_of(10);
    let gpu = inc.gpu.as_ref().expect("gpu");
    assert_eq!(gpu.files_released_by, Some(Source::LeftDriver), "{inc:?}");
    assert_eq!(back(inc), Some(300_050_000), "{inc:?}");
}

/// A job's exit unmaps its memory in the driver before its files go (its stack there lost):
/// its leaving of the driver is its own moment, but not the driver's release of the files,
/// which its child, the last holder, did later (without a sight). The memory is back with the
/// child's release, never at the job's unmapping (an H100 soak, 2026-12-07: a pid namespace's
/// job reported 32 ms before NVML's interval).
#[test]
fn an_exit_s_unmapping_in_the_driver_is_not_the_files_release() {
    let mut r = job_with_child();
    r.kill(SHELL, 11, 9, 100.01);
    r.die_with(10, 2, 100.05, 9);
    sample(&mut r, 100.1, SampleKind::BlockStart, -1, 0.0);
    sample(&mut r, 100.2, SampleKind::BlockEnd, -1, 0.1);
    sample(&mut r, 100.3, SampleKind::LeftDriver, -1, 0.1);
    r.zombie_and_reap(10, 100.5);
    r.die_with(11, 1, 100.6, 9);
    r.zombie_and_reap(11, 300.0);
    r.nvml(301.0, GIB, &[]);
    r.tick(600.0);
    let job = r.last_of(10);
    assert_eq!(verdict(job), VerdictKind::Released, "{job:?}");
    let back = back(job).expect("back");
    assert!((300 * MS..=301 * MS).contains(&back), "{job:?}");
}
