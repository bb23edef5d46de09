//! `--lean`: no opens or driver calls traced, NVML and the kernel's release alone.

use crate::analysis::verdict::VerdictKind;

use super::run::{back, verdict, Run, FILE, GIB, MS, SHELL};

/// A CUDA context's own memory, as NVML lists it on the H200.
const CTX: u64 = 518 << 20;

#[test]
fn lean_a_kill_before_any_holder_was_known_is_found_through_nvml() {
    let mut r = Run::new();
    r.lean();
    r.nvml(0.0, GIB / 2, &[]);
    // No open was seen: the process is not a known holder when it is killed.
    r.kill(SHELL, 10, 9, 200.0);
    r.die(10, &[], 200.1, 9);
    r.nvml(201.0, 5 * GIB / 2, &[(10, 2 * GIB)]);
    r.nvml(330.0, GIB / 2, &[]);
    r.zombie_and_reap(10, 331.0);
    r.tick(400.0);
    let inc = r.last_of(10);
    assert_eq!(verdict(inc), VerdictKind::Released);
    assert_eq!(back(inc), Some(330 * MS));
    assert!(!inc.unseen.is_empty(), "says what --lean cannot see");
}

/// `--lean` on a busy GPU: the kernel's release of a victim's files, once NVML no longer lists
/// it, is its memory's return unless another process's figure rose as it left the list. One
/// riser alone that took over what the victim held is an importer, one that rose by less
/// says nothing; a riser among other rising processes cannot be told from a job
/// allocating (`incomplete`); a process still starting CUDA (listed at no more than the slack)
/// imports nothing.
#[test]
fn lean_on_a_busy_gpu_times_the_return_by_the_kernel_and_says_where_risers_blur_it() {
    const STARTING: u64 = 14 << 20;
    // (other processes' figures before and as the victim leaves the list; the verdict)
    type Figures<'a> = &'a [(u32, u64)];
    let cases: [(Figures, Figures, VerdictKind); 5] = [
        // A job not listed yet takes 4 GiB as the victim's come back.
        (&[], &[], VerdictKind::Released),
        // A job starting CUDA: its rise is its own start.
        (
            &[(20, STARTING)],
            &[(20, CTX + 4 * GIB)],
            VerdictKind::Released,
        ),
        // The only riser, with a context of its own: an importer.
        (&[(30, CTX)], &[(30, CTX + 4 * GIB)], VerdictKind::Imported),
        // The only riser, by far less than the victim held: a job's own allocation as
        // likely as an import (an H100's churn: new jobs' first 64 MiB).
        (
            &[(30, CTX)],
            &[(30, CTX + (64 << 20))],
            VerdictKind::Incomplete,
        ),
        // The same beside a job starting at the same moment: either may be allocating.
        (
            &[(20, STARTING), (30, CTX)],
            &[(20, CTX + 4 * GIB), (30, CTX + 4 * GIB)],
            VerdictKind::Incomplete,
        ),
    ];
    for (before, after, expected) in cases {
        let mut r = Run::new();
        r.lean();
        let with = |others: &[(u32, u64)], victim: Option<u64>| {
            let mut v: Vec<(u32, u64)> = others.to_vec();
            v.extend(victim.map(|b| (10, b)));
            v
        };
        let used = 20 * GIB;
        r.nvml(0.0, used, &with(before, None));
        r.holder(10, 0, 100.0);
        r.nvml(200.0, used, &with(before, Some(CTX + 4 * GIB)));
        r.kill(SHELL, 10, 9, 300.0);
        r.die(10, &[FILE], 300.1, 9);
        r.nvml(301.0, used, &with(before, Some(CTX + 4 * GIB)));
        r.zombie_and_reap(10, 420.0);
        // Used memory stays: another job took what came back, or an importer holds it.
        r.nvml(425.0, used, &with(after, None));
        r.tick(500.0);
        let inc = r.last_of(10);
        assert_eq!(verdict(inc), expected, "{before:?} -> {after:?}: {inc:?}");
        if expected != VerdictKind::Imported {
            assert_eq!(back(inc), Some(420 * MS), "the kernel's release, confirmed");
        }
    }
}

/// Once a dead process's files are released, the kernel reuses their addresses for other
/// processes' opens: a later job exiting with a file at the same address holds its own memory,
/// not the earlier victim's (whose import, here, is still held).
#[test]
fn lean_a_released_files_address_reused_by_a_new_job_is_not_the_old_victims_memory() {
    let mut r = Run::new();
    r.lean();
    r.nvml(0.0, 20 * GIB, &[(30, CTX)]);
    r.holder(10, 0, 100.0);
    r.nvml(200.0, 20 * GIB, &[(10, CTX + 4 * GIB), (30, CTX)]);
    r.kill(SHELL, 10, 9, 300.0);
    r.die(10, &[FILE], 300.1, 9);
    r.zombie_and_reap(10, 420.0);
    // The only riser, with a context of its own: it imported the victim's 4 GiB and holds it.
    r.nvml(425.0, 20 * GIB, &[(30, CTX + 4 * GIB)]);
    assert_eq!(verdict(r.last_of(10)), VerdictKind::Imported);
    // A new job (found as a /proc look would) exits with a file at the address the victim's
    // had; NVML lists it only during its teardown.
    r.holder(40, 0, 700.0);
    r.die(40, &[FILE], 800.0, 0);
    r.nvml(805.0, 20 * GIB, &[(30, CTX + 4 * GIB), (40, GIB)]);
    r.zombie_and_reap(40, 810.0);
    r.nvml(820.0, 19 * GIB, &[(30, CTX + 4 * GIB)]);
    r.tick(900.0);
    let inc = r.last_of(40);
    assert_eq!(verdict(inc), VerdictKind::Released, "{inc:?}");
    assert_eq!(back(inc), Some(810 * MS), "its own release, confirmed");
}

/// Two victims leave NVML's list in the same interval and one process rose by what either had:
/// without driver calls it may hold either's (or be allocating), so neither is called imported.
#[test]
fn lean_one_riser_as_two_victims_leave_together_imports_for_neither() {
    let mut r = Run::new();
    r.lean();
    r.nvml(0.0, 30 * GIB, &[(30, CTX)]);
    r.holder(10, 0, 100.0);
    r.holder(20, 1, 100.0);
    let both = [(10, CTX + 4 * GIB), (20, CTX + 4 * GIB), (30, CTX)];
    r.nvml(200.0, 30 * GIB, &both);
    r.kill(SHELL, 10, 9, 300.0);
    r.kill(SHELL, 20, 9, 300.5);
    r.die(10, &[FILE], 300.1, 9);
    r.die(20, &[FILE + 1], 300.6, 9);
    r.zombie_and_reap(10, 420.0);
    r.zombie_and_reap(20, 421.0);
    r.nvml(425.0, 30 * GIB, &[(30, CTX + 4 * GIB)]);
    r.tick(500.0);
    for pid in [10, 20] {
        let inc = r.last_of(pid);
        assert_eq!(verdict(inc), VerdictKind::Incomplete, "{inc:?}");
    }
}
