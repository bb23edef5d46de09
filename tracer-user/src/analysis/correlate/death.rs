//! The rules of a death: signals, the group's exit, zombies, reaps, the holders of its files.

use std::collections::{BTreeMap, BTreeSet};

use crate::analysis::{
    holders::{FileId, Holder, How},
    incident::{Action, Delivery, ExitStatus, Incident, Outcome, ReapHow, Reaper, Source, Target},
    memory::{Residual, Role},
    references::{self, Unseen},
    teardown::Leaving,
    termination::SignalSent,
};
use crate::event::Event;

use super::{case::Case, group, Correlator};

impl Correlator {
    fn open_case(&mut self, mut target: Target, t_ns: u64) -> u64 {
        let pid = target.pid;
        target.workload = target.workload.or_else(|| self.workload_of(target.pid));
        let id = self.cases.open(pid, |id| Case {
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
            co_victims: BTreeMap::new(),
            parent: None,
            importer_names: BTreeMap::new(),
            unaccounted: Unseen::default(),
            how_held: None,
            ppid: 0,
            reported: None,
            stuck_reported: false,
        });
        self.agenda.open(id, t_ns);
        self.xids.link(pid, None, t_ns);
        id
    }

    /// A fatal signal `sent` to `target`: the first opens its case. One to a group already
    /// exiting (`exiting`, as the kernel says; or dropped by the kernel while its dead group
    /// is not reaped, in recordings without that word) belongs to the death under way: the
    /// kernel's own kill of what is left of a pid namespace as its init exits, which reaches
    /// the dying init too, or a second kill of the same job. It never opens a case.
    pub(super) fn signal(&mut self, sent: SignalSent, target: Target, exiting: bool) {
        let pid = target.pid;
        let t_ns = sent.t_ns;
        let late = exiting || sent.discarded;
        let id = match (self.cases.of_alive(pid), self.cases.of_unreaped(pid)) {
            (Some(id), _) => id,
            (None, Some(id)) if late => {
                if let Some(c) = self.cases.get_mut(&id) {
                    c.signals.push(SignalSent {
                        discarded: true,
                        ..sent
                    });
                }
                self.agenda.touch(id);
                return;
            }
            (None, _) if exiting => return,
            (None, _) if self.wanted(pid, &target.comm) => self.open_case(target, t_ns),
            (None, _) => return,
        };
        let holds_gpu = self.holders.holds_gpu_files(pid);
        self.killed_holder(pid, &sent);
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

    pub(super) fn delivered(&mut self, e: &Event, sig: u32, handler: u64) {
        let Some(id) = self.cases.of_alive(e.pid) else {
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
    pub(super) fn group_died(&mut self, e: &Event, exit_code: u32, comm: &str) {
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
        let how_held = self
            .holders
            .process(pid)
            .and_then(|p| p.fds.values().next().map(|f| f.how));
        let walked_ns = self.holders.walked_at(pid).unwrap_or(t_ns);
        let held = self.holders.group_died(pid);
        // The cases whose files it held: known, or found by its walk among their unseen
        // references.
        self.unseen_holder_died((pid, ppid, comm), &held, t_ns);
        let holds_for = self.cases.held_by(pid);
        self.co_victim_died(pid, t_ns, &holds_for);
        self.holder_walked(&holds_for, &held, (pid, walked_ns));
        let files = unique_files(held.iter().map(|h| h.file));
        let id = match self.cases.no_longer_alive(pid) {
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
                self.cases.no_longer_alive(pid);
                Some(id)
            }
            None => None,
        };
        if let Some(id) = id {
            self.agenda.touch(id);
            self.cases.unreaped(pid, id);
            if let Some(c) = self.cases.get_mut(&id) {
                if c.inc.target.workload.is_none() {
                    c.inc.target.workload = workload;
                }
            }
            let oom = self.oom_marked.remove(&pid).is_some();
            let fd_holders = self.holders_at_death(id, pid, &files);
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
                c.how_held = how_held;
                c.ppid = ppid;
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
                    let read: Vec<u32> = self.memory.latest().map(|g| g.index).collect();
                    let only = match (infos, read.as_slice()) {
                        ([one], _) => Some(one.index),
                        ([], [one]) => Some(*one),
                        _ => None,
                    };
                    c.ledger_parts = self.ledger.parts(&files, infos, only);
                    c.unaccounted = references::unaccounted(&held, &self.holders, pid);
                    gpu.files = held;
                    c.files = files.clone();
                    c.holder_gone = fd_holders.iter().map(|h| (h.pid, None)).collect();
                    c.fd_holders = fd_holders;
                }
                if c.gpu {
                    c.inc.gpu.get_or_insert_with(Default::default);
                }
            }
            self.keep_unseen(id, walked_ns);
            let others: Vec<u32> = self
                .cases
                .get(&id)
                .map(|c| c.holder_gone.keys().copied().collect())
                .unwrap_or_default();
            for holder in others {
                self.cases.holds_for(holder, id);
            }
            if self.cases.get(&id).is_some_and(|c| c.gpu) {
                self.watch_death(id, pid, t_ns, role, &files);
                self.owner_died(id, &holds_for, comm);
            }
        }
        // A holder of other dead processes' files is gone: their memory may be on its way.
        let watching = self.cases.held_by(pid);
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
        let placed: BTreeMap<u32, u64> = self
            .cases
            .get(&id)
            .iter()
            .flat_map(|c| &c.ledger_parts)
            .filter_map(|p| Some((p.gpu?, p.bytes)))
            .collect();
        self.memory.placed(id, placed);
        // Who imported its objects must be asked before its clients are freed.
        for i in self.ledger.imports_from(files) {
            self.memory.imported(id, i.importer, i.bytes, i.via, i.dups);
        }
    }

