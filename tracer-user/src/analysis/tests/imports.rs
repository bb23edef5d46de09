//! Memory another process imported: held while it holds it, and who it is.

use crate::analysis::{holders::How, incident::Source, verdict::VerdictKind};
use crate::event::EventData;

use super::run::{back, verdict, Run, FILE, GIB, SHELL};

/// Imported memory is never called back while the importer holds it, whatever NVML's figures
/// do; it is back at the importer's own release, which a reading no longer listing it confirms.
#[test]
fn imported_memory_is_never_called_back_and_names_the_importer() {
    let mut r = Run::new();
    r.ioctls_traced();
    r.holder(10, 0, 0.0);
    r.holder(20, 1, 0.0);
    let ioctl = |h_root, h_object, h_class, ctrl_cmd, cmd, size| EventData::GpuIoctl {
        fd: 3,
        cmd,
        dev: 195 << 20,
        ret: 0,
        duration_ns: 1000,
        file: 0,
        h_root,
        h_parent: 0,
        h_object,
        h_class,
        status: 0,
        ctrl_cmd,
        size,
    };
    // 10 creates client 0xc1 through its file and allocates 4.5 GiB; 20 duplicates it.
    let mut alloc = ioctl(0xc1, 0xc1, 0x41, 0, 0xc030_462b, 0);
    if let EventData::GpuIoctl { file, .. } = &mut alloc {
        *file = FILE;
    }
    r.feed(10, 1.0, alloc);
    let mut mem = ioctl(0xc1, 0x96, 0x40, 0, 0xc030_462b, 9 * GIB / 2);
    if let EventData::GpuIoctl { file, .. } = &mut mem {
        *file = FILE;
    }
    r.feed(10, 2.0, mem);
    let mut dup = ioctl(0xc2, 0x98, 0x96, 0xc1, 0xc01c_4634, 0);
    if let EventData::GpuIoctl { file, .. } = &mut dup {
        *file = FILE + 1;
    }
    r.feed(20, 3.0, dup);
    r.nvml(900.0, 6 * GIB, &[(10, 5 * GIB), (20, GIB / 2)]);
    r.kill(SHELL, 10, 9, 1000.0);
    r.die(10, &[FILE], 1000.1, 9);
    r.nvml(1001.0, 6 * GIB, &[(10, 5 * GIB), (20, GIB / 2)]);
    // The exporter leaves the list; only its context comes back; 20 is charged the rest.
    r.nvml(1080.0, 11 * GIB / 2, &[(20, 5 * GIB)]);
    r.zombie_and_reap(10, 1081.0);
    r.tick(1200.0);
    let inc = r.last_of(10);
    assert_eq!(verdict(inc), VerdictKind::Imported);
    assert_eq!(
        back(inc),
        None,
        "never released while the importer holds it"
    );
    let importer = inc.holders.iter().find(|h| h.pid == 20).expect("importer");
    assert!(matches!(importer.how, How::Import { bytes, .. } if bytes == 9 * GIB / 2));
    // The importer exits: an update with the memory back at its release.
    r.kill(SHELL, 20, 9, 4000.0);
    r.die(20, &[FILE + 1], 4000.1, 9);
    r.nvml(4001.0, 11 * GIB / 2, &[(20, 5 * GIB)]);
    r.nvml(4130.0, GIB / 2, &[]);
    r.zombie_and_reap(20, 4131.0);
    r.tick(4132.0);
    assert_eq!(back(r.last_of(10)), None, "no reading since its release");
    r.nvml(4134.0, GIB / 2, &[]);
    r.tick(4200.0);
    let update = r.last_of(10);
    assert_eq!(update.record_type, "incident_update");
    assert_eq!(back(update), Some(4_131_000_000));
    let gpu = update.gpu.as_ref().expect("gpu");
    assert_eq!(gpu.memory_back_by, Some(Source::Confirmed));
    let importer = update
        .holders
        .iter()
        .find(|h| h.pid == 20)
        .expect("importer");
    assert_eq!(importer.t_released_ns, Some(4_131_000_000));
}

