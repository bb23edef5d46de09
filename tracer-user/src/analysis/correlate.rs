//! The incident state machine. Pure: time comes only from the events (including the
//! collector's ticks), so a replay of the same events yields the same incidents.

use std::collections::HashMap;

use super::{
    holders::{FileId, Holders},
    incident::{
        Action, Delivery, ExitStatus, GpuImpact, Incident, Outcome, ReapHow, Reaper, Sender,
        Target, ThreadExit,
    },
    ledger::Ledger,
    signals::{self, Origin, SIGCHLD, SIGKILL},
};
use crate::event::{Event, EventData, NvmlGpu};

const SIGSTOP: u32 = 19;
/// TRACE_SIGNAL_IGNORED: the kernel discarded the signal at generation.
const RESULT_IGNORED: i32 = 1;

#[derive(Clone, Debug)]
pub struct CorrelatorConfig {
    /// Only incidents whose target has one of these pids (empty: all).
    pub pids: Vec<u32>,
    /// Only incidents whose target has one of these comms (empty: all).
    pub comms: Vec<String>,
    /// A process that received a catchable signal and is alive this long after it survived.
    pub survive_after_ns: u64,
    /// A dead process not reaped this long after its group died is reported without a reap.
    pub reap_wait_ns: u64,
    /// GPU memory not back this long after the group died is reported as lingering.
    pub linger_after_ns: u64,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        Self {
            pids: Vec::new(),
            comms: Vec::new(),
            survive_after_ns: 1_000_000_000,
            reap_wait_ns: 5_000_000_000,
            linger_after_ns: 30_000_000_000,
        }
    }
}

#[derive(Default)]
pub struct Correlator {
    config: CorrelatorConfig,
    open: HashMap<u32, Incident>,
    next_id: u64,
    now_ns: u64,
    holders: Holders,
    ledger: Ledger,
    /// The latest NVML reading; None until one arrives (no NVML on this machine).
    nvml: Option<Vec<NvmlGpu>>,
}

impl Correlator {
    pub fn new(config: CorrelatorConfig) -> Self {
        Self {
            config,
            ..Default::default()
        }
    }

    /// Feeds one event; incidents it closes are appended to `closed`.
    pub fn on_event(&mut self, e: &Event, closed: &mut Vec<Incident>) {
        self.now_ns = self.now_ns.max(e.ts_ns);
        self.holders.on_event(e);
        self.ledger.on_event(e);
        match &e.data {
            EventData::SignalGenerate {
                sig,
                code,
                result,
                target_pid,
                target_threads,
                sender_comm,
                target_comm,
                ..
            } => {
                if *sig == SIGCHLD {
                    if let Some(inc) = self.open.get_mut(&e.pid) {
                        inc.t_zombie_ns.get_or_insert(e.ts_ns);
                    }
                } else if let Some(inc) = self.open.get_mut(target_pid) {
                    inc.repeats += 1;
                } else if self.wanted(*target_pid, target_comm) {
                    let inc = self.open_incident(
                        e,
                        *sig,
                        *code,
                        *target_pid,
                        *target_threads,
                        sender_comm,
                        target_comm,
                    );
                    if *result == RESULT_IGNORED {
                        // Discarded by the kernel at generation: nothing will happen.
                        closed.push(close(inc, Outcome::Survived));
                    } else {
                        self.open.insert(*target_pid, inc);
                    }
                }
            }
            EventData::SignalDeliver { sig, handler, .. } => {
                if let Some(inc) = self.open.get_mut(&e.pid) {
                    inc.deliveries.push(Delivery {
                        tid: e.tid,
                        t_ns: e.ts_ns,
                        sig: *sig,
                        action: Action::from_handler(*handler),
                    });
                }
            }
            EventData::TaskExit {
                exit_code,
                group_dead,
                ..
            } => {
                if let Some(inc) = self.open.get_mut(&e.pid) {
                    inc.exits.push(ThreadExit {
                        tid: e.tid,
                        t_ns: e.ts_ns,
                    });
                    if *group_dead {
                        inc.t_group_dead_ns = Some(e.ts_ns);
                        inc.exit = Some(ExitStatus::from_code(*exit_code));
                    }
                }
                if *group_dead {
                    self.group_died(e.pid, e.ts_ns);
                }
            }
            EventData::GpuFd { .. } | EventData::GpuCloseRange { .. } => {
                self.check_files_released(e.ts_ns);
            }
            EventData::Reap {
                reaped_pid,
                by_wait,
                comm,
            } => {
                if let Some(inc) = self.open.get_mut(reaped_pid) {
                    if inc.t_reaped_ns.is_none() {
                        inc.t_reaped_ns = Some(e.ts_ns);
                        inc.reaper = Some(if *by_wait {
                            Reaper {
                                pid: Some(e.pid),
                                comm: Some(comm.clone()),
                                how: ReapHow::Wait,
                            }
                        } else {
                            Reaper {
                                pid: None,
                                comm: None,
                                how: ReapHow::Freed,
                            }
                        });
                    }
                }
            }
            EventData::Nvml { gpus } => self.nvml_sample(e.ts_ns, gpus),
            _ => {}
        }
        self.expire(closed);
    }

