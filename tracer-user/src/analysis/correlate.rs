//! The incident state machine. Pure: time comes only from the events (including the
//! collector's ticks), so a replay of the same events yields the same records.
//!
//! One case per process death: it opens at the first fatal signal (or at the death of a GPU
//! holder nobody signalled), collects every signal until the process dies, and, for GPU
//! holders, stays open until the memory is back. It is reported as soon as there is something
//! to say (the memory is back, or it is held elsewhere, or it is slow) and updated when that
//! changes.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    agenda::Agenda,
    gpu_errors::{GpuErrorRecord, XidBook},
    holders::{FileId, Holder, Holders, How},
    id_map::IdMap,
    incident::{
        Action, Delivery, ExitStatus, Incident, Outcome, ReapHow, Reaper, Sender, Source, Target,
        ThreadExit,
    },
    ledger::{self, Ledger, LedgerPart},
    losses::LossLog,
    memory::{Change, ImportVia, MemoryBook, NvmlNeed, OwnUse, Residual, Role, Watch},
    notice::SignalNotice,
    references,
    signals::{SIGCHLD, SIGKILL},
    snapshot,
    storm::{StormLog, Teardown},
    teardown::{DriverSpan, Stack, TeardownLog},
    termination::{self, SignalSent},
};
use crate::event::{DriverFunc, Event, EventData, FdOp, NvmlGpu, Workload};
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
}

/// What was last reported of a case, to tell when an update is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Reported {
    pub holders_left: Vec<u32>,
    pub residuals_back: usize,
    pub importers: usize,
    pub back: bool,
    pub lingering: bool,
    pub dead: bool,
}

/// One process's way to its death and its memory's return.
pub(super) struct Case {
    pub inc: Incident,
    pub signals: Vec<SignalSent>,
    /// Signals already reported as survived.
    noticed: usize,
    pub oom: bool,
    /// The thread that ended the group: it runs the exit path's release of the files.
    pub dead_tid: Option<u32>,
    /// GPU files it held when its group died.
    pub files: Vec<FileId>,
    /// The video memory of those files' clients on each GPU, by the ledger, at the death.
    pub ledger_parts: Vec<LedgerPart>,
    /// A GPU holder: its memory is watched.
    pub gpu: bool,
    /// End of the last exit-path `__fput` of one of its files (driver hooks).
    fput_end: Option<u64>,
    /// Its own release of its GPU files.
    pub kernel_release: Option<(u64, Source)>,
    /// Other processes holding its files at death, and when each let go.
    pub fd_holders: Vec<Holder>,
    /// For a holder of another dead process's files: that process, "comm[pid]".
    pub owner: Option<String>,
    /// NVML listed it, or the ledger saw it allocate: the memory of its files is its own.
    owns: bool,
    pub holder_gone: BTreeMap<u32, Option<u64>>,
    /// The process its SIGCHLD went to, and its comm: the one that reaps it.
    parent: Option<(u32, String)>,
    /// Importers of its memory: comm and parent, as known when the import was found.
    pub importer_names: BTreeMap<u32, (String, u32)>,
    /// References to its files at death that no known holder accounted for; less as the
    /// search finds their holders.
    pub unaccounted: u64,
    reported: Option<Reported>,
    stuck_reported: bool,
}