/// A successful RM escape through `file` (`ctrl` is RM_DUP_OBJECT's source client).
fn rm(cmd: u32, file: u64, root: u32, object: u32, class: u32, ctrl: u32, size: u64) -> EventData {
    EventData::GpuIoctl {
        fd: 3,
        cmd,
        dev: 195 << 20,
        ret: 0,
        duration_ns: 0,
        file,
        h_root: root,
        h_parent: root,
        h_object: object,
        h_class: class,
        status: 0,
        ctrl_cmd: ctrl,
        size,
    }
}

/// Exporter 10 (client 0xc1, 4 GiB object 0x96) whose object importer 20 duplicated (client
/// 0xc2, handle 0x98), with job 30 beside them; driver calls traced. NVML: 10 at 5 GiB, 20 at
/// 4.5 GiB (its context and the import), 30 at 4 GiB. 10 is killed at 1000 ms; at 1080 ms it
/// leaves NVML's list and the device's used memory falls by its whole share: 30's frees, which
/// NVML's per-process figures do not show yet, hide that 20 still holds 4 GiB of it.
fn exporter_gone_under_churn() -> Run {
    use tracer_common::driver::{RM_ALLOC, RM_DUP_OBJECT};
    let mut r = Run::new();
    r.ioctls_traced();
    for (pid, n) in [(10, 0), (20, 1), (30, 2)] {
        r.holder(pid, n, 0.0);
    }
    r.feed(10, 1.0, rm(RM_ALLOC, FILE, 0xc1, 0xc1, 0x41, 0, 0));
    r.feed(10, 2.0, rm(RM_ALLOC, FILE, 0xc1, 0x96, 0x40, 0, 4 * GIB));
    r.feed(20, 3.0, rm(RM_ALLOC, FILE + 1, 0xc2, 0xc2, 0x41, 0, 0));
    r.feed(
        20,
        4.0,
        rm(RM_DUP_OBJECT, FILE + 1, 0xc2, 0x98, 0x96, 0xc1, 0),
    );
    let before = [(10, 5 * GIB), (20, 9 * GIB / 2), (30, 4 * GIB)];
    r.nvml(900.0, 10 * GIB, &before);
    r.kill(SHELL, 10, 9, 1000.0);
    r.die(10, &[FILE], 1000.1, 9);
    r.nvml(1001.0, 10 * GIB, &before);
    r.nvml(1080.0, 5 * GIB, &[(20, 9 * GIB / 2), (30, 4 * GIB)]);
    r.zombie_and_reap(10, 1081.0);
    r.tick(1100.0);
    r
}

/// Issue 32: an import the ledger saw is held whatever the device's used memory did, and is
/// back at the importer's own release once a reading no longer lists it: NVML's account of
/// it, moved by other jobs, said it back early or never saw it held.
#[test]
fn an_import_the_ledger_saw_is_back_at_the_importers_release_under_churn() {
    let mut r = exporter_gone_under_churn();
    let inc = r.last_of(10);
    assert_eq!(verdict(inc), VerdictKind::Imported);
    assert_eq!(back(inc), None, "20 holds 4 GiB of it");
    let importer = inc.holders.iter().find(|h| h.pid == 20).expect("importer");
    assert!(matches!(importer.how, How::Import { bytes, .. } if bytes == 4 * GIB));
    // 30 frees meanwhile; NVML's account of 20's figure does not move: still held.
    r.nvml(2000.0, 3 * GIB, &[(20, 9 * GIB / 2)]);
    r.tick(2100.0);
    assert_eq!(back(r.last_of(10)), None);
    // The importer exits: its zombie at 3100 ms, a reading 3 ms later no longer lists it.
    r.die(20, &[FILE + 1], 3000.0, 0);
    r.nvml(3099.0, 3 * GIB, &[]);
    r.zombie_and_reap(20, 3100.0);
    r.nvml(3103.0, 3 * GIB, &[]);
    r.tick(3200.0);
    let update = r.last_of(10);
    assert_eq!(verdict(update), VerdictKind::Imported);
    assert_eq!(back(update), Some(3_100_000_000));
    let gpu = update.gpu.as_ref().expect("gpu");
    assert_eq!(gpu.memory_back_by, Some(Source::Confirmed));
    let importer = update
        .holders
        .iter()
        .find(|h| h.pid == 20)
        .expect("importer");
    assert_eq!(importer.t_released_ns, Some(3_100_000_000));
}