    /// Who else held case `id`'s `files` when `pid` died: the live holders, those dying before
    /// it, and which were killed with it.
    fn holders_at_death(&mut self, id: u64, pid: u32, files: &[FileId]) -> Vec<Holder> {
        let mut fd_holders = self.holders.holders_of(files, pid);
        fd_holders.extend(self.dying_holders(id, files));
        self.co_victims_at_death(id, &fd_holders);
        fd_holders
    }

    /// Processes dead before case `id` whose exit has not closed their descriptors of `files`
    /// yet (killed beside it): they hold the files until their own release.
    fn dying_holders(&self, id: u64, files: &[FileId]) -> Vec<Holder> {
        self.cases
            .iter()
            .filter(|(other, o)| {
                **other != id
                    && o.kernel_release.is_none()
                    && o.files.iter().any(|f| files.contains(f))
            })
            .filter_map(|(_, o)| {
                let dead = o.inc.t_group_dead_ns?;
                let fds = o.inc.gpu.iter().flat_map(|g| &g.files);
                Some(Holder {
                    pid: o.inc.target.pid,
                    comm: o.inc.target.comm.clone(),
                    ppid: o.ppid,
                    fds: fds
                        .filter(|h| files.contains(&h.file) && h.fd >= 0)
                        .map(|h| h.fd)
                        .collect(),
                    how: o.how_held.unwrap_or(How::Seen { t_ns: dead }),
                    t_released_ns: None,
                    t_dead_ns: Some(dead),
                    t_killed_ns: None,
                })
            })
            .collect()
    }

