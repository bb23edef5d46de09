//! What the kernel side lost, kept so that incidents traced meanwhile can say so.

use std::collections::BTreeMap;

use super::incident::LossCount;
use crate::{
    event::{Event, EventData, LossKind},
    source::collect::LOSS_PERIOD,
};

#[derive(Default)]
pub struct LossLog {
    /// (when reported, what, how many).
    reports: Vec<(u64, LossKind, u64)>,
}

impl LossLog {
    pub fn on_event(&mut self, e: &Event) {
        if let EventData::Loss { count, what } = e.data {
            self.reports.push((e.ts_ns, what, count));
        }
    }

    /// Losses reported in `[from, to]`, widened by one reading period at the start (a report
    /// covers the period before it).
    pub fn between(&self, from: u64, to: u64) -> Vec<LossCount> {
        let from = from.saturating_sub(LOSS_PERIOD.as_nanos() as u64);
        let mut by: BTreeMap<LossKind, u64> = BTreeMap::new();
        for (t, what, count) in &self.reports {
            if (from..=to).contains(t) {
                *by.entry(*what).or_default() += count;
            }
        }
        by.into_iter()
            .map(|(what, count)| LossCount { what, count })
            .collect()
    }

    /// Forgets reports older than `before` (no incident open since then needs them).
    pub fn prune(&mut self, before: u64) {
        self.reports.retain(|(t, _, _)| *t >= before);
    }
}