/// An importer that frees its duplicate and lives on lets go at the free, once NVML's figure
/// for it has fallen by what it imported.
#[test]
fn an_importer_that_frees_its_duplicate_lets_go_at_the_free() {
    use tracer_common::driver::RM_FREE;
    let mut r = exporter_gone_under_churn();
    r.feed(20, 2000.0, rm(RM_FREE, FILE + 1, 0xc2, 0x98, 0, 0, 0));
    r.nvml(2001.0, 5 * GIB, &[(20, 9 * GIB / 2), (30, 4 * GIB)]);
    r.tick(2002.0);
    assert_eq!(back(r.last_of(10)), None, "too soon to confirm");
    r.nvml(2005.0, GIB, &[(20, GIB / 2)]);
    r.tick(2100.0);
    let update = r.last_of(10);
    assert_eq!(back(update), Some(2_000_000_000));
    let gpu = update.gpu.as_ref().expect("gpu");
    assert_eq!(gpu.memory_back_by, Some(Source::Confirmed));
}

/// Victim 10 (4 GiB) killed while job 30 (client 0xc3, 1 GiB so far) allocates 4 GiB: at
/// 1080 ms 10 leaves NVML's list, 30's figure rises by 4 GiB and used memory stays put. The
/// record of 30's allocation (made at 1060 ms) has not arrived yet.
fn victim_beside_an_allocating_job() -> Run {
    use tracer_common::driver::RM_ALLOC;
    let mut r = Run::new();
    r.ioctls_traced();
    r.holder(10, 0, 0.0);
    r.holder(30, 2, 0.0);
    r.feed(30, 5.0, rm(RM_ALLOC, FILE + 2, 0xc3, 0xc3, 0x41, 0, 0));
    r.nvml(900.0, 5 * GIB + GIB / 2, &[(10, 4 * GIB), (30, GIB)]);
    r.kill(SHELL, 10, 9, 1000.0);
    r.die(10, &[FILE], 1000.1, 9);
    r.nvml(1001.0, 5 * GIB + GIB / 2, &[(10, 4 * GIB), (30, GIB)]);
    r.nvml(1080.0, 5 * GIB + GIB / 2, &[(30, 5 * GIB)]);
    r.zombie_and_reap(10, 1081.0);
    r.nvml(1084.0, 5 * GIB + GIB / 2, &[(30, 5 * GIB)]);
    r.tick(1100.0);
    r
}

/// Issue 32: a job whose figure rose as the victim left, because it allocated, is not an
/// importer, though the record of its allocation came after the reading; and nothing is
/// reported as imported while its records may still be on their way.
#[test]
fn a_rise_the_risers_late_allocation_record_explains_is_no_import() {
    use tracer_common::driver::RM_ALLOC;
    let mut r = victim_beside_an_allocating_job();
    assert!(
        r.incidents().iter().all(|i| i.target.pid != 10),
        "{:?}",
        r.out
    );
    r.feed(
        30,
        1060.0,
        rm(RM_ALLOC, FILE + 2, 0xc3, 0x99, 0x40, 0, 4 * GIB),
    );
    r.nvml(1160.0, 5 * GIB + GIB / 2, &[(30, 5 * GIB)]);
    r.tick(1200.0);
    assert!(r
        .incidents()
        .iter()
        .filter(|i| i.target.pid == 10)
        .all(|i| verdict(i) == VerdictKind::Released && i.holders.is_empty()));
    let inc = r.last_of(10);
    let at = back(inc).expect("back");
    assert!((1_080_000_000..=1_081_000_000).contains(&at), "{at}");
}

