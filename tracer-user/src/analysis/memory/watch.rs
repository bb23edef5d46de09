//! One watched process: what it has on each GPU, what importers hold of it, and its share.

use std::collections::BTreeMap;

use super::{
    import_via::ImportVia,
    limits::VERIFY_NS,
    role::{Role, ShareFrom},
};
use crate::analysis::incident::source::Source;

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
    pub(super) nvml_ns: Option<u64>,
    /// For an importer only NVML suggests: its figure's rise, which its own driver calls may
    /// yet explain (their records can arrive after the reading).
    pub(super) rise: Option<Rise>,
    /// For an importer only NVML suggests: the kernel's release of its files (its exit),
    /// the moment it let go once a reading no longer lists it.
    pub(super) exited_ns: Option<u64>,
}

impl Residual {
    pub(super) fn new(importer: u32, bytes: u64, via: ImportVia, found_ns: u64) -> Self {
        Self {
            importer,
            bytes,
            via,
            found_ns,
            back_ns: None,
            nvml_ns: None,
            rise: None,
            exited_ns: None,
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
pub(super) struct Rise {
    pub(super) from_ns: u64,
    pub(super) to_ns: u64,
    pub(super) bytes: u64,
    /// Its figure before the rise.
    pub(super) before: u64,
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
pub(super) struct KnownImport {
    pub(super) importer: u32,
    pub(super) bytes: Option<u64>,
    pub(super) via: ImportVia,
    /// Its duplicates of the victim's objects, (client, handle).
    pub(super) dups: Vec<(u32, u32)>,
    /// The importer's kernel-side release of it, and how.
    pub(super) released: Option<(u64, ImportEnd)>,
    /// That release, once a reading at least `CONFIRM_AFTER_NS` later agreed.
    pub(super) confirmed_ns: Option<u64>,
}

/// What a watched process has on one GPU.
#[derive(Clone, Debug, Default)]
pub struct Device {
    /// NVML's largest figure for it on this GPU while watched.
    pub max_figure: Option<u64>,
    /// What its death is to give back here by NVML: its figure in the last reading before the
    /// death, or a larger one after (NVML lists a process killed early only after it died,
    /// and may show 0 for one mid-teardown).
    pub(super) death_figure: Option<u64>,
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
    pub(super) done: bool,
    /// Not known to hold GPU files: watched only in case NVML lists it (`--lean`).
    pub(super) probe: bool,
    /// Its own release of its GPU files (kernel side), which orders credits in a storm.
    pub kernel_release_ns: Option<u64>,
    /// Importers the ledger knows of.
    pub(super) known_importers: Vec<KnownImport>,
    /// When its group died.
    pub(super) dead_ns: Option<u64>,
    /// Its ledger's video memory at death on each GPU (by NVML index) the ledger placed it.
    pub(super) ledger_devices: BTreeMap<u32, u64>,
    /// Last time something happened that may release its memory (fast NVML reads until a
    /// while after).
    pub(super) last_activity_ns: u64,
    /// Without driver calls: the processes whose NVML figures rose (pid, bytes) as it left the
    /// list, when other processes' figures rose at the same time.
    pub ambiguous: Vec<(u32, u64)>,
    /// When its memory was back, as its incident last said (kept for the aliases that follow
    /// it once its incident is done).
    pub(super) back_reported: Option<(u64, Source)>,
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

    pub(super) fn own_part(&self, gpu: u32) -> u64 {
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
