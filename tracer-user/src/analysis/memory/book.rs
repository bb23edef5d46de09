//! The book of watches: one per victim, by a key of the caller's, with the pools that count
//! releases per GPU. Its readings are counted in `pool.rs`, its imports settled in
//! `imports.rs`.

use std::collections::{BTreeMap, BTreeSet};

use crate::analysis::incident::source::Source;
use crate::event::NvmlGpu;

use super::{
    import_via::ImportVia,
    limits::{ACTIVE_NS, PROBE_NS},
    reading::{Change, OwnUse},
    role::Role,
    watch::{ImportEnd, KnownImport, Watch},
};

/// The watches, by a key of the caller's (an incident id: pids are reused).
#[derive(Default)]
pub struct MemoryBook {
    pub(super) watches: BTreeMap<u64, Watch>,
    pub(super) pools: BTreeMap<u32, Pool>,
    /// A reading arrived: NVML answers on this machine (or did when the trace was recorded).
    pub(super) nvml: bool,
    /// The latest reading of each GPU, and when it was taken: the correlator's one copy.
    pub(super) last: BTreeMap<u32, (NvmlGpu, u64)>,
    /// Watches whose memory is another's (`Role::AliasOf`): without any, a finished watch
    /// goes at once instead of after a pass over every watch (thousands in a kill storm).
    pub(super) aliases: usize,
    /// Importer pid → the watches whose imports by it NVML has not confirmed released.
    pub(super) importing: BTreeMap<u32, BTreeSet<u64>>,
    /// Watches with an importer only NVML suggests, not back yet.
    pub(super) suspects: BTreeSet<u64>,
    /// Importer pid → the watches with a part it holds that only NVML suggests: its exit is
    /// that part's return once a reading agrees.
    pub(super) nvml_importing: BTreeMap<u32, BTreeSet<u64>>,
    /// Watches by pid: a reading visits the watches of the processes it lists.
    pub(super) by_pid: BTreeMap<u32, BTreeSet<u64>>,
    /// Watches the latest reading of each GPU listed.
    pub(super) listed_on: BTreeMap<u32, BTreeSet<u64>>,
    /// Watches whose listing, figures or imports changed since the caller last asked.
    pub(super) touched: BTreeSet<u64>,
    /// Watches NVML gave a first figure since the caller last asked.
    pub(super) figured: BTreeSet<u64>,
    /// Watches of dead victims with memory of their own (`Role::Own`).
    pub(super) own: BTreeSet<u64>,
}

/// Releases on one GPU counted from one reading on.
#[derive(Clone, Debug)]
pub(super) struct Pool {
    pub(super) prev: NvmlGpu,
    pub(super) prev_ns: u64,
    /// Released bytes not yet credited to a victim.
    pub(super) bytes: i128,
    /// Watches (by key) counted here.
    pub(super) victims: BTreeSet<u64>,
    /// Processes NVML alone suggests imported a victim's memory.
    pub(super) suspected: BTreeSet<u32>,
}

impl MemoryBook {
    pub fn watch(&self, key: u64) -> Option<&Watch> {
        self.watches.get(&key)
    }

    /// When victim `key`'s memory was all back by the kernel's account, once NVML and the
    /// ledger agree: its own last release (`t_ns`), or the last confirmed release of an import
    /// of its objects the ledger saw, whichever came later. NVML agrees when a reading at or
    /// after `t_ns` on each GPU it was listed on (on every GPU, where it never was) no longer
    /// lists it; an importer only NVML suggests leaves the answer to NVML's account.
    pub fn confirmed_back(&self, key: u64, t_ns: u64) -> Option<u64> {
        let w = self.watches.get(&key)?;
        if !matches!(w.role, Role::Own { .. }) || w.residuals().any(|r| r.via == ImportVia::Nvml) {
            return None;
        }
        let back = w
            .known_importers
            .iter()
            .try_fold(t_ns, |t, i| i.confirmed_ns.map(|c| t.max(c)))?;
        let read_since = |gpu: &u32| self.last.get(gpu).is_some_and(|(_, at)| *at >= t_ns);
        let unlisted = if w.devices.is_empty() {
            !self.last.is_empty() && self.last.keys().all(read_since)
        } else {
            w.devices
                .iter()
                .all(|(gpu, d)| !d.listed && read_since(gpu))
        };
        unlisted.then_some(back)
    }

    /// Whether every import of victim `key`'s objects the ledger saw has been released by its
    /// importer (kernel side; NVML's confirmation may be pending).
    pub fn imports_released(&self, key: u64) -> bool {
        self.watches
            .get(&key)
            .is_none_or(|w| w.known_importers.iter().all(|i| i.released.is_some()))
    }

    /// Whether the ledger saw another process import objects of victim `key`.
    pub fn has_known_imports(&self, key: u64) -> bool {
        self.watches
            .get(&key)
            .is_some_and(|w| !w.known_importers.is_empty())
    }

