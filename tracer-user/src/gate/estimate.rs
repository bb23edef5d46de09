//! When a teardown under way should end, from the release times of past incidents of about
//! its size in the agent's log.

use serde::Serialize;

/// Past releases compared with: the nearest in size.
const NEAREST: usize = 9;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// The median release time (signal to memory back) of the past incidents compared with.
    pub release_ms: u64,
    /// How many.
    pub from_incidents: usize,
    /// What is left of it now, when the death's time is known; 0 once overdue.
    pub remaining_ms: Option<u64>,
}

/// From `past` releases (bytes, ns), for a teardown of `bytes` (unknown: all sizes) that
/// began `elapsed_ns` ago (unknown: None).
pub fn estimate(
    past: impl Iterator<Item = (u64, u64)>,
    bytes: Option<u64>,
    elapsed_ns: Option<u64>,
) -> Option<Estimate> {
    let mut past: Vec<(u64, u64)> = past.collect();
    if past.is_empty() {
        return None;
    }
    if let Some(b) = bytes.filter(|&b| b > 0) {
        // Nearest by ratio of sizes: a 40 GiB teardown is compared with other large ones.
        let distance = |x: u64| (x.max(1) as f64 / b as f64).ln().abs();
        past.sort_by(|x, y| distance(x.0).total_cmp(&distance(y.0)));
        past.truncate(NEAREST);
    }
    let mut times: Vec<u64> = past.iter().map(|p| p.1).collect();
    times.sort_unstable();
    let median = times[times.len() / 2];
    Some(Estimate {
        release_ms: median / 1_000_000,
        from_incidents: times.len(),
        remaining_ms: elapsed_ns.map(|e| median.saturating_sub(e) / 1_000_000),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MS: u64 = 1_000_000;

    #[test]
    fn the_nearest_sizes_decide() {
        let mut past = vec![(GIB / 2, 50 * MS); 20];
        past.extend([
            (32 * GIB, 900 * MS),
            (30 * GIB, 800 * MS),
            (40 * GIB, 1200 * MS),
        ]);
        let e = estimate(past.iter().copied(), Some(32 * GIB), Some(300 * MS)).expect("some");
        // The three large ones and six of the small ones: most of the nearest are small...
        assert_eq!((e.from_incidents, e.release_ms), (NEAREST, 50));
        // ...and where the large ones are most of them, theirs is the answer.
        let few = vec![
            (GIB / 2, 50 * MS),
            (32 * GIB, 900 * MS),
            (30 * GIB, 800 * MS),
        ];
        let e = estimate(few.into_iter(), Some(32 * GIB), Some(300 * MS)).expect("some");
        assert_eq!((e.release_ms, e.remaining_ms), (800, Some(500)));
    }

    #[test]
    fn overdue_is_zero_left_and_nothing_past_is_no_estimate() {
        let e = estimate([(GIB, 100 * MS)].into_iter(), None, Some(900 * MS)).expect("some");
        assert_eq!(e.remaining_ms, Some(0));
        assert!(estimate(std::iter::empty(), Some(GIB), None).is_none());
    }
}
