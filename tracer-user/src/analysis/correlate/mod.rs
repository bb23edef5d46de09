//! The incident state machine. Pure: time comes only from the events (including the
//! collector's ticks), so a replay of the same events yields the same records.
//!
//! One case per process death: it opens at the first fatal signal (or at the death of a GPU
//! holder nobody signalled), collects every signal until the process dies, and, for GPU
//! holders, stays open until the memory is back. It is reported as soon as there is something
//! to say (the memory is back, or it is held elsewhere, or it is slow) and updated when that
//! changes.

mod case;
mod cases;
mod death;
mod group;
mod release;
mod report;
mod snapshot;
mod unseen;

use cases::CaseTable;

use super::{
    agenda::Agenda,
    gpu_errors::{GpuErrorRecord, XidBook},
    holders::Holders,
    id_map::IdMap,
    incident::{Incident, Sender, Target, ThreadExit},
    ledger::{self, Ledger},
    losses::LossLog,
    memory::{MemoryBook, Watch},
    notice::SignalNotice,
    signals::{SIGCHLD, SIGKILL},
    storm::StormLog,
    stuck::{Found, StuckBook, StuckRecord},
    teardown::{Stack, TeardownLog},
    termination,
    unheld::{UnheldRecord, UnheldWatch},
};
use crate::event::{Event, EventData, FdOp, NvmlGpu, Workload};
use tracer_common::driver;

/// TRACE_SIGNAL_IGNORED: the kernel discarded the signal at generation.
const RESULT_IGNORED: i32 = 1;
/// A dead process with memory held elsewhere is reported once reaped, or this long after its
/// death when nobody reaps it.
const HELD_REPORT_NS: u64 = 50_000_000;
/// NVML's account of a return this much after the kernel's confirmed release is late: its
/// readings queue behind the driver during teardowns, and other jobs move the device's figure.
const NVML_LATE_NS: u64 = 2_000_000;
/// How long after a teardown's own release NVML's readings may still be catching up.
const IN_FLIGHT_NS: u64 = 200_000_000;

/// Stored in trace files (as the replay's defaults), so it serializes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CorrelatorConfig {
    /// Only incidents whose target has one of these pids (empty: all).
    pub pids: Vec<u32>,
    /// Only incidents whose target has one of these comms (empty: all).
    pub comms: Vec<String>,
    /// A process still alive this long after a catchable signal survived it (reported then).
    pub survive_after_ns: u64,
    /// A dead process not reaped this long after its group died is reported without a reap.
    pub reap_wait_ns: u64,
    /// GPU memory still held this long after the death is called lingering (and a SIGKILLed
    /// process not dead by then stuck).
    pub linger_after_ns: u64,
    /// A teardown longer than this is `slow_teardown`; memory not back by then is reported
    /// as still held.
    pub slow_after_ns: u64,
    /// Signals a process survived belong to its death if it dies within this long.
    pub escalation_window_ns: u64,
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
            escalation_window_ns: 120_000_000_000,
        }
    }
}

/// What the correlator reports.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum Output {
    /// An incident or an update of one.
    Incident(Box<Incident>),
    /// A fatal-by-default signal the process survived (so far).
    Signal(Box<SignalNotice>),
    /// A GPU error no incident took.
    GpuError(Box<GpuErrorRecord>),
    /// A thread stuck in the driver, or running again.
    Stuck(Box<StuckRecord>),
    /// A GPU busy with no holder, or no longer.
    Unheld(Box<UnheldRecord>),
}