    /// When the memory of watch `key` was all back, following aliases.
    pub fn back_ns(&self, key: u64) -> Option<u64> {
        let w = self.watches.get(&key)?;
        match w.role {
            Role::AliasOf(other) if other != key => self.back_ns(other),
            Role::Own { .. } => w.back_ns(),
            _ => None,
        }
    }

    /// The owner whose memory `key`'s is, for an alias.
    pub fn owner_of(&self, key: u64) -> Option<u64> {
        match self.watches.get(&key)?.role {
            Role::AliasOf(owner) if owner != key => Some(owner),
            _ => None,
        }
    }

    /// Its incident is done with its memory back at `back`: what aliases of it say after.
    pub fn keep_back(&mut self, key: u64, back: (u64, Source)) {
        if let Some(w) = self.watches.get_mut(&key) {
            w.back_reported = Some(back);
        }
    }

    /// When `key`'s memory was back, as its incident said before it was done.
    pub fn kept_back(&self, key: u64) -> Option<(u64, Source)> {
        self.watches.get(&key)?.back_reported
    }

    /// The watch whose memory `key`'s is: its own, or its owner's for an alias.
    pub fn memory_of(&self, key: u64) -> Option<&Watch> {
        let w = self.watches.get(&key)?;
        match w.role {
            Role::AliasOf(owner) if owner != key => self.memory_of(owner),
            _ => Some(w),
        }
    }

    /// Starts watching `pid` under `key` (a fatal signal reached a GPU holder, or one died).
    pub fn start(&mut self, key: u64, pid: u32, t_ns: u64) {
        let w = self.watches.entry(key).or_insert_with(|| Watch {
            pid,
            start_ns: t_ns,
            role: Role::Alive,
            devices: BTreeMap::new(),
            done: false,
            probe: false,
            kernel_release_ns: None,
            known_importers: Vec::new(),
            dead_ns: None,
            ledger_devices: BTreeMap::new(),
            last_activity_ns: t_ns,
            ambiguous: Vec::new(),
            back_reported: None,
        });
        w.last_activity_ns = w.last_activity_ns.max(t_ns);
        self.by_pid.entry(pid).or_default().insert(key);
        // What NVML said last is the earliest figure it gets, on each GPU that lists it.
        for (g, _) in self.last.values() {
            if let Some(p) = g.processes.iter().find(|p| p.pid == pid) {
                let d = w.devices.entry(g.index).or_default();
                d.listed = true;
                if d.max_figure.is_none() && p.used.is_some() {
                    self.figured.insert(key);
                }
                d.max_figure = d.max_figure.max(p.used);
                self.listed_on.entry(g.index).or_default().insert(key);
            }
        }
    }

    /// The watches NVML gave a first figure since the last call, in key order.
    pub fn take_figured(&mut self) -> BTreeSet<u64> {
        std::mem::take(&mut self.figured)
    }

    /// The watches whose listing, figures or imports changed since the last call.
    pub fn take_touched(&mut self) -> BTreeSet<u64> {
        std::mem::take(&mut self.touched)
    }

    /// The watches whose memory is `key`'s (forked holders of its files).
    pub fn aliases_of(&self, key: u64) -> Vec<u64> {
        if self.aliases == 0 {
            return Vec::new();
        }
        self.watches
            .iter()
            .filter(|(_, w)| w.role == Role::AliasOf(key))
            .map(|(k, _)| *k)
            .collect()
    }

    /// Watches `pid` under `key` in case NVML lists it: with `--lean`, a process killed before
    /// NVML ever listed it is not known to hold GPU files.
    pub fn start_probe(&mut self, key: u64, pid: u32, t_ns: u64) {
        let known = self.watches.contains_key(&key);
        self.start(key, pid, t_ns);
        if let (false, Some(w)) = (known, self.watches.get_mut(&key)) {
            w.probe = w.max_figure().is_none();
        }
    }

    /// Something that may release the memory of `key` happened (a holder died or closed).
    pub fn activity(&mut self, key: u64, t_ns: u64) {
        if let Some(w) = self.watches.get_mut(&key) {
            w.last_activity_ns = w.last_activity_ns.max(t_ns);
        }
    }

