//! Whether a dead process's GPU memory is back on the device, from NVML readings alone.
//!
//! A victim's memory is back when NVML no longer lists its pid *and* the device's used memory
//! has come down by its share. NVML's per-pid list is a coarse clock under load (several
//! victims can leave it in one reading while their memory leaves over hundreds of
//! milliseconds), and other processes allocate and free at the same time, so releases are
//! counted per GPU in a pool: each reading adds the drop in `used` since the previous one,
//! corrected by what other processes' NVML figures did meanwhile (their allocations hide a
//! release, their frees fake one), and victims that have left the list are credited from the
//! pool in the order their own kernel-side release happened.
//!
//! A process that imported a victim's memory (CUDA IPC, an exported handle) takes over its
//! accounting: NVML stops listing the victim, the importer's figure rises and `used` does not
//! fall. Importers' figures are never counted as corrections, so such memory stays unexplained
//! until the importer lets go (its figure falls or it exits); the part it holds is a
//! [`Residual`] of the victim, back when the importer's memory is.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::event::NvmlGpu;

/// Slack when comparing a drop with a share: the larger of 32 MiB and 1 % of the share (the
/// device's `used` fell by the NVML figure plus about 6 MB for every release seen on the H200).
pub fn tolerance(bytes: u64) -> u64 {
    (32 << 20u64).max(bytes / 100)
}

/// What a victim's death is to give back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Not dead yet: NVML figures are collected.
    Alive,
    /// Its own share: NVML's largest figure for it, else its ledger's video bytes.
    Own { ledger: u64 },
    /// Its files' memory is another watched victim's (incident id; a forked holder of a dead
    /// parent's files): back when that one's is.
    AliasOf(u64),
    /// No memory of its own: its files stay open in live processes that own the memory.
    Nothing,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareFrom {
    Nvml,
    Ledger,
    /// Neither NVML nor the ledger knows of any memory.
    None,
}

impl ShareFrom {
    pub fn label(self) -> &'static str {
        match self {
            Self::Nvml => "nvml",
            Self::Ledger => "ledger",
            Self::None => "none",
        }
    }
}

/// How an importer was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportVia {
    /// It duplicated one of the victim's objects (RM_DUP_OBJECT: legacy CUDA IPC handles).
    DupObject,
    /// It imported objects from an exported file descriptor (RM_CONTROL 0x3d06) after the
    /// victim exported some (0x3d05).
    FdImport,
    /// Only NVML says so: its figure rose as the victim left the list, and no allocation of its
    /// own explains the rise.
    Nvml,
}

/// Part of a victim's share another process holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Residual {
    pub importer: u32,
    pub bytes: u64,
    pub via: ImportVia,
    /// The reading that found it short.
    pub found_ns: u64,
    pub back_ns: Option<u64>,
    /// When NVML's account had it back (the pool, or the importer's own return): the answer
    /// for an importer only NVML suggests, a fallback for one the ledger saw.
    nvml_ns: Option<u64>,
    /// For an importer only NVML suggests: its figure's rise, which its own driver calls may
    /// yet explain (their records can arrive after the reading).
    rise: Option<Rise>,
}

impl Residual {
    fn new(importer: u32, bytes: u64, via: ImportVia, found_ns: u64) -> Self {
        Self {
            importer,
            bytes,
            via,
            found_ns,
            back_ns: None,
            nvml_ns: None,
            rise: None,
        }
    }

    /// An importer only NVML suggests, whose own driver calls may still explain its rise.
    pub fn provisional(&self, now_ns: u64) -> bool {
        self.verified_ns().is_some_and(|t| now_ns < t)
    }

    /// When a suspicion NVML alone raised stands, unless withdrawn before.
    pub fn verified_ns(&self) -> Option<u64> {
        self.rise.map(|_| self.found_ns.saturating_add(VERIFY_NS))
    }
}

/// A rise of a process's NVML figure, and the window its own driver calls would explain it in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rise {
    from_ns: u64,
    to_ns: u64,
    bytes: u64,
    /// Its figure before the rise.
    before: u64,
}

/// How an importer the ledger saw let go of what it imported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportEnd {
    /// Its files were released (its exit): NVML is to stop listing it.
    Exit,
    /// It freed its duplicates and lives on: NVML's figure for it is to fall by the import
    /// from this one.
    Freed { figure: u64 },
}

