//! When memory is back by NVML's readings, the kernel's release and the ledger.

use crate::analysis::{
    correlate::Output, incident::Source, termination::Mode, verdict::VerdictKind,
};
use crate::event::{EventData, FdOp, LossKind, NvmlGpu, NvmlProcess};

use super::run::{back, fd, gpu, verdict, Run, FILE, GIB, MS, SHELL};

#[test]
fn a_kill_before_nvml_ever_listed_the_victim_is_timed_from_the_readings_after_it() {
    let mut r = Run::new();
    r.nvml(0.0, GIB / 2, &[]);
    // Allocated 16 GiB at 500 ms; the next idle reading would be at 1 s.
    r.holder(10, 0, 500.0);
    r.kill(SHELL, 10, 9, 700.0);
    r.die(10, &[FILE], 700.1, 9);
    r.nvml(701.0, 17 * GIB, &[(10, 16 * GIB)]);
    r.nvml(750.0, 17 * GIB, &[(10, 16 * GIB)]);
    r.nvml(839.5, GIB / 2, &[]);
    r.zombie_and_reap(10, 840.0);
    r.tick(860.0);
    let inc = r.last_of(10);
    assert_eq!(verdict(inc), VerdictKind::Released);
    assert_eq!(back(inc), Some(839_500_000));
    let gpu = inc.gpu.as_ref().expect("gpu");
    assert_eq!(gpu.memory_back_by, Some(Source::Nvml));
    assert_eq!(gpu.share_bytes, 16 * GIB);
    // Its own release of the files is the zombie transition, not the group's death.
    assert_eq!(gpu.t_files_released_ns, Some(840_000_000));
    assert_eq!(gpu.files_released_by, Some(Source::Zombie));
}

/// Two GPUs, instances in the other order than NVML's: NVML lists the victim on GPU0 only,
/// its ledger also saw 4 GiB on GPU1. That part is awaited on GPU1 by the ledger's figure,
/// and the incident says the sources disagreed.
#[test]
fn memory_only_the_ledger_saw_on_a_gpu_is_awaited_there() {
    use crate::analysis::ledger::tests::{rm_event, CLIENT};
    use crate::event::GpuInfo;
    use tracer_common::driver::{id_info_size, NV01_DEVICE_0, RM_ALLOC, RM_CONTROL};
    let mut r = Run::new();
    let info = |index: u32, pci: &str| GpuInfo {
        index,
        uuid: format!("GPU-{index}"),
        model: "H200".into(),
        pci_bus_id: pci.into(),
        minor: Some(index),
    };
    let gpus = vec![info(0, "00000000:1B:00.0"), info(1, "00000000:3B:00.0")];
    r.feed(0, 0.0, EventData::Gpus { gpus });
    r.holder(10, 0, 0.0);
    let mut rm = |t_ms: f64, cmd: u32, parent: u32, object: u32, class: u32, size: u64| {
        r.feed(10, t_ms, rm_event(cmd, parent, object, class, size));
    };
    rm(1.0, RM_ALLOC, 0, CLIENT, 0x41, 0);
    rm(1.1, RM_CONTROL, 0, CLIENT, 0x202, id_info_size(0x1b00, 1));
    rm(1.2, RM_CONTROL, 0, CLIENT, 0x202, id_info_size(0x3b00, 0));
    rm(2.0, RM_ALLOC, CLIENT, 0xd0, NV01_DEVICE_0, 1);
    rm(2.1, RM_ALLOC, CLIENT, 0xd1, NV01_DEVICE_0, 0);
    rm(3.0, RM_ALLOC, 0xd0, 0x100, 0x40, 8 * GIB);
    rm(3.1, RM_ALLOC, 0xd1, 0x101, 0x40, 4 * GIB);
    let two = |r: &mut Run, t_ms: f64, used: [u64; 2], listed: bool| {
        let gpu = |index: u32, used: u64, procs: Vec<NvmlProcess>| NvmlGpu {
            utilization: None,
            index,
            used,
            total: 140 * GIB,
            processes: procs,
        };
        let on0 = listed.then_some(NvmlProcess {
            pid: 10,
            used: Some(8 * GIB),
        });
        let gpus = vec![
            gpu(0, used[0], on0.into_iter().collect()),
            gpu(1, used[1], vec![]),
        ];
        r.feed(0, t_ms, EventData::Nvml { gpus });
    };
    two(&mut r, 100.0, [9 * GIB, 5 * GIB], true);
    r.kill(SHELL, 10, 9, 1000.0);
    r.die(10, &[FILE], 1000.1, 9);
    two(&mut r, 1001.0, [9 * GIB, 5 * GIB], true);
    // GPU0's part is back first; GPU1 still holds the 4 GiB only the ledger saw.
    two(&mut r, 1050.0, [GIB, 5 * GIB], false);
    r.zombie_and_reap(10, 1051.0);
    two(&mut r, 11_000.0, [GIB, 5 * GIB], false);
    r.tick(11_100.0);
    let inc = r.last_of(10);
    assert!(inc.lingering, "GPU1's part is not back: {inc:?}");
    assert_eq!(back(inc), None);
    let gpu = inc.gpu.as_ref().expect("gpu");
    let part = |i| gpu.gpus.iter().find(|p| p.index == Some(i)).expect("part");
    assert_eq!(part(0).bytes_ledger, Some(8 * GIB));
    assert_eq!(part(0).device_instance, Some(1));
    assert!(part(0).t_memory_back_ns.is_some());
    assert_eq!(part(1).bytes_ledger, Some(4 * GIB));
    assert_eq!(part(1).device_instance, Some(0));
    assert_eq!(
        (part(1).share_bytes, part(1).share_from),
        (4 * GIB, "ledger")
    );
    assert_eq!(gpu.share_bytes, 12 * GIB);
    assert!(
        gpu.evidence
            .iter()
            .any(|e| e.starts_with("GPU1: the ledger saw 4.0 GiB that NVML did not list")),
        "{:?}",
        gpu.evidence
    );
    two(&mut r, 11_120.0, [GIB, GIB], false);
    r.tick(11_200.0);
    let update = r.last_of(10);
    assert_eq!(back(update), Some(11_120_000_000));
}