    /// The group died: from now on its share (or another's) is what comes back.
    pub fn died(&mut self, key: u64, t_ns: u64, role: Role) {
        let Some(w) = self.watches.get_mut(&key) else {
            return;
        };
        self.aliases -= usize::from(matches!(w.role, Role::AliasOf(_)));
        self.aliases += usize::from(matches!(role, Role::AliasOf(_)));
        w.role = role;
        if matches!(role, Role::Own { .. }) {
            self.own.insert(key);
        } else {
            self.own.remove(&key);
        }
        w.dead_ns.get_or_insert(t_ns);
        w.last_activity_ns = w.last_activity_ns.max(t_ns);
        // What it held just before, by a reading taken since the signal (an older one may
        // predate its allocations): frees of its own while it lived are not the death's. An
        // exit has no signal: the last reading before it is the best there is (on a busy node
        // the next may come after its memory is back, or list it at 0 mid-teardown).
        let (pid, since) = (w.pid, w.start_ns);
        let exit = since >= t_ns;
        for (g, t) in self.last.values() {
            let figure = g
                .processes
                .iter()
                .find(|p| p.pid == pid)
                .filter(|_| *t >= since || exit)
                .map(|p| p.used.unwrap_or(0));
            match (w.devices.get_mut(&g.index), figure) {
                (Some(d), _) => d.death_figure = figure,
                (None, Some(_)) => {
                    w.devices.entry(g.index).or_default().death_figure = figure;
                }
                (None, None) => {}
            }
        }
    }

    /// Dead victim `key`, which gave back nothing of its own, follows `owner`'s memory from
    /// now on (the owner died after it).
    pub fn follow(&mut self, key: u64, owner: u64) {
        let Some(w) = self
            .watches
            .get_mut(&key)
            .filter(|w| w.role == Role::Nothing)
        else {
            return;
        };
        w.role = Role::AliasOf(owner);
        self.aliases += 1;
    }

    /// Where its ledger saw its video memory at death, by NVML index: it is awaited there
    /// too on a GPU NVML never listed it on.
    pub fn placed(&mut self, key: u64, by_gpu: BTreeMap<u32, u64>) {
        let Some(w) = self
            .watches
            .get_mut(&key)
            .filter(|w| matches!(w.role, Role::Own { .. }))
        else {
            return;
        };
        for gpu in by_gpu.keys() {
            w.devices.entry(*gpu).or_default();
        }
        w.ledger_devices = by_gpu;
    }

    pub fn kernel_released(&mut self, key: u64, t_ns: u64) {
        if let Some(w) = self.watches.get_mut(&key) {
            w.kernel_release_ns.get_or_insert(t_ns);
            w.last_activity_ns = w.last_activity_ns.max(t_ns);
        }
    }

    /// The ledger saw `importer` take `bytes` (when known) of the objects of watch `key`,
    /// through `dups`, its duplicates of them (client, handle).
    pub fn imported(
        &mut self,
        key: u64,
        importer: u32,
        bytes: Option<u64>,
        via: ImportVia,
        dups: Vec<(u32, u32)>,
    ) {
        let Some(w) = self.watches.get_mut(&key) else {
            return;
        };
        if w.known_importers.iter().any(|i| i.importer == importer) {
            return;
        }
        w.known_importers.push(KnownImport {
            importer,
            bytes,
            via,
            dups,
            released: None,
            confirmed_ns: None,
        });
        self.importing.entry(importer).or_default().insert(key);
    }