/// An import of a victim's objects the ledger saw.
#[derive(Clone, Debug)]
struct KnownImport {
    importer: u32,
    bytes: Option<u64>,
    via: ImportVia,
    /// Its duplicates of the victim's objects, (client, handle).
    dups: Vec<(u32, u32)>,
    /// The importer's kernel-side release of it, and how.
    released: Option<(u64, ImportEnd)>,
    /// That release, once a reading at least `CONFIRM_AFTER_NS` later agreed.
    confirmed_ns: Option<u64>,
}

/// What linger saw a process do itself, to tell a rise of its NVML figure from an import.
pub trait OwnUse {
    /// Video memory `pid` took on through its own driver calls in `[from_ns, to_ns]`.
    fn taken_on(&self, pid: u32, from_ns: u64, to_ns: u64) -> u64;
    /// Whether linger first saw `pid` open a GPU file at or after `t_ns`: a new job.
    fn new_since(&self, pid: u32, t_ns: u64) -> bool;
    /// Whether driver calls are traced: without them (`--lean`) a rise of NVML's figure for a
    /// process has nothing to tell an import from the process's own allocation.
    fn sees_calls(&self) -> bool {
        true
    }
}

/// Without opens: allocations (or their absence) alone.
impl<F: Fn(u32, u64, u64) -> u64> OwnUse for F {
    fn taken_on(&self, pid: u32, from_ns: u64, to_ns: u64) -> u64 {
        self(pid, from_ns, to_ns)
    }

    fn new_since(&self, _: u32, _: u64) -> bool {
        false
    }
}

/// What a watched process has on one GPU.
#[derive(Clone, Debug, Default)]
pub struct Device {
    /// NVML's largest figure for it on this GPU while watched.
    pub max_figure: Option<u64>,
    /// What its death is to give back here by NVML: its figure in the last reading before the
    /// death, or a larger one after (NVML lists a process killed early only after it died,
    /// and may show 0 for one mid-teardown).
    death_figure: Option<u64>,
    /// Listed in the latest reading of this GPU.
    pub listed: bool,
    /// This GPU's `used` at the reading its pool counts from.
    pub used_before: Option<u64>,
    /// Its own part here (share minus residuals) was seen back.
    pub own_back_ns: Option<u64>,
    pub residuals: Vec<Residual>,
}

impl Device {
    /// When all of its share on this GPU was back.
    pub fn back_ns(&self) -> Option<u64> {
        let own = self.own_back_ns?;
        self.residuals
            .iter()
            .try_fold(own, |t, r| r.back_ns.map(|b| t.max(b)))
    }
}

#[derive(Clone, Debug)]
pub struct Watch {
    pub pid: u32,
    pub start_ns: u64,
    pub role: Role,
    /// The GPUs NVML listed it on (or the only GPU there is, for a victim it never listed),
    /// by NVML index: each one's memory comes back on its own.
    pub devices: BTreeMap<u32, Device>,
    /// Its incident is done; kept while aliases still need its return.
    done: bool,
    /// Not known to hold GPU files: watched only in case NVML lists it (`--lean`).
    probe: bool,
    /// Its own release of its GPU files (kernel side), which orders credits in a storm.
    pub kernel_release_ns: Option<u64>,
    /// Importers the ledger knows of.
    known_importers: Vec<KnownImport>,
    /// When its group died.
    dead_ns: Option<u64>,
    /// Its ledger's video memory at death on each GPU (by NVML index) the ledger placed it.
    ledger_devices: BTreeMap<u32, u64>,
    /// Last time something happened that may release its memory (fast NVML reads until a
    /// while after).
    last_activity_ns: u64,
    /// Without driver calls: the processes whose NVML figures rose (pid, bytes) as it left the
    /// list, when other processes' figures rose at the same time.
    pub ambiguous: Vec<(u32, u64)>,
}

impl Watch {
    /// Watched only in case NVML lists it: not known to hold GPU files.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The first GPU it has memory on (the only one, for most processes).
    pub fn gpu(&self) -> Option<u32> {
        self.devices.keys().next().copied()
    }

    /// Whether the latest reading of one of its GPUs lists it.
    pub fn listed(&self) -> bool {
        self.devices.values().any(|d| d.listed)
    }

    /// NVML's largest figures for it while watched, summed over its GPUs.
    pub fn max_figure(&self) -> Option<u64> {
        self.devices
            .values()
            .filter_map(|d| d.max_figure)
            .reduce(|a, b| a + b)
    }

    /// The parts of its share other processes hold, on every GPU.
    pub fn residuals(&self) -> impl Iterator<Item = &Residual> {
        self.devices.values().flat_map(|d| &d.residuals)
    }