#[derive(Default)]
pub struct Correlator {
    pub(super) config: CorrelatorConfig,
    pub(super) now_ns: u64,
    /// linger's own process, never an incident.
    self_pid: Option<u32>,
    /// `--lean`: opens are not traced, so a process not known to hold GPU files may.
    pub(super) lean: bool,
    /// Driver calls are traced (not `--lean`, not `--no-ioctls`): an import of a victim's
    /// memory shows in the ledger.
    pub(super) ioctls_traced: bool,
    /// What the strategy could not see, for the incidents of GPU processes.
    pub(super) unseen: Vec<String>,
    /// The open cases and their indexes.
    pub(super) cases: CaseTable,
    /// Which cases the pass after an event looks at.
    pub(super) agenda: Agenda,
    pub(super) holders: Holders,
    pub(super) ledger: Ledger,
    pub(super) memory: MemoryBook,
    pub(super) losses: LossLog,
    pub(super) storms: StormLog,
    /// Symbolized kernel stacks by id.
    pub(super) stacks: IdMap<i32, Stack>,
    /// Teardown samples by dying process.
    pub(super) teardown: IdMap<u32, TeardownLog>,
    oom_marked: IdMap<u32, u64>,
    /// A death left references nobody known accounts for: the live collector should have the
    /// processes holding GPU files walked (`take_search_request`).
    search_wanted: bool,
    /// GPU errors, for the incidents they belong to.
    pub(super) xids: XidBook,
    /// Threads stuck in the driver now.
    stuck: StuckBook,
    /// GPUs busy with no holder.
    unheld: UnheldWatch,
    /// The kernel side lost records that may have named a holder (see
    /// `LossKind::hides_holders`): one may live unseen.
    holders_lost: bool,
}

impl Correlator {
    pub fn new(config: CorrelatorConfig) -> Self {
        Self {
            config,
            ..Default::default()
        }
    }

    /// Feeds one event; what it makes reportable is appended to `out`.
    pub fn on_event(&mut self, e: &Event, out: &mut Vec<Output>) {
        self.now_ns = self.now_ns.max(e.ts_ns);
        self.holders.on_event(e);
        self.ledger.on_event(e);
        self.losses.on_event(e);
        match &e.data {
            EventData::Loss { .. } | EventData::Collector { .. } | EventData::Strategy(_) => {
                self.how_traced(&e.data);
            }
            EventData::SignalGenerate {
                sig,
                code,
                result,
                target_exiting,
                target_pid,
                target_threads,
                sender_threads,
                sender_comm,
                target_comm,
                ..
            } => {
                if *sig == SIGCHLD {
                    self.zombie(e, *sender_threads, (*target_pid, target_comm.clone()));
                } else {
                    let sender = sender_of(e, *code, sender_comm);
                    let target = Target {
                        pid: *target_pid,
                        comm: target_comm.clone(),
                        threads: *target_threads,
                        workload: None,
                    };
                    let discarded = *result == RESULT_IGNORED;
                    let sent = termination::sent(*sig, *code, sender, e.ts_ns, discarded);
                    self.signal(sent, target, *target_exiting);
                }
            }
            EventData::SignalDeliver { sig, handler, .. } => self.delivered(e, *sig, *handler),
            EventData::TaskExit {
                exit_code,
                group_dead,
                comm,
            } => {
                if let Some(id) = self.cases.of_alive(e.pid) {
                    if let Some(c) = self.cases.get_mut(&id) {
                        c.inc.exits.push(ThreadExit {
                            tid: e.tid,
                            t_ns: e.ts_ns,
                        });
                    }
                    self.agenda.touch(id);
                }
                if *group_dead {
                    self.group_died(e, *exit_code, comm);
                }
            }
            EventData::Reap {
                reaped_pid,
                by_wait,
                comm,
            } => self.reaped(e, *reaped_pid, *by_wait, comm),
            EventData::OomVictim { pid } => {
                self.oom_marked.insert(*pid, e.ts_ns);
            }
            EventData::GpuFd {
                op: FdOp::HeldAtSearch,
                ..
            } => self.searched(e.pid),
            EventData::GpuFd { .. } | EventData::GpuCloseRange { .. } => self.holders_changed(),
            EventData::Nvml { gpus } => {
                self.nvml_reading(e.ts_ns, gpus);
                self.unheld_reading(e.ts_ns, gpus, out);
            }
            EventData::Gpus { gpus } => self.xids.set_gpus(gpus),
            EventData::GpuXid {
                xid,
                pci,
                message,
                truncated,
                source,
            } => {
                self.xids
                    .add(e.ts_ns, *xid, pci, message, *truncated, *source);
                self.link_xids();
            }
            EventData::DriverCall {
                func,
                exit: true,
                file,
                duration_ns,
                ..
            } if *duration_ns > 0 => self.driver_call(e, *func, *file, *duration_ns),
            EventData::GpuIoctl { cmd, status: 0, .. }
                if ledger::escape_nr(*cmd) == driver::RM_FREE =>
            {
                self.freed_by(e.pid, e.ts_ns);
            }
            EventData::Stack { .. }
            | EventData::TeardownSample { .. }
            | EventData::KthreadWakeup { .. } => self.teardown_event(e),
            EventData::Stuck { .. } | EventData::StuckCleared { .. } => self.stuck_event(e, out),
            _ => {}
        }
        // A search walk lists one descriptor per record: report what it found once it is over
        // (the next event), not descriptor by descriptor.
        if let EventData::GpuFd {
            op: FdOp::HeldAtSearch,
            ..
        } = e.data
        {
            return;
        }
        self.advance(out);
    }