/// A busy node: a new job, not listed by NVML yet, takes 4 GiB just as the victim's 4 GiB
/// come back, so the device's used memory never falls by the victim's share. The kernel's
/// release of its files, once NVML no longer lists it and its driver calls show no import,
/// says when it was back; while NVML still lists it, nothing does.
#[test]
fn a_return_hidden_by_another_jobs_allocation_is_the_kernels_release_nvml_confirms() {
    for traced in [true, false] {
        let mut r = Run::new();
        if traced {
            r.ioctls_traced();
        }
        r.nvml(0.0, GIB / 2, &[]);
        r.holder(10, 0, 100.0);
        r.nvml(200.0, 4 * GIB + GIB / 2, &[(10, 4 * GIB)]);
        r.kill(SHELL, 10, 9, 300.0);
        r.die(10, &[FILE], 300.1, 9);
        r.nvml(301.0, 4 * GIB + GIB / 2, &[(10, 4 * GIB)]);
        r.zombie_and_reap(10, 420.0);
        r.nvml(420.5, 4 * GIB + GIB / 2, &[(10, 4 * GIB)]);
        r.tick(421.0);
        assert!(
            r.incidents().iter().all(|i| back(i).is_none()),
            "NVML still lists it"
        );
        r.nvml(425.0, 4 * GIB + GIB / 2, &[]);
        r.tick(500.0);
        if traced {
            let inc = r.last_of(10);
            let gpu = inc.gpu.as_ref().expect("gpu");
            assert_eq!(verdict(inc), VerdictKind::Released);
            assert_eq!(back(inc), Some(420_000_000));
            assert_eq!(gpu.memory_back_by, Some(Source::Confirmed));
            assert_eq!(gpu.released_bytes, 4 * GIB);
        } else {
            // Without its driver calls an import cannot be ruled out: NVML's account alone,
            // which the other job's allocation holds up.
            assert!(
                r.incidents().iter().all(|i| back(i).is_none()),
                "{:?}",
                r.out
            );
        }
    }
}