#[derive(Default)]
pub struct Correlator {
    pub(super) config: CorrelatorConfig,
    pub(super) now_ns: u64,
    next_id: u64,
    /// linger's own process, never an incident.
    self_pid: Option<u32>,
    /// `--lean`: opens are not traced, so a process not known to hold GPU files may.
    pub(super) lean: bool,
    /// Driver calls are traced (not `--lean`, not `--no-ioctls`): an import of a victim's
    /// memory shows in the ledger.
    pub(super) ioctls_traced: bool,
    /// What the strategy could not see, for the incidents of GPU processes.
    pub(super) unseen: Vec<String>,
    /// Boxed: a B-tree node shifts its entries on every insert and removal, and a case is
    /// over a kilobyte.
    pub(super) cases: BTreeMap<u64, Box<Case>>,
    /// Live processes with a case.
    alive: IdMap<u32, u64>,
    /// Dead processes with a case, until reaped.
    unreaped: IdMap<u32, u64>,
    /// Holder pid → the cases whose `holder_gone` names it: an exit finds the cases it may
    /// release without a walk over every case (thousands in a kill storm under `--lean`).
    held_for: IdMap<u32, BTreeSet<u64>>,
    /// Which cases the pass after an event looks at.
    pub(super) agenda: Agenda,
    /// Dead cases waiting for a reading taken since their death or their files' release:
    /// the next reading looks at them.
    await_reading: BTreeSet<u64>,
    /// Open cases per target pid (a pid may be reused while its old case is open).
    cases_of_pid: IdMap<u32, usize>,
    pub(super) holders: Holders,
    pub(super) ledger: Ledger,
    pub(super) memory: MemoryBook,
    pub(super) losses: LossLog,
    pub(super) storms: StormLog,
    /// The latest NVML reading; None until one arrives (no NVML on this machine).
    pub(super) nvml: Option<Vec<NvmlGpu>>,
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
            EventData::Collector { pid } => self.self_pid = Some(*pid),
            EventData::Strategy(s) => {
                // Opens are not all traced: a process not known to hold GPU files may.
                self.lean = s.lean || !s.libraries.is_empty();
                self.ioctls_traced = !s.lean && s.hooks.iter().any(|h| h.contains("ioctl"));
                self.unseen = s.unseen.clone();
                self.agenda.touch_all();
            }
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
                    self.zombie(e.pid, (*target_pid, target_comm.clone()), e.ts_ns);
                } else {
                    let sender = sender_of(e, *code, sender_comm);
                    let target = Target {
                        pid: *target_pid,
                        comm: target_comm.clone(),
                        threads: *target_threads,
                        workload: None,
                    };
                    let discarded = *result == RESULT_IGNORED;
                    self.signal(e.ts_ns, *sig, *code, sender, target, discarded);
                }
            }
            EventData::SignalDeliver { sig, handler, .. } => self.delivered(e, *sig, *handler),
            EventData::TaskExit {
                exit_code,
                group_dead,
                comm,
            } => {
                if let Some(&id) = self.alive.get(&e.pid) {
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
            EventData::Nvml { gpus } => self.nvml_reading(e.ts_ns, gpus),
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
    }

    /// Lets every open case take the GPU errors it cites.
    fn link_xids(&mut self) {
        if !self.xids.waiting() {
            return;
        }
        for (id, c) in &self.cases {
            let gpu = self.memory.watch(*id).and_then(Watch::gpu);
            self.xids.link(c.inc.target.pid, gpu, c.inc.t_signal_ns);
        }
    }

    /// GPU errors no incident took in time, as their own records.
    fn gpu_errors(&mut self, all: bool, out: &mut Vec<Output>) {
        for error in self.xids.unlinked(self.now_ns, all) {
            out.push(Output::GpuError(Box::new(GpuErrorRecord {
                record_type: "gpu_error",
                schema: super::incident::SCHEMA,
                node: None,
                wall_time: None,
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
        self.await_reading.clear();
        self.cases_of_pid.clear();
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

    /// How closely NVML should be read now: each awaited release asks for what tells its
    /// moment. A reading costs the collector up to milliseconds of CPU on a busy H200, so
    /// reading every millisecond is kept for releases only NVML can time; a busy node's churn
    /// always has some teardown under way.
    pub fn nvml_need(&self) -> NvmlNeed {
        self.memory
            .awaited(self.now_ns)
            .filter(|(id, _)| self.back(*id).is_none())
            .map(|(id, w)| self.need_of(id, w))
            .max()
            .unwrap_or(NvmlNeed::Quiet)
    }

    fn need_of(&self, id: u64, w: &Watch) -> NvmlNeed {
        if matches!(w.role, Role::AliasOf(_) | Role::Nothing) {
            // Its memory is another's, which asks for itself.
            return NvmlNeed::Await;
        }
        // An import the ledger saw comes back at its importer's own release; one only NVML
        // suggests, when NVML says.
        let kernel_timed = (self.ioctls_traced || self.lean)
            && !w.is_probe()
            && w.residuals().all(|r| r.via != ImportVia::Nvml)
            && self.cases.get(&id).is_some_and(|c| c.gpu);
        if !kernel_timed {
            return NvmlNeed::Fast;
        }
        let released = self.cases.get(&id).and_then(|c| self.last_release(c));
        if released.is_some() && self.memory.imports_released(id) {
            NvmlNeed::Confirm
        } else {
            NvmlNeed::Await
        }
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

    fn open_case(&mut self, mut target: Target, t_ns: u64) -> u64 {
        let pid = target.pid;
        target.workload = target.workload.or_else(|| self.workload_of(target.pid));
        self.next_id += 1;
        let id = self.next_id;
        self.alive.insert(target.pid, id);
        let case = Box::new(Case {
            inc: Incident::new(id, target, t_ns),
            signals: Vec::new(),
            noticed: 0,
            oom: false,
            dead_tid: None,
            files: Vec::new(),
            gpu: false,
            fput_end: None,
            kernel_release: None,
            fd_holders: Vec::new(),
            owner: None,
            owns: false,
            ledger_parts: Vec::new(),
            holder_gone: BTreeMap::new(),
            parent: None,
            importer_names: BTreeMap::new(),
            unaccounted: 0,
            reported: None,
            stuck_reported: false,
        });
        self.cases.insert(id, case);
        self.agenda.open(id, t_ns);
        *self.cases_of_pid.entry(pid).or_default() += 1;
        self.xids.link(pid, None, t_ns);
        id
    }

    fn signal(
        &mut self,
        t_ns: u64,
        sig: u32,
        code: i32,
        sender: Sender,
        target: Target,
        discarded: bool,
    ) {
        let pid = target.pid;
        let id = match self.alive.get(&pid) {
            Some(&id) => id,
            None if self.wanted(pid, &target.comm) => self.open_case(target, t_ns),
            None => return,
        };
        let sent = termination::sent(sig, code, sender, t_ns, discarded);
        let holds_gpu = self.holders.holds_gpu_files(pid);
        if let Some(c) = self.cases.get_mut(&id) {
            c.signals.push(sent);
            c.gpu |= holds_gpu;
        }
        self.agenda.touch(id);
        if holds_gpu {
            // Read NVML at once: the victim's share comes from the readings that follow.
            self.memory.start(id, pid, t_ns);
        } else if self.lean {
            // Without traced opens it may hold GPU files all the same: NVML will say.
            self.memory.start_probe(id, pid, t_ns);
        }
    }

    fn delivered(&mut self, e: &Event, sig: u32, handler: u64) {
        let Some(&id) = self.alive.get(&e.pid) else {
            return;
        };
        self.agenda.touch(id);
        let Some(c) = self.cases.get_mut(&id) else {
            return;
        };
        let action = Action::from_handler(handler);
        c.inc.deliveries.push(Delivery {
            tid: e.tid,
            t_ns: e.ts_ns,
            sig,
            action,
        });
        if let Some(s) = c
            .signals
            .iter_mut()
            .find(|s| s.sig == sig && s.action.is_none())
        {
            s.action = Some(action);
        }
    }

    /// A thread group died: what it held, who else holds it, and what is released.
    fn group_died(&mut self, e: &Event, exit_code: u32, comm: &str) {
        let (pid, t_ns) = (e.pid, e.ts_ns);
        // The record's comm is the last thread's; the process's is the leader's.
        let comm = self
            .holders
            .process(pid)
            .map(|p| p.comm.clone())
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| comm.to_string());
        let comm = comm.as_str();
        let ppid = self.holders.process(pid).map_or(0, |p| p.ppid);
        let workload = self.workload_of(pid);
        let held = self.holders.group_died(pid);
        let held_fds: Vec<i32> = held.iter().map(|h| h.fd).filter(|fd| *fd >= 0).collect();
        let files = unique_files(held.iter().map(|h| h.file));
        let id = match self.alive.remove(&pid) {
            Some(id) => Some(id),
            // A GPU holder nobody signalled: its exit is an incident too.
            None if !held.is_empty() && self.wanted(pid, comm) => {
                let target = Target {
                    pid,
                    comm: comm.to_string(),
                    threads: 1,
                    workload: None,
                };
                let id = self.open_case(target, t_ns);
                self.alive.remove(&pid);
                Some(id)
            }
            None => None,
        };
        if let Some(id) = id {
            self.agenda.touch(id);
            self.unreaped.insert(pid, id);
            if let Some(c) = self.cases.get_mut(&id) {
                if c.inc.target.workload.is_none() {
                    c.inc.target.workload = workload;
                }
            }
            let oom = self.oom_marked.remove(&pid).is_some();
            let fd_holders = self.holders.holders_of(&files, pid);
            let role = self.role_at_death(id, pid, &files, &fd_holders);
            let owner = match role {
                Role::AliasOf(o) => self
                    .cases
                    .get(&o)
                    .map(|o| format!("{}[{}]", o.inc.target.comm, o.inc.target.pid)),
                _ => None,
            };
            let owns = self.ledger.allocators(&files).contains(&pid)
                || self
                    .memory
                    .watch(id)
                    .is_some_and(|w| w.max_figure().is_some());
            if let Some(c) = self.cases.get_mut(&id) {
                c.owner = owner;
                c.owns = owns;
                c.inc.t_group_dead_ns = Some(t_ns);
                c.inc.exit = Some(ExitStatus::from_code(exit_code));
                c.inc.outcome = Outcome::Exited;
                c.dead_tid = Some(e.tid);
                c.oom = oom;
                if !held.is_empty() {
                    c.gpu = true;
                    let gpu = c.inc.gpu.get_or_insert_with(Default::default);
                    gpu.ledger = self.ledger.bytes(&files);
                    gpu.bytes_ledger = gpu.ledger.video;
                    gpu.classes = self.ledger.classes(&files);
                    let infos = self.xids.gpus();
                    // The only GPU there is, by NVML's names, or its readings in a trace
                    // recorded before linger named GPUs.
                    let only = match (infos, self.nvml.as_deref()) {
                        ([one], _) => Some(one.index),
                        ([], Some([one])) => Some(one.index),
                        _ => None,
                    };
                    c.ledger_parts = self.ledger.parts(&files, infos, only);
                    c.unaccounted = references::unaccounted(&held, &self.holders, pid);
                    self.search_wanted |= c.unaccounted > 0;
                    gpu.files = held;
                    c.files = files.clone();
                    c.holder_gone = fd_holders.iter().map(|h| (h.pid, None)).collect();
                    for h in &fd_holders {
                        self.held_for.entry(h.pid).or_default().insert(id);
                    }
                    c.fd_holders = fd_holders;
                }
                if c.gpu {
                    c.inc.gpu.get_or_insert_with(Default::default);
                }
            }
            if let Role::AliasOf(owner) = role {
                // It held those files unseen until now: the owner's holder, found at its death.
                self.unseen_holder_died(owner, pid, ppid, comm, held_fds, t_ns);
            }
            if self.cases.get(&id).is_some_and(|c| c.gpu) {
                self.watch_death(id, pid, t_ns, role, &files);
            }
        }
        // A holder of other dead processes' files is gone: their memory may be on its way.
        let watching: Vec<u64> = self
            .held_for
            .get(&pid)
            .map(|ids| ids.iter().copied().collect())
            .unwrap_or_default();
        for w in watching {
            self.memory.activity(w, t_ns);
            self.agenda.touch(w);
        }
        // Files nobody else holds die with this process, whether or not it had an incident.
        let orphaned: Vec<FileId> = files
            .into_iter()
            .filter(|f| self.holders.holders_of(&[*f], pid).is_empty())
            .collect();
        self.ledger.release_files(&orphaned);
        self.holders_changed();
    }

    /// A GPU holder died: its memory is watched from now on, where the ledger placed it, and
    /// with the imports of its objects the ledger saw.
    fn watch_death(&mut self, id: u64, pid: u32, t_ns: u64, role: Role, files: &[FileId]) {
        self.memory.start(id, pid, t_ns);
        self.memory.died(id, t_ns, role);
        let placed: BTreeMap<u32, u64> = self.cases[&id]
            .ledger_parts
            .iter()
            .filter_map(|p| Some((p.gpu?, p.bytes)))
            .collect();
        self.memory.placed(id, placed);
        // Who imported its objects must be asked before its clients are freed.
        for i in self.ledger.imports_from(files) {
            self.memory.imported(id, i.importer, i.bytes, i.via, i.dups);
        }
    }

    /// What a GPU holder's death is to give back.
    fn role_at_death(&self, id: u64, pid: u32, files: &[FileId], others: &[Holder]) -> Role {
        let video = self.ledger.bytes(files).video;
        let allocators = self.ledger.allocators(files);
        let listed = self
            .memory
            .watch(id)
            .is_some_and(|w| w.max_figure().is_some());
        if listed || allocators.contains(&pid) {
            return Role::Own { ledger: video };
        }
        // Another dead process's memory, in files it inherited. Without files there is none
        // to look for: a kill storm's deaths skip the walk over every open case.
        let owner = if files.is_empty() {
            None
        } else {
            self.cases.iter().find(|(other, c)| {
                **other != id
                    && c.inc.t_group_dead_ns.is_some()
                    && c.files.iter().any(|f| files.contains(f))
                    && self.memory.back_ns(**other).is_none()
            })
        };
        if let Some((other, _)) = owner {
            return Role::AliasOf(*other);
        }
        // The memory is the live holders' only on evidence: NVML lists one of them, or one
        // of them allocated it; without that it counts as this death's.
        let owned_by_others = others
            .iter()
            .any(|h| allocators.contains(&h.pid) || self.memory.listed(h.pid));
        if owned_by_others {
            Role::Nothing
        } else {
            Role::Own { ledger: video }
        }
    }

    /// SIGCHLD from `pid`: it is a zombie, its files released.
    fn zombie(&mut self, pid: u32, parent: (u32, String), t_ns: u64) {
        let Some(&id) = self.unreaped.get(&pid) else {
            // An importer with no case of its own let go with its exit.
            self.memory.importer_exited(pid, t_ns);
            return;
        };
        if let Some(c) = self.cases.get_mut(&id) {
            c.inc.t_zombie_ns.get_or_insert(t_ns);
            c.parent.get_or_insert(parent);
        }
        self.agenda.touch(id);
        self.kernel_released(id, t_ns);
    }

    /// The exit path is done with the files: the driver hooks' last `__fput` if they timed
    /// one, else this moment (the zombie transition or the reap) as an upper bound.
    fn kernel_released(&mut self, id: u64, t_ns: u64) {
        let Some(c) = self.cases.get_mut(&id) else {
            return;
        };
        if c.kernel_release.is_some() {
            return;
        }
        let release = match c.fput_end {
            Some(end) if end <= t_ns => (end, Source::Fput),
            _ => (t_ns, Source::Zombie),
        };
        c.kernel_release = Some(release);
        let pid = c.inc.target.pid;
        self.agenda.touch(id);
        self.memory.kernel_released(id, release.0);
        // Whatever it imported went with its files.
        self.memory.importer_exited(pid, release.0);
        self.holders_changed();
    }

    fn reaped(&mut self, e: &Event, reaped_pid: u32, by_wait: bool, comm: &str) {
        let Some(id) = self.unreaped.remove(&reaped_pid) else {
            self.memory.importer_exited(reaped_pid, e.ts_ns);
            return;
        };
        self.agenda.touch(id);
        if let Some(c) = self.cases.get_mut(&id) {
            if c.inc.t_reaped_ns.is_none() {
                c.inc.t_reaped_ns = Some(e.ts_ns);
                c.inc.reaper = Some(if by_wait {
                    Reaper::waited(e.pid, comm)
                } else {
                    freed_by(c)
                });
            }
        }
        self.kernel_released(id, e.ts_ns);
    }

    /// `pid` died holding files of `owner`'s, which had references nobody known accounted for.
    fn unseen_holder_died(
        &mut self,
        owner: u64,
        pid: u32,
        ppid: u32,
        comm: &str,
        fds: Vec<i32>,
        t_ns: u64,
    ) {
        let Some(c) = self.cases.get_mut(&owner) else {
            return;
        };
        if c.unaccounted == 0 || c.holder_gone.contains_key(&pid) {
            return;
        }
        c.unaccounted = c.unaccounted.saturating_sub(fds.len() as u64);
        c.holder_gone.insert(pid, None);
        self.agenda.touch(owner);
        self.held_for.entry(pid).or_default().insert(owner);
        c.fd_holders.push(Holder {
            pid,
            comm: comm.to_string(),
            ppid,
            fds,
            how: How::Seen { t_ns },
            t_released_ns: None,
        });
    }

    /// A searched process's walk is in: it joins the holders of the dead cases whose files it
    /// holds and whose references were not all accounted for.
    fn searched(&mut self, pid: u32) {
        let ids: Vec<u64> = self
            .cases
            .iter()
            // A walk lists one descriptor per record: a holder already found grows with them.
            .filter(|(_, c)| {
                c.unaccounted > 0
                    || c.fd_holders
                        .iter()
                        .any(|h| h.pid == pid && h.found_by_walk())
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let Some(c) = self.cases.get(&id) else {
                continue;
            };
            let target = c.inc.target.pid;
            let Some(found) = self
                .holders
                .holders_of(&c.files, target)
                .into_iter()
                .find(|h| h.pid == pid)
            else {
                continue;
            };
            let held = c
                .inc
                .gpu
                .as_ref()
                .map(|g| g.files.clone())
                .unwrap_or_default();
            let left = references::unaccounted(&held, &self.holders, target);
            if let Some(c) = self.cases.get_mut(&id) {
                c.unaccounted = c.unaccounted.min(left);
                c.holder_gone.entry(pid).or_insert(None);
                self.agenda.touch(id);
                self.held_for.entry(pid).or_default().insert(id);
                match c.fd_holders.iter_mut().find(|h| h.pid == pid) {
                    Some(known) => known.fds = found.fds,
                    None => c.fd_holders.push(found),
                }
            }
        }
    }

    /// Dead cases whose other holders let go: when each did (its own release, if it died).
    fn holders_changed(&mut self) {
        let now = self.now_ns;
        let mut gone_of: Vec<(u64, u32, u64)> = Vec::new();
        // Only cases with other holders name a holder in `held_for`.
        let ids: BTreeSet<u64> = self.held_for.values().flatten().copied().collect();
        for (id, c) in ids.iter().filter_map(|id| Some((id, self.cases.get(id)?))) {
            if c.holder_gone.values().all(Option::is_some) {
                continue;
            }
            let target = c.inc.target.pid;
            for (&holder, gone) in &c.holder_gone {
                if gone.is_some() || (holder != target && self.holders.holds_any(holder, &c.files))
                {
                    continue;
                }
                // A holder that died let go with its own release; one that closed, now.
                let t = match self.case_of_dead(holder) {
                    Some(hc) => match hc.kernel_release {
                        Some((t, _)) => t,
                        None => continue,
                    },
                    None => now,
                };
                gone_of.push((*id, holder, t));
            }
        }
        for (id, holder, t) in gone_of {
            if let Some(c) = self.cases.get_mut(&id) {
                c.holder_gone.insert(holder, Some(t));
            }
            self.agenda.touch(id);
            self.memory.activity(id, t);
        }
    }

    /// The case of a dead process (the latest, should the pid have been reused).
    fn case_of_dead(&self, pid: u32) -> Option<&Case> {
        self.cases
            .values()
            .rev()
            .find(|c| c.inc.target.pid == pid && c.inc.t_group_dead_ns.is_some())
            .map(Box::as_ref)
    }

    /// Remembers the importers' names while they are known: an import is back with its
    /// importer's end, when the importer itself may be gone.
    fn name_importers(&mut self, id: u64, residuals: &[Residual]) {
        let names: Vec<(u32, (String, u32))> = residuals
            .iter()
            .filter_map(|r| Some((r.importer, self.name_of(r.importer)?)))
            .collect();
        if let Some(c) = self.cases.get_mut(&id) {
            c.importer_names.extend(names);
        }
    }

    /// A process's comm and parent, from its table or its case.
    pub(super) fn name_of(&self, pid: u32) -> Option<(String, u32)> {
        self.holders
            .process(pid)
            .map(|p| (p.comm.clone(), p.ppid))
            .filter(|(comm, _)| !comm.is_empty())
            .or_else(|| {
                self.cases
                    .values()
                    .find(|o| o.inc.target.pid == pid)
                    .map(|o| (o.inc.target.comm.clone(), 0))
            })
    }

    /// `pid` freed driver objects: whatever of a victim's it imported, if its duplicates
    /// went with them.
    fn freed_by(&mut self, pid: u32, t_ns: u64) {
        for (key, dups) in self.memory.imports_held_by(pid) {
            if !self.ledger.holds_dups(&dups) {
                self.memory.import_freed(key, pid, t_ns);
                self.agenda.touch(key);
            }
        }
    }

    fn nvml_reading(&mut self, t_ns: u64, gpus: &[NvmlGpu]) {
        let seen = Seen {
            ledger: &self.ledger,
            holders: &self.holders,
            calls: self.ioctls_traced,
        };
        let changes = self.memory.reading(t_ns, gpus, seen);
        let mut touched = self.memory.take_touched();
        touched.append(&mut self.await_reading);
        for change in changes {
            match change {
                Change::Imported { key, residuals } => {
                    self.memory.activity(key, t_ns);
                    self.name_importers(key, &residuals);
                    touched.insert(key);
                }
                Change::OwnBack { key, .. }
                | Change::ResidualBack { key, .. }
                | Change::Withdrawn { key, .. } => {
                    touched.insert(key);
                }
            }
        }
        // A case's memory may be another's: it moves with that one's.
        let aliases: Vec<u64> = touched
            .iter()
            .flat_map(|k| self.memory.aliases_of(*k))
            .collect();
        for id in touched.into_iter().chain(aliases) {
            if self.cases.contains_key(&id) {
                self.agenda.touch(id);
            }
        }
        // The first reading changes how every case's memory is judged. Later ones concern
        // only the cases whose memory's account they changed, those waiting for a reading and
        // those it lists now: a pass over every quiet case after each reading (a millisecond
        // apart while memory is awaited) was most of the collector's work in kill storms.
        if self.nvml.is_none() {
            self.agenda.touch_all();
        }
        self.nvml = Some(gpus.to_vec());
        // A process NVML lists is a GPU process, whether or not its files were seen.
        let listed: Vec<(u64, Option<u64>)> = self
            .memory
            .take_figured()
            .into_iter()
            .filter_map(|id| self.cases.get(&id).filter(|c| !c.gpu).map(|c| (id, c)))
            .map(|(id, c)| (id, c.inc.t_group_dead_ns))
            .collect();
        for (id, dead) in listed {
            self.agenda.touch(id);
            if let Some(c) = self.cases.get_mut(&id) {
                c.gpu = true;
                c.owns = true;
                c.inc.gpu.get_or_insert_with(Default::default);
            }
            if let Some(dead) = dead {
                self.memory.died(id, dead, Role::Own { ledger: 0 });
            }
        }
    }

    fn driver_call(&mut self, e: &Event, func: DriverFunc, file: u64, duration_ns: u64) {
        let span = DriverSpan {
            func,
            start_ns: e.ts_ns.saturating_sub(duration_ns),
            end_ns: e.ts_ns,
        };
        // The dying process's own thread, or a driver worker closing one of its files.
        let owner = if self.teardown.contains_key(&e.pid) || self.alive.contains_key(&e.pid) {
            Some(e.pid)
        } else {
            self.cases
                .values()
                .find(|c| c.kernel_release.is_none() && c.files.contains(&file))
                .map(|c| c.inc.target.pid)
        };
        if let Some(owner) = owner {
            self.teardown.entry(owner).or_default().calls.push(span);
        }
        if func == DriverFunc::Fput {
            if let Some(&id) = self.unreaped.get(&e.pid) {
                if let Some(c) = self.cases.get_mut(&id) {
                    if c.files.contains(&file) {
                        c.fput_end = c.fput_end.max(Some(e.ts_ns));
                        self.agenda.touch(id);
                    }
                }
            }
        }
    }

    /// Time-based decisions and the reports they make due.
    fn advance(&mut self, out: &mut Vec<Output>) {
        let now = self.now_ns;
        for id in self.agenda.take(now) {
            self.advance_case(id, out);
            if let Some(until) = self.quiet_until(id) {
                self.agenda.quiet(id, until);
            }
            if self.awaits_reading(id) {
                self.await_reading.insert(id);
            }
        }
        self.link_xids();
        self.gpu_errors(false, out);
        // Nothing older than the oldest open case needs its loss reports or teardowns.
        let oldest = self.agenda.oldest();
        self.losses.prune(oldest.unwrap_or(now));
        self.storms.prune(oldest.unwrap_or(now));
        if self.cases.is_empty() {
            // The collector empties the kernel's stack map now: its ids start over.
            self.stacks.clear();
            self.teardown.clear();
        }
    }

    /// Until when nothing can happen to open case `id` that no event touching it brings: a
    /// live process's decisions depend on its own signals and the clock; a dead one's not
    /// known to hold GPU memory (those of kill storms) on its death and reap too; a watched
    /// one's also on the readings that change its memory's account (`watched_quiet_until`).
    /// None: every pass looks at it. A pass over every open case after every event (700k
    /// events in a 150 s soak, teardown samples most of them) was most of the analysis's
    /// work under churn.
    fn quiet_until(&self, id: u64) -> Option<u64> {
        let c = self.cases.get(&id)?;
        let figure = self
            .memory
            .watch(id)
            .is_some_and(|w| w.max_figure().is_some());
        let cfg = &self.config;
        match c.inc.t_group_dead_ns {
            None if c.reported.is_some() => None,
            Some(dead) if c.gpu || figure || c.reported.is_some() => {
                self.watched_quiet_until(id, c, dead)
            }
            None => {
                // Its next survived signal to notice, its stuck report, or its case's end.
                let notice = c
                    .signals
                    .get(c.noticed)
                    .map(|s| s.t_ns.saturating_add(cfg.survive_after_ns));
                let first_kill = c.signals.iter().find(|s| s.sig == SIGKILL).map(|s| s.t_ns);
                let other = match first_kill {
                    Some(t) if !c.stuck_reported => Some(t.saturating_add(cfg.linger_after_ns)),
                    Some(_) => None,
                    None => {
                        let last = c.signals.last().map_or(self.now_ns, |s| s.t_ns);
                        Some(last.saturating_add(cfg.escalation_window_ns))
                    }
                };
                notice.into_iter().chain(other).min()
            }
            Some(dead) => {
                // Reported once reaped, or once nobody reaped it in time, or slow.
                let held_elsewhere = !c.fd_holders.is_empty() || c.unaccounted > 0;
                if held_elsewhere || c.inc.t_reaped_ns.is_some() || !self.reportable_death(id) {
                    return None;
                }
                Some(dead.saturating_add(cfg.reap_wait_ns.min(cfg.slow_after_ns)))
            }
        }
    }

    /// Until when nothing can happen to dead case `id`, whose memory is watched (or which was
    /// reported), that no event touching it brings: its own records, its holders', a reading
    /// that changes its memory's account or one it waits for (`await_reading`); else the
    /// clock's thresholds. None while its memory is off NVML's list but not back, unreported:
    /// whether that is unexplained turns on other teardowns in flight, so every pass looks.
    fn watched_quiet_until(&self, id: u64, c: &Case, dead: u64) -> Option<u64> {
        let back = self.back(id).map(|b| b.0);
        let w = self.memory.watch(id);
        let off_list = w.is_some_and(|w| {
            matches!(w.role, Role::Own { .. })
                && w.max_figure().is_some()
                && !w.listed()
                && w.residuals().next().is_none()
        });
        if c.reported.is_none()
            && self.nvml.is_some()
            && back.is_none()
            && c.kernel_release.is_some()
            && off_list
        {
            return None;
        }
        let cfg = &self.config;
        let times = [
            dead.saturating_add(HELD_REPORT_NS),
            dead.saturating_add(cfg.reap_wait_ns),
            dead.saturating_add(cfg.slow_after_ns),
            dead.saturating_add(cfg.linger_after_ns),
        ];
        let back = back.map(|b| b.saturating_add(HELD_REPORT_NS));
        let in_flight = c.kernel_release.map(|k| k.0.saturating_add(IN_FLIGHT_NS));
        let verified = w
            .into_iter()
            .flat_map(|w| w.residuals())
            .filter_map(|r| r.verified_ns());
        let next = times
            .into_iter()
            .chain(back)
            .chain(in_flight)
            .chain(verified)
            .filter(|t| *t > self.now_ns)
            .min();
        Some(next.unwrap_or(u64::MAX))
    }

    /// Whether dead GPU case `id` waits for a reading taken since its death or its files'
    /// last release: whether it was read then, and what the kernel's release is worth, turn
    /// on it.
    fn awaits_reading(&self, id: u64) -> bool {
        let Some(c) = self.cases.get(&id).filter(|c| c.gpu) else {
            return false;
        };
        let Some(dead) = c.inc.t_group_dead_ns else {
            return false;
        };
        let released = self.last_release(c).unwrap_or(0);
        !self.memory.read_since(dead.max(released.saturating_sub(1)))
    }

    /// One case's time-based decisions and the reports they make due.
    fn advance_case(&mut self, id: u64, out: &mut Vec<Output>) {
        let now = self.now_ns;
        let Some(c) = self.cases.get(&id) else {
            return;
        };
        if c.inc.t_group_dead_ns.is_none() {
            self.advance_alive(id, out);
            return;
        }
        if !self.reportable_death(id) {
            if self.settled(id) {
                self.drop_case(id);
            }
            return;
        }
        let dead = c.inc.t_group_dead_ns.unwrap_or(now);
        let since_death = now.saturating_sub(dead);
        let reaped = c.inc.t_reaped_ns.is_some() || since_death >= self.config.reap_wait_ns;
        let settled = self.settled(id);
        match &c.reported {
            None => {
                let held_elsewhere =
                    !c.fd_holders.is_empty() || c.unaccounted > 0 || self.imported(id);
                // NVML's word on its share comes with the first reading after the death.
                let read = self.nvml.is_none() || self.memory.read_since(dead);
                let due = (settled && reaped)
                    || ((held_elsewhere || self.unexplained(id))
                        && ((reaped && read) || since_death >= HELD_REPORT_NS))
                    || since_death >= self.config.slow_after_ns;
                if due {
                    out.push(self.emit(id, "incident"));
                }
            }
            Some(last) => {
                // Memory back: one final update once the holders' releases are known too.
                let holding = self.back(id).is_some() && !settled;
                if !holding && (settled || self.state(id).as_ref() != Some(last)) {
                    out.push(self.emit(id, "incident_update"));
                }
            }
        }
        if self.cases.get(&id).is_some_and(|c| c.reported.is_some()) && settled {
            self.drop_case(id);
        }
    }

    fn advance_alive(&mut self, id: u64, out: &mut Vec<Output>) {
        let now = self.now_ns;
        self.notices(id, false, out);
        let Some(c) = self.cases.get(&id) else {
            return;
        };
        let first_kill = c.signals.iter().find(|s| s.sig == SIGKILL).map(|s| s.t_ns);
        match first_kill {
            // A SIGKILLed process still alive this long is stuck: say so now.
            Some(t)
                if !c.stuck_reported && now.saturating_sub(t) >= self.config.linger_after_ns =>
            {
                out.push(self.emit(id, "incident"));
                if let Some(c) = self.cases.get_mut(&id) {
                    c.stuck_reported = true;
                }
            }
            Some(_) => {}
            None => {
                let last = c.signals.last().map_or(now, |s| s.t_ns);
                if now.saturating_sub(last) >= self.config.escalation_window_ns {
                    self.drop_case(id);
                }
            }
        }
    }

    /// Reports catchable signals the process survived `survive_after` (at once when the
    /// kernel discarded them, or with `all`, whatever is left).
    fn notices(&mut self, id: u64, all: bool, out: &mut Vec<Output>) {
        let now = self.now_ns;
        let wait = self.config.survive_after_ns;
        let Some(c) = self.cases.get_mut(&id) else {
            return;
        };
        while let Some(s) = c.signals.get(c.noticed) {
            if s.sig == SIGKILL {
                c.noticed += 1;
                continue;
            }
            let survived = now.saturating_sub(s.t_ns);
            if !(all || s.discarded || survived >= wait) {
                break;
            }
            let notice = SignalNotice::new(&c.inc, s.clone(), survived, c.gpu);
            out.push(Output::Signal(Box::new(notice)));
            c.noticed += 1;
        }
    }

    fn drop_case(&mut self, id: u64) {
        if let Some(t) = self.teardown_of(id) {
            self.storms.done(id, t);
        }
        self.await_reading.remove(&id);
        if let Some(c) = self.cases.remove(&id) {
            for holder in c.holder_gone.keys() {
                if let Some(ids) = self.held_for.get_mut(holder) {
                    ids.remove(&id);
                    if ids.is_empty() {
                        self.held_for.remove(holder);
                    }
                }
            }
            let pid = c.inc.target.pid;
            if self.alive.get(&pid) == Some(&id) {
                self.alive.remove(&pid);
            }
            if self.unreaped.get(&pid) == Some(&id) {
                self.unreaped.remove(&pid);
            }
            self.agenda.close(id, c.inc.t_signal_ns);
            let left = self.cases_of_pid.get_mut(&pid).map(|n| {
                *n -= 1;
                *n
            });
            if left == Some(0) {
                self.cases_of_pid.remove(&pid);
                self.teardown.remove(&pid);
            }
            self.memory.forget(id);
        }
    }

    /// A dead GPU case's teardown, for storms.
    pub(super) fn teardown_of(&self, id: u64) -> Option<Teardown> {
        let c = self.cases.get(&id)?;
        let w = self.memory.watch(id)?;
        let (gpu, device) = w.devices.iter().next()?;
        Some(Teardown {
            gpu: *gpu,
            dead_ns: c.inc.t_group_dead_ns?,
            released_ns: c.kernel_release.map(|k| k.0),
            back_ns: self.back(id).map(|b| b.0),
            used_before: device.used_before,
        })
    }

    /// Whether a dead case's memory needs no more watching: it is back, and the holders'
    /// own releases (which follow NVML's reading by a millisecond or so) are known, and so is
    /// the victim's own end (its zombie: the memory can come back before the rest of its exit,
    /// such as unpinning host memory, is done), or a while has passed.
    fn settled(&self, id: u64) -> bool {
        let Some(c) = self.cases.get(&id) else {
            return true;
        };
        if !c.gpu {
            return true;
        }
        if let Some(Role::Nothing) = self.memory.watch(id).map(|w| w.role) {
            return true;
        }
        let Some((back, _)) = self.back(id) else {
            return false;
        };
        if self.suspicion_pending(id) {
            return false;
        }
        let known = c.holder_gone.values().all(Option::is_some);
        let ended = c.inc.t_zombie_ns.is_some() || c.inc.t_reaped_ns.is_some();
        (known && ended) || self.now_ns.saturating_sub(back) >= HELD_REPORT_NS
    }

    /// Whether other teardowns on the same GPU are under way or just done: NVML's readings
    /// lag behind them, so a victim's memory may still be on its way.
    pub(super) fn others_in_flight(&self, id: u64) -> bool {
        let gpus: Vec<u32> = self
            .memory
            .watch(id)
            .map(|w| w.devices.keys().copied().collect())
            .unwrap_or_default();
        let shares_gpu = |w: &Watch| {
            w.devices.keys().any(|g| gpus.contains(g)) || (gpus.is_empty() && w.devices.is_empty())
        };
        self.cases.iter().any(|(other, c)| {
            *other != id
                && c.gpu
                && c.inc.t_group_dead_ns.is_some()
                && self.back(*other).is_none()
                && self
                    .memory
                    .watch(*other)
                    .is_some_and(|w| matches!(w.role, Role::Own { .. }) && shares_gpu(w))
                && c.kernel_release
                    .is_none_or(|(t, _)| self.now_ns.saturating_sub(t) < IN_FLIGHT_NS)
        })
    }

    /// Whether NVML holds the memory of a victim it no longer lists, with no importer found.
    fn unexplained(&self, id: u64) -> bool {
        let Some(w) = self.memory.watch(id) else {
            return false;
        };
        if !matches!(w.role, Role::Own { .. }) || w.max_figure().is_none() {
            return false;
        }
        let released = self.cases.get(&id).and_then(|c| c.kernel_release);
        self.nvml.is_some()
            && !w.listed()
            && w.residuals().next().is_none()
            && released.is_some_and(|(t, _)| self.now_ns.saturating_sub(t) >= IN_FLIGHT_NS)
            && self.back(id).is_none()
            && !self.others_in_flight(id)
    }

    /// Whether importers hold part of a victim's memory. Where driver calls are traced, an
    /// importer only NVML suggests counts once its own calls had time to explain its rise.
    fn imported(&self, id: u64) -> bool {
        let now = self.now_ns;
        self.memory.watch(id).is_some_and(|w| {
            w.residuals()
                .any(|r| !(self.ioctls_traced && r.provisional(now)))
        })
    }

    /// Whether an importer only NVML suggests may still turn out a job allocating: driver
    /// calls are traced, and their records had no time to explain its rise yet.
    fn suspicion_pending(&self, id: u64) -> bool {
        let now = self.now_ns;
        self.ioctls_traced
            && self
                .memory
                .watch(id)
                .is_some_and(|w| w.residuals().any(|r| r.provisional(now)))
    }

    /// Whether a dead case is worth a report: deaths by signal always; exits of GPU holders
    /// when they had memory of their own (or NVML cannot tell).
    fn reportable_death(&self, id: u64) -> bool {
        let Some(c) = self.cases.get(&id) else {
            return false;
        };
        if !c.signals.is_empty() || c.inc.exit.as_ref().is_some_and(|e| e.signal.is_some()) {
            return true;
        }
        // An exit that left its files open in live processes released nothing, unless the
        // memory is known to be its own (a shell's child that inherited them is not news).
        if !c.fd_holders.is_empty() && !c.owns {
            return false;
        }
        match self.memory.watch(id) {
            Some(w) => match w.role {
                Role::Nothing => false,
                Role::Own { .. } if self.nvml.is_some() => {
                    w.share().is_some_and(|(bytes, _)| bytes > 0)
                }
                _ => true,
            },
            None => false,
        }
    }

    /// When the memory of a dead case was back, and what says so: NVML where it reads (or,
    /// when earlier, the kernel's release that NVML confirms), else the kernel (its own
    /// release, or its last other holder's).
    pub(super) fn back(&self, id: u64) -> Option<(u64, Source)> {
        let c = self.cases.get(&id)?;
        if self.nvml.is_some() {
            let nvml = self.memory.back_ns(id);
            let confirmed = self.confirmed_release(id, c);
            let imported = self.memory.has_known_imports(id);
            // NVML's own account where it came with the kernel's release; the confirmed
            // release where NVML's waits on other jobs' memory or its lagging readings, and
            // for imports, whose return NVML sees only as the importer's figure.
            return match (nvml, confirmed) {
                (Some(n), Some(k)) if n > k + NVML_LATE_NS || (imported && n >= k) => {
                    Some((k, Source::Confirmed))
                }
                (Some(n), _) => Some((n, Source::Nvml)),
                (None, k) => k.map(|k| (k, Source::Confirmed)),
            };
        }
        Some((self.last_release(c)?, Source::Kernel))
    }

    /// The kernel's release of the last reference to a case's GPU files: its own, or its
    /// last other holder's; None while someone (known or not) still holds them.
    fn last_release(&self, c: &Case) -> Option<u64> {
        // References nobody known accounts for: someone unseen still holds the files.
        if c.unaccounted > 0 {
            return None;
        }
        let own = c.kernel_release?.0;
        c.holder_gone
            .values()
            .try_fold(own, |t, g| g.map(|g| t.max(g)))
    }

    /// The kernel's last release of a victim's files, once NVML confirms it: no reading since
    /// lists the pid, and its driver calls show nothing of its memory imported elsewhere (under
    /// `--lean`, no other process's NVML figure rose as it left the list), or every importer's
    /// release of it was confirmed too (then the last of those). Other jobs
    /// allocating and freeing at the same moment move the device's used memory that NVML's
    /// own account of the return waits for; this evidence is the victim's and its importers'
    /// alone.
    fn confirmed_release(&self, id: u64, c: &Case) -> Option<u64> {
        if !self.ioctls_traced && !self.lean {
            return None;
        }
        let t = self.last_release(c)?;
        self.memory.confirmed_back(id, t)
    }

    fn state(&self, id: u64) -> Option<Reported> {
        let c = self.cases.get(&id)?;
        let w = self.memory.watch(id);
        Some(Reported {
            holders_left: c
                .holder_gone
                .iter()
                .filter(|(_, g)| g.is_none())
                .map(|(p, _)| *p)
                .chain(w.iter().flat_map(|w| {
                    w.residuals()
                        .filter(|r| r.back_ns.is_none())
                        .map(|r| r.importer)
                }))
                .collect(),
            residuals_back: w.map_or(0, |w| w.residuals().filter(|r| r.back_ns.is_some()).count()),
            importers: w.map_or(0, |w| w.residuals().count()),
            back: self.back(id).is_some(),
            lingering: c
                .inc
                .t_group_dead_ns
                .is_some_and(|d| self.now_ns.saturating_sub(d) >= self.config.linger_after_ns)
                && self.back(id).is_none(),
            dead: c.inc.t_group_dead_ns.is_some(),
        })
    }

    /// The case as a record now, remembering what was reported.
    fn emit(&mut self, id: u64, record_type: &'static str) -> Output {
        let mut inc = self.snapshot(id);
        inc.record_type = record_type;
        inc.settled = inc.t_group_dead_ns.is_some() && self.settled(id);
        let state = self.state(id);
        if let Some(c) = self.cases.get_mut(&id) {
            if record_type == "incident_update" {
                inc.changes = snapshot::changes(c.reported.as_ref(), &inc);
            }
            c.reported = state;
        }
        Output::Incident(Box::new(inc))
    }
}

/// Who reaped a process seen only when the kernel freed it: the parent its SIGCHLD went to
/// (only the parent's wait can reap it; a process that sent none was auto-reaped).
fn freed_by(c: &Case) -> Reaper {
    match &c.parent {
        Some((pid, comm)) => Reaper {
            pid: Some(*pid),
            comm: Some(comm.clone()),
            how: ReapHow::Parent,
        },
        None => Reaper::freed(),
    }
}

fn sender_of(e: &Event, code: i32, comm: &str) -> Sender {
    match super::signals::origin(code) {
        super::signals::Origin::User => Sender {
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

pub(super) fn unique_files(files: impl Iterator<Item = FileId>) -> Vec<FileId> {
    let mut v: Vec<FileId> = files.collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// What linger saw processes do themselves, for telling a rise of a process's NVML figure
/// from an import: its driver calls (the ledger) and its opens.
struct Seen<'a> {
    ledger: &'a Ledger,
    holders: &'a Holders,
    calls: bool,
}

impl OwnUse for Seen<'_> {
    fn taken_on(&self, pid: u32, from_ns: u64, to_ns: u64) -> u64 {
        self.ledger.taken_on(pid, from_ns, to_ns)
    }

    fn new_since(&self, pid: u32, t_ns: u64) -> bool {
        self.holders
            .process(pid)
            .and_then(|p| p.first_open_ns)
            .is_some_and(|t| t >= t_ns)
    }

    fn sees_calls(&self) -> bool {
        self.calls
    }
}