    /// What its death is to give back on GPU `gpu`, and where that figure comes from. Where
    /// NVML never listed it on a GPU, its ledger's bytes there (or, on the only GPU it is
    /// counted on, all of them).
    pub fn device_share(&self, gpu: u32) -> Option<(u64, ShareFrom)> {
        let Role::Own { ledger } = self.role else {
            return None;
        };
        let d = self.devices.get(&gpu)?;
        let placed = self.ledger_devices.get(&gpu).copied();
        Some(match (d.death_figure, self.devices.len(), ledger) {
            (Some(nvml), _, _) => (nvml, ShareFrom::Nvml),
            (None, _, _) if d.max_figure.is_none() && placed.is_some() => {
                (placed.unwrap_or(0), ShareFrom::Ledger)
            }
            // On several GPUs: what NVML saw it hold on this one.
            (None, 2.., _) => (d.max_figure.unwrap_or(0), ShareFrom::Nvml),
            // No driver calls, and no reading since its death: the most NVML saw it hold.
            (None, _, 0) => match d.max_figure {
                Some(nvml) => (nvml, ShareFrom::Nvml),
                None => (0, ShareFrom::None),
            },
            (None, _, bytes) => (bytes, ShareFrom::Ledger),
        })
    }

    /// What its death is to give back, summed over its GPUs, and where that comes from.
    pub fn share(&self) -> Option<(u64, ShareFrom)> {
        let Role::Own { ledger } = self.role else {
            return None;
        };
        if self.devices.is_empty() {
            return Some(if ledger == 0 {
                (0, ShareFrom::None)
            } else {
                (ledger, ShareFrom::Ledger)
            });
        }
        let shares: Vec<(u64, ShareFrom)> = self
            .devices
            .keys()
            .filter_map(|g| self.device_share(*g))
            .collect();
        let from = if shares.iter().any(|s| s.1 == ShareFrom::Nvml) {
            ShareFrom::Nvml
        } else {
            shares.first().map_or(ShareFrom::None, |s| s.1)
        };
        Some((shares.iter().map(|s| s.0).sum(), from))
    }

    /// NVML's figure for what its death gives back on GPU `gpu` (its largest one before it
    /// died).
    pub fn device_figure(&self, gpu: u32) -> Option<u64> {
        let d = self.devices.get(&gpu)?;
        d.death_figure.or(d.max_figure)
    }

    /// The same, summed over its GPUs.
    pub fn nvml_figure(&self) -> Option<u64> {
        self.devices
            .keys()
            .filter_map(|g| self.device_figure(*g))
            .reduce(|a, b| a + b)
    }

    fn own_part(&self, gpu: u32) -> u64 {
        let held: u64 = self
            .devices
            .get(&gpu)
            .map_or(0, |d| d.residuals.iter().map(|r| r.bytes).sum());
        self.device_share(gpu)
            .map_or(0, |(s, _)| s.saturating_sub(held))
    }

    /// When all of its share was back, on every GPU.
    pub fn back_ns(&self) -> Option<u64> {
        if self.devices.is_empty() {
            return None;
        }
        self.devices
            .values()
            .try_fold(0, |t, d| d.back_ns().map(|b| t.max(b)))
    }

    /// Bytes seen back so far on GPU `gpu`.
    pub fn device_released(&self, gpu: u32) -> u64 {
        let Some(d) = self.devices.get(&gpu) else {
            return 0;
        };
        let residuals: u64 = d
            .residuals
            .iter()
            .filter(|r| r.back_ns.is_some())
            .map(|r| r.bytes)
            .sum();
        if d.own_back_ns.is_some() {
            self.own_part(gpu) + residuals
        } else {
            residuals
        }
    }

    /// Bytes seen back so far, on every GPU.
    pub fn released(&self) -> u64 {
        self.devices.keys().map(|g| self.device_released(*g)).sum()
    }
}

/// Releases on one GPU counted from one reading on.
#[derive(Clone, Debug)]
struct Pool {
    prev: NvmlGpu,
    prev_ns: u64,
    /// Released bytes not yet credited to a victim.
    bytes: i128,
    /// Watches (by key) counted here.
    victims: BTreeSet<u64>,
    /// Processes NVML alone suggests imported a victim's memory.
    suspected: BTreeSet<u32>,
}

/// A change a reading brought.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The victim's own part is back (its share, less what importers hold).
    OwnBack {
        key: u64,
        bytes: u64,
    },
    /// Its memory is short although NVML stopped listing it: importers hold this much.
    Imported {
        key: u64,
        residuals: Vec<Residual>,
    },
    ResidualBack {
        key: u64,
        importer: u32,
    },
    /// What an importer only NVML suggested was thought to hold is the victim's own after all:
    /// the importer's own driver calls explain its rise.
    Withdrawn {
        key: u64,
        importer: u32,
    },
}

