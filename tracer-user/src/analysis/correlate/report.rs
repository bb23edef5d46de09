//! When a case is reported and updated, and when it closes.

use crate::analysis::{memory::Role, notice::SignalNotice, signals::SIGKILL, storm::Teardown};

use super::{
    case::{Case, Reported},
    snapshot, Correlator, Output, HELD_REPORT_NS, IN_FLIGHT_NS,
};

impl Correlator {
    /// Time-based decisions and the reports they make due.
    pub(super) fn advance(&mut self, out: &mut Vec<Output>) {
        let now = self.now_ns;
        for id in self.agenda.take(now) {
            self.advance_case(id, out);
            if let Some(until) = self.quiet_until(id) {
                self.agenda.quiet(id, until);
            }
            if self.awaits_reading(id) {
                self.cases.await_reading(id);
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
    pub(super) fn quiet_until(&self, id: u64) -> Option<u64> {
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
                let held_elsewhere = !c.fd_holders.is_empty() || c.unaccounted.any();
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
            && self.memory.nvml()
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
        // A slow report waiting for NVML (`nvml_lags`) is due by then at the latest.
        let lagging = c
            .kernel_release
            .map(|k| k.0.saturating_add(cfg.slow_after_ns));
        let verified = w
            .into_iter()
            .flat_map(|w| w.residuals())
            .filter_map(|r| r.verified_ns());
        let next = times
            .into_iter()
            .chain(back)
            .chain(in_flight)
            .chain(lagging)
            .chain(verified)
            .filter(|t| *t > self.now_ns)
            .min();
        Some(next.unwrap_or(u64::MAX))
    }

    /// Whether only NVML keeps case `id`'s memory from being called back: the kernel released
    /// its files, and no reading has completed since (its calls queue behind the driver's lock
    /// in a storm), for less than the slow threshold. Its slow report waits for that reading
    /// (or the threshold again): a teardown the kernel finished is not one still under way.
    fn nvml_lags(&self, id: u64) -> bool {
        let Some(c) = self.cases.get(&id) else {
            return false;
        };
        let now = self.now_ns;
        self.memory.nvml()
            && self.back(id).is_none()
            && c.kernel_release.is_some_and(|(k, _)| {
                !self.memory.read_since(k) && now.saturating_sub(k) < self.config.slow_after_ns
            })
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
        let dead = c.inc.t_group_dead_ns.unwrap_or(now);
        let since_death = now.saturating_sub(dead);
        if !self.reportable_death(id) {
            // Kept until its exit let go of its files: a victim dying meanwhile (a parent
            // killed as its child exits) counts it among the holders letting go, not as
            // references nobody accounts for.
            let let_go = c.kernel_release.is_some() || since_death >= self.config.reap_wait_ns;
            if self.settled(id) && let_go {
                self.drop_case(id);
            }
            return;
        }
        let reaped = c.inc.t_reaped_ns.is_some() || since_death >= self.config.reap_wait_ns;
        let settled = self.settled(id);
        match &c.reported {
            None => {
                let held_elsewhere =
                    !c.fd_holders.is_empty() || c.unaccounted.any() || self.imported(id);
                // NVML's word on its share comes with the first reading after the death.
                let read = !self.memory.nvml() || self.memory.read_since(dead);
                let slow = since_death >= self.config.slow_after_ns && !self.nvml_lags(id);
                // Holders killed with it let go with their exits: their deaths give the verdict.
                let waits = self.awaits_co_victims(id);
                let due = (settled && reaped)
                    || ((held_elsewhere || self.unexplained(id))
                        && !waits
                        && ((reaped && read) || since_death >= HELD_REPORT_NS))
                    || slow;
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
    pub(super) fn notices(&mut self, id: u64, all: bool, out: &mut Vec<Output>) {
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
        if let Some(back) = self.back(id) {
            self.memory.keep_back(id, back);
        }
        if let Some((c, last_of_pid)) = self.cases.close(id) {
            self.agenda.close(id, c.inc.t_signal_ns);
            if last_of_pid {
                self.teardown.remove(&c.inc.target.pid);
            }
            self.memory.forget(id);
        }
    }

    /// A dead GPU case's teardown, for storms.
    pub(in crate::analysis) fn teardown_of(&self, id: u64) -> Option<Teardown> {
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

    /// Whether a dead case is worth a report: deaths by signal always; exits of GPU holders
    /// when they had memory of their own (or NVML cannot tell).
    pub(super) fn reportable_death(&self, id: u64) -> bool {
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
                Role::Own { .. } if self.memory.nvml() => {
                    w.share().is_some_and(|(bytes, _)| bytes > 0)
                }
                _ => true,
            },
            None => false,
        }
    }

    pub(super) fn state(&self, id: u64) -> Option<Reported> {
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
    pub(super) fn emit(&mut self, id: u64, record_type: &'static str) -> Output {
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