#[test]
fn nvml_is_read_every_millisecond_only_for_a_release_it_alone_can_time() {
    use crate::analysis::memory::NvmlNeed;
    for traced in [true, false] {
        let mut r = Run::new();
        if traced {
            r.ioctls_traced();
        }
        r.nvml(0.0, GIB / 2, &[]);
        r.holder(10, 0, 100.0);
        r.nvml(200.0, 4 * GIB + GIB / 2, &[(10, 4 * GIB)]);
        assert_eq!(r.c.nvml_need(), NvmlNeed::Quiet);
        r.kill(SHELL, 10, 9, 300.0);
        r.tick(300.0);
        // Its teardown: the kernel's release will time it where its driver calls are seen.
        let tearing_down = if traced {
            NvmlNeed::Await
        } else {
            NvmlNeed::Fast
        };
        assert_eq!(r.c.nvml_need(), tearing_down);
        r.die(10, &[FILE], 300.1, 9);
        r.nvml(301.0, 4 * GIB + GIB / 2, &[(10, 4 * GIB)]);
        r.zombie_and_reap(10, 420.0);
        r.tick(420.2);
        let need = r.c.nvml_need();
        if traced {
            // Its release's time, from which the readings space out.
            assert!(
                matches!(need, NvmlNeed::Confirm(t) if t == 420 * MS),
                "{need:?}"
            );
        } else {
            assert_eq!(need, NvmlNeed::Fast, "released, NVML still lists it");
        }
        r.nvml(425.0, GIB / 2, &[]);
        r.tick(430.0);
        assert_eq!(r.c.nvml_need(), NvmlNeed::Quiet, "back");
    }
}

#[test]
fn an_exit_nvml_reads_next_at_zero_or_gone_gives_back_what_the_reading_before_showed() {
    // A busy node's NVML readings come hundreds of milliseconds apart: the one after an exit
    // may list it at 0 mid-teardown, or not at all.
    for after in [Some(0), None] {
        let mut r = Run::new();
        r.ioctls_traced();
        r.nvml(0.0, GIB / 2, &[]);
        r.holder(10, 0, 100.0);
        r.nvml(900.0, 2 * GIB, &[(10, GIB + GIB / 2)]);
        r.die(10, &[FILE], 1000.0, 0);
        r.tick(1000.0);
        let listed: Vec<(u32, u64)> = after.map(|b| (10, b)).into_iter().collect();
        r.nvml(1500.0, GIB / 2, &listed);
        r.zombie_and_reap(10, 1600.0);
        r.tick(1700.0);
        r.nvml(1800.0, GIB / 2, &[]);
        r.tick(1900.0);
        let inc = r.last_of(10);
        let gpu = inc.gpu.as_ref().expect("gpu");
        assert_eq!(inc.termination.mode, Mode::Exit);
        assert_eq!(verdict(inc), VerdictKind::Released, "{after:?}");
        assert_eq!(gpu.released_bytes, GIB + GIB / 2, "{after:?}");
        assert!(back(inc).is_some(), "{after:?}: {inc:?}");
    }
}

/// NVML fails on the victim's GPU mid-teardown: the sampler leaves that GPU out of its
/// readings (source/nvml.rs), so a run of failures is no reading of it, never an empty GPU.
/// Its memory is not back, by NVML or by the kernel's release NVML is to confirm, until NVML
/// reads that GPU again.
#[test]
fn a_failed_nvml_reading_mid_teardown_never_says_the_memory_is_back() {
    let mut r = Run::new();
    r.ioctls_traced();
    let read = |r: &mut Run, t_ms: f64, gpus: Vec<NvmlGpu>| {
        r.feed(0, t_ms, EventData::Nvml { gpus });
    };
    read(
        &mut r,
        0.0,
        vec![gpu(0, GIB / 2, &[]), gpu(1, GIB / 2, &[])],
    );
    r.holder(10, 0, 100.0);
    read(
        &mut r,
        200.0,
        vec![
            gpu(0, 4 * GIB + GIB / 2, &[(10, 4 * GIB)]),
            gpu(1, GIB / 2, &[]),
        ],
    );
    r.kill(SHELL, 10, 9, 300.0);
    r.die(10, &[FILE], 300.1, 9);
    r.zombie_and_reap(10, 420.0);
    // GPU 0 fails from here on: readings of GPU 1 alone, some with its used memory moving.
    for (i, t) in [425.0, 450.0, 500.0, 900.0].into_iter().enumerate() {
        read(&mut r, t, vec![gpu(1, GIB / 2 + i as u64 * GIB, &[])]);
        r.tick(t + 1.0);
        assert!(
            r.incidents().iter().all(|i| back(i).is_none()),
            "no reading of its GPU since its release: {:?}",
            r.out
        );
    }
    // NVML answers for GPU 0 again: the kernel's release, confirmed.
    read(
        &mut r,
        950.0,
        vec![gpu(0, GIB / 2, &[]), gpu(1, GIB / 2, &[])],
    );
    r.tick(1000.0);
    let inc = r.last_of(10);
    assert_eq!(back(inc), Some(420_000_000));
    assert_eq!(verdict(inc), VerdictKind::Released);
}

