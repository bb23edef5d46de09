//! One gate: its scope, what it looks at each tick, and the rules that decide whether the
//! GPUs are clean.
//!
//! A tick is cheap: NVML's reading, the last look's blockers checked again, the scope's new
//! children. Only when nothing blocks any more does the gate look at every process's GPU
//! descriptors and memory mappings: clean is only ever said after such a look. While
//! something blocks it also looks at every process's descriptors now and then (mappings only
//! of the scope's processes and the last blockers: reading every process's maps is most of a
//! look's cost), to name new holders and see the files the scope passes on.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    time::{Duration, Instant},
};

use crate::{
    clock::boottime_ns,
    event::NvmlGpu,
    probe::devices::GpuDevices,
    source::{
        nvml,
        procfs::{self, ProcStat},
    },
};

use super::{
    estimate::estimate,
    findings::{Blocker, Dead, Kind, Known},
    holdings::{self, Holding, Nodes},
    log::Log,
    released::Releases,
    rules::{self, Answer, InScope, Policy, Process},
    scope::{Scope, Selectors},
};

/// A look at every process at least this often while something blocks: new holders are
/// named, and files the scope passes to other processes are seen while the scope still holds
/// them...
const LOOK_EVERY: Duration = Duration::from_secs(5);
/// ...and at most at this share of its own cost (a look that took 20 ms waits 5 s, one that
/// took 200 ms on a node of many processes waits 10 s).
const LOOK_SHARE: u32 = 50;

/// The kernel threads' parent.
const KTHREADD: u32 = 2;

/// NVML and the GPUs (by index) its readings are taken from; None: every GPU.
pub struct NvmlScope {
    pub reader: nvml::Reader,
    pub indices: Option<Vec<u32>>,
}

pub struct Config {
    pub selectors: Selectors,
    pub any_process: bool,
    pub allowed: Vec<u32>,
    /// The device files looked at.
    pub devices: GpuDevices,
    /// Their nodes, for telling their memory mappings.
    pub node_paths: Vec<PathBuf>,
    pub nvml: Option<NvmlScope>,
    pub log: Option<Log>,
}

pub struct Gate {
    cfg: Config,
    scope: Scope,
    nodes: Nodes,
    /// Processes outside the scope found holding an open file of the scope's, and how.
    shared: HashMap<(u32, u64), String>,
    /// When members were first seen dead (boot-time ns).
    died: HashMap<u32, u64>,
    pub blockers: Vec<Blocker>,
    pub dead: Vec<Dead>,
    /// Without the agent's word on dead memory: live processes holding GPU files NVML does
    /// not list.
    pub candidates: Vec<(u32, String)>,
    /// NVML answers that failed in the last reading.
    pub nvml_failures: u64,
    /// Dead processes NVML stopped listing, until their memory is down on the device.
    releases: Releases,
    /// When the last look at every process began, and what it cost.
    last_full: Option<(Instant, Duration)>,
    ticks_per_s: u64,
}

