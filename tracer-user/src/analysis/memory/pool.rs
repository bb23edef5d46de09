//! Releases counted per GPU in a pool, corrected by other processes' figures, and credited
//! to victims in the order of their own release.

use std::collections::{BTreeMap, BTreeSet};

use crate::event::NvmlGpu;

use super::{
    book::{MemoryBook, Pool},
    import_via::ImportVia,
    imports::{importers_of, Importers},
    limits::{tolerance, ALLOC_LAG_NS, CONFIRM_AFTER_NS},
    reading::{figure, Change, OwnUse},
    role::Role,
    watch::Rise,
};

impl MemoryBook {
    /// Updates each watch's figures on `g`'s GPU.
    pub(super) fn note_listing(&mut self, g: &NvmlGpu) {
        let mut listed: BTreeSet<u64> = BTreeSet::new();
        let mut seen: BTreeSet<u32> = BTreeSet::new();
        // A pid listed twice counts by its first entry.
        for p in g.processes.iter().filter(|p| seen.insert(p.pid)) {
            for &key in self.by_pid.get(&p.pid).into_iter().flatten() {
                let Some(w) = self.watches.get_mut(&key) else {
                    continue;
                };
                let alive = w.role == Role::Alive;
                let d = w.devices.entry(g.index).or_default();
                let before = (d.listed, d.max_figure, d.death_figure);
                // Its largest figure: NVML may show 0 for a process mid-teardown.
                d.listed = true;
                d.max_figure = d.max_figure.max(p.used);
                if !alive {
                    d.death_figure = d.death_figure.max(Some(p.used.unwrap_or(0)));
                }
                if before != (d.listed, d.max_figure, d.death_figure) {
                    self.touched.insert(key);
                }
                if before.1.is_none() && d.max_figure.is_some() {
                    self.figured.insert(key);
                }
                listed.insert(key);
            }
        }
        let was = std::mem::replace(self.listed_on.entry(g.index).or_default(), listed);
        for key in was {
            let Some(w) = self.watches.get_mut(&key) else {
                continue;
            };
            if let Some(d) = w.devices.get_mut(&g.index).filter(|d| d.listed) {
                if !self.listed_on[&g.index].contains(&key) {
                    d.listed = false;
                    self.touched.insert(key);
                }
            }
        }
    }

    /// Opens the GPU's pool when a dead victim on it has memory to come back.
    pub(super) fn open_pool(&mut self, g: &NvmlGpu, t_ns: u64) {
        let single_gpu = self.last.len() <= 1;
        let waiting: Vec<u64> = self
            .own
            .iter()
            .filter(|key| {
                self.watches
                    .get(key)
                    .is_some_and(|w| match w.devices.get(&g.index) {
                        Some(d) => d.back_ns().is_none(),
                        // A victim NVML never listed counts on the only GPU there is.
                        None => w.devices.is_empty() && single_gpu,
                    })
            })
            .copied()
            .collect();
        if waiting.is_empty() {
            return;
        }
        let (prev, prev_ns) = self
            .last
            .get(&g.index)
            .cloned()
            .unwrap_or_else(|| (g.clone(), t_ns));
        let pool = self.pools.entry(g.index).or_insert_with(|| Pool {
            prev,
            prev_ns,
            bytes: 0,
            victims: BTreeSet::new(),
            suspected: BTreeSet::new(),
        });
        for key in waiting {
            if pool.victims.insert(key) {
                if let Some(w) = self.watches.get_mut(&key) {
                    let d = w.devices.entry(g.index).or_default();
                    d.used_before.get_or_insert(pool.prev.used);
                }
            }
        }
    }

    /// Adds the reading's release to the pool and credits victims from it.
    pub(super) fn count(
        &mut self,
        g: &NvmlGpu,
        t_ns: u64,
        own: &impl OwnUse,
        changes: &mut Vec<Change>,
    ) {
        let Some(pool) = self.pools.get(&g.index) else {
            return;
        };
        let (correction, risers) = self.corrections(pool, g, t_ns, own);
        if let Some(pool) = self.pools.get_mut(&g.index) {
            pool.bytes += pool.prev.used as i128 - g.used as i128 + correction;
        }
        self.credit_victims(g, t_ns, &risers, own, changes);
        self.credit_residuals(g, t_ns, own, changes);
        let gpu = g.index;
        let Some(pool) = self.pools.get_mut(&gpu) else {
            return;
        };
        pool.prev = g.clone();
        pool.prev_ns = t_ns;
        // A pool whose victims are all back on its GPU closes.
        let all_back = pool.victims.iter().all(|k| {
            self.watches
                .get(k)
                .and_then(|w| w.devices.get(&gpu))
                .is_none_or(|d| d.back_ns().is_some())
        });
        if all_back {
            self.pools.remove(&gpu);
        }
    }

