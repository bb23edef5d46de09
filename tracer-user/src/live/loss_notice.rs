//! What the kernel lost, told on stderr in text mode without flooding it: a busy node loses a
//! few stacks every second, and a line for each loss report (one a second) buried everything
//! else. The first loss of each kind is told at once, later ones at most once a minute of the
//! stream's time (the same lines live and in a replay), and what is left at the end.

use std::collections::BTreeMap;

use crate::event::LossKind;

/// Losses of one kind are told at most this often.
const EVERY_NS: u64 = 60_000_000_000;

#[derive(Default)]
pub struct LossNotice {
    kinds: BTreeMap<LossKind, Kind>,
}

#[derive(Default)]
struct Kind {
    total: u64,
    /// Lost since the last line.
    untold: u64,
    told_at: Option<u64>,
}

impl LossNotice {
    /// A loss report at `ts_ns`: the line to print now, if one is due.
    pub fn lost(&mut self, ts_ns: u64, count: u64, what: LossKind) -> Option<String> {
        let k = self.kinds.entry(what).or_default();
        k.total += count;
        k.untold += count;
        let due = k
            .told_at
            .is_none_or(|t| ts_ns.saturating_sub(t) >= EVERY_NS);
        if !due {
            return None;
        }
        let line = k.line(what);
        k.told_at = Some(ts_ns);
        k.untold = 0;
        Some(line)
    }

    /// The lines for what was lost since each kind's last line.
    pub fn finish(&mut self) -> Vec<String> {
        self.kinds
            .iter_mut()
            .filter(|(_, k)| k.untold > 0)
            .map(|(what, k)| {
                let line = k.line(*what);
                k.untold = 0;
                line
            })
            .collect()
    }
}

impl Kind {
    fn line(&self, what: LossKind) -> String {
        let name = describe(what);
        match self.told_at {
            None => format!("linger: the kernel lost {} {name}", self.untold),
            Some(_) => format!(
                "linger: the kernel lost {} more {name} ({} in all)",
                self.untold, self.total
            ),
        }
    }
}

fn describe(what: LossKind) -> String {
    match what {
        LossKind::Ring => "record(s): ring buffer full".to_string(),
        LossKind::Stacks => "kernel stack(s): stack map full or a collision".to_string(),
        LossKind::AsleepStacks => {
            "kernel stack(s) of GPU holders' sleeps: stuck threads' stacks read from /proc"
                .to_string()
        }
        LossKind::Asleep => {
            "sleep(s) of GPU holders' threads: map full, those threads not watched".to_string()
        }
        LossKind::FdWalk => format!(
            "listing(s) of GPU files above descriptor {} (a table walk stops there)",
            tracer_common::FD_WALK_MAX
        ),
        LossKind::Calls => {
            "driver or library call(s) under way: not decoded or not timed".to_string()
        }
        other => format!("{other:?} map insert(s): map full").to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::{LossNotice, EVERY_NS};
    use crate::event::LossKind;

    #[test]
    fn the_first_loss_is_told_at_once_later_ones_once_a_minute_and_the_rest_at_the_end() {
        let mut n = LossNotice::default();
        let s = 1_000_000_000;
        assert_eq!(
            n.lost(0, 3, LossKind::Stacks).as_deref(),
            Some("linger: the kernel lost 3 kernel stack(s): stack map full or a collision")
        );
        // A ring loss is another kind: told at once too.
        assert!(n.lost(s, 1, LossKind::Ring).is_some());
        for t in 1..60 {
            assert_eq!(n.lost(t * s, 2, LossKind::Stacks), None, "second {t}");
        }
        assert_eq!(
            n.lost(EVERY_NS, 2, LossKind::Stacks).as_deref(),
            Some(
                "linger: the kernel lost 120 more kernel stack(s): stack map full or a \
                 collision (123 in all)"
            )
        );
        n.lost(EVERY_NS + s, 5, LossKind::Stacks);
        assert_eq!(
            n.finish(),
            [
                "linger: the kernel lost 5 more kernel stack(s): stack map full or a collision \
              (128 in all)"
            ]
        );
        assert!(n.finish().is_empty(), "told once");
    }
}