/// A process linger first saw open a GPU file after the victim died is a new job, not an
/// importer of the victim's memory, allocation records or not.
#[test]
fn a_new_job_listed_as_the_victim_leaves_is_no_importer() {
    let mut r = Run::new();
    r.ioctls_traced();
    r.holder(10, 0, 0.0);
    r.nvml(900.0, 4 * GIB + GIB / 2, &[(10, 4 * GIB)]);
    r.kill(SHELL, 10, 9, 1000.0);
    r.die(10, &[FILE], 1000.1, 9);
    r.nvml(1001.0, 4 * GIB + GIB / 2, &[(10, 4 * GIB)]);
    r.holder(30, 2, 1050.0);
    r.nvml(1080.0, 4 * GIB + GIB / 2, &[(30, 4 * GIB)]);
    r.zombie_and_reap(10, 1081.0);
    r.nvml(1084.0, 4 * GIB + GIB / 2, &[(30, 4 * GIB)]);
    r.tick(1100.0);
    let inc = r.last_of(10);
    assert_eq!(verdict(inc), VerdictKind::Released);
    assert!(inc.holders.is_empty());
    assert_eq!(back(inc), Some(1_081_000_000));
    let gpu = inc.gpu.as_ref().expect("gpu");
    assert_eq!(gpu.memory_back_by, Some(Source::Confirmed));
}

/// A rise nothing the process did explains, once its records had time to arrive: NVML says
/// it took the memory, its traced driver calls say it imported nothing. The verdict says the
/// sources disagree rather than name an importer.
#[test]
fn a_rise_nothing_explains_is_incomplete_where_the_risers_calls_are_traced() {
    let mut r = victim_beside_an_allocating_job();
    r.nvml(1400.0, 5 * GIB + GIB / 2, &[(30, 5 * GIB)]);
    r.tick(1450.0);
    assert!(
        r.incidents().iter().all(|i| i.target.pid != 10),
        "{:?}",
        r.out
    );
    r.nvml(1590.0, 5 * GIB + GIB / 2, &[(30, 5 * GIB)]);
    r.tick(1600.0);
    let inc = r.last_of(10);
    assert_eq!(verdict(inc), VerdictKind::Incomplete);
    let evidence = &inc.verdict.as_ref().expect("verdict").evidence;
    assert!(
        evidence[0].contains("NVML and the driver calls disagree"),
        "{evidence:?}"
    );
    let importer = inc.holders.iter().find(|h| h.pid == 30).expect("suspect");
    assert!(matches!(
        importer.how,
        How::Import {
            via: crate::analysis::memory::ImportVia::Nvml,
            ..
        }
    ));
}

/// Where the riser's driver calls are not seen (it opened the device outside the libraries
/// hooked), NVML's word stands: an import NVML alone suggests.
#[test]
fn a_rise_of_a_process_whose_calls_are_unseen_stands_as_an_nvml_import() {
    let mut r = Run::new();
    r.ioctls_traced();
    r.holder(10, 0, 0.0);
    r.nvml(900.0, 5 * GIB + GIB / 2, &[(10, 4 * GIB), (30, GIB)]);
    r.kill(SHELL, 10, 9, 1000.0);
    r.die(10, &[FILE], 1000.1, 9);
    r.nvml(1001.0, 5 * GIB + GIB / 2, &[(10, 4 * GIB), (30, GIB)]);
    r.nvml(1080.0, 5 * GIB + GIB / 2, &[(30, 5 * GIB)]);
    r.zombie_and_reap(10, 1081.0);
    r.nvml(1590.0, 5 * GIB + GIB / 2, &[(30, 5 * GIB)]);
    r.tick(1600.0);
    let inc = r.last_of(10);
    assert_eq!(verdict(inc), VerdictKind::Imported);
    assert!(inc.holders.iter().any(|h| h.pid == 30));
}
