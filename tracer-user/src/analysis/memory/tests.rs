//! The memory book from NVML readings alone.

use super::*;
use crate::analysis::tests::run::gpu;
use crate::event::NvmlGpu;

const GIB: u64 = 1 << 30;

fn reading(used: u64, procs: &[(u32, u64)]) -> Vec<NvmlGpu> {
    vec![gpu(0, used, procs)]
}

fn own() -> Role {
    Role::Own { ledger: 0 }
}

fn feed(m: &mut MemoryBook, t: u64, r: &[NvmlGpu]) -> Vec<Change> {
    m.reading(t, r, |_, _, _| 0)
}

#[test]
fn back_only_when_the_pid_left_the_list_and_used_fell_by_its_share() {
    let mut m = MemoryBook::default();
    feed(&mut m, 0, &reading(18 * GIB, &[(10, 17 * GIB)]));
    m.start(10, 10, 0);
    m.died(10, 10, own());
    // Used fell, the pid is still listed: not back.
    assert!(feed(&mut m, 20, &reading(GIB, &[(10, 0)])).is_empty());
    let c = feed(&mut m, 30, &reading(GIB, &[]));
    assert_eq!(
        c,
        vec![Change::OwnBack {
            key: 10,
            bytes: 17 * GIB
        }]
    );
    assert_eq!(m.watch(10).and_then(Watch::back_ns), Some(30));
}

#[test]
fn another_process_allocating_at_the_same_moment_does_not_hide_the_release() {
    let mut m = MemoryBook::default();
    m.reading(
        0,
        &reading(5 * GIB, &[(10, 4 * GIB), (20, GIB)]),
        |_, _, _| 0,
    );
    m.start(10, 10, 0);
    m.died(10, 10, own());
    // As 10 leaves, 20 allocates 4 GiB: `used` does not move. The ledger saw 20 allocate
    // them, so its rise is a correction, not an import.
    let next = reading(5 * GIB, &[(20, 5 * GIB)]);
    let c = m.reading(30, &next, |pid, _, _| if pid == 20 { 4 * GIB } else { 0 });
    assert_eq!(
        c,
        vec![Change::OwnBack {
            key: 10,
            bytes: 4 * GIB
        }]
    );
}

const MS: u64 = 1_000_000;

/// Victim 10 (5 GiB by NVML) that importer 20 (0.5 GiB of its own) took 4.5 GiB of, by
/// the ledger: dead, and off NVML's list at 90 ms with only its context back.
fn exported() -> MemoryBook {
    let mut m = MemoryBook::default();
    feed(
        &mut m,
        0,
        &reading(6 * GIB, &[(10, 5 * GIB), (20, GIB / 2)]),
    );
    m.start(10, 10, 0);
    m.imported(
        10,
        20,
        Some(9 * GIB / 2),
        ImportVia::DupObject,
        vec![(2, 3)],
    );
    m.died(10, 10 * MS, own());
    let c = feed(&mut m, 90 * MS, &reading(11 * GIB / 2, &[(20, 5 * GIB)]));
    assert!(
        matches!(&c[0], Change::Imported { key: 10, residuals } if residuals[0].importer == 20)
    );
    assert_eq!(
        c[1],
        Change::OwnBack {
            key: 10,
            bytes: GIB / 2
        }
    );
    assert_eq!(m.watch(10).and_then(Watch::back_ns), None);
    m
}

/// The importer's exit is when its import came back, once a reading taken a little later
/// no longer lists it: NVML's own account follows other jobs' memory too.
#[test]
fn imported_memory_is_back_at_the_importers_release_once_nvml_no_longer_lists_it() {
    let mut m = exported();
    m.importer_exited(20, 2990 * MS);
    assert_eq!(m.imports_held_by(20), vec![]);
    // Too soon after the release to confirm it.
    let c = feed(&mut m, 2991 * MS, &reading(GIB / 2, &[]));
    assert!(c.is_empty(), "{c:?}");
    let c = feed(&mut m, 2993 * MS, &reading(GIB / 2, &[]));
    assert_eq!(
        c,
        vec![Change::ResidualBack {
            key: 10,
            importer: 20
        }]
    );
    assert_eq!(m.watch(10).and_then(Watch::back_ns), Some(2990 * MS));
    assert_eq!(m.confirmed_back(10, 100 * MS), Some(2990 * MS));
}

