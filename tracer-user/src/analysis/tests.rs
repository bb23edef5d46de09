//! The state machine and its verdicts from synthetic event sequences, shaped like the kill
//! situations seen on the H200 (no root, no kernel): one test per way the answer went wrong.

use super::{
    correlate::{Correlator, CorrelatorConfig, Output},
    holders::How,
    incident::{Incident, Source},
    termination::Mode,
    verdict::VerdictKind,
};
use crate::event::{Event, EventData, FdOp, LossKind, NvmlGpu, NvmlProcess, ProcInfo, SampleKind};

const MS: u64 = 1_000_000;
const GIB: u64 = 1 << 30;
const SHELL: u32 = 100;
const FILE: u64 = 0xffff_8880_0000_1000;

/// Feeds events and keeps what the correlator reported.
struct Run {
    c: Correlator,
    out: Vec<Output>,
}

impl Run {
    fn new() -> Self {
        Self {
            c: Correlator::new(CorrelatorConfig {
                linger_after_ns: 10_000 * MS,
                ..Default::default()
            }),
            out: Vec::new(),
        }
    }

    fn feed(&mut self, pid: u32, t_ms: f64, data: EventData) {
        self.feed_tid(pid, pid, t_ms, data);
    }

    fn feed_tid(&mut self, pid: u32, tid: u32, t_ms: f64, data: EventData) {
        let e = Event {
            ts_ns: (t_ms * MS as f64) as u64,
            cpu: 0,
            pid,
            tid,
            data,
        };
        self.c.on_event(&e, &mut self.out);
    }

    /// Tracing under `--lean`: opens are not seen, so any process may hold GPU files.
    fn lean(&mut self) {
        let strategy = crate::event::Strategy {
            lean: true,
            unseen: crate::event::LEAN_UNSEEN.map(String::from).to_vec(),
            ..Default::default()
        };
        self.feed(0, 0.0, EventData::Strategy(strategy));
    }

    /// Tracing the driver's calls (the default mode's system call tracepoints).
    fn ioctls_traced(&mut self) {
        let strategy = crate::event::Strategy {
            hooks: vec!["tracepoint/syscalls/sys_exit_ioctl".into()],
            ..Default::default()
        };
        self.feed(0, 0.0, EventData::Strategy(strategy));
    }

    fn tick(&mut self, t_ms: f64) {
        self.feed(0, t_ms, EventData::Tick);
    }

    /// A GPU holder: opened the device (file FILE + n) and NVML lists its allocation.
    fn holder(&mut self, pid: u32, n: u64, t_ms: f64) {
        self.feed(pid, t_ms, fd(FdOp::Open, 3, FILE + n));
    }

    fn kill(&mut self, sender: u32, target: u32, sig: u32, t_ms: f64) {
        self.feed(
            sender,
            t_ms,
            EventData::SignalGenerate {
                sig,
                code: 0,
                result: 0,
                group: true,
                target_pid: target,
                target_tid: target,
                target_threads: 2,
                sender_comm: "bash".into(),
                target_comm: "python3".into(),
            },
        );
    }

    /// Group death, the held files walked first, as the kernel records them.
    fn die(&mut self, pid: u32, files: &[u64], t_ms: f64, exit_code: u32) {
        for (i, f) in files.iter().enumerate() {
            self.feed(pid, t_ms, fd(FdOp::HeldAtExit, 3 + i as i32, *f));
        }
        self.feed(
            pid,
            t_ms,
            EventData::TaskExit {
                exit_code,
                group_dead: true,
                comm: "python3".into(),
            },
        );
    }

    /// SIGCHLD to the parent (zombie), then the parent's reap.
    fn zombie_and_reap(&mut self, pid: u32, t_ms: f64) {
        self.kill(pid, SHELL, 17, t_ms);
        self.feed(
            SHELL,
            t_ms + 0.05,
            EventData::Reap {
                reaped_pid: pid,
                by_wait: true,
                comm: "bash".into(),
            },
        );
    }

    fn nvml(&mut self, t_ms: f64, used: u64, procs: &[(u32, u64)]) {
        let gpus = vec![NvmlGpu {
            index: 0,
            used,
            total: 140 * GIB,
            processes: procs
                .iter()
                .map(|&(pid, used)| NvmlProcess {
                    pid,
                    used: Some(used),
                })
                .collect(),
        }];
        self.feed(0, t_ms, EventData::Nvml { gpus });
    }

    fn incidents(&self) -> Vec<&Incident> {
        self.out
            .iter()
            .filter_map(|o| match o {
                Output::Incident(i) => Some(&**i),
                Output::Signal(_) | Output::GpuError(_) => None,
            })
            .collect()
    }