    /// What the collector says of itself and of how it traces, and what the kernel lost.
    fn how_traced(&mut self, data: &EventData) {
        match data {
            EventData::Loss { count, what, .. } if *count > 0 && what.hides_holders() => {
                self.holders_lost = true;
            }
            EventData::Collector {
                pid,
                partial_pid_view,
            } => {
                self.self_pid = Some(*pid);
                self.unheld.partial_view = *partial_pid_view;
            }
            EventData::Strategy(s) => {
                // Opens are not all traced: a process not known to hold GPU files may.
                self.lean = s.mode().holders_from_nvml();
                self.ioctls_traced = !s.lean && s.hooks.iter().any(|h| h.contains("ioctl"));
                self.unseen = s.unseen.clone();
                self.agenda.touch_all();
            }
            _ => {}
        }
    }

    /// An NVML reading: the GPUs busy with no holder for a while, or no longer.
    fn unheld_reading(&mut self, t_ns: u64, gpus: &[NvmlGpu], out: &mut Vec<Output>) {
        let known = self.xids.gpus();
        let minor = |index: u32| known.iter().find(|g| g.index == index)?.minor;
        let missed = self.holders_missed();
        for record in self
            .unheld
            .reading(t_ns, gpus, &minor, &self.holders, missed)
        {
            out.push(Output::Unheld(Box::new(record)));
        }
    }

