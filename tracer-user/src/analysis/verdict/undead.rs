//! The rules of a process that never died: blocked in the driver, or the signal never taken.

use super::{facts::Context, Verdict, VerdictKind};
use crate::analysis::{incident::Incident, teardown::is_driver_frame};

/// The process never died: blocked in the driver, or the signal was never taken.
pub(super) fn undead(inc: &Incident, cx: &Context) -> Verdict {
    let in_driver = cx
        .asleep
        .iter()
        .find(|(_, _, frames)| frames.iter().any(|f| is_driver_frame(f)));
    if let Some((tid, since, frames)) = in_driver {
        let top: Vec<&str> = frames.iter().take(6).map(String::as_str).collect();
        return Verdict {
            kind: VerdictKind::StuckInDriver,
            evidence: vec![format!(
                "thread {tid} asleep in the driver for {:.1} s: {}",
                cx.now_ns.saturating_sub(*since) as f64 / 1e9,
                top.join(" <- ")
            )],
            hint: "a thread in uninterruptible sleep in the NVIDIA driver cannot die; check \
                   dmesg for Xid errors; the GPU may need an administrator's reset"
                .into(),
        };
    }
    Verdict {
        kind: VerdictKind::NotDelivered,
        evidence: vec![format!(
            "{} deliveries, {} thread exits, no group death after {:.1} s",
            inc.deliveries.len(),
            inc.exits.len(),
            cx.now_ns.saturating_sub(inc.t_signal_ns) as f64 / 1e9
        )],
        hint: "the signal is pending but no thread took it: a thread is blocked \
               uninterruptibly (see /proc/PID/stack) or the process is stopped or traced"
            .into(),
    }
}
