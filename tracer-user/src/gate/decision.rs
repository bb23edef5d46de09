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
    scope::{Member, Scope, Selectors},
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
        self.blockers.is_empty() && self.dead.is_empty() && self.nvml_failures == 0
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
        let mut blockers = Vec::new();
        for (&pid, s) in procs.iter().filter(|(_, s)| alive(s)) {
            let h = held.get(&pid);
            let nvml_bytes = listed.get(&pid).copied();
            let holds = h.is_some() || nvml_bytes.is_some();
            let member = self.scope.member(pid, s.start_ticks);
            let allowed = self.cfg.allowed.contains(&pid);
            let (kind, how) = match member {
                Some(m) if m.named => (Kind::NotDead, held_how(h, nvml_bytes, "alive")),
                Some(m) if holds => (Kind::LiveHolder, self.member_how(pid, s, m, h, &held)),
                // Its exit closes what it held after /proc stopped listing it, and a close
                // stuck in a driver keeps it: gone only once it is.
                Some(_) if s.exiting => (
                    Kind::NotDead,
                    "exiting: what its exit closes may still be held".into(),
                ),
                _ if !holds => continue,
                None if self.shared.contains_key(&(pid, s.start_ticks)) => {
                    (Kind::SharedFd, self.shared[&(pid, s.start_ticks)].clone())
                }
                None if from_log.contains_key(&pid) => (Kind::SharedFd, from_log[&pid].clone()),
                _ if self.cfg.any_process && !allowed => {
                    (Kind::GpuBusy, held_how(h, nvml_bytes, "not allowed here"))
                }
                None if unattributed && !allowed => (
                    Kind::Unattributed,
                    held_how(h, nvml_bytes, "whose, nothing says"),
                ),
                _ => continue,
            };
            blockers.push(blocker(kind, pid, s, member, how, h, nvml_bytes));
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

    /// How a member came to hold what it holds.
    fn member_how(
        &self,
        pid: u32,
        s: &ProcStat,
        m: &Member,
        h: Option<&Holding>,
        held: &HashMap<u32, Holding>,
    ) -> String {
        let sharing = h.and_then(|h| {
            held.iter()
                .filter(|(&other, _)| other != pid && self.scope.ever(other))
                .find(|(_, o)| h.shares_with(o))
                .map(|(&other, _)| other)
        });
        let got = match sharing {
            Some(other) => format!("the same open GPU file as {other} (inherited or passed)"),
            None if m.why.starts_with("child of") => {
                "inherited from its parent, or opened itself".into()
            }
            None => "opened itself, or inherited in the scope".into(),
        };
        let mut how = format!("{} ({}): {got}", held_how(h, None, "holds"), m.why);
        if s.session == pid {
            how.push_str("; in a session of its own (setsid)");
        }
        if s.ppid == 1 {
            how.push_str("; orphaned (its parent is gone, init adopted it)");
        }
        how
    }
}

fn alive(s: &ProcStat) -> bool {
    !matches!(s.state, 'Z' | 'X' | 'x')
}

fn listed(gpus: &[NvmlGpu]) -> impl Iterator<Item = (u32, &crate::event::NvmlProcess)> {
    gpus.iter()
        .flat_map(|g| g.processes.iter().map(move |p| (g.index, p)))
}

/// What a process holds, in words: its descriptors, mappings and NVML memory.
fn held_how(h: Option<&Holding>, nvml_bytes: Option<Option<u64>>, lead: &str) -> String {
    let mut parts = Vec::new();
    if let Some(h) = h {
        if !h.fds.is_empty() {
            parts.push(format!("{} GPU descriptor(s)", h.fds.len()));
        }
        if !h.mapped.is_empty() {
            parts.push(format!("{} mapping(s) of GPU files", h.mapped.len()));
        }
    }
    match nvml_bytes {
        Some(Some(b)) => parts.push(format!("{} MiB NVML accounts to it", b >> 20)),
        Some(None) => parts.push("memory NVML accounts to it".into()),
        None => {}
    }
    if parts.is_empty() {
        lead.to_string()
    } else {
        format!("{lead}: {}", parts.join(", "))
    }
}

fn blocker(
    kind: Kind,
    pid: u32,
    s: &ProcStat,
    member: Option<&Member>,
    how: String,
    h: Option<&Holding>,
    nvml_bytes: Option<Option<u64>>,
) -> Blocker {
    let info = procfs::proc_info(pid, &procfs::Describe::default());
    Blocker {
        kind,
        pid,
        comm: s.comm.clone(),
        state: s.state,
        ppid: s.ppid,
        session: s.session,
        start_ticks: s.start_ticks,
        scope: member.map(|m| m.why.clone()),
        hint: hint(kind, pid, s),
        how,
        cgroup: info.as_ref().map(|i| i.cgroup.clone()).unwrap_or_default(),
        workload: info.and_then(|i| i.workload),
        fds: h
            .map(|h| h.fds.iter().map(|f| f.fd).collect())
            .unwrap_or_default(),
        mappings: h.map_or(0, |h| h.mapped.len()),
        nvml_bytes: nvml_bytes.flatten(),
    }
}

fn hint(kind: Kind, pid: u32, s: &ProcStat) -> String {
    if s.state == 'D' {
        return format!(
            "{pid} sleeps in the kernel where no signal reaches it (a driver call?): a SIGKILL \
             waits for the call to return; if it does not, drain the node"
        );
    }
    match kind {
        Kind::NotDead => format!("{pid} is still alive: SIGKILL it"),
        Kind::LiveHolder => format!(
            "{pid} outlived the job and keeps its GPU memory: SIGKILL it (and fix whatever \
             forked it to let its workers die with it)"
        ),
        Kind::SharedFd => format!("stop {pid}, or have it close the GPU files it got"),
        Kind::GpuBusy => format!("stop {pid}, or allow it with --allow-pid {pid}"),
        Kind::Unattributed => format!(
            "stop {pid} if it is the job's; to know, start the gate before the kill, scope it \
             by cgroup, job or pod, or run `linger agent`"
        ),
    }
}