    /// What other processes' figures did since the pool's last reading (their allocations hide
    /// a release, their frees fake one), and who rose as a victim left the list without its
    /// own driver calls explaining the rise: an importer may take over the accounting of what
    /// it imported.
    fn corrections(
        &self,
        pool: &Pool,
        g: &NvmlGpu,
        t_ns: u64,
        own: &impl OwnUse,
    ) -> (i128, Vec<(u32, Rise)>) {
        let victims: BTreeSet<u32> = self.watches.values().map(|w| w.pid).collect();
        let importers: BTreeSet<u32> = self
            .watches
            .values()
            .flat_map(|w| {
                w.known_importers
                    .iter()
                    .map(|i| i.importer)
                    .chain(w.residuals().map(|r| r.importer))
            })
            .chain(pool.suspected.iter().copied())
            .collect();
        let prev = &pool.prev;
        let mut pids: BTreeSet<u32> = prev.processes.iter().map(|p| p.pid).collect();
        pids.extend(g.processes.iter().map(|p| p.pid));
        let vanished = pids
            .iter()
            .any(|p| victims.contains(p) && figure(prev, *p).is_some() && figure(g, *p).is_none());
        let from_ns = pool.prev_ns.saturating_sub(ALLOC_LAG_NS);
        let mut risers = Vec::new();
        let mut correction: i128 = 0;
        for &pid in &pids {
            let (before, now) = (figure(prev, pid), figure(g, pid));
            let delta = now.unwrap_or(0) as i128 - before.unwrap_or(0) as i128;
            if importers.contains(&pid) {
                continue;
            }
            if victims.contains(&pid) {
                // A victim growing allocated; a victim shrinking or leaving released.
                if delta > 0 {
                    correction += delta;
                }
                continue;
            }
            if delta > tolerance(0) as i128 && vanished {
                // Its own allocations explain a rise; otherwise it may have imported.
                let taken = own.taken_on(pid, from_ns, t_ns);
                if (taken as i128) < delta * 9 / 10 {
                    let rise = Rise {
                        from_ns,
                        to_ns: t_ns,
                        bytes: delta as u64,
                        before: before.unwrap_or(0),
                    };
                    risers.push((pid, rise));
                    continue;
                }
            }
            correction += delta;
        }
        (correction, risers)
    }

    /// Credits the victims off the list from the pool, their own release first; a victim
    /// whose memory is short, or whose objects the ledger saw imported, has importers hold
    /// part of it.
    fn credit_victims(
        &mut self,
        g: &NvmlGpu,
        t_ns: u64,
        risers: &[(u32, Rise)],
        own: &impl OwnUse,
        changes: &mut Vec<Change>,
    ) {
        let gpu = g.index;
        let Some(pool) = self.pools.get_mut(&gpu) else {
            return;
        };
        let mut candidates: Vec<(u64, u64, u64)> = pool
            .victims
            .iter()
            .filter_map(|key| Some((key, self.watches.get(key)?)))
            .filter(|(_, w)| {
                w.devices.get(&gpu).is_some_and(|d| d.own_back_ns.is_none())
                    && w.device_share(gpu).is_some()
                    && figure(g, w.pid).is_none()
            })
            .map(|(key, w)| (w.kernel_release_ns.unwrap_or(u64::MAX), w.start_ns, *key))
            .collect();
        candidates.sort_unstable();
        // Victims off the list together: without driver calls, a riser could hold any one's.
        let rivals = candidates.len().saturating_sub(1);
        for (_, _, key) in candidates {
            let Some(w) = self.watches.get_mut(&key) else {
                continue;
            };
            let Some((share, _)) = w.device_share(gpu) else {
                continue;
            };
            let no_residuals = w.devices.get(&gpu).is_none_or(|d| d.residuals.is_empty());
            let short = pool.bytes + (tolerance(share) as i128) < share as i128;
            // What the ledger saw duplicated is held whatever else the device's memory did.
            let dup_seen = w.known_importers.iter().any(|i| i.bytes.is_some());
            // Without driver calls the pool cannot be trusted on a busy GPU (jobs NVML does
            // not list yet allocate into it): every vanishing is looked at.
            if no_residuals && (short || dup_seen || !own.sees_calls()) {
                let residuals = match importers_of(w, risers, rivals, share, pool.bytes, t_ns, own)
                {
                    Importers::Found(r) => r,
                    Importers::Ambiguous(rose) => {
                        w.ambiguous = rose;
                        Vec::new()
                    }
                };
                if !residuals.is_empty() {
                    for r in residuals.iter().filter(|r| r.via == ImportVia::Nvml) {
                        pool.suspected.insert(r.importer);
                        self.suspects.insert(key);
                        self.nvml_importing
                            .entry(r.importer)
                            .or_default()
                            .insert(key);
                    }
                    w.devices.entry(gpu).or_default().residuals = residuals.clone();
                    changes.push(Change::Imported { key, residuals });
                }
            }
            let own = w.own_part(gpu);
            if pool.bytes + tolerance(own) as i128 >= own as i128 {
                pool.bytes -= own as i128;
                w.devices.entry(gpu).or_default().own_back_ns = Some(t_ns);
                changes.push(Change::OwnBack { key, bytes: own });
            }
        }
    }

