//! When a case's memory is back: NVML's readings, driver calls, the kernel's release, and how
//! closely NVML is to be read meanwhile.

use crate::analysis::{
    holders::Holders,
    incident::Source,
    ledger::Ledger,
    memory::{Change, ImportVia, NvmlNeed, OwnUse, Role, Watch},
    teardown::DriverSpan,
};
use crate::event::{DriverFunc, Event, NvmlGpu};

use super::{case::Case, Correlator, HELD_REPORT_NS, IN_FLIGHT_NS, NVML_LATE_NS};

impl Correlator {
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
        match released {
            Some(t) if self.memory.imports_released(id) => NvmlNeed::Confirm(t),
            _ => NvmlNeed::Await,
        }
    }

    /// `pid` freed driver objects: whatever of a victim's it imported, if its duplicates
    /// went with them.
    pub(super) fn freed_by(&mut self, pid: u32, t_ns: u64) {
        for (key, dups) in self.memory.imports_held_by(pid) {
            if !self.ledger.holds_dups(&dups) {
                self.memory.import_freed(key, pid, t_ns);
                self.agenda.touch(key);
            }
        }
    }

    pub(super) fn nvml_reading(&mut self, t_ns: u64, gpus: &[NvmlGpu]) {
        let seen = Seen {
            ledger: &self.ledger,
            holders: &self.holders,
            calls: self.ioctls_traced,
        };
        let changes = self.memory.reading(t_ns, gpus, seen);
        let mut touched = self.memory.take_touched();
        touched.append(&mut self.cases.take_awaiting_reading());
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
            if self.cases.get(&id).is_some() {
                self.agenda.touch(id);
            }
        }
        // The first reading changes how every case's memory is judged. Later ones concern
        // only the cases whose memory's account they changed, those waiting for a reading and
        // those it lists now: a pass over every quiet case after each reading (a millisecond
        // apart while memory is awaited) was most of the collector's work in kill storms.
        if !self.memory.nvml() {
            self.agenda.touch_all();
        }
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

    pub(super) fn driver_call(&mut self, e: &Event, func: DriverFunc, file: u64, duration_ns: u64) {
        let span = DriverSpan {
            func,
            tid: e.tid,
            start_ns: e.ts_ns.saturating_sub(duration_ns),
            end_ns: e.ts_ns,
        };
        // The dying process's own thread, or a driver worker closing one of its files.
        let owner = if self.teardown.contains_key(&e.pid) || self.cases.of_alive(e.pid).is_some() {
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
            // The driver's own release inside it, where its functions are hooked: the rest of
            // `__fput` can be preempted for milliseconds after the memory is back.
            let released = self
                .teardown
                .get(&e.pid)
                .and_then(|log| log.driver_release_within(&span))
                .unwrap_or(e.ts_ns);
            if let Some(id) = self.cases.of_unreaped(e.pid) {
                if let Some(c) = self.cases.get_mut(&id) {
                    if c.files.contains(&file) {
                        c.fput_end = c.fput_end.max(Some(released));
                        self.agenda.touch(id);
                    }
                }
            }
        }
    }

    /// A thread of dying `owner` left the CPU for good. Once the group is dead and every one
    /// of its threads has, its exit is over, the release of its files with it: a
    /// process nobody reaps (its parent ignores SIGCHLD, as a pid namespace's dying init
    /// does) sends no SIGCHLD, and its free comes an RCU grace period later, or never while
    /// something holds its task.
    pub(super) fn thread_exited(&mut self, owner: u32, t_ns: u64) {
        let Some(id) = self.cases.of_unreaped(owner) else {
            return;
        };
        let (Some(c), Some(log)) = (self.cases.get(&id), self.teardown.get(&owner)) else {
            return;
        };
        // Every thread's exit seen: it was signalled (followed from then on), and as many
        // threads exited as it had.
        let all_seen =
            !c.signals.is_empty() && c.inc.exits.len() >= c.inc.target.threads.max(1) as usize;
        let over = c.kernel_release.is_none()
            && c.inc.t_zombie_ns.is_none()
            && all_seen
            && c.dead_tid.is_some_and(|t| log.has_exited(t))
            && c.inc.exits.iter().all(|x| log.has_exited(x.tid));
        if over {
            self.kernel_released_by(id, t_ns, Source::Exited);
        }
    }

    /// Whether a dead case's memory needs no more watching: it is back, and the holders'
    /// own releases (which follow NVML's reading by a millisecond or so) are known, and so is
    /// the victim's own end (its zombie: the memory can come back before the rest of its exit,
    /// such as unpinning host memory, is done), or a while has passed.
    pub(super) fn settled(&self, id: u64) -> bool {
        let Some(c) = self.cases.get(&id) else {
            return true;
        };
        if !c.gpu {
            return true;
        }
        if let Some(Role::Nothing) = self.memory.watch(id).map(|w| w.role) {
            // Its files stay open in live owners: an unreported death is done; a reported
            // one is followed until they let go (and its memory is theirs, back with it).
            return !self.reportable_death(id) || c.holder_gone.values().all(Option::is_some);
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
    pub(in crate::analysis) fn others_in_flight(&self, id: u64) -> bool {
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
    pub(super) fn unexplained(&self, id: u64) -> bool {
        let Some(w) = self.memory.watch(id) else {
            return false;
        };
        if !matches!(w.role, Role::Own { .. }) || w.max_figure().is_none() {
            return false;
        }
        let released = self.cases.get(&id).and_then(|c| c.kernel_release);
        self.memory.nvml()
            && !w.listed()
            && w.residuals().next().is_none()
            && released.is_some_and(|(t, _)| self.now_ns.saturating_sub(t) >= IN_FLIGHT_NS)
            && self.back(id).is_none()
            && !self.others_in_flight(id)
    }

    /// Whether importers hold part of a victim's memory. Where driver calls are traced, an
    /// importer only NVML suggests counts once its own calls had time to explain its rise.
    pub(super) fn imported(&self, id: u64) -> bool {
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

    /// When the memory of a dead case was back, and what says so: NVML where it reads (or,
    /// when earlier, the kernel's release that NVML confirms), else the kernel (its own
    /// release, or its last other holder's).
    pub(in crate::analysis) fn back(&self, id: u64) -> Option<(u64, Source)> {
        let c = self.cases.get(&id)?;
        // An alias's memory is its owner's: back when the owner's incident says it is.
        if let Some(owner) = self.memory.owner_of(id) {
            return match self.cases.get(&owner) {
                Some(_) => self.back(owner),
                None => self.memory.kept_back(owner),
            };
        }
        if self.memory.nvml() {
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
    pub(super) fn last_release(&self, c: &Case) -> Option<u64> {
        // References nobody known accounts for: someone unseen still holds the files.
        if c.unaccounted.any() {
            return None;
        }
        let (own, _) = c.kernel_release?;
        let mut last = own;
        // The driver's release of the files, seen: it ran once every other reference went,
        // whatever later bound (a zombie transition) another holder's exit gave.
        let mut closed = (self.closing_release_by(c, own) == Some(own)).then_some(own);
        for (&pid, gone) in &c.holder_gone {
            let g = (*gone)?;
            last = last.max(g);
            let closing = self
                .case_of_dead(pid)
                .is_some_and(|hc| self.closing_release_by(hc, g) == Some(g));
            if closing {
                closed = Some(closed.map_or(g, |t| t.max(g)));
            }
        }
        Some(closed.unwrap_or(last))
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
