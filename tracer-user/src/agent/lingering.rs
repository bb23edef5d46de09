//! Open GPU incidents as the metrics see them: which memory is still held under which labels.
//! An incident is kept from its first record to its settled one and no longer, so the agent's
//! memory follows the incidents open now, not all it ever saw.

use std::collections::HashMap;

use super::labels::MemoryLabels;
use crate::analysis::{incident::HELD_BY_OWNERS, Incident};

/// The lingering memory of one label set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    pub bytes: u64,
    pub incidents: u64,
}

struct Open {
    target: u32,
    /// Labels and bytes of each GPU's part still held; empty once all is back.
    held: Vec<(MemoryLabels, u64)>,
    release_observed: bool,
    collateral_seen: usize,
}

/// What one record changed.
#[derive(Debug, Default, PartialEq)]
pub struct Change {
    /// Seconds from the signal to the memory back, the first time a record says it is back,
    /// where that moment is known to 2 ms...
    pub released_after_s: Option<f64>,
    /// ... or that the moment it said is only a bound (counted apart).
    pub release_bounded: bool,
    /// Refused allocations not counted before.
    pub collateral: u64,
    /// Label sets whose totals may have changed.
    pub touched: Vec<MemoryLabels>,
}

#[derive(Default)]
pub struct Lingering {
    open: HashMap<u64, Open>,
}

impl Lingering {
    /// Takes the latest record of an incident; `labels(gpu)` labels its memory on a GPU.
    pub fn update(
        &mut self,
        inc: &Incident,
        labels: impl Fn(Option<u32>) -> MemoryLabels,
    ) -> Change {
        let mut change = Change::default();
        let Some(gpu) = &inc.gpu else {
            return change;
        };
        let open = self.open.entry(inc.id).or_insert(Open {
            target: inc.target.pid,
            held: Vec::new(),
            release_observed: false,
            collateral_seen: 0,
        });
        change
            .touched
            .extend(open.held.drain(..).map(|(old, _)| old));
        if gpu.t_memory_back_ns.is_none() && !inc.settled {
            // Per GPU where NVML tells the parts apart, else the sums on the incident's GPU.
            let parts: Vec<_> = gpu
                .gpus
                .iter()
                .filter(|p| p.index.is_some() && p.share_bytes > 0)
                .collect();
            // A death whose memory its live owners hold (a child whose files its parent
            // holds) lingers nothing, however long it is followed.
            if parts.is_empty() && gpu.share_from != HELD_BY_OWNERS {
                let bytes = gpu.share_bytes.saturating_sub(gpu.released_bytes);
                open.held.push((labels(gpu.index), bytes));
            }
            for p in parts.iter().filter(|p| p.t_memory_back_ns.is_none()) {
                let bytes = p.share_bytes.saturating_sub(p.released_bytes);
                open.held.push((labels(p.index), bytes));
            }
            change
                .touched
                .extend(open.held.iter().map(|(l, _)| l.clone()));
        }
        if let (false, Some(back)) = (open.release_observed, gpu.t_memory_back_ns) {
            open.release_observed = true;
            match gpu.known_moment() {
                Some(_) => {
                    change.released_after_s =
                        Some(back.saturating_sub(inc.t_signal_ns) as f64 / 1e9)
                }
                None => change.release_bounded = true,
            }
        }
        let refused = inc.collateral.len();
        change.collateral = refused.saturating_sub(open.collateral_seen) as u64;
        open.collateral_seen = open.collateral_seen.max(refused);
        if inc.settled {
            self.open.remove(&inc.id);
        }
        change.touched.sort();
        change.touched.dedup();
        change
    }

    /// The memory held under `labels`; None when no incident has them.
    pub fn total(&self, labels: &MemoryLabels) -> Option<Memory> {
        self.open
            .values()
            .flat_map(|o| &o.held)
            .filter(|(l, _)| l == labels)
            .fold(None, |sum, (_, bytes)| {
                let s: Memory = sum.unwrap_or_default();
                Some(Memory {
                    bytes: s.bytes + bytes,
                    incidents: s.incidents + 1,
                })
            })
    }

    /// The label sets open incidents hold memory under on GPU `gpu` (its index label).
    pub fn labels_on(&self, gpu: &str) -> Vec<MemoryLabels> {
        let mut labels: Vec<MemoryLabels> = self
            .open
            .values()
            .flat_map(|o| &o.held)
            .filter(|(l, _)| l.gpu.gpu == gpu)
            .map(|(l, _)| l.clone())
            .collect();
        labels.sort();
        labels.dedup();
        labels
    }

    /// What each open incident holds on GPU `gpu` (its index label): (incident, target, bytes),
    /// by incident.
    pub fn claims_on(&self, gpu: &str) -> Vec<(u64, u32, u64)> {
        let mut claims: Vec<(u64, u32, u64)> = self
            .open
            .iter()
            .map(|(id, o)| {
                let on_gpu = o.held.iter().filter(|(l, _)| l.gpu.gpu == gpu);
                (*id, o.target, on_gpu.map(|(_, b)| b).sum::<u64>())
            })
            .filter(|(_, _, bytes)| *bytes > 0)
            .collect();
        claims.sort_unstable();
        claims
    }