    /// Owner `id` of memory died: the reported deaths before it whose files it held and whose
    /// memory was its own (a child killed beside its live parent) follow its memory from now
    /// on, back when its is.
    fn owner_died(&mut self, id: u64, held_for: &[u64], comm: &str) {
        let owns = self
            .memory
            .watch(id)
            .is_some_and(|w| matches!(w.role, Role::Own { .. } | Role::AliasOf(_)));
        if !owns {
            return;
        }
        let pid = self.cases.get(&id).map_or(0, |c| c.inc.target.pid);
        for &other in held_for.iter().filter(|o| **o != id) {
            let nothing = self
                .memory
                .watch(other)
                .is_some_and(|w| w.role == Role::Nothing);
            if !nothing || !self.reportable_death(other) {
                continue;
            }
            self.memory.follow(other, id);
            if let Some(c) = self.cases.get_mut(&other) {
                c.owner = Some(format!("{comm}[{pid}]"));
            }
            self.agenda.touch(other);
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
                    && c.files_may_be_open()
                    && self
                        .memory
                        .watch(**other)
                        .is_none_or(|w| w.role != Role::Nothing)
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

    /// SIGCHLD generated by a thread of `e.pid`: it is a zombie, its files released, when the
    /// group's last thread sent it (`sender_threads` 1: the group's own notification, sent
    /// after every thread's exit closed what it held). With more threads left it is about a
    /// child of the sender's: a thread that leaves while others still exit hands its zombie
    /// children to a subreaper or init, which a SIGCHLD tells, while the release of the GPU
    /// files has not begun (seen on an H100: a killed job's leader handed on a forked child
    /// that had exited, 80 ms before the job's memory came back). Recordings without the
    /// count (0) take the thread that ended the group, which misses the notification when
    /// another thread leaves last (on an H100 under churn, 2 of 1791 jobs: the reap's
    /// moment an RCU grace period later was then taken instead).
    pub(super) fn zombie(&mut self, e: &Event, sender_threads: u32, parent: (u32, String)) {
        let (pid, t_ns) = (e.pid, e.ts_ns);
        let Some(id) = self.cases.of_unreaped(pid) else {
            // An importer with no case of its own let go with its exit.
            self.memory.importer_exited(pid, t_ns);
            return;
        };
        let last_thread = match sender_threads {
            0 => self
                .cases
                .get(&id)
                .and_then(|c| c.dead_tid)
                .is_none_or(|tid| tid == e.tid),
            n => n == 1,
        };
        if !last_thread {
            return;
        }
        if let Some(c) = self.cases.get_mut(&id) {
            c.inc.t_zombie_ns.get_or_insert(t_ns);
            c.parent.get_or_insert(parent);
        }
        self.agenda.touch(id);
        self.kernel_released(id, t_ns);
    }

    /// The exit path is done with the files: the driver hooks' last `__fput` if they timed
    /// one, else this moment (the zombie transition or the reap) as an upper bound.
    pub(super) fn kernel_released(&mut self, id: u64, t_ns: u64) {
        self.kernel_released_by(id, t_ns, Source::Zombie);
    }

    /// [`Self::kernel_released`], at a moment `by` says.
    pub(super) fn kernel_released_by(&mut self, id: u64, t_ns: u64, by: Source) {
        let Some(c) = self.cases.get(&id) else {
            return;
        };
        if c.kernel_release.is_some() {
            return;
        }
        let release = self.own_release_by(c, t_ns).unwrap_or((t_ns, by));
        let pid = c.inc.target.pid;
        if let Some(c) = self.cases.get_mut(&id) {
            c.kernel_release = Some(release);
        }
        self.agenda.touch(id);
        self.memory.kernel_released(id, release.0);
        // Whatever it imported went with its files.
        self.memory.importer_exited(pid, release.0);
        self.holders_changed();
    }

    pub(super) fn reaped(&mut self, e: &Event, reaped_pid: u32, by_wait: bool, comm: &str) {
        let Some(id) = self.cases.reaped(reaped_pid) else {
            self.memory.importer_exited(reaped_pid, e.ts_ns);
            return;
        };
        self.agenda.touch(id);
        // Freed without a SIGCHLD (nobody to reap it): its exit was over at its threads'
        // final switches, an RCU grace period before the free.
        let exited = match (by_wait, self.cases.get(&id)) {
            (false, Some(c)) if c.inc.t_zombie_ns.is_none() => self
                .teardown
                .get(&reaped_pid)
                .and_then(|l| l.exits_over_by(e.ts_ns)),
            _ => None,
        };
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
        match exited {
            Some(t) => self.kernel_released_by(id, t, Source::Exited),
            None => self.kernel_released(id, e.ts_ns),
        }
    }

    /// Dead cases whose other holders let go: when each did (its own release, if it died).
    pub(super) fn holders_changed(&mut self) {
        let now = self.now_ns;
        let mut gone_of: Vec<(u64, u32, u64)> = Vec::new();
        // Only cases with other holders name a holder in `held_for`.
        let ids: BTreeSet<u64> = self.cases.held_by_others();
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
                // A holder that died let go with its own release (or, killed in its pid
                // namespace's teardown, by the end of the init's exit, which waits for it);
                // one that closed, now.
                let t = match self.case_of_dead(holder) {
                    Some(hc) => match (hc.kernel_release, group::released_in_teardown(c, holder)) {
                        (Some((t, _)), _) => t,
                        // Its own release, where the hooks or its threads' sights tell it.
                        (None, Some(t)) => self.own_release_by(hc, t).map_or(t, |r| r.0),
                        (None, None) => continue,
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

    /// When case `c`'s process let go of its files at or before `t_ns`, where more than the
    /// end of its exit says: the driver hooks' last `__fput`, else its threads' leaving of the
    /// driver.
    pub(super) fn own_release_by(&self, c: &Case, t_ns: u64) -> Option<(u64, Source)> {
        self.release_seen_by(c, t_ns).map(|(l, by)| (l.at, by))
    }

    /// [`Self::own_release_by`], where it was the driver's release of a file (the hooks'
    /// `__fput`, or a leaving after a sight in the driver's file release): it ran once every
    /// other reference had gone. A leaving known only to come during the exit (its stacks
    /// lost) is not: the exit also enters the driver to unmap its memory.
    pub(super) fn closing_release_by(&self, c: &Case, t_ns: u64) -> Option<u64> {
        self.release_seen_by(c, t_ns)
            .filter(|(l, _)| l.closing)
            .map(|(l, _)| l.at)
    }

    /// How closely the driver's own free is known where the kernel's release at `back` (case
    /// `c`'s own, or one of its holders') is the moment: exactly where the hooks timed it, to
    /// the time since the last sight inside the driver where its threads' leaving placed it;
    /// None where `back` is a bound (a zombie transition, a final switch).
    pub(super) fn moment_known_to(&self, c: &Case, back: u64) -> Option<u64> {
        let holders = c
            .holder_gone
            .keys()
            .filter_map(|&pid| self.case_of_dead(pid));
        std::iter::once(c)
            .chain(holders)
            .filter_map(|x| self.release_seen_by(x, back))
            .find(|(l, _)| l.at == back)
            .map(|(l, _)| l.at - l.since)
    }

    /// The last release of case `c`'s files by `t_ns` that the hooks (`__fput`) or its
    /// threads' sights place.
    fn release_seen_by(&self, c: &Case, t_ns: u64) -> Option<(Leaving, Source)> {
        if let Some(end) = c.fput_end.filter(|end| *end <= t_ns) {
            let exact = Leaving {
                at: end,
                since: end,
                closing: true,
            };
            return Some((exact, Source::Fput));
        }
        let log = self.teardown.get(&c.inc.target.pid)?;
        let window = (c.inc.t_signal_ns, t_ns);
        let dead = c.inc.t_group_dead_ns;
        let mut leaving = log.left_driver_by(&self.stacks, window, dead)?;
        // Its stacks lost, a leaving during its exit is still the driver's file release where
        // its exit walk showed it the last holder of a GPU file: that release is the last thing
        // of its exit to enter the driver (its memory's unmapping comes before it).
        leaving.closing |= dead.is_some_and(|d| leaving.since >= d) && sole_holder(c);
        Some((leaving, Source::LeftDriver))
    }

    /// The case of a dead process (the latest, should the pid have been reused).
    pub(super) fn case_of_dead(&self, pid: u32) -> Option<&Case> {
        self.cases
            .values()
            .rev()
            .find(|c| c.inc.target.pid == pid && c.inc.t_group_dead_ns.is_some())
            .map(Box::as_ref)
    }

    /// Remembers the importers' names while they are known: an import is back with its
    /// importer's end, when the importer itself may be gone.
    pub(super) fn name_importers(&mut self, id: u64, residuals: &[Residual]) {
        let names: Vec<(u32, (String, u32))> = residuals
            .iter()
            .filter_map(|r| Some((r.importer, self.name_of(r.importer)?)))
            .collect();
        if let Some(c) = self.cases.get_mut(&id) {
            c.importer_names.extend(names);
        }
    }

    /// A process's comm and parent, from its table or its case.
    pub(in crate::analysis) fn name_of(&self, pid: u32) -> Option<(String, u32)> {
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

fn unique_files(files: impl Iterator<Item = FileId>) -> Vec<FileId> {
    let mut v: Vec<FileId> = files.collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Whether case `c`'s exit walk showed it the only holder of one of its GPU files: that file's
/// references were its own descriptors' (a GPU file's count is one per descriptor, FACTS).
fn sole_holder(c: &Case) -> bool {
    let files = c.inc.gpu.iter().flat_map(|g| &g.files);
    files.clone().any(|f| {
        let own = files.clone().filter(|g| g.file == f.file).count() as u64;
        references::is_gpu_node(f.dev) && f.refcount == own
    })
}
