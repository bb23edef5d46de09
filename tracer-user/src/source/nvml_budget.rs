//! The NVML thread's CPU budget: a share of one CPU over time, with a burst. On a busy node a
//! reading costs milliseconds of CPU (the driver polls its firmware while jobs start and die),
//! and the pace the analysis asks for would take a whole CPU; sustained, the thread keeps to
//! its share. A burst (a kill storm, one crash after a quiet while) spends the credit saved
//! meanwhile, so the readings that confirm its releases are not held back by the cost of one.

use std::time::{Duration, Instant};

/// The thread's CPU at most, sustained: one CPU divided by this. Under a busy node's churn
/// the budget is always spent (some release always awaits NVML's word) and a reading costs
/// milliseconds: half a percent reads about every 800 ms there, in time for confirmations
/// (the kernel times the releases), at about 1.7 ms of CPU a kill at 3 kills a second.
pub const CPU_SHARE: u64 = 200;
/// CPU time saved up while readings were cheap or rare, for a burst.
const BURST_NS: i64 = 50_000_000;
/// The most one costly reading can owe: whatever it cost, the next waits at most 1 s (at
/// `CPU_SHARE`), in time to confirm the releases of the storm that made it costly.
const DEBT_NS: i64 = 5_000_000;

pub struct Budget {
    credit_ns: i64,
    at: Instant,
}

impl Budget {
    pub fn new(now: Instant) -> Self {
        Self {
            credit_ns: BURST_NS,
            at: now,
        }
    }

    /// How long the next reading waits for its credit (zero: it may start now).
    pub fn wait(&mut self, now: Instant) -> Duration {
        self.refill(now);
        if self.credit_ns > 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos((1 - self.credit_ns) as u64 * CPU_SHARE)
        }
    }

    /// A reading took `cpu_ns` of the thread's CPU.
    pub fn spend(&mut self, cpu_ns: u64, now: Instant) {
        self.refill(now);
        self.credit_ns = (self.credit_ns - cpu_ns.min(i64::MAX as u64) as i64).max(-DEBT_NS);
    }

    fn refill(&mut self, now: Instant) {
        let earned = now.saturating_duration_since(self.at).as_nanos() / CPU_SHARE as u128;
        self.credit_ns = (self.credit_ns as i128 + earned as i128).min(BURST_NS as i128) as i64;
        self.at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_burst_spends_saved_credit_and_a_sustained_load_keeps_to_the_share() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        // A storm after a quiet while: a dozen 4 ms readings go at once.
        for _ in 0..13 {
            assert_eq!(b.wait(t0), Duration::ZERO);
            b.spend(4_000_000, t0);
        }
        // The credit is spent: the next waits until it is earned back at the share.
        let wait = b.wait(t0);
        assert!(wait > Duration::ZERO && wait <= 600 * MS, "{wait:?}");
        // Sustained 4 ms readings: half a percent of a CPU, about one every 800 ms.
        let mut t = t0 + wait;
        let mut cpu = 0u64;
        let start = t;
        for _ in 0..100 {
            t += b.wait(t);
            b.spend(4_000_000, t);
            cpu += 4_000_000;
        }
        let share = cpu as f64 / (t - start).as_nanos() as f64;
        assert!((0.0045..0.00575).contains(&share), "{share}");
        // A reading that cost 30 ms (the driver busy with a storm) holds the next back 1 s
        // at most, not 3.
        let mut costly = Budget::new(t0);
        costly.spend(80_000_000, t0);
        assert!(costly.wait(t0) <= Duration::from_secs(1) + MS);
        // Saved credit is capped: a long quiet buys one burst, not an hour's worth.
        let later = t + Duration::from_secs(3600);
        b.spend(60_000_000, later);
        assert!(b.wait(later) > Duration::ZERO);
    }
}