    fn last_of(&self, pid: u32) -> &Incident {
        self.incidents()
            .into_iter()
            .rev()
            .find(|i| i.target.pid == pid)
            .unwrap_or_else(|| panic!("no incident of {pid}: {:?}", self.out))
    }
}

fn fd(op: FdOp, fd: i32, file: u64) -> EventData {
    EventData::GpuFd {
        op,
        fd,
        dev: 195 << 20,
        cloexec: false,
        truncated: false,
        file,
        refcount: 1,
    }
}

fn verdict(i: &Incident) -> VerdictKind {
    i.verdict.as_ref().expect("a verdict").kind
}

fn back(i: &Incident) -> Option<u64> {
    i.gpu.as_ref().and_then(|g| g.t_memory_back_ns)
}

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

#[test]
fn waking_uvm_bottom_half_threads_is_not_a_deferred_close() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.nvml(1.0, 3 * GIB, &[(10, 2 * GIB)]);
    r.kill(SHELL, 10, 9, 100.0);
    r.die(10, &[FILE], 100.1, 9);
    for (t, comm) in [(110.0, "UVM GPU1 BH"), (120.0, "UVM GPU1 KC")] {
        r.feed(
            10,
            t,
            EventData::KthreadWakeup {
                kthread_tid: 77,
                owner: 10,
                comm: comm.into(),
            },
        );
    }
    r.nvml(230.0, GIB, &[]);
    r.zombie_and_reap(10, 231.0);
    r.tick(250.0);
    assert_eq!(verdict(r.last_of(10)), VerdictKind::Released);

    // UVM's deferred release queue is evidence.
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.nvml(1.0, 3 * GIB, &[(10, 2 * GIB)]);
    r.kill(SHELL, 10, 9, 100.0);
    r.die(10, &[FILE], 100.1, 9);
    r.feed(
        10,
        110.0,
        EventData::KthreadWakeup {
            kthread_tid: 78,
            owner: 10,
            comm: "UVM deferred re".into(),
        },
    );
    r.nvml(230.0, GIB, &[]);
    r.zombie_and_reap(10, 231.0);
    r.tick(250.0);
    assert_eq!(verdict(r.last_of(10)), VerdictKind::DeferredClose);
}

#[test]
fn phases_partition_the_dying_threads_time_with_lock_waits_their_own() {
    let mut r = Run::new();
    let stack = |id: i32, frames: &[&str]| EventData::Stack {
        id,
        frames: frames.iter().map(|f| f.to_string()).collect(),
    };
    r.holder(10, 0, 0.0);
    r.nvml(1.0, 3 * GIB, &[(10, 2 * GIB)]);
    r.kill(SHELL, 10, 9, 100.0);
    // Symbolized stacks follow the samples that first name them, while an incident is open.
    r.feed(
        0,
        100.0,
        stack(
            1,
            &[
                "_kgspRpcRecvPoll [nvidia]",
                "rpcRmApiFree_GSP [nvidia]",
                "rm_cleanup_file_private [nvidia]",
            ],
        ),
    );
    r.feed(
        0,
        100.0,
        stack(
            2,
            &[
                "schedule",
                "rwsem_down_write_slowpath",
                "down_write",
                "os_acquire_rwlock_write [nvidia]",
            ],
        ),
    );
    // The group-dead thread is 11; thread 12 ran in parallel (its time is not the interval's).
    r.feed_tid(
        10,
        12,
        100.05,
        EventData::TaskExit {
            exit_code: 9,
            group_dead: false,
            comm: "t".into(),
        },
    );
    r.feed(10, 100.1, fd(FdOp::HeldAtExit, 3, FILE));
    r.feed_tid(
        10,
        11,
        100.1,
        EventData::TaskExit {
            exit_code: 9,
            group_dead: true,
            comm: "t".into(),
        },
    );
    let sample = |tid, kind, stack_id, blocked_ns| EventData::TeardownSample {
        sample: kind,
        stack_id,
        owner: 10,
        tid,
        blocked_ns,
    };
    // Waiting 600 ms for another process's teardown, then 100 ms of its own.
    r.feed(10, 100.2, sample(11, SampleKind::BlockStart, 2, 0));
    r.feed(10, 700.2, sample(11, SampleKind::BlockEnd, 2, 600 * MS));
    r.feed(10, 800.2, sample(11, SampleKind::OnCpu, 1, 0));
    r.feed(10, 800.2, sample(12, SampleKind::OnCpu, 1, 0));
    r.nvml(800.5, GIB, &[]);
    r.zombie_and_reap(10, 801.0);
    r.tick(820.0);
    let inc = r.last_of(10);
    let sum: u64 = inc.phases.iter().map(|p| p.ns).sum();
    let interval = 801 * MS - 100_100_000;
    assert!(sum <= interval, "{sum} > {interval}");
    assert_eq!(inc.phases[0].name.label(), "lock wait");
    // The sleep, and the moment before it when the thread ran into the lock.
    assert!((600 * MS..=601 * MS).contains(&inc.phases[0].ns));
    let coverage = inc.phases_coverage.expect("coverage");
    assert!((0.99..=1.0).contains(&coverage), "{coverage}");
}