/// The watches, by a key of the caller's (an incident id: pids are reused).
#[derive(Default)]
pub struct MemoryBook {
    watches: BTreeMap<u64, Watch>,
    pools: BTreeMap<u32, Pool>,
    /// The latest reading of each GPU, and when it was taken.
    last: BTreeMap<u32, (NvmlGpu, u64)>,
    /// Watches whose memory is another's (`Role::AliasOf`): without any, a finished watch
    /// goes at once instead of after a pass over every watch (thousands in a kill storm).
    aliases: usize,
    /// Importer pid → the watches whose imports by it NVML has not confirmed released.
    importing: BTreeMap<u32, BTreeSet<u64>>,
    /// Watches with an importer only NVML suggests, not back yet.
    suspects: BTreeSet<u64>,
    /// Watches by pid: a reading visits the watches of the processes it lists.
    by_pid: BTreeMap<u32, BTreeSet<u64>>,
    /// Watches the latest reading of each GPU listed.
    listed_on: BTreeMap<u32, BTreeSet<u64>>,
    /// Watches whose listing, figures or imports changed since the caller last asked.
    touched: BTreeSet<u64>,
    /// Watches NVML gave a first figure since the caller last asked.
    figured: BTreeSet<u64>,
    /// Watches of dead victims with memory of their own (`Role::Own`).
    own: BTreeSet<u64>,
}

/// How closely NVML should be read now, least to most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NvmlNeed {
    /// Nothing awaited.
    Quiet,
    /// Teardowns under way whose moment the kernel's release will tell: NVML's account is a
    /// cross-check, read every few tens of milliseconds.
    Await,
    /// A kernel release awaits NVML's word that the pid is gone: a few readings.
    Confirm,
    /// A release whose moment only NVML can tell (no ioctl evidence, an import, a process not
    /// known to hold GPU files): every millisecond.
    Fast,
}

/// How long after something that may release memory NVML is read fast.
pub const ACTIVE_NS: u64 = 2_000_000_000;
/// How long a process not known to hold GPU files is looked for in NVML's list after its
/// signal (`--lean`): its teardown, if it had memory, takes over 100 ms.
const PROBE_NS: u64 = 300_000_000;

