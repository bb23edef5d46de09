//! What the kernel side lost, kept so that incidents traced meanwhile can say so.

use std::collections::BTreeMap;

use super::incident::LossCount;
use crate::event::{Event, EventData, LossKind};

#[derive(Default)]
pub struct LossLog {
    reports: Vec<Report>,
}

struct Report {
    t_ns: u64,
    what: LossKind,
    count: u64,
    /// The time before `t_ns` it covers.
    period_ns: u64,
}

impl LossLog {
    pub fn on_event(&mut self, e: &Event) {
        if let EventData::Loss {
            count,
            what,
            period_ns,
        } = e.data
        {
            self.reports.push(Report {
                t_ns: e.ts_ns,
                what,
                count,
                period_ns,
            });
        }
    }

    /// Losses reported in `[from, to]`, each report widened by its period at the start (a
    /// report covers the period before it).
    pub fn between(&self, from: u64, to: u64) -> Vec<LossCount> {
        let mut by: BTreeMap<LossKind, u64> = BTreeMap::new();
        for r in &self.reports {
            if (from.saturating_sub(r.period_ns)..=to).contains(&r.t_ns) {
                *by.entry(r.what).or_default() += r.count;
            }
        }
        by.into_iter()
            .map(|(what, count)| LossCount { what, count })
            .collect()
    }

    /// Forgets reports older than `before` (no incident open since then needs them).
    pub fn prune(&mut self, before: u64) {
        self.reports.retain(|r| r.t_ns >= before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn loss(t_ns: u64, count: u64, period_ns: u64) -> Event {
        Event::collector(
            t_ns,
            EventData::Loss {
                count,
                what: LossKind::Holders,
                period_ns,
            },
        )
    }

    /// A report covers its own period before it: a longer period reaches further back.
    #[test]
    fn a_report_counts_for_the_period_it_carries() {
        let mut log = LossLog::default();
        log.on_event(&loss(10 * S, 3, S));
        log.on_event(&loss(20 * S, 5, 4 * S));
        let counts = |from, to| log.between(from, to).iter().map(|l| l.count).sum::<u64>();
        // Each report reaches back its own period from when it was made.
        assert_eq!(counts(10 * S + S / 2, 10 * S + S / 2), 3);
        assert_eq!(counts(11 * S + S / 2, 11 * S + S / 2), 0);
        assert_eq!(counts(23 * S, 23 * S), 5);
        assert_eq!(counts(25 * S, 25 * S), 0);
    }
}