#[test]
fn a_stop_escalated_by_timeout_is_one_incident_with_every_signal() {
    let mut r = Run::new();
    let (timeout, cmd) = (50, 51);
    r.holder(cmd, 0, 0.0);
    r.nvml(1.0, 3 * GIB, &[(cmd, 2 * GIB)]);
    // SIGTERM to the child, to the group (timeout itself handles it), ignored by the child.
    r.kill(timeout, cmd, 15, 12_000.0);
    r.kill(timeout, timeout, 15, 12_000.1);
    r.feed(
        timeout,
        12_000.2,
        EventData::SignalDeliver {
            sig: 15,
            code: 0,
            handler: 0x4000,
            sa_flags: 0,
        },
    );
    r.tick(13_100.0);
    // Both survivors are reported at once, not after the escalation window.
    let notices = r
        .out
        .iter()
        .filter(|o| matches!(o, Output::Signal(_)))
        .count();
    assert_eq!(notices, 2);
    r.kill(timeout, cmd, 9, 14_000.0);
    r.kill(timeout, timeout, 9, 14_000.1);
    r.die(timeout, &[], 14_000.2, 9);
    r.die(cmd, &[FILE], 14_000.3, 9);
    r.nvml(14_001.0, 3 * GIB, &[(cmd, 2 * GIB)]);
    r.nvml(14_140.0, GIB, &[]);
    r.zombie_and_reap(cmd, 14_141.0);
    r.zombie_and_reap(timeout, 14_001.0);
    r.tick(14_200.0);
    let incidents: Vec<&Incident> = r
        .incidents()
        .into_iter()
        .filter(|i| i.target.pid == cmd)
        .collect();
    assert_eq!(incidents.len(), 1);
    let t = &incidents[0].termination;
    assert_eq!(t.mode, Mode::Escalated);
    assert_eq!(t.signals.len(), 2);
    assert_eq!(t.grace_ns, Some(2_000 * MS));
    assert_eq!(incidents[0].signal_name, "SIGKILL");
    // timeout killed itself with its own kill(0, SIGKILL): its own doing.
    assert_eq!(r.last_of(timeout).termination.mode, Mode::Fault);
}

#[test]
fn a_gpu_process_that_exits_on_its_own_is_an_exit_incident() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.nvml(1.0, 3 * GIB, &[(10, 2 * GIB)]);
    r.die(10, &[FILE], 500.0, 0);
    r.nvml(501.0, 3 * GIB, &[(10, 2 * GIB)]);
    r.nvml(620.0, GIB, &[]);
    r.zombie_and_reap(10, 621.0);
    r.tick(640.0);
    let inc = r.last_of(10);
    assert_eq!(inc.termination.mode, Mode::Exit);
    assert_eq!(inc.signal, 0);
    assert!(inc.sender.is_none());
    assert_eq!(
        inc.t_signal_ns,
        500 * MS,
        "an exit counts from the group's death"
    );
    assert_eq!(back(inc), Some(620 * MS));
}

#[test]
fn lingers_own_signals_are_not_incidents() {
    let mut r = Run::new();
    r.feed(0, 0.0, EventData::Collector { pid: 42 });
    r.kill(SHELL, 42, 2, 10.0);
    r.tick(5_000.0);
    let mut out = Vec::new();
    r.c.finish(&mut out);
    assert!(r.out.is_empty() && out.is_empty(), "{:?} {out:?}", r.out);
}

#[test]
fn lost_records_make_an_unconfirmed_release_incomplete() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.kill(SHELL, 10, 9, 100.0);
    r.feed(
        0,
        100.05,
        EventData::Loss {
            count: 12,
            what: LossKind::Holders,
        },
    );
    r.die(10, &[FILE], 100.1, 9);
    r.zombie_and_reap(10, 240.0);
    r.tick(300.0);
    let inc = r.last_of(10);
    assert_eq!(verdict(inc), VerdictKind::Incomplete);
    assert_eq!(inc.losses[0].what, LossKind::Holders);
}