/// An allocation may show in NVML's figures this long after its driver call began: the call
/// waits for the driver's lock while other processes' teardowns hold it.
const ALLOC_LAG_NS: u64 = 300_000_000;
/// The records of driver calls can arrive this long after an NVML reading taken later: until
/// then a rise not yet explained by its process's own calls is only a suspicion.
pub const VERIFY_NS: u64 = 500_000_000;
/// A reading confirms an importer's release when taken at least this long after it (NVML's
/// readings queue behind the driver during teardowns).
const CONFIRM_AFTER_NS: u64 = 2_000_000;

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

    /// Updates each watch's figures on `g`'s GPU.
    fn note_listing(&mut self, g: &NvmlGpu) {
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
    fn open_pool(&mut self, g: &NvmlGpu, t_ns: u64) {
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
    fn count(&mut self, g: &NvmlGpu, t_ns: u64, own: &impl OwnUse, changes: &mut Vec<Change>) {
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
                let residuals = match importers_of(w, risers, share, pool.bytes, t_ns, own) {
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
                if let Some(&t) = backs.get(&r.importer).and_then(Option::as_ref) {
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

    /// Settles the imports the ledger saw: the imported part is back at the importer's
    /// kernel-side release once a reading taken `CONFIRM_AFTER_NS` later agrees (an exited
    /// importer no longer listed; one that freed its duplicates with its figure down by
    /// them), else at NVML's account once that is `VERIFY_NS` old with no release confirmed.
    fn confirm_imports(&mut self, t_ns: u64, gpus: &[NvmlGpu], changes: &mut Vec<Change>) {
        let pending: Vec<(u32, u64)> = self
            .importing
            .iter()
            .flat_map(|(p, keys)| keys.iter().map(move |k| (*p, *k)))
            .collect();
        for (importer, key) in pending {
            let Some(w) = self.watches.get_mut(&key) else {
                continue;
            };
            let listed = gpus
                .iter()
                .filter_map(|g| figure(g, importer))
                .reduce(|a, b| a + b);
            let Some(back) = settle_import(w, importer, t_ns, listed) else {
                continue;
            };
            self.touched.insert(key);
            for d in w.devices.values_mut() {
                for r in d.residuals.iter_mut() {
                    if r.importer == importer && r.back_ns.is_none() {
                        r.back_ns = Some(back);
                        changes.push(Change::ResidualBack { key, importer });
                    }
                }
            }
            if let Some(keys) = self.importing.get_mut(&importer) {
                keys.remove(&key);
                if keys.is_empty() {
                    self.importing.remove(&importer);
                }
            }
        }
    }

    /// Withdraws the suspicions the suspects' own driver calls now explain (their records can
    /// arrive after the reading that showed the rise), and those of new jobs: the rise was the
    /// victim's memory coming back while another process allocated. A suspicion older than
    /// `VERIFY_NS` stands.
    fn recheck_suspects(&mut self, t_ns: u64, own: &impl OwnUse, changes: &mut Vec<Change>) {
        let keys: Vec<u64> = self.suspects.iter().copied().collect();
        for key in keys {
            let Some(w) = self.watches.get_mut(&key) else {
                self.suspects.remove(&key);
                continue;
            };
            let dead = w.dead_ns.unwrap_or(w.start_ns);
            let mut waiting = false;
            for (gpu, d) in &mut w.devices {
                let own_back = d.own_back_ns.is_some();
                for r in std::mem::take(&mut d.residuals) {
                    let explained = r.rise.is_some_and(|rise| {
                        own.taken_on(r.importer, rise.from_ns, rise.to_ns) * 10 >= rise.bytes * 9
                            || own.new_since(r.importer, dead)
                    });
                    let Some(rise) = r.rise.filter(|_| explained) else {
                        waiting |= r.provisional(t_ns);
                        d.residuals.push(r);
                        continue;
                    };
                    if let Some(pool) = self.pools.get_mut(gpu) {
                        // Its rise is a correction after all, and the part it was thought to
                        // hold is the victim's own: credited with the rest of it, or when
                        // that is.
                        let credited = if r.nvml_ns.is_some() { r.bytes } else { 0 };
                        let owed = if own_back { r.bytes } else { 0 };
                        pool.bytes += (rise.bytes + credited) as i128 - owed as i128;
                        pool.suspected.remove(&r.importer);
                    }
                    changes.push(Change::Withdrawn {
                        key,
                        importer: r.importer,
                    });
                }
            }
            if !waiting {
                self.suspects.remove(&key);
            }
        }
    }
}

/// NVML's figure for `pid` in reading `g`, where it lists it.
fn figure(g: &NvmlGpu, pid: u32) -> Option<u64> {
    g.processes
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| p.used.unwrap_or(0))
}

/// When `importer`'s import of `w`'s objects was back, if this reading (at `t_ns`, its figure
/// for the importer `listed`) settles it.
fn settle_import(w: &mut Watch, importer: u32, t_ns: u64, listed: Option<u64>) -> Option<u64> {
    let i = w
        .known_importers
        .iter_mut()
        .find(|i| i.importer == importer)?;
    if let Some((t, end)) = i.released {
        let agreed = match end {
            ImportEnd::Exit => listed.is_none(),
            ImportEnd::Freed { figure } => {
                let bytes = i.bytes.unwrap_or(0);
                listed.unwrap_or(0) + bytes <= figure + tolerance(bytes)
            }
        };
        if agreed && t_ns >= t.saturating_add(CONFIRM_AFTER_NS) {
            i.confirmed_ns = Some(t);
            return Some(t);
        }
    }
    w.residuals()
        .find(|r| r.importer == importer)
        .and_then(|r| r.nvml_ns)
        .filter(|n| t_ns >= n.saturating_add(VERIFY_NS))
}

/// Who holds the part of `w`'s share that did not come back.
enum Importers {
    /// The importers the ledger knows of, else the one NVML's figures point at.
    Found(Vec<Residual>),
    /// Without driver calls, processes rose as it left the list (pid, bytes) while others'
    /// figures rose too: any of them may hold it, or all were allocating.
    Ambiguous(Vec<(u32, u64)>),
}

/// Who holds the part of `w`'s share that did not come back: the importers the ledger knows
/// of (with what it saw them duplicate, else what they rose by), else those NVML's figures
/// point at, unless they are new jobs or rose by more than it had.
fn importers_of(
    w: &Watch,
    risers: &[(u32, Rise)],
    share: u64,
    pool: i128,
    t_ns: u64,
    own: &impl OwnUse,
) -> Importers {
    let missing = (share as i128 - pool.max(0)).max(0) as u64;
    let held: BTreeSet<u32> = w.residuals().map(|r| r.importer).collect();
    let mut out: Vec<Residual> = Vec::new();
    let mut left = missing;
    for i in w
        .known_importers
        .iter()
        .filter(|i| !held.contains(&i.importer))
    {
        let rise = risers.iter().find(|r| r.0 == i.importer).map(|r| r.1.bytes);
        let bytes = match i.bytes {
            Some(b) => b.min(share),
            None => rise.unwrap_or(left).min(left),
        };
        left = left.saturating_sub(bytes);
        if bytes > 0 {
            let mut r = Residual::new(i.importer, bytes, i.via, t_ns);
            r.back_ns = i.confirmed_ns;
            out.push(r);
        }
    }
    if !out.is_empty() || !held.is_empty() {
        return Importers::Found(out);
    }
    let dead = w.dead_ns.unwrap_or(w.start_ns);
    // An import is at most what the victim had, and needs a context of the importer's own: a
    // process NVML listed with no more than the slack was still starting CUDA, and its rise
    // is that start (its context and first allocations).
    let candidates: Vec<&(u32, Rise)> = risers
        .iter()
        .filter(|(p, rise)| {
            !own.new_since(*p, dead)
                && rise.bytes <= share + tolerance(share)
                && rise.before > tolerance(0)
        })
        .collect();
    if !own.sees_calls() {
        // Nothing else tells what came back: an importer holds what it rose by.
        left = share;
    }
    // Without driver calls, a candidate is told from a job allocating only where no other
    // process's figure rose at the same time.
    if !own.sees_calls() && !candidates.is_empty() && risers.len() > 1 {
        return Importers::Ambiguous(candidates.iter().map(|(p, r)| (*p, r.bytes)).collect());
    }
    for (importer, rise) in candidates {
        let bytes = rise.bytes.min(left);
        if bytes > 0 {
            left -= bytes;
            let mut r = Residual::new(*importer, bytes, ImportVia::Nvml, t_ns);
            r.rise = Some(*rise);
            out.push(r);
        }
    }
    Importers::Found(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::NvmlProcess;

    const GIB: u64 = 1 << 30;

    fn reading(used: u64, procs: &[(u32, u64)]) -> Vec<NvmlGpu> {
        vec![NvmlGpu {
            index: 0,
            used,
            total: 140 * GIB,
            processes: procs
                .iter()
                .map(|&(pid, used)| NvmlProcess {
                    pid,
                    used: Some(used),
                })
                .collect(),
        }]
    }

    fn own() -> Role {
        Role::Own { ledger: 0 }
    }

    fn feed(m: &mut MemoryBook, t: u64, r: &[NvmlGpu]) -> Vec<Change> {
        m.reading(t, r, |_, _, _| 0)
    }

    #[test]
    fn back_only_when_the_pid_left_the_list_and_used_fell_by_its_share() {
        let mut m = MemoryBook::default();
        feed(&mut m, 0, &reading(18 * GIB, &[(10, 17 * GIB)]));
        m.start(10, 10, 0);
        m.died(10, 10, own());
        // Used fell, the pid is still listed: not back.
        assert!(feed(&mut m, 20, &reading(GIB, &[(10, 0)])).is_empty());
        let c = feed(&mut m, 30, &reading(GIB, &[]));
        assert_eq!(
            c,
            vec![Change::OwnBack {
                key: 10,
                bytes: 17 * GIB
            }]
        );
        assert_eq!(m.watch(10).and_then(Watch::back_ns), Some(30));
    }

    #[test]
    fn another_process_allocating_at_the_same_moment_does_not_hide_the_release() {
        let mut m = MemoryBook::default();
        m.reading(
            0,
            &reading(5 * GIB, &[(10, 4 * GIB), (20, GIB)]),
            |_, _, _| 0,
        );
        m.start(10, 10, 0);
        m.died(10, 10, own());
        // As 10 leaves, 20 allocates 4 GiB: `used` does not move. The ledger saw 20 allocate
        // them, so its rise is a correction, not an import.
        let next = reading(5 * GIB, &[(20, 5 * GIB)]);
        let c = m.reading(30, &next, |pid, _, _| if pid == 20 { 4 * GIB } else { 0 });
        assert_eq!(
            c,
            vec![Change::OwnBack {
                key: 10,
                bytes: 4 * GIB
            }]
        );
    }

    const MS: u64 = 1_000_000;

    /// Victim 10 (5 GiB by NVML) that importer 20 (0.5 GiB of its own) took 4.5 GiB of, by
    /// the ledger: dead, and off NVML's list at 90 ms with only its context back.
    fn exported() -> MemoryBook {
        let mut m = MemoryBook::default();
        feed(
            &mut m,
            0,
            &reading(6 * GIB, &[(10, 5 * GIB), (20, GIB / 2)]),
        );
        m.start(10, 10, 0);
        m.imported(
            10,
            20,
            Some(9 * GIB / 2),
            ImportVia::DupObject,
            vec![(2, 3)],
        );
        m.died(10, 10 * MS, own());
        let c = feed(&mut m, 90 * MS, &reading(11 * GIB / 2, &[(20, 5 * GIB)]));
        assert!(
            matches!(&c[0], Change::Imported { key: 10, residuals } if residuals[0].importer == 20)
        );
        assert_eq!(
            c[1],
            Change::OwnBack {
                key: 10,
                bytes: GIB / 2
            }
        );
        assert_eq!(m.watch(10).and_then(Watch::back_ns), None);
        m
    }

    /// The importer's exit is when its import came back, once a reading taken a little later
    /// no longer lists it: NVML's own account follows other jobs' memory too.
    #[test]
    fn imported_memory_is_back_at_the_importers_release_once_nvml_no_longer_lists_it() {
        let mut m = exported();
        m.importer_exited(20, 2990 * MS);
        assert_eq!(m.imports_held_by(20), vec![]);
        // Too soon after the release to confirm it.
        let c = feed(&mut m, 2991 * MS, &reading(GIB / 2, &[]));
        assert!(c.is_empty(), "{c:?}");
        let c = feed(&mut m, 2993 * MS, &reading(GIB / 2, &[]));
        assert_eq!(
            c,
            vec![Change::ResidualBack {
                key: 10,
                importer: 20
            }]
        );
        assert_eq!(m.watch(10).and_then(Watch::back_ns), Some(2990 * MS));
        assert_eq!(m.confirmed_back(10, 100 * MS), Some(2990 * MS));
    }

    /// No release of the importer's seen (its records lost, say): NVML's account stands once
    /// it has been alone for a while.
    #[test]
    fn without_the_importers_release_nvmls_account_of_an_import_stands_after_a_while() {
        let mut m = exported();
        let c = feed(&mut m, 3000 * MS, &reading(GIB / 2, &[]));
        assert!(c.is_empty(), "{c:?}");
        let c = feed(&mut m, 3499 * MS, &reading(GIB / 2, &[]));
        assert!(c.is_empty(), "{c:?}");
        feed(&mut m, 3500 * MS, &reading(GIB / 2, &[]));
        assert_eq!(m.watch(10).and_then(Watch::back_ns), Some(3000 * MS));
        assert_eq!(m.confirmed_back(10, 100 * MS), None);
    }

    /// An importer that frees its duplicates and lives on: back when its figure falls by them.
    #[test]
    fn an_importer_that_frees_what_it_imported_lets_go_when_its_figure_falls() {
        let mut m = exported();
        assert_eq!(m.imports_held_by(20), vec![(10, vec![(2, 3)])]);
        m.import_freed(10, 20, 2000 * MS);
        let c = feed(&mut m, 2003 * MS, &reading(11 * GIB / 2, &[(20, 5 * GIB)]));
        assert!(c.is_empty(), "still charged with it: {c:?}");
        feed(&mut m, 2010 * MS, &reading(GIB, &[(20, GIB / 2)]));
        assert_eq!(m.watch(10).and_then(Watch::back_ns), Some(2000 * MS));
    }

    /// A busy node: as the exporter leaves, another job frees as much as the importer holds,
    /// so the device's used memory falls by the exporter's whole share. What the ledger saw
    /// duplicated is held all the same.
    #[test]
    fn a_duplicate_the_ledger_saw_is_held_when_other_jobs_frees_hide_the_shortfall() {
        let mut m = MemoryBook::default();
        let before = [(10, 5 * GIB), (20, GIB / 2), (30, 9 * GIB / 2)];
        feed(&mut m, 0, &reading(11 * GIB, &before));
        m.start(10, 10, 0);
        m.imported(
            10,
            20,
            Some(9 * GIB / 2),
            ImportVia::DupObject,
            vec![(2, 3)],
        );
        m.died(10, 10 * MS, own());
        let c = feed(&mut m, 90 * MS, &reading(11 * GIB / 2, &[(20, 5 * GIB)]));
        assert!(
            matches!(&c[0], Change::Imported { key: 10, residuals }
                if residuals[0].importer == 20 && residuals[0].bytes == 9 * GIB / 2),
            "{c:?}"
        );
        assert_eq!(m.watch(10).and_then(Watch::back_ns), None);
    }

    #[test]
    fn without_ledger_evidence_a_riser_at_the_victims_departure_is_a_suspected_importer() {
        let mut m = MemoryBook::default();
        feed(
            &mut m,
            0,
            &reading(6 * GIB, &[(10, 5 * GIB), (20, GIB / 2)]),
        );
        m.start(10, 10, 0);
        m.died(10, 10, own());
        let c = feed(&mut m, 90, &reading(11 * GIB / 2, &[(20, 5 * GIB)]));
        assert!(
            matches!(&c[0], Change::Imported { residuals, .. } if residuals[0].via == ImportVia::Nvml)
        );
        assert_eq!(m.watch(10).and_then(Watch::back_ns), None);
    }

    #[test]
    fn a_storm_credits_victims_in_the_order_of_their_own_release() {
        let mut m = MemoryBook::default();
        feed(
            &mut m,
            0,
            &reading(4 * GIB, &[(1, GIB), (2, GIB), (3, GIB)]),
        );
        for pid in 1..=3 {
            m.start(pid as u64, pid, 0);
            m.died(pid as u64, 6, own());
        }
        m.kernel_released(2, 100);
        m.kernel_released(1, 200);
        // All three leave NVML's list at once, but only one GiB has come back.
        let c = feed(&mut m, 300, &reading(3 * GIB, &[]));
        assert_eq!(c, vec![Change::OwnBack { key: 2, bytes: GIB }]);
        let c = feed(&mut m, 400, &reading(GIB, &[]));
        assert_eq!(
            c,
            vec![
                Change::OwnBack { key: 1, bytes: GIB },
                Change::OwnBack { key: 3, bytes: GIB }
            ]
        );
    }

    /// Readings of two GPUs: (used, processes) for GPU0, then for GPU1.
    fn two(gpu0: (u64, &[(u32, u64)]), gpu1: (u64, &[(u32, u64)])) -> Vec<NvmlGpu> {
        let mut r = reading(gpu0.0, gpu0.1);
        let mut other = reading(gpu1.0, gpu1.1);
        other[0].index = 1;
        r.append(&mut other);
        r
    }

    #[test]
    fn memory_on_two_gpus_is_back_only_when_both_parts_are() {
        let mut m = MemoryBook::default();
        feed(
            &mut m,
            0,
            &two((5 * GIB, &[(10, 4 * GIB)]), (9 * GIB, &[(10, 8 * GIB)])),
        );
        m.start(10, 10, 0);
        m.died(10, 10, own());
        let w = m.watch(10).expect("watched");
        assert_eq!(w.share(), Some((12 * GIB, ShareFrom::Nvml)));
        assert_eq!(w.device_share(1), Some((8 * GIB, ShareFrom::Nvml)));
        // GPU0's part is back; GPU1 still lists it and holds its 8 GiB.
        let c = feed(&mut m, 30, &two((GIB, &[]), (9 * GIB, &[(10, 8 * GIB)])));
        assert_eq!(
            c,
            vec![Change::OwnBack {
                key: 10,
                bytes: 4 * GIB
            }]
        );
        let w = m.watch(10).expect("watched");
        assert_eq!(w.devices[&0].back_ns(), Some(30));
        assert_eq!(w.back_ns(), None, "GPU1's part is not back");
        assert_eq!(w.released(), 4 * GIB);
        let c = feed(&mut m, 60, &two((GIB, &[]), (GIB, &[])));
        assert_eq!(
            c,
            vec![Change::OwnBack {
                key: 10,
                bytes: 8 * GIB
            }]
        );
        assert_eq!(m.watch(10).and_then(Watch::back_ns), Some(60));
    }

    #[test]
    fn a_death_on_gpu1_is_not_credited_with_gpu0s_frees() {
        let mut m = MemoryBook::default();
        feed(
            &mut m,
            0,
            &two((4 * GIB, &[(20, 3 * GIB)]), (9 * GIB, &[(10, 8 * GIB)])),
        );
        m.start(10, 10, 0);
        m.died(10, 10, own());
        // It leaves GPU1's list while GPU1's memory stays; another process frees 3 GiB on
        // GPU0 at the same moment.
        let c = feed(&mut m, 30, &two((GIB, &[]), (9 * GIB, &[])));
        assert!(c.is_empty(), "{c:?}");
        let w = m.watch(10).expect("watched");
        assert_eq!(w.devices.keys().copied().collect::<Vec<_>>(), [1]);
        assert_eq!(w.back_ns(), None);
        let c = feed(&mut m, 60, &two((GIB, &[]), (GIB, &[])));
        assert_eq!(
            c,
            vec![Change::OwnBack {
                key: 10,
                bytes: 8 * GIB
            }]
        );
    }
}