    /// Imported parts come back with their importer, by NVML's account: the answer for an
    /// importer only NVML suggests. One the ledger saw is not credited while NVML still lists
    /// it (it holds them); its confirmed release decides (`confirm_imports`).
    fn credit_residuals(
        &mut self,
        g: &NvmlGpu,
        t_ns: u64,
        own: &impl OwnUse,
        changes: &mut Vec<Change>,
    ) {
        let gpu = g.index;
        let Some(pool) = self.pools.get_mut(&gpu) else {
            return;
        };
        // An importer that was a victim too: its own return, by its latest watch that has one.
        let mut backs: BTreeMap<u32, Option<u64>> = BTreeMap::new();
        for key in pool.victims.iter() {
            let Some(w) = self.watches.get(key) else {
                continue;
            };
            for r in w.devices.get(&gpu).into_iter().flat_map(|d| &d.residuals) {
                backs.entry(r.importer).or_insert_with(|| {
                    let keys = self.by_pid.get(&r.importer).into_iter().flatten();
                    keys.rev().find_map(|k| self.watches.get(k)?.back_ns())
                });
            }
        }
        for &key in pool.victims.iter() {
            let Some(d) = self
                .watches
                .get_mut(&key)
                .and_then(|w| w.devices.get_mut(&gpu))
            else {
                continue;
            };
            for r in d.residuals.iter_mut().filter(|r| r.nvml_ns.is_none()) {
                if let Some(exit) = r.exited_ns.filter(|_| !own.sees_calls()) {
                    // Without driver calls the pool is no evidence: its files' release is the
                    // moment, once a reading after it agrees.
                    if figure(g, r.importer).is_some()
                        || t_ns < exit.saturating_add(CONFIRM_AFTER_NS)
                    {
                        continue;
                    }
                    r.nvml_ns = Some(exit);
                } else if let Some(&t) = backs.get(&r.importer).and_then(Option::as_ref) {
                    r.nvml_ns = Some(t);
                } else if r.via != ImportVia::Nvml && figure(g, r.importer).is_some() {
                    continue;
                } else if let Some(rise) = r.rise.filter(|_| !own.sees_calls()) {
                    // Without driver calls the pool is no evidence: it holds what it rose by
                    // while NVML lists it above its figure before the rise, and an importer
                    // that died gives it back with its own memory (its watch says when).
                    if figure(g, r.importer).is_some_and(|f| f > rise.before + tolerance(r.bytes))
                        || backs.contains_key(&r.importer)
                    {
                        continue;
                    }
                    r.nvml_ns = Some(t_ns);
                } else if pool.bytes + tolerance(r.bytes) as i128 >= r.bytes as i128 {
                    pool.bytes -= r.bytes as i128;
                    r.nvml_ns = Some(t_ns);
                } else {
                    continue;
                }
                if r.via == ImportVia::Nvml && r.back_ns.is_none() {
                    r.back_ns = r.nvml_ns;
                    changes.push(Change::ResidualBack {
                        key,
                        importer: r.importer,
                    });
                }
            }
        }
    }
}