    /// Whether `pid` is the target of an open incident (which accounts for its memory).
    pub fn is_target(&self, pid: u32) -> bool {
        self.open.values().any(|o| o.target == pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::labels::GpuLabels;
    use crate::analysis::incident::{GpuImpact, GpuPart, Target};

    const GIB: u64 = 1 << 30;

    fn record(id: u64, pid: u32, back: Option<u64>, settled: bool) -> Incident {
        let target = Target {
            pid,
            comm: "python3".into(),
            threads: 1,
            workload: None,
        };
        let mut inc = Incident::new(id, target, 1_000_000_000);
        inc.gpu = Some(GpuImpact {
            share_bytes: 5 * GIB,
            released_bytes: GIB,
            t_memory_back_ns: back,
            // The driver's release, timed by its hooks.
            memory_back_known_to_ns: back.map(|_| 0),
            ..Default::default()
        });
        inc.settled = settled;
        inc
    }

    fn labels(verdict: &str) -> MemoryLabels {
        MemoryLabels {
            gpu: GpuLabels {
                gpu: "0".into(),
                ..Default::default()
            },
            verdict: verdict.into(),
            ..Default::default()
        }
    }

    #[test]
    fn held_memory_is_summed_per_label_set_until_it_is_back() {
        let mut l = Lingering::default();
        let a = l.update(&record(1, 10, None, false), |_| labels("imported"));
        assert_eq!(a.touched, vec![labels("imported")]);
        l.update(&record(2, 11, None, false), |_| labels("imported"));
        assert_eq!(
            l.total(&labels("imported")),
            Some(Memory {
                bytes: 8 * GIB,
                incidents: 2
            })
        );
        assert!(l.is_target(10));
        // Back 3.2 s after the signal: observed once, and the series loses that incident.
        let back = l.update(&record(1, 10, Some(4_200_000_000), false), |_| {
            labels("imported")
        });
        assert_eq!(back.released_after_s, Some(3.2));
        assert_eq!(back.touched, vec![labels("imported")]);
        assert_eq!(l.total(&labels("imported")).map(|m| m.incidents), Some(1));
        let again = l.update(&record(1, 10, Some(4_200_000_000), true), |_| {
            labels("imported")
        });
        assert_eq!(again.released_after_s, None, "observed once");
        assert!(!l.is_target(10), "a settled incident is forgotten");
    }

    /// A moment that is only a bound (a zombie transition 30 ms after the last moment it was
    /// seen held) is counted apart, never observed as a release time.
    #[test]
    fn a_bound_is_no_release_time() {
        let mut l = Lingering::default();
        l.update(&record(1, 10, None, false), |_| labels("released"));
        let mut bound = record(1, 10, Some(1_100_000_000), false);
        if let Some(g) = bound.gpu.as_mut() {
            g.memory_back_known_to_ns = None;
            g.t_memory_held_until_ns = Some(1_070_000_000);
        }
        let back = l.update(&bound, |_| labels("released"));
        assert_eq!((back.released_after_s, back.release_bounded), (None, true));
    }

    #[test]
    fn a_new_verdict_moves_the_memory_to_its_series() {
        let mut l = Lingering::default();
        l.update(&record(1, 10, None, false), |_| labels("shared_fd"));
        let moved = l.update(&record(1, 10, None, false), |_| labels("stuck_in_driver"));
        assert_eq!(
            moved.touched,
            vec![labels("shared_fd"), labels("stuck_in_driver")]
        );
        assert_eq!(l.total(&labels("shared_fd")), None);
        assert_eq!(
            l.total(&labels("stuck_in_driver")).map(|m| m.bytes),
            Some(4 * GIB)
        );
        l.update(&record(1, 10, None, true), |_| labels("stuck_in_driver"));
        assert_eq!(l.total(&labels("stuck_in_driver")), None);
        assert!(l.open.is_empty(), "nothing kept once settled");
    }

    /// Memory on two GPUs: each GPU's series holds its own part until that part is back.
    #[test]
    fn each_gpu_holds_its_own_part() {
        let on = |gpu: Option<u32>| MemoryLabels {
            gpu: GpuLabels {
                gpu: gpu.map(|g| g.to_string()).unwrap_or_default(),
                ..Default::default()
            },
            verdict: "slow_teardown".into(),
            ..Default::default()
        };
        let mut inc = record(1, 10, None, false);
        let part = |index, share, back| GpuPart {
            index: Some(index),
            share_bytes: share,
            t_memory_back_ns: back,
            ..Default::default()
        };
        if let Some(gpu) = &mut inc.gpu {
            gpu.share_bytes = 6 * GIB;
            gpu.released_bytes = 2 * GIB;
            gpu.gpus = vec![
                part(0, 2 * GIB, Some(1_100_000_000)),
                part(1, 4 * GIB, None),
            ];
            gpu.gpus[0].released_bytes = 2 * GIB;
        }
        let c = l_update(&inc, &on);
        assert_eq!(c.0.touched, vec![on(Some(1))]);
        assert_eq!(c.1.total(&on(Some(0))), None, "GPU0's part is back");
        assert_eq!(
            c.1.total(&on(Some(1))),
            Some(Memory {
                bytes: 4 * GIB,
                incidents: 1
            })
        );
    }

    fn l_update(inc: &Incident, on: &impl Fn(Option<u32>) -> MemoryLabels) -> (Change, Lingering) {
        let mut l = Lingering::default();
        let c = l.update(inc, on);
        (c, l)
    }
}
