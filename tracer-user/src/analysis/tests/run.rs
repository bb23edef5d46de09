//! The harness: feeds synthetic events to a correlator and keeps what it reported.

use crate::analysis::{
    correlate::{Correlator, CorrelatorConfig, Output},
    incident::Incident,
    verdict::VerdictKind,
};
use crate::event::{Event, EventData, FdOp, NvmlGpu, NvmlProcess};

pub(super) const MS: u64 = 1_000_000;
pub(super) const GIB: u64 = 1 << 30;
pub(super) const SHELL: u32 = 100;
pub(super) const FILE: u64 = 0xffff_8880_0000_1000;

/// Feeds events and keeps what the correlator reported.
pub(super) struct Run {
    pub(super) c: Correlator,
    pub(super) out: Vec<Output>,
}

impl Run {
    pub(super) fn new() -> Self {
        Self {
            c: Correlator::new(CorrelatorConfig {
                linger_after_ns: 10_000 * MS,
                ..Default::default()
            }),
            out: Vec::new(),
        }
    }

    pub(super) fn feed(&mut self, pid: u32, t_ms: f64, data: EventData) {
        self.feed_tid(pid, pid, t_ms, data);
    }

    pub(super) fn feed_tid(&mut self, pid: u32, tid: u32, t_ms: f64, data: EventData) {
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
    pub(super) fn lean(&mut self) {
        let strategy = crate::event::Strategy {
            lean: true,
            unseen: crate::event::LEAN_UNSEEN.map(String::from).to_vec(),
            ..Default::default()
        };
        self.feed(0, 0.0, EventData::Strategy(strategy));
    }

    /// Tracing the driver's calls (the default mode's system call tracepoints).
    pub(super) fn ioctls_traced(&mut self) {
        let strategy = crate::event::Strategy {
            hooks: vec!["tracepoint/syscalls/sys_exit_ioctl".into()],
            ..Default::default()
        };
        self.feed(0, 0.0, EventData::Strategy(strategy));
    }

    pub(super) fn tick(&mut self, t_ms: f64) {
        self.feed(0, t_ms, EventData::Tick);
    }

    /// A GPU holder: opened the device (file FILE + n) and NVML lists its allocation.
    pub(super) fn holder(&mut self, pid: u32, n: u64, t_ms: f64) {
        self.feed(pid, t_ms, fd(FdOp::Open, 3, FILE + n));
    }

    pub(super) fn kill(&mut self, sender: u32, target: u32, sig: u32, t_ms: f64) {
        self.feed(
            sender,
            t_ms,
            EventData::SignalGenerate {
                sig,
                code: 0,
                result: 0,
                group: true,
                target_exiting: false,
                target_pid: target,
                target_tid: target,
                target_threads: 2,
                sender_threads: 0,
                sender_comm: "bash".into(),
                target_comm: "python3".into(),
            },
        );
    }

    /// Group death, the held files walked first, as the kernel records them.
    pub(super) fn die(&mut self, pid: u32, files: &[u64], t_ms: f64, exit_code: u32) {
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

    /// `parent` forks `child` at `t_ms` (a copied descriptor table).
    pub(super) fn fork(&mut self, parent: u32, child: u32, t_ms: f64) {
        let data = EventData::Fork {
            child_pid: child,
            files_shared: false,
            comm: "python3".into(),
        };
        self.feed(parent, t_ms, data);
    }

    /// `pid`'s exit walk: FILE with `refcount` references.
    pub(super) fn walk(&mut self, pid: u32, refcount: u64, t_ms: f64) {
        let walk = EventData::GpuFd {
            op: FdOp::HeldAtExit,
            fd: 3,
            dev: 195 << 20,
            cloexec: false,
            truncated: false,
            file: FILE,
            refcount,
        };
        self.feed(pid, t_ms, walk);
    }

    /// `pid`'s group-dead record.
    pub(super) fn group_dead(&mut self, pid: u32, t_ms: f64, exit_code: u32) {
        let exit = EventData::TaskExit {
            exit_code,
            group_dead: true,
            comm: "python3".into(),
        };
        self.feed(pid, t_ms, exit);
    }

    /// `pid`'s group dies, its exit walk showing FILE with `refcount` references.
    pub(super) fn die_with(&mut self, pid: u32, refcount: u64, t_ms: f64, exit_code: u32) {
        self.walk(pid, refcount, t_ms);
        self.group_dead(pid, t_ms, exit_code);
    }

    /// SIGCHLD to the parent (zombie), then the parent's reap.
    pub(super) fn zombie_and_reap(&mut self, pid: u32, t_ms: f64) {
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

    pub(super) fn nvml(&mut self, t_ms: f64, used: u64, procs: &[(u32, u64)]) {
        let gpus = vec![gpu(0, used, procs)];
        self.feed(0, t_ms, EventData::Nvml { gpus });
    }

    pub(super) fn incidents(&self) -> Vec<&Incident> {
        self.out
            .iter()
            .filter_map(|o| match o {
                Output::Incident(i) => Some(&**i),
                Output::Signal(_) | Output::GpuError(_) | Output::Stuck(_) | Output::Unheld(_) => {
                    None
                }
            })
            .collect()
    }

    pub(super) fn last_of(&self, pid: u32) -> &Incident {
        self.incidents()
            .into_iter()
            .rev()
            .find(|i| i.target.pid == pid)
            .unwrap_or_else(|| panic!("no incident of {pid}: {:?}", self.out))
    }
}

/// SI_KERNEL: the kernel's own signals (a pid namespace's teardown).
pub(super) const SI_KERNEL: i32 = 0x80;

/// A SIGKILL to `target`: from `sender`'s user space, or (`kernel`) the kernel's own, sent in
/// `sender`'s context; `exiting`: the target's group had begun its exit, as the kernel says.
pub(super) fn sigkill(
    r: &mut Run,
    sender: u32,
    target: u32,
    t_ms: f64,
    kernel: bool,
    exiting: bool,
) {
    let data = EventData::SignalGenerate {
        sig: 9,
        code: if kernel { SI_KERNEL } else { 0 },
        // The kernel drops a signal to a group already exiting.
        result: i32::from(exiting),
        group: true,
        target_exiting: exiting,
        target_pid: target,
        target_tid: target,
        target_threads: 1,
        sender_threads: 0,
        sender_comm: if kernel { "python3" } else { "bash" }.into(),
        target_comm: "python3".into(),
    };
    r.feed(sender, t_ms, data);
}

pub(super) fn fd(op: FdOp, fd: i32, file: u64) -> EventData {
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

pub(super) fn verdict(i: &Incident) -> VerdictKind {
    i.verdict.as_ref().expect("a verdict").kind
}

pub(super) fn back(i: &Incident) -> Option<u64> {
    i.gpu.as_ref().and_then(|g| g.t_memory_back_ns)
}

/// GPU `index`'s part of an NVML reading: its used memory and the figures NVML lists.
pub(in crate::analysis) fn gpu(index: u32, used: u64, procs: &[(u32, u64)]) -> NvmlGpu {
    NvmlGpu {
        utilization: None,
        index,
        used,
        total: 140 * GIB,
        processes: procs
            .iter()
            .map(|&(pid, used)| NvmlProcess {
                pid,
                used: Some(used),
            })
            .collect(),
    }
}
