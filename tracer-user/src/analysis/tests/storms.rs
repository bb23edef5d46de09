//! Kill storms: per-event work follows what the event touches.

use crate::analysis::verdict::VerdictKind;

use super::run::{back, verdict, Run, FILE, GIB, MS, SHELL};

/// A kill storm under `--lean` (or the libraries' uprobes): every victim is watched in case
/// NVML lists it, and NVML is read every millisecond meanwhile. A reading concerns the cases
/// it lists, not the hundreds of others waiting for their reap: a pass over all of them after
/// each reading was most of the collector's work on the H200.
#[test]
fn a_reading_wakes_only_the_cases_it_lists() {
    let mut r = Run::new();
    r.lean();
    r.nvml(0.0, GIB / 2, &[]);
    let victims = 1000..1300u32;
    for (i, pid) in victims.clone().enumerate() {
        let t = 1.0 + i as f64 * 0.01;
        r.kill(SHELL, pid, 9, t);
        r.die(pid, &[], t + 0.005, 9);
    }
    // Every victim is dead and unreaped: nothing to decide until its reap or the reap wait.
    let before = r.c.agenda.taken;
    for n in 0..100 {
        r.nvml(10.0 + n as f64, GIB / 2, &[]);
    }
    let looked = r.c.agenda.taken - before;
    assert!(looked < 100, "{looked} cases looked at over 100 readings");
    // One of them turns out to have had GPU memory: that reading wakes it.
    r.nvml(111.0, 5 * GIB / 2, &[(1100, 2 * GIB)]);
    r.nvml(240.0, GIB / 2, &[]);
    for pid in victims {
        r.zombie_and_reap(pid, 241.0);
    }
    r.tick(300.0);
    let inc = r.last_of(1100);
    assert_eq!(verdict(inc), VerdictKind::Released);
    assert_eq!(back(inc), Some(240 * MS));
    assert!(r.last_of(1101).gpu.is_none(), "{:?}", r.last_of(1101).gpu);
}

/// Per-event work follows what the event touches, not how many GPU cases are open: 200 dead
/// victims whose memory NVML still lists stay open, and events that concern none of them
/// (the collector's ticks, readings that change nothing) look at none of them.
#[test]
fn events_that_touch_no_open_gpu_case_look_at_none() {
    let mut r = Run::new();
    r.ioctls_traced();
    let victims = 1000..1200u32;
    let listed: Vec<(u32, u64)> = victims.clone().map(|pid| (pid, GIB)).collect();
    r.nvml(0.0, 200 * GIB, &listed);
    for (i, pid) in victims.clone().enumerate() {
        let t = 1.0 + i as f64 * 0.01;
        r.holder(pid, i as u64, t);
        r.kill(SHELL, pid, 9, t);
        r.die(pid, &[FILE + i as u64], t + 0.005, 9);
    }
    r.nvml(5.0, 200 * GIB, &listed);
    let before = r.c.agenda.taken;
    for n in 0..1000 {
        let t = 10.0 + n as f64 * 0.03;
        r.tick(t);
        if n % 50 == 0 {
            r.nvml(t, 200 * GIB, &listed);
        }
    }
    let looked = r.c.agenda.taken - before;
    assert!(
        looked < 100,
        "{looked} cases looked at over 1000 ticks and 20 readings"
    );
    // A reading that no longer lists one of them wakes that one.
    let fewer: Vec<(u32, u64)> = listed.iter().copied().filter(|p| p.0 != 1100).collect();
    let before = r.c.agenda.taken;
    r.nvml(45.0, 199 * GIB, &fewer);
    assert_eq!(r.c.agenda.taken - before, 1);
}