    /// Why a holder of GPU files may live unseen, if one may.
    fn holders_missed(&self) -> Option<&'static str> {
        if self.lean {
            Some("opens of GPU files are not traced (--lean)")
        } else if self.holders_lost {
            Some("the kernel side lost records that may name a holder (linger_lost_records)")
        } else if self.holders.some_unreadable() {
            Some("/proc would not list some processes' descriptors")
        } else {
            None
        }
    }

    /// A GPU holder's thread found stuck in the driver, or out of that sleep again.
    fn stuck_event(&mut self, e: &Event, out: &mut Vec<Output>) {
        let record = match &e.data {
            EventData::Stuck {
                since_ns,
                comm,
                frames,
                before_start,
            } => {
                let found = Found {
                    t_ns: e.ts_ns,
                    pid: e.pid,
                    tid: e.tid,
                    since_ns: *since_ns,
                    before_start: *before_start,
                    comm,
                    frames,
                };
                Some(
                    self.stuck
                        .stuck(&found, &self.holders, &mut self.memory.latest()),
                )
            }
            EventData::StuckCleared { since_ns } => self.stuck.cleared(e.ts_ns, e.tid, *since_ns),
            _ => None,
        };
        if let Some(record) = record {
            out.push(Output::Stuck(Box::new(record)));
        }
    }

    /// A record of a dying process's teardown: a kernel stack, a sample, a woken kthread.
    fn teardown_event(&mut self, e: &Event) {
        match &e.data {
            EventData::Stack { id, frames } => {
                self.stacks.insert(*id, Stack::new(frames.clone()));
            }
            EventData::TeardownSample {
                sample,
                stack_id,
                owner,
                tid,
                blocked_ns,
            } => {
                self.teardown.entry(*owner).or_default().sample(
                    e.ts_ns,
                    *tid,
                    *sample,
                    *stack_id,
                    *blocked_ns,
                );
                if *sample == crate::event::SampleKind::Exited {
                    self.thread_exited(*owner, e.ts_ns);
                }
            }
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
    }

    /// Lets every open case take the GPU errors it cites.
    fn link_xids(&mut self) {
        if !self.xids.waiting() {
            return;
        }
        for (id, c) in self.cases.iter() {
            let gpu = self.memory.watch(*id).and_then(Watch::gpu);
            self.xids.link(c.inc.target.pid, gpu, c.inc.t_signal_ns);
        }
    }

    /// GPU errors no incident took in time, as their own records.
    fn gpu_errors(&mut self, all: bool, out: &mut Vec<Output>) {
        for error in self.xids.unlinked(self.now_ns, all) {
            out.push(Output::GpuError(Box::new(GpuErrorRecord {
                head: super::incident::Head::new("gpu_error"),
                error,
            })));
        }
    }

    /// Reports what is still open when the stream ends.
    pub fn finish(&mut self, out: &mut Vec<Output>) {
        self.link_xids();
        let ids: Vec<u64> = self.cases.keys().copied().collect();
        for id in ids {
            let Some(c) = self.cases.get(&id) else {
                continue;
            };
            if c.inc.t_group_dead_ns.is_none() {
                if c.signals.iter().any(|s| s.sig == SIGKILL) {
                    if !c.stuck_reported {
                        out.push(self.emit(id, "incident"));
                    }
                } else {
                    self.notices(id, true, out);
                }
            } else if self.reportable_death(id) {
                let kind = match c.reported {
                    None => "incident",
                    Some(_) => "incident_update",
                };
                if c.reported.is_none() || self.state(id) != c.reported {
                    out.push(self.emit(id, kind));
                }
            }
        }
        self.cases.clear();
        self.agenda.clear();
        self.gpu_errors(true, out);
    }

    /// Whether no incident is open: symbolized stacks are no longer needed (the kernel's stack
    /// ids may be reused from now on).
    /// Whether a search for unknown holders is wanted (once per death that needs one).
    pub fn take_search_request(&mut self) -> bool {
        std::mem::take(&mut self.search_wanted)
    }

    pub fn is_idle(&self) -> bool {
        self.cases.is_empty()
    }

    fn wanted(&self, pid: u32, comm: &str) -> bool {
        Some(pid) != self.self_pid
            && (self.config.pids.is_empty() || self.config.pids.contains(&pid))
            && (self.config.comms.is_empty() || self.config.comms.iter().any(|c| c == comm))
    }

    /// Who `pid` ran for, as /proc said while it was alive.
    fn workload_of(&self, pid: u32) -> Option<Workload> {
        let info = self.holders.process(pid)?.info.as_ref()?;
        info.workload.clone()
    }
}

/// Who sent signal `code` of event `e`: the user process, or the kernel in its context.
fn sender_of(e: &Event, code: i32, comm: &str) -> Sender {
    match crate::analysis::signals::origin(code) {
        crate::analysis::signals::Origin::User => Sender {
            pid: e.pid,
            tid: e.tid,
            comm: comm.to_string(),
            context_pid: None,
        },
        _ => Sender {
            pid: 0,
            tid: 0,
            comm: "kernel".into(),
            context_pid: Some(e.pid),
        },
    }
}