/// What the busy-with-no-holder record says of who holds it, after a minute of a GPU with
/// memory in use and nothing listed, following `before` (a run's start).
fn holder_said(before: impl FnOnce(&mut Run)) -> Vec<(&'static str, Option<&'static str>)> {
    let mut r = Run::new();
    before(&mut r);
    for s in 0..=61 {
        r.nvml(f64::from(s) * 1000.0, 3 * GIB, &[]);
    }
    r.out
        .iter()
        .filter_map(|o| match o {
            Output::Unheld(u) => Some((u.holder, u.holder_view)),
            _ => None,
        })
        .collect()
}

/// Where linger may have missed a holder (records that may name one lost, opens untraced, a
/// process whose descriptors /proc would not list, alive) the record says "unknown", not
/// "nobody" with a reset; a process /proc would not list that died since does not count.
#[test]
fn a_gpu_busy_with_no_holder_known_says_unknown_where_one_may_have_been_missed() {
    let loss = |what| EventData::Loss {
        count: 1,
        what,
        period_ns: 1,
    };
    let unknown = |r: &[(&str, Option<&str>)]| r.len() == 1 && r[0].0 == "unknown";
    assert_eq!(holder_said(|_| {}), [("nobody", None)]);
    assert!(unknown(&holder_said(|r| r.feed(
        0,
        0.0,
        loss(LossKind::Holders)
    ))));
    assert!(unknown(&holder_said(|r| r.feed(
        0,
        0.0,
        loss(LossKind::Ring)
    ))));
    assert!(unknown(&holder_said(Run::lean)));
    let unreadable = EventData::FdsUnreadable { holder: 40 };
    assert!(unknown(&holder_said(|r| r.feed(
        0,
        0.0,
        unreadable.clone()
    ))));
    // A loss of stack samples hides no holder; an unreadable process that died is no holder.
    assert_eq!(
        holder_said(|r| r.feed(0, 0.0, loss(LossKind::Stacks))),
        [("nobody", None)]
    );
    assert_eq!(
        holder_said(|r| {
            r.feed(0, 0.0, unreadable);
            r.die(40, &[], 1.0, 9);
        }),
        [("nobody", None)]
    );
}

/// A GPU whose memory stays in use with no process listed and nobody holding its files is a
/// `busy_no_holder` after a minute; one a process holds the file of is not.
#[test]
fn a_gpu_busy_with_no_holder_for_a_minute_is_reported_unless_someone_holds_its_file() {
    let unheld = |r: &Run| -> Vec<(bool, u64)> {
        r.out
            .iter()
            .filter_map(|o| match o {
                Output::Unheld(u) => Some((u.cleared, u.used_bytes)),
                _ => None,
            })
            .collect()
    };
    let mut r = Run::new();
    for s in 0..=61 {
        r.nvml(f64::from(s) * 1000.0, 3 * GIB, &[]);
    }
    r.nvml(62_000.0, 0, &[]);
    assert_eq!(unheld(&r), vec![(false, 3 * GIB), (true, 3 * GIB)]);

    let mut r = Run::new();
    r.feed(7, 0.0, fd(FdOp::Open, 3, FILE));
    for s in 0..=61 {
        r.nvml(f64::from(s) * 1000.0, 3 * GIB, &[]);
    }
    assert_eq!(unheld(&r), vec![]);
}
