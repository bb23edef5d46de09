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
    teardown::{DriverSpan, TeardownLog},
    verdict,
};
use crate::event::{Event, EventData, NvmlGpu};

const SIGSTOP: u32 = 19;
/// TRACE_SIGNAL_IGNORED: the kernel discarded the signal at generation.
const RESULT_IGNORED: i32 = 1;

/// Stored in trace files (as the replay's defaults), so it serializes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CorrelatorConfig {
    /// Only incidents whose target has one of these pids (empty: all).
    pub pids: Vec<u32>,
    /// Only incidents whose target has one of these comms (empty: all).
    pub comms: Vec<String>,
    /// A process that received a catchable signal and is alive this long after it survived.
    pub survive_after_ns: u64,
    /// A dead process not reaped this long after its group died is reported without a reap.
    pub reap_wait_ns: u64,
    /// GPU memory not back this long after the group died is reported as lingering (and a
    /// SIGKILLed process not dead by then as stuck).
    pub linger_after_ns: u64,
    /// A teardown longer than this is `slow_teardown`.
    pub slow_after_ns: u64,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        Self {
            pids: Vec::new(),
            comms: Vec::new(),
            survive_after_ns: 1_000_000_000,
            reap_wait_ns: 5_000_000_000,
            linger_after_ns: 30_000_000_000,
            slow_after_ns: 1_000_000_000,
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
    /// Symbolized kernel stacks by id.
    stacks: HashMap<i32, Vec<String>>,
    /// Teardown samples by dying process.
    teardown: HashMap<u32, TeardownLog>,
    /// Incidents reported while their memory lingered, watched until it comes back.
    lingering: HashMap<u32, Incident>,
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
                        closed.push(self.finalize(inc, Outcome::Survived));
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
            EventData::DriverCall {
                func,
                exit: true,
                file,
                duration_ns,
                ..
            } if *duration_ns > 0 => {
                // The dying process's own thread, or a driver worker closing one of its files.
                let owner = if self.teardown.contains_key(&e.pid) || self.open.contains_key(&e.pid)
                {
                    Some(e.pid)
                } else {
                    self.open
                        .values()
                        .find(|inc| {
                            inc.gpu
                                .as_ref()
                                .is_some_and(|g| g.files.iter().any(|h| h.file == *file))
                        })
                        .map(|inc| inc.target.pid)
                };
                if let Some(owner) = owner {
                    self.teardown
                        .entry(owner)
                        .or_default()
                        .calls
                        .push(DriverSpan {
                            func: *func,
                            start_ns: e.ts_ns.saturating_sub(*duration_ns),
                            end_ns: e.ts_ns,
                        });
                }
            }
            EventData::Stack { id, frames } => {
                self.stacks.insert(*id, frames.clone());
            }
            EventData::TeardownSample {
                sample,
                stack_id,
                owner,
                tid,
                blocked_ns,
            } => self.teardown.entry(*owner).or_default().sample(
                e.ts_ns,
                *tid,
                *sample,
                *stack_id,
                *blocked_ns,
            ),
            EventData::KthreadWakeup {
                kthread_tid,
                owner,
                comm,
            } => self.teardown.entry(*owner).or_default().wakeups.push((
                e.ts_ns,
                *kthread_tid,
                comm.clone(),
            )),
            _ => {}
        }
        self.expire(closed);
        self.watch_lingering(closed);
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
            closed.push(self.finalize(inc, outcome));
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
            phases: Vec::new(),
            release: None,
            verdict: None,
            collateral: Vec::new(),
            teardown_stacks: Vec::new(),
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
            bytes_nvml,
            nvml_used_before: used_before,
            ..Default::default()
        }
    }

    /// A thread group died: what it held, who else holds it, and what is released.
    fn group_died(&mut self, pid: u32, t_ns: u64) {
        let held = self.holders.group_died(pid);
        let files = unique_files(held.iter().map(|h| h.file));
        if let Some(inc) = self.open.get_mut(&pid) {
            if !held.is_empty() {
                let gpu = inc.gpu.get_or_insert_with(GpuImpact::default);
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
                    let waited = now.saturating_sub(inc.t_signal_ns);
                    if catchable && waited >= cfg.survive_after_ns {
                        return Some((pid, Outcome::Survived));
                    }
                    // A SIGKILLed process still alive this long is stuck: say so now.
                    return (!catchable && waited >= cfg.linger_after_ns)
                        .then_some((pid, Outcome::Pending));
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
                let inc = self.finalize(inc, outcome);
                let lingers = inc.gpu.as_ref().is_some_and(|g| {
                    g.t_memory_back_ns.is_none() && g.t_files_released_ns.is_none()
                });
                if lingers && inc.t_group_dead_ns.is_some() {
                    self.lingering.insert(pid, inc.clone());
                }
                closed.push(inc);
            }
        }
    }

    /// Reported-as-lingering incidents whose memory came back: an `incident_update`.
    fn watch_lingering(&mut self, closed: &mut Vec<Incident>) {
        if self.lingering.is_empty() {
            return;
        }
        let now = self.now_ns;
        let nvml = &self.nvml;
        let listed = |pid: u32| {
            nvml.as_ref().is_some_and(|gpus| {
                gpus.iter()
                    .any(|g| g.processes.iter().any(|p| p.pid == pid))
            })
        };
        let mut back: Vec<u32> = Vec::new();
        for (&pid, inc) in self.lingering.iter_mut() {
            let Some(gpu) = inc.gpu.as_mut() else {
                continue;
            };
            let files = unique_files(gpu.files.iter().map(|h| h.file));
            if gpu.t_files_released_ns.is_none() && self.holders.holders_of(&files, pid).is_empty()
            {
                gpu.t_files_released_ns = Some(now);
            }
            let nvml_knows = gpu.nvml_used_before.is_some() && nvml.is_some();
            if nvml_knows && !listed(pid) {
                gpu.t_memory_back_ns = Some(now);
            }
            if gpu.t_memory_back_ns.is_some() || (!nvml_knows && gpu.t_files_released_ns.is_some())
            {
                back.push(pid);
            }
        }
        back.sort_unstable();
        for pid in back {
            if let Some(mut inc) = self.lingering.remove(&pid) {
                inc.record_type = "incident_update";
                // Allocations refused while it lingered, up to its release.
                inc.collateral = self.ledger.refused_others(pid, inc.t_signal_ns, now);
                closed.push(inc);
            }
        }
    }

    /// Teardown phases, verdict and collateral, computed when the incident is reported.
    fn finalize(&mut self, mut inc: Incident, outcome: Outcome) -> Incident {
        inc.outcome = outcome;
        let log = self.teardown.remove(&inc.target.pid).unwrap_or_default();
        let from = inc.t_group_dead_ns.unwrap_or(inc.t_signal_ns);
        // The teardown ends when NVML shows the memory back; without that, when the dying
        // task is done releasing its files (it becomes a zombie right after).
        let end = inc
            .gpu
            .as_ref()
            .and_then(|g| g.t_memory_back_ns)
            .or(inc.t_zombie_ns)
            .unwrap_or(self.now_ns);
        inc.phases = log.phases(&self.stacks, from, end);
        inc.release = log.driver_release(from, end);
        if inc.phases.is_empty() {
            inc.phases = log.hooked_phases(from, end);
        }
        inc.teardown_stacks = log
            .weighted_stacks(from, end)
            .into_iter()
            .map(|(id, ns)| {
                let mut frames = self.stacks.get(&id).cloned().unwrap_or_default();
                frames.reverse();
                (frames, ns)
            })
            .collect();

        let asleep = log
            .asleep(self.now_ns)
            .into_iter()
            .map(|(tid, since, id)| {
                let frames = self.stacks.get(&id).cloned().unwrap_or_default();
                (tid, since, frames)
            })
            .collect();
        let target = inc.target.pid;
        let unknown_nvml_pids = self
            .nvml
            .iter()
            .flatten()
            .flat_map(|g| g.processes.iter().map(|p| p.pid))
            .filter(|&p| p != target && self.holders.process(p).is_none())
            .collect();
        inc.collateral = self.ledger.refused_others(target, inc.t_signal_ns, end);

        if inc.gpu.is_some() || inc.t_group_dead_ns.is_none() {
            inc.verdict = verdict::decide(
                &inc,
                &verdict::Context {
                    phases: &inc.phases,
                    wakeups: &log.wakeups,
                    asleep,
                    unknown_nvml_pids,
                    slow_after_ns: self.config.slow_after_ns,
                    now_ns: self.now_ns,
                },
            );
        }
        inc
    }
}

fn unique_files(files: impl Iterator<Item = FileId>) -> Vec<FileId> {
    let mut v: Vec<FileId> = files.collect();
    v.sort_unstable();
    v.dedup();
    v
}