/// No release of the importer's seen (its records lost, say): NVML's account stands once
/// it has been alone for a while.
#[test]
fn without_the_importers_release_nvmls_account_of_an_import_stands_after_a_while() {
    let mut m = exported();
    let c = feed(&mut m, 3000 * MS, &reading(GIB / 2, &[]));
    assert!(c.is_empty(), "{c:?}");
    let c = feed(&mut m, 3499 * MS, &reading(GIB / 2, &[]));
    assert!(c.is_empty(), "{c:?}");
    feed(&mut m, 3500 * MS, &reading(GIB / 2, &[]));
    assert_eq!(m.watch(10).and_then(Watch::back_ns), Some(3000 * MS));
    assert_eq!(m.confirmed_back(10, 100 * MS), None);
}

/// An importer that frees its duplicates and lives on: back when its figure falls by them.
#[test]
fn an_importer_that_frees_what_it_imported_lets_go_when_its_figure_falls() {
    let mut m = exported();
    assert_eq!(m.imports_held_by(20), vec![(10, vec![(2, 3)])]);
    m.import_freed(10, 20, 2000 * MS);
    let c = feed(&mut m, 2003 * MS, &reading(11 * GIB / 2, &[(20, 5 * GIB)]));
    assert!(c.is_empty(), "still charged with it: {c:?}");
    feed(&mut m, 2010 * MS, &reading(GIB, &[(20, GIB / 2)]));
    assert_eq!(m.watch(10).and_then(Watch::back_ns), Some(2000 * MS));
}

/// A busy node: as the exporter leaves, another job frees as much as the importer holds,
/// so the device's used memory falls by the exporter's whole share. What the ledger saw
/// duplicated is held all the same.
#[test]
fn a_duplicate_the_ledger_saw_is_held_when_other_jobs_frees_hide_the_shortfall() {
    let mut m = MemoryBook::default();
    let before = [(10, 5 * GIB), (20, GIB / 2), (30, 9 * GIB / 2)];
    feed(&mut m, 0, &reading(11 * GIB, &before));
    m.start(10, 10, 0);
    m.imported(
        10,
        20,
        Some(9 * GIB / 2),
        ImportVia::DupObject,
        vec![(2, 3)],
    );
    m.died(10, 10 * MS, own());
    let c = feed(&mut m, 90 * MS, &reading(11 * GIB / 2, &[(20, 5 * GIB)]));
    assert!(
        matches!(&c[0], Change::Imported { key: 10, residuals }
            if residuals[0].importer == 20 && residuals[0].bytes == 9 * GIB / 2),
        "{c:?}"
    );
    assert_eq!(m.watch(10).and_then(Watch::back_ns), None);
}

#[test]
fn without_ledger_evidence_a_riser_at_the_victims_departure_is_a_suspected_importer() {
    let mut m = MemoryBook::default();
    feed(
        &mut m,
        0,
        &reading(6 * GIB, &[(10, 5 * GIB), (20, GIB / 2)]),
    );
    m.start(10, 10, 0);
    m.died(10, 10, own());
    let c = feed(&mut m, 90, &reading(11 * GIB / 2, &[(20, 5 * GIB)]));
    assert!(
        matches!(&c[0], Change::Imported { residuals, .. } if residuals[0].via == ImportVia::Nvml)
    );
    assert_eq!(m.watch(10).and_then(Watch::back_ns), None);
}

#[test]
fn a_storm_credits_victims_in_the_order_of_their_own_release() {
    let mut m = MemoryBook::default();
    feed(
        &mut m,
        0,
        &reading(4 * GIB, &[(1, GIB), (2, GIB), (3, GIB)]),
    );
    for pid in 1..=3 {
        m.start(pid as u64, pid, 0);
        m.died(pid as u64, 6, own());
    }
    m.kernel_released(2, 100);
    m.kernel_released(1, 200);
    // All three leave NVML's list at once, but only one GiB has come back.
    let c = feed(&mut m, 300, &reading(3 * GIB, &[]));
    assert_eq!(c, vec![Change::OwnBack { key: 2, bytes: GIB }]);
    let c = feed(&mut m, 400, &reading(GIB, &[]));
    assert_eq!(
        c,
        vec![
            Change::OwnBack { key: 1, bytes: GIB },
            Change::OwnBack { key: 3, bytes: GIB }
        ]
    );
}

