//! Who holds what did not come back: importers the ledger saw, or those NVML's figures point
//! at, and when each import is settled.

use std::collections::BTreeSet;

use crate::event::NvmlGpu;

use super::{
    book::MemoryBook,
    import_via::ImportVia,
    limits::{tolerance, CONFIRM_AFTER_NS, VERIFY_NS},
    reading::{figure, Change, OwnUse},
    watch::{ImportEnd, Residual, Rise, Watch},
};

impl MemoryBook {
    /// Settles the imports the ledger saw: the imported part is back at the importer's
    /// kernel-side release once a reading taken `CONFIRM_AFTER_NS` later agrees (an exited
    /// importer no longer listed; one that freed its duplicates with its figure down by
    /// them), else at NVML's account once that is `VERIFY_NS` old with no release confirmed.
    pub(super) fn confirm_imports(
        &mut self,
        t_ns: u64,
        gpus: &[NvmlGpu],
        changes: &mut Vec<Change>,
    ) {
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
    pub(super) fn recheck_suspects(
        &mut self,
        t_ns: u64,
        own: &impl OwnUse,
        changes: &mut Vec<Change>,
    ) {
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

/// What of an exporter's NVML figure does not move to its importer: its own CUDA context
/// (518 MiB on an H200 with PyTorch), with room to spare.
const CONTEXT_SLACK: u64 = 1 << 30;

/// Who holds the part of `w`'s share that did not come back.
pub(super) enum Importers {
    /// The importers the ledger knows of, else the one NVML's figures point at.
    Found(Vec<Residual>),
    /// Without driver calls, processes rose as it left the list (pid, bytes) while others'
    /// figures rose too: any of them may hold it, or all were allocating.
    Ambiguous(Vec<(u32, u64)>),
}

/// Who holds the part of `w`'s share that did not come back: the importers the ledger knows
/// of (with what it saw them duplicate, else what they rose by), else those NVML's figures
/// point at, unless they are new jobs or rose by more than it had. `rivals`: other victims
/// that left NVML's list at the same time.
pub(super) fn importers_of(
    w: &Watch,
    risers: &[(u32, Rise)],
    rivals: usize,
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
    // process's figure rose at the same time, and is the importer of this victim only where
    // no other left the list with it, and where it took over what the victim held: NVML moves
    // an imported allocation to its importer as the exporter leaves its list, all of it but
    // the exporter's own CUDA context. A smaller rise says nothing (on an H100 under churn,
    // new jobs' first 64 MiB were taken for imports of victims of gigabytes).
    let takes_over = |rise: &Rise| rise.bytes + CONTEXT_SLACK.max(tolerance(share)) >= share;
    if !own.sees_calls()
        && !candidates.is_empty()
        && (risers.len() > 1 || rivals > 0 || !candidates.iter().all(|(_, r)| takes_over(r)))
    {
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