    /// The imports `pid` holds by the ledger's account, not released yet: (victim key, its
    /// duplicates of the victim's objects).
    pub fn imports_held_by(&self, pid: u32) -> Vec<(u64, Vec<(u32, u32)>)> {
        let Some(keys) = self.importing.get(&pid) else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|key| {
                let i = self.known_import(*key, pid)?;
                (i.released.is_none() && !i.dups.is_empty()).then(|| (*key, i.dups.clone()))
            })
            .collect()
    }

    fn known_import(&self, key: u64, importer: u32) -> Option<&KnownImport> {
        let w = self.watches.get(&key)?;
        w.known_importers.iter().find(|i| i.importer == importer)
    }

    /// `pid`'s files were released at `t_ns` (its exit): so was whatever it imported.
    pub fn importer_exited(&mut self, pid: u32, t_ns: u64) {
        let keys: Vec<u64> = self
            .importing
            .get(&pid)
            .into_iter()
            .flatten()
            .copied()
            .collect();
        for key in keys {
            self.import_released(key, pid, t_ns, ImportEnd::Exit);
        }
        for key in self.nvml_importing.remove(&pid).into_iter().flatten() {
            let Some(w) = self.watches.get_mut(&key) else {
                continue;
            };
            w.last_activity_ns = w.last_activity_ns.max(t_ns);
            for r in w.devices.values_mut().flat_map(|d| d.residuals.iter_mut()) {
                if r.importer == pid && r.via == ImportVia::Nvml {
                    r.exited_ns.get_or_insert(t_ns);
                }
            }
        }
    }

    /// `pid` freed its duplicates of victim `key`'s objects at `t_ns` and lives on.
    pub fn import_freed(&mut self, key: u64, pid: u32, t_ns: u64) {
        let figure = self
            .last
            .values()
            .flat_map(|(g, _)| g.processes.iter().filter(|p| p.pid == pid))
            .map(|p| p.used.unwrap_or(0))
            .sum();
        self.import_released(key, pid, t_ns, ImportEnd::Freed { figure });
    }

    fn import_released(&mut self, key: u64, importer: u32, t_ns: u64, end: ImportEnd) {
        let Some(w) = self.watches.get_mut(&key) else {
            return;
        };
        w.last_activity_ns = w.last_activity_ns.max(t_ns);
        if let Some(i) = w
            .known_importers
            .iter_mut()
            .find(|i| i.importer == importer)
        {
            i.released.get_or_insert((t_ns, end));
        }
    }

    /// Its incident is done: the watch goes once no alias needs its return any more.
    pub fn forget(&mut self, key: u64) {
        if let Some(w) = self.watches.get_mut(&key) {
            w.done = true;
        }
        if self.aliases == 0 {
            if self.remove_watch(key).is_some() {
                self.pools.retain(|_, p| !p.victims.is_empty());
            }
            return;
        }
        loop {
            let needed: BTreeSet<u64> = self
                .watches
                .values()
                .filter(|w| !w.done)
                .filter_map(|w| match w.role {
                    Role::AliasOf(k) => Some(k),
                    _ => None,
                })
                .collect();
            let gone: Vec<u64> = self
                .watches
                .iter()
                .filter(|(k, w)| w.done && !needed.contains(k))
                .map(|(k, _)| *k)
                .collect();
            if gone.is_empty() {
                break;
            }
            for k in gone {
                if let Some(w) = self.remove_watch(k) {
                    self.aliases -= usize::from(matches!(w.role, Role::AliasOf(_)));
                }
            }
        }
        self.pools.retain(|_, p| !p.victims.is_empty());
    }

    /// Stops watching `key`, and drops it from the pools and indexes.
    fn remove_watch(&mut self, key: u64) -> Option<Watch> {
        let w = self.watches.remove(&key)?;
        if let Some(keys) = self.by_pid.get_mut(&w.pid) {
            keys.remove(&key);
            if keys.is_empty() {
                self.by_pid.remove(&w.pid);
            }
        }
        for keys in self.listed_on.values_mut() {
            keys.remove(&key);
        }
        for pool in self.pools.values_mut() {
            pool.victims.remove(&key);
        }
        for i in &w.known_importers {
            if let Some(keys) = self.importing.get_mut(&i.importer) {
                keys.remove(&key);
                if keys.is_empty() {
                    self.importing.remove(&i.importer);
                }
            }
        }
        self.suspects.remove(&key);
        self.own.remove(&key);
        self.figured.remove(&key);
        self.touched.remove(&key);
        Some(w)
    }

    /// Whether a reading arrived: without one, NVML is missing and the kernel alone tells.
    pub fn nvml(&self) -> bool {
        self.nvml
    }

    /// The latest reading of each GPU read so far.
    pub fn latest(&self) -> impl Iterator<Item = &NvmlGpu> {
        self.last.values().map(|(g, _)| g)
    }

    /// Whether the latest reading lists `pid` on some GPU.
    pub fn listed(&self, pid: u32) -> bool {
        self.last
            .values()
            .any(|(g, _)| g.processes.iter().any(|p| p.pid == pid))
    }

    /// Whether a reading of every GPU was taken after `t_ns`.
    pub fn read_since(&self, t_ns: u64) -> bool {
        !self.last.is_empty() && self.last.values().all(|(_, t)| *t > t_ns)
    }

    /// The watches whose release may be under way: not done, not back by NVML's account, and
    /// with something that may release memory lately.
    pub fn awaited(&self, now_ns: u64) -> impl Iterator<Item = (u64, &Watch)> {
        self.watches.iter().filter_map(move |(key, w)| {
            let window = if w.probe && w.max_figure().is_none() {
                PROBE_NS
            } else {
                ACTIVE_NS
            };
            let awaited = !w.done
                && w.back_ns().is_none()
                && now_ns.saturating_sub(w.last_activity_ns) < window;
            awaited.then_some((*key, w))
        })
    }

    /// Feeds one reading of every GPU; returns what it changed. `own` tells a process whose
    /// figure rose because it allocated from one that took over an import's accounting.
    pub fn reading(&mut self, t_ns: u64, gpus: &[NvmlGpu], own: impl OwnUse) -> Vec<Change> {
        self.nvml = true;
        let mut changes = Vec::new();
        self.recheck_suspects(t_ns, &own, &mut changes);
        for g in gpus {
            self.note_listing(g);
            self.open_pool(g, t_ns);
            if self.pools.contains_key(&g.index) {
                self.count(g, t_ns, &own, &mut changes);
            }
            self.last.insert(g.index, (g.clone(), t_ns));
        }
        self.confirm_imports(t_ns, gpus, &mut changes);
        changes
    }
}