impl Gate {
    pub fn new(cfg: Config) -> Self {
        let nodes = Nodes::of_paths(cfg.node_paths.iter().map(PathBuf::as_path), &cfg.devices);
        let ticks_per_s = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .map_or(100, |t| t as u64);
        Self {
            scope: Scope::new(cfg.selectors.clone()),
            cfg,
            nodes,
            shared: HashMap::new(),
            died: HashMap::new(),
            blockers: Vec::new(),
            dead: Vec::new(),
            candidates: Vec::new(),
            nvml_failures: 0,
            releases: Releases::default(),
            last_full: None,
            ticks_per_s,
        }
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    pub fn log(&self) -> Option<&Log> {
        self.cfg.log.as_ref()
    }

    pub fn has_nvml(&self) -> bool {
        self.cfg.nvml.is_some()
    }

    /// One tick; true when the GPUs are clean.
    pub fn tick(&mut self) -> bool {
        self.scope.follow_children();
        let listed = self.read_nvml();
        let still = self.blockers.iter().any(|b| self.still_blocks(b, &listed));
        let due = self
            .last_full
            .is_none_or(|(t, cost)| t.elapsed() >= LOOK_EVERY.max(cost * LOOK_SHARE));
        if !still && self.dead.is_empty() {
            self.full_look(&listed, true);
        } else if due {
            self.full_look(&listed, false);
        }
        self.is_clean()
    }

    /// A full look now, for the final report.
    pub fn look_again(&mut self) {
        let listed = self.read_nvml();
        self.full_look(&listed, true);
    }

    pub fn is_clean(&self) -> bool {
        self.answer() == Answer::Clean
    }

    /// What `linger wait` answers after the last look.
    pub fn answer(&self) -> Answer {
        rules::answer(self.blockers.len(), self.dead.len(), self.nvml_failures)
    }

    /// NVML's reading of the scope's GPUs: memory of dead processes into `dead`; returns
    /// the live processes listed, with their memory.
    fn read_nvml(&mut self) -> HashMap<u32, Option<u64>> {
        let Some(n) = &self.cfg.nvml else {
            return HashMap::new();
        };
        let (gpus, failures) = n
            .reader
            .read_some(|i| n.indices.as_ref().is_none_or(|w| w.contains(&i)));
        self.nvml_failures = failures;
        self.releases.take(&gpus, procfs::dead_or_invisible);
        let mut live: HashMap<u32, Option<u64>> = HashMap::new();
        let mut dead = Vec::new();
        for (gpu, p) in listed(&gpus) {
            if procfs::dead_or_invisible(p.pid) {
                dead.push(self.dead_entry(p.pid, gpu, p.used, None));
            } else {
                let sum = live.get(&p.pid).copied().unwrap_or(Some(0));
                live.insert(p.pid, sum.zip(p.used).map(|(a, b)| a + b));
            }
        }
        for u in self.releases.pending.clone() {
            dead.push(self.dead_entry(u.pid, u.gpu, Some(u.share), Some("unlisted")));
        }
        self.dead = dead;
        live
    }

    /// `state`: how it is dead, when not from /proc (`unlisted`: NVML no longer lists it,
    /// its memory not yet down on the device).
    fn dead_entry(
        &mut self,
        pid: u32,
        gpu: u32,
        bytes: Option<u64>,
        state: Option<&'static str>,
    ) -> Dead {
        let since = self.member_start_ns(pid);
        let incident = self
            .cfg
            .log
            .as_ref()
            .and_then(|log| log.incident(pid, since));
        Dead {
            pid,
            gpu,
            bytes,
            state: state.unwrap_or(if procfs::exists(pid) {
                "zombie"
            } else {
                "gone"
            }),
            incident: incident.map(|i| Known {
                id: i.id,
                verdict: i.verdict.clone(),
                hint: i.hint.clone(),
                holders: i
                    .holders
                    .iter()
                    .filter(|h| !h.released && self.alive_before(h.pid, i.t_signal_ns))
                    .cloned()
                    .collect(),
            }),
            estimate: None,
        }
    }

    /// For the report: when each dead process's memory should be back, from the log's past
    /// incidents (not every tick: a long log has many).
    pub fn estimate_dead(&mut self) {
        let Some(log) = &self.cfg.log else {
            return;
        };
        let now = boottime_ns();
        for d in &mut self.dead {
            let began = log
                .incident(d.pid, None)
                .map(|i| i.t_signal_ns)
                .or_else(|| self.died.get(&d.pid).copied());
            d.estimate = estimate(
                log.releases(),
                d.bytes,
                began.map(|b| now.saturating_sub(b)),
            );
        }
    }

    /// Whether `pid` is alive and the process that had it at `t_ns` (started before then).
    fn alive_before(&self, pid: u32, t_ns: u64) -> bool {
        procfs::stat(pid)
            .is_some_and(|s| alive(&s) && s.start_ticks * 1_000_000_000 / self.ticks_per_s <= t_ns)
    }

    /// When the scope's process of this pid started (boot-time ns), if the gate saw it.
    fn member_start_ns(&self, pid: u32) -> Option<u64> {
        self.scope
            .members()
            .filter(|m| m.pid == pid)
            .map(|m| m.start_ticks * 1_000_000_000 / self.ticks_per_s)
            .max()
    }

    /// Whether a blocker of the last look still blocks: the same process, alive, and (but
    /// for a named one, which must die) still holding GPU files or listed by NVML.
    fn still_blocks(&self, b: &Blocker, listed: &HashMap<u32, Option<u64>>) -> bool {
        let Some(s) = procfs::stat(b.pid).filter(|s| s.start_ticks == b.start_ticks) else {
            return false;
        };
        if !alive(&s) {
            return false;
        }
        if b.kind == Kind::NotDead || listed.contains_key(&b.pid) {
            return true;
        }
        !holdings::of(b.pid, &self.cfg.devices, &self.nodes, b.mappings > 0).is_empty()
    }

    /// Looks at every process: their GPU descriptors, and their mappings where `all_maps`,
    /// else only the scope's and the last blockers'.
    fn full_look(&mut self, listed: &HashMap<u32, Option<u64>>, all_maps: bool) {
        let began = Instant::now();
        // Kernel threads (kthreadd, 2, and its children) hold no files: hundreds of them on
        // a GPU node, not worth reading.
        let procs: BTreeMap<u32, ProcStat> = procfs::others()
            .filter(|&pid| pid != KTHREADD)
            .filter_map(|pid| Some((pid, procfs::stat(pid)?)))
            .filter(|(_, s)| s.ppid != KTHREADD)
            .collect();
        let now = boottime_ns();
        for m in self.scope.members() {
            if procs
                .get(&m.pid)
                .is_none_or(|s| s.start_ticks != m.start_ticks || !alive(s))
            {
                self.died.entry(m.pid).or_insert(now);
            }
        }
        self.scope.look(&procs);
        if let Some(log) = &mut self.cfg.log {
            log.catch_up();
        }
        let mut held: HashMap<u32, Holding> = HashMap::new();
        for (&pid, s) in procs.iter().filter(|(_, s)| alive(s)) {
            let maps = all_maps
                || self.scope.member(pid, s.start_ticks).is_some()
                || self.blockers.iter().any(|b| b.pid == pid && b.mappings > 0);
            let h = holdings::of(pid, &self.cfg.devices, &self.nodes, maps);
            self.nodes.learn(&h.fds);
            if !h.is_empty() {
                held.insert(pid, h);
            }
        }
        self.note_shared(&procs, &held);
        let from_log = self.log_holders(&procs);
        let unattributed = self.cfg.nvml.is_none()
            && self.scope.unseen.iter().any(|&pid| {
                self.cfg
                    .log
                    .as_ref()
                    .is_none_or(|log| log.incident(pid, None).is_none())
            });
        let policy = Policy {
            any_process: self.cfg.any_process,
            unattributed,
        };
        let mut blockers = Vec::new();
        for (&pid, s) in procs.iter().filter(|(_, s)| alive(s)) {
            let member = self.scope.member(pid, s.start_ticks);
            let h = held.get(&pid);
            let process = Process {
                pid,
                state: s.state,
                session: s.session,
                ppid: s.ppid,
                exiting: s.exiting,
                scope: member.map(|m| InScope {
                    named: m.named,
                    why: &m.why,
                }),
                holding: h,
                nvml_bytes: listed.get(&pid).copied(),
                // Only a holding member's words name it.
                shares_with: member.and(h).and_then(|h| self.sharing(pid, h, &held)),
                got_from_scope: self
                    .shared
                    .get(&(pid, s.start_ticks))
                    .or_else(|| from_log.get(&pid))
                    .map(String::as_str),
                allowed: self.cfg.allowed.contains(&pid),
            };
            if let Some((kind, how)) = rules::blocks(&process, &policy) {
                blockers.push(blocker(
                    kind,
                    &process,
                    s,
                    member.map(|m| m.why.clone()),
                    how,
                ));
            }
        }
        blockers.sort_by_key(|b| (b.kind, b.pid));
        self.blockers = blockers;
        self.candidates = if self.dead.iter().any(|d| d.incident.is_none()) {
            held.keys()
                .filter(|p| !listed.contains_key(p))
                .filter_map(|&p| Some((p, procs.get(&p)?.comm.clone())))
                .collect()
        } else {
            Vec::new()
        };
        self.candidates.sort();
        self.last_full = Some((began, began.elapsed()));
    }

    /// Processes outside the scope holding an open file a live member holds too: they keep
    /// it when the member goes.
    fn note_shared(&mut self, procs: &BTreeMap<u32, ProcStat>, held: &HashMap<u32, Holding>) {
        let members: Vec<(u32, &Holding)> = held
            .iter()
            .filter(|(pid, _)| {
                procs
                    .get(pid)
                    .is_some_and(|s| self.scope.member(**pid, s.start_ticks).is_some())
            })
            .map(|(&pid, h)| (pid, h))
            .collect();
        for (&pid, h) in held {
            let Some(s) = procs.get(&pid) else { continue };
            let id = (pid, s.start_ticks);
            if self.scope.member(pid, s.start_ticks).is_some() || self.shared.contains_key(&id) {
                continue;
            }
            if let Some((owner, _)) = members.iter().find(|(_, m)| h.shares_with(m)) {
                let same_number = members
                    .iter()
                    .find(|(o, _)| o == owner)
                    .is_some_and(|(_, m)| h.fds.iter().any(|f| m.fds.iter().any(|g| g.fd == f.fd)));
                let how = if same_number {
                    format!("inherited from {owner} (its open GPU file, at the same descriptor number: forked from it before leaving)")
                } else {
                    format!("passed from {owner} (its open GPU file, at another descriptor number: over a unix socket or pidfd_getfd)")
                };
                self.shared.insert(id, how);
            }
        }
    }

    /// Live holders the agent's incidents of the named processes name, and how they got the
    /// files or memory.
    fn log_holders(&self, procs: &BTreeMap<u32, ProcStat>) -> HashMap<u32, String> {
        let Some(log) = &self.cfg.log else {
            return HashMap::new();
        };
        let mut out = HashMap::new();
        for &pid in &self.scope.selectors().pids {
            let Some(incident) = log.incident(pid, self.member_start_ns(pid)) else {
                continue;
            };
            for h in incident.holders.iter().filter(|h| !h.released) {
                // The same process: alive, and started before the death it holds memory of.
                if procs.contains_key(&h.pid) && self.alive_before(h.pid, incident.t_signal_ns) {
                    out.insert(
                        h.pid,
                        format!(
                            "{} (the agent's incident {} of {pid}: verdict {})",
                            h.how, incident.id, incident.verdict
                        ),
                    );
                }
            }
        }
        out
    }

    /// Another process the scope ever had that holds an open GPU file `h` (of `pid`) holds.
    fn sharing(&self, pid: u32, h: &Holding, held: &HashMap<u32, Holding>) -> Option<u32> {
        held.iter()
            .filter(|(&other, _)| other != pid && self.scope.ever(other))
            .find(|(_, o)| h.shares_with(o))
            .map(|(&other, _)| other)
    }
}

fn alive(s: &ProcStat) -> bool {
    !matches!(s.state, 'Z' | 'X' | 'x')
}

fn listed(gpus: &[NvmlGpu]) -> impl Iterator<Item = (u32, &crate::event::NvmlProcess)> {
    gpus.iter()
        .flat_map(|g| g.processes.iter().map(move |p| (g.index, p)))
}

fn blocker(kind: Kind, p: &Process, s: &ProcStat, scope: Option<String>, how: String) -> Blocker {
    let info = procfs::proc_info(p.pid, &procfs::Describe::default());
    Blocker {
        kind,
        pid: p.pid,
        comm: s.comm.clone(),
        state: s.state,
        ppid: s.ppid,
        session: s.session,
        start_ticks: s.start_ticks,
        scope,
        hint: rules::hint(kind, p),
        how,
        cgroup: info.as_ref().map(|i| i.cgroup.clone()).unwrap_or_default(),
        workload: info.and_then(|i| i.workload),
        fds: p
            .holding
            .map(|h| h.fds.iter().map(|f| f.fd).collect())
            .unwrap_or_default(),
        mappings: p.holding.map_or(0, |h| h.mapped.len()),
        nvml_bytes: p.nvml_bytes.flatten(),
    }
}