/// Readings of two GPUs: (used, processes) for GPU0, then for GPU1.
fn two(gpu0: (u64, &[(u32, u64)]), gpu1: (u64, &[(u32, u64)])) -> Vec<NvmlGpu> {
    let mut r = reading(gpu0.0, gpu0.1);
    let mut other = reading(gpu1.0, gpu1.1);
    other[0].index = 1;
    r.append(&mut other);
    r
}

#[test]
fn memory_on_two_gpus_is_back_only_when_both_parts_are() {
    let mut m = MemoryBook::default();
    feed(
        &mut m,
        0,
        &two((5 * GIB, &[(10, 4 * GIB)]), (9 * GIB, &[(10, 8 * GIB)])),
    );
    m.start(10, 10, 0);
    m.died(10, 10, own());
    let w = m.watch(10).expect("watched");
    assert_eq!(w.share(), Some((12 * GIB, ShareFrom::Nvml)));
    assert_eq!(w.device_share(1), Some((8 * GIB, ShareFrom::Nvml)));
    // GPU0's part is back; GPU1 still lists it and holds its 8 GiB.
    let c = feed(&mut m, 30, &two((GIB, &[]), (9 * GIB, &[(10, 8 * GIB)])));
    assert_eq!(
        c,
        vec![Change::OwnBack {
            key: 10,
            bytes: 4 * GIB
        }]
    );
    let w = m.watch(10).expect("watched");
    assert_eq!(w.devices[&0].back_ns(), Some(30));
    assert_eq!(w.back_ns(), None, "GPU1's part is not back");
    assert_eq!(w.released(), 4 * GIB);
    let c = feed(&mut m, 60, &two((GIB, &[]), (GIB, &[])));
    assert_eq!(
        c,
        vec![Change::OwnBack {
            key: 10,
            bytes: 8 * GIB
        }]
    );
    assert_eq!(m.watch(10).and_then(Watch::back_ns), Some(60));
}

#[test]
fn a_death_on_gpu1_is_not_credited_with_gpu0s_frees() {
    let mut m = MemoryBook::default();
    feed(
        &mut m,
        0,
        &two((4 * GIB, &[(20, 3 * GIB)]), (9 * GIB, &[(10, 8 * GIB)])),
    );
    m.start(10, 10, 0);
    m.died(10, 10, own());
    // It leaves GPU1's list while GPU1's memory stays; another process frees 3 GiB on
    // GPU0 at the same moment.
    let c = feed(&mut m, 30, &two((GIB, &[]), (9 * GIB, &[])));
    assert!(c.is_empty(), "{c:?}");
    let w = m.watch(10).expect("watched");
    assert_eq!(w.devices.keys().copied().collect::<Vec<_>>(), [1]);
    assert_eq!(w.back_ns(), None);
    let c = feed(&mut m, 60, &two((GIB, &[]), (GIB, &[])));
    assert_eq!(
        c,
        vec![Change::OwnBack {
            key: 10,
            bytes: 8 * GIB
        }]
    );
}

/// What `--lean` sees a process do: nothing of its driver calls.
struct Lean;

impl OwnUse for Lean {
    fn taken_on(&self, _: u32, _: u64, _: u64) -> u64 {
        0
    }

    fn new_since(&self, _: u32, _: u64) -> bool {
        false
    }

    fn sees_calls(&self) -> bool {
        false
    }
}

#[test]
fn without_driver_calls_an_importers_exit_is_its_imports_return_once_a_reading_agrees() {
    let mut m = MemoryBook::default();
    m.reading(0, &reading(6 * GIB, &[(10, 5 * GIB), (20, GIB / 2)]), Lean);
    m.start(10, 10, 0);
    m.died(10, 10, own());
    let c = m.reading(90 * MS, &reading(11 * GIB / 2, &[(20, 5 * GIB)]), Lean);
    assert!(
        matches!(&c[0], Change::Imported { residuals, .. } if residuals[0].via == ImportVia::Nvml),
        "{c:?}"
    );
    m.importer_exited(20, 500 * MS);
    // NVML still lists it, then a reading too soon after its exit: not yet.
    m.reading(499 * MS, &reading(11 * GIB / 2, &[(20, 5 * GIB)]), Lean);
    m.reading(501 * MS, &reading(GIB, &[]), Lean);
    let back = |m: &MemoryBook| m.watch(10).and_then(|w| w.residuals().next()?.back_ns);
    assert_eq!(back(&m), None);
    // A reading taken later no longer lists it: back at its exit, not at the reading.
    m.reading(700 * MS, &reading(GIB, &[]), Lean);
    assert_eq!(back(&m), Some(500 * MS));
}
