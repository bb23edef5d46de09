//! The incident state machine. Pure: time comes only from the events (including the
//! collector's ticks), so a replay of the same events yields the same incidents.

use std::collections::HashMap;

use super::{
    incident::{
        Action, Delivery, ExitStatus, Incident, Outcome, ReapHow, Reaper, Sender, Target,
        ThreadExit,
    },
    signals::{self, Origin, SIGCHLD, SIGKILL},
};
use crate::event::{Event, EventData};

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
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        Self {
            pids: Vec::new(),
            comms: Vec::new(),
            survive_after_ns: 1_000_000_000,
            reap_wait_ns: 5_000_000_000,
        }
    }
}

#[derive(Default)]
pub struct Correlator {
    config: CorrelatorConfig,
    open: HashMap<u32, Incident>,
    next_id: u64,
    now_ns: u64,
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
            }
            EventData::Reap {
                reaped_pid,
                by_wait,
                comm,
            } => {
                if let Some(mut inc) = self.open.remove(reaped_pid) {
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
                    closed.push(close(inc, Outcome::Exited));
                }
            }
            EventData::Fork { .. }
            | EventData::Exec { .. }
            | EventData::GpuFd { .. }
            | EventData::GpuCloseRange { .. }
            | EventData::GpuIoctl { .. }
            | EventData::BenchTick
            | EventData::Loss { .. }
            | EventData::Tick => {}
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

    pub fn open_incidents(&self) -> usize {
        self.open.len()
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
        }
    }

    /// Time-based decisions: survivors, and dead processes nobody reaps.
    fn expire(&mut self, closed: &mut Vec<Incident>) {
        let now = self.now_ns;
        let cfg = &self.config;
        let mut done: Vec<(u32, Outcome)> = self
            .open
            .iter()
            .filter_map(|(&pid, inc)| match inc.t_group_dead_ns {
                Some(dead) if now.saturating_sub(dead) >= cfg.reap_wait_ns => {
                    Some((pid, Outcome::Exited))
                }
                None if inc.signal != SIGKILL
                    && inc.signal != SIGSTOP
                    && now.saturating_sub(inc.t_signal_ns) >= cfg.survive_after_ns =>
                {
                    Some((pid, Outcome::Survived))
                }
                _ => None,
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

fn close(mut inc: Incident, outcome: Outcome) -> Incident {
    inc.outcome = outcome;
    inc
}