    /// Closes what is still open when the stream ends.
    pub fn finish(&mut self, closed: &mut Vec<Incident>) {
        let mut rest: Vec<_> = self.open.drain().map(|(_, inc)| inc).collect();
        rest.sort_by_key(|inc| inc.id);
        for inc in rest {
            let outcome = if inc.t_group_dead_ns.is_some() {
                Outcome::Exited
            } else {
                Outcome::Pending
            };
            closed.push(close(inc, outcome));
        }
    }

    /// Whether an open incident waits for GPU memory to come back: NVML should then be read
    /// at millisecond rate.
    pub fn awaiting_gpu_memory(&self) -> bool {
        self.open.values().any(|inc| {
            inc.gpu
                .as_ref()
                .is_some_and(|g| g.t_memory_back_ns.is_none())
        })
    }

    pub fn holders(&self) -> &Holders {
        &self.holders
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn wanted(&self, pid: u32, comm: &str) -> bool {
        (self.config.pids.is_empty() || self.config.pids.contains(&pid))
            && (self.config.comms.is_empty() || self.config.comms.iter().any(|c| c == comm))
    }

    #[allow(clippy::too_many_arguments)]
    fn open_incident(
        &mut self,
        e: &Event,
        sig: u32,
        code: i32,
        target_pid: u32,
        threads: u32,
        sender_comm: &str,
        target_comm: &str,
    ) -> Incident {
        self.next_id += 1;
        let origin = signals::origin(code);
        let sender = match origin {
            Origin::User => Sender {
                pid: e.pid,
                tid: e.tid,
                comm: sender_comm.to_string(),
                context_pid: None,
            },
            Origin::Kernel | Origin::Fault => Sender {
                pid: 0,
                tid: 0,
                comm: "kernel".into(),
                context_pid: Some(e.pid),
            },
        };
        let gpu = self
            .holders
            .holds_gpu_files(target_pid)
            .then(|| self.gpu_before(target_pid));
        Incident {
            record_type: "incident",
            id: self.next_id,
            signal: sig,
            signal_name: signals::name(sig),
            origin,
            si_code: code,
            sender,
            target: Target {
                pid: target_pid,
                comm: target_comm.to_string(),
                threads,
            },
            t_signal_ns: e.ts_ns,
            repeats: 0,
            deliveries: Vec::new(),
            exits: Vec::new(),
            t_group_dead_ns: None,
            exit: None,
            t_zombie_ns: None,
            t_reaped_ns: None,
            reaper: None,
            outcome: Outcome::Pending,
            gpu,
            holders: Vec::new(),
        }
    }

    /// What NVML said about `pid` just before the signal.
    fn gpu_before(&self, pid: u32) -> GpuImpact {
        let (bytes_nvml, used_before) = match &self.nvml {
            Some(gpus) => {
                let mine: Vec<&NvmlGpu> = gpus
                    .iter()
                    .filter(|g| g.processes.iter().any(|p| p.pid == pid))
                    .collect();
                let bytes = mine
                    .iter()
                    .flat_map(|g| g.processes.iter().filter(|p| p.pid == pid))
                    .filter_map(|p| p.used)
                    .sum();
                let used = mine.iter().map(|g| g.used).sum();
                (Some(bytes), (!mine.is_empty()).then_some(used))
            }
            None => (None, None),
        };
        GpuImpact {
            bytes_ledger: 0,
            ledger: Default::default(),
            classes: Vec::new(),
            bytes_nvml,
            nvml_used_before: used_before,
            t_memory_back_ns: None,
            t_files_released_ns: None,
            files: Vec::new(),
        }
    }

    /// A thread group died: what it held, who else holds it, and what is released.
    fn group_died(&mut self, pid: u32, t_ns: u64) {
        let held = self.holders.group_died(pid);
        let files = unique_files(held.iter().map(|h| h.file));
        if let Some(inc) = self.open.get_mut(&pid) {
            if !held.is_empty() {
                let gpu = inc.gpu.get_or_insert_with(|| GpuImpact {
                    bytes_ledger: 0,
                    ledger: Default::default(),
                    classes: Vec::new(),
                    bytes_nvml: None,
                    nvml_used_before: None,
                    t_memory_back_ns: None,
                    t_files_released_ns: None,
                    files: Vec::new(),
                });
                gpu.ledger = self.ledger.bytes(&files);
                gpu.bytes_ledger = gpu.ledger.video;
                gpu.classes = self.ledger.classes(&files);
                gpu.files = held;
                inc.holders = self.holders.holders_of(&files, pid);
            }
        }
        // Files nobody else holds die with this process, whether or not it had an incident.
        let orphaned: Vec<FileId> = files
            .into_iter()
            .filter(|f| self.holders.holders_of(&[*f], pid).is_empty())
            .collect();
        self.ledger.release_files(&orphaned);
        self.check_files_released(t_ns);
    }

    /// Marks incidents whose dead target's files no longer have any holder.
    fn check_files_released(&mut self, t_ns: u64) {
        for inc in self.open.values_mut() {
            let pid = inc.target.pid;
            let Some(gpu) = inc.gpu.as_mut() else {
                continue;
            };
            if inc.t_group_dead_ns.is_none() || gpu.t_files_released_ns.is_some() {
                continue;
            }
            let files = unique_files(gpu.files.iter().map(|h| h.file));
            if self.holders.holders_of(&files, pid).is_empty() {
                gpu.t_files_released_ns = Some(t_ns);
                self.ledger.release_files(&files);
            }
        }
    }

    fn nvml_sample(&mut self, t_ns: u64, gpus: &[NvmlGpu]) {
        for inc in self.open.values_mut() {
            let pid = inc.target.pid;
            let Some(gpu) = inc.gpu.as_mut() else {
                continue;
            };
            // Back once NVML no longer accounts any memory to the pid it listed before.
            let listed = gpus
                .iter()
                .any(|g| g.processes.iter().any(|p| p.pid == pid));
            if inc.t_group_dead_ns.is_some()
                && gpu.t_memory_back_ns.is_none()
                && gpu.nvml_used_before.is_some()
                && !listed
            {
                gpu.t_memory_back_ns = Some(t_ns);
            }
        }
        self.nvml = Some(gpus.to_vec());
    }

    /// Time-based decisions: survivors, dead processes nobody reaps, memory that lingers.
    fn expire(&mut self, closed: &mut Vec<Incident>) {
        let now = self.now_ns;
        let cfg = &self.config;
        let nvml_seen = self.nvml.is_some();
        let mut done: Vec<(u32, Outcome)> = self
            .open
            .iter()
            .filter_map(|(&pid, inc)| {
                let Some(dead) = inc.t_group_dead_ns else {
                    let catchable = inc.signal != SIGKILL && inc.signal != SIGSTOP;
                    return (catchable
                        && now.saturating_sub(inc.t_signal_ns) >= cfg.survive_after_ns)
                        .then_some((pid, Outcome::Survived));
                };
                let since_death = now.saturating_sub(dead);
                let reaped = inc.t_reaped_ns.is_some() || since_death >= cfg.reap_wait_ns;
                let gpu_settled = match &inc.gpu {
                    None => true,
                    Some(g) if g.t_memory_back_ns.is_some() => true,
                    // Without NVML, the last holder going is all there is to see.
                    Some(g) if !nvml_seen || g.nvml_used_before.is_none() => {
                        g.t_files_released_ns.is_some()
                    }
                    Some(_) => false,
                };
                (reaped && (gpu_settled || since_death >= cfg.linger_after_ns))
                    .then_some((pid, Outcome::Exited))
            })
            .collect();
        done.sort_by_key(|(pid, _)| self.open[pid].id);
        for (pid, outcome) in done {
            if let Some(inc) = self.open.remove(&pid) {
                closed.push(close(inc, outcome));
            }
        }
    }
}

fn unique_files(files: impl Iterator<Item = FileId>) -> Vec<FileId> {
    let mut v: Vec<FileId> = files.collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn close(mut inc: Incident, outcome: Outcome) -> Incident {
    inc.outcome = outcome;
    inc
}