#[test]
fn a_forked_holder_is_reported_at_once_and_updated_when_it_goes() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.feed(
        10,
        1.0,
        EventData::Fork {
            child_pid: 11,
            files_shared: false,
            comm: "python3".into(),
        },
    );
    // /proc is read after the parent died: it says ppid 1, the fork record knows better.
    r.feed(
        11,
        1.1,
        EventData::ProcInfo(ProcInfo {
            pid: 11,
            ppid: 1,
            comm: "python3".into(),
            ..Default::default()
        }),
    );
    r.nvml(2.0, 5 * GIB, &[(10, 4 * GIB)]);
    r.kill(SHELL, 10, 9, 1000.0);
    r.die(10, &[FILE], 1000.1, 9);
    r.zombie_and_reap(10, 1000.3);
    r.nvml(1001.0, 5 * GIB, &[(10, 4 * GIB)]);
    r.tick(1020.0);
    let first = r.last_of(10);
    assert_eq!(first.record_type, "incident");
    assert_eq!(verdict(first), VerdictKind::SharedFd);
    assert_eq!(first.holders[0].pid, 11);
    assert_eq!(first.holders[0].ppid, 10);
    assert!(back(first).is_none());
    // The child dies 7.8 s later: its own incident, and the parent's update.
    r.kill(SHELL, 11, 9, 8800.0);
    r.die(11, &[FILE], 8800.1, 9);
    r.nvml(8801.0, 5 * GIB, &[(10, 4 * GIB)]);
    r.nvml(8920.0, GIB, &[]);
    r.zombie_and_reap(11, 8921.0);
    r.tick(8940.0);
    let update = r.last_of(10);
    assert_eq!(update.record_type, "incident_update");
    assert_eq!(back(update), Some(8920 * MS));
    assert_eq!(update.holders[0].t_released_ns, Some(8921 * MS));
    let child = r.last_of(11);
    assert_eq!(
        back(child),
        Some(8920 * MS),
        "the child held the parent's memory"
    );
}

#[test]
fn without_nvml_the_kernel_side_release_is_the_answer_and_says_so() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.kill(SHELL, 10, 9, 100.0);
    r.die(10, &[FILE], 100.1, 9);
    r.zombie_and_reap(10, 230.0);
    r.tick(250.0);
    let gpu = r.last_of(10).gpu.clone().expect("gpu");
    assert_eq!(gpu.t_memory_back_ns, Some(230 * MS));
    assert_eq!(gpu.memory_back_by, Some(Source::Kernel));
}

#[test]
fn without_nvml_a_forked_holders_death_updates_its_parent() {
    let mut r = Run::new();
    r.holder(10, 0, 0.0);
    r.feed(
        10,
        1.0,
        EventData::Fork {
            child_pid: 11,
            files_shared: false,
            comm: "x".into(),
        },
    );
    r.feed(11, 2.0, EventData::Exec { comm: "x".into() });
    r.feed(11, 2.1, fd(FdOp::HeldAtExec, 3, FILE));
    r.kill(SHELL, 10, 9, 500.0);
    r.die(10, &[FILE], 500.1, 9);
    r.kill(10, 1, 17, 500.2);
    r.tick(600.0);
    assert_eq!(r.last_of(10).record_type, "incident");
    r.kill(SHELL, 11, 9, 900.0);
    r.die(11, &[FILE], 900.1, 9);
    r.kill(11, 1, 17, 900.2);
    r.tick(1000.0);
    let update = r.last_of(10);
    assert_eq!(update.record_type, "incident_update", "{:?}", r.out);
}

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

/// Two GPUs, instances in the other order than NVML's: NVML lists the victim on GPU0 only,
/// its ledger also saw 4 GiB on GPU1. That part is awaited on GPU1 by the ledger's figure,
/// and the incident says the sources disagreed.
#[test]
fn memory_only_the_ledger_saw_on_a_gpu_is_awaited_there() {
    use super::ledger::tests::{rm_event, CLIENT};
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
    use super::memory::NvmlNeed;
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
        let released = if traced {
            NvmlNeed::Confirm
        } else {
            NvmlNeed::Fast
        };
        assert_eq!(r.c.nvml_need(), released, "released, NVML still lists it");
        r.nvml(425.0, GIB / 2, &[]);
        r.tick(430.0);
        assert_eq!(r.c.nvml_need(), NvmlNeed::Quiet, "back");
    }
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
            via: super::memory::ImportVia::Nvml,
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

/// `--lean` on a busy GPU: the kernel's release of a victim's files, once NVML no longer lists
/// it, is its memory's return unless another process's figure rose as it left the list. One
/// riser alone is an importer; a riser among other rising processes cannot be told from a job
/// allocating (`incomplete`); a process still starting CUDA (listed at no more than the slack)
/// imports nothing.
#[test]
fn lean_on_a_busy_gpu_times_the_return_by_the_kernel_and_says_where_risers_blur_it() {
    const CTX: u64 = 518 << 20;
    const STARTING: u64 = 14 << 20;
    // (other processes' figures before and as the victim leaves the list; the verdict)
    type Figures<'a> = &'a [(u32, u64)];
    let cases: [(Figures, Figures, VerdictKind); 4] = [
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
