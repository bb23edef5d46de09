//! The NVML thread's pace: a quiet period while nothing is awaited, the period the analysis asks
//! for while a release is (every millisecond where only NVML can time it). The thread sleeps on
//! a condition variable, not in 1 ms steps, so a quiet machine sees one wake-up per quiet period
//! (1000 wake-ups a second slowed bystanders on the H200's CPUs), and a change of pace wakes it
//! at once.

use std::{
    sync::{Condvar, Mutex, MutexGuard},
    time::Duration,
};

#[derive(Default, Clone, Copy, PartialEq)]
struct State {
    /// The period asked for; None: the quiet one.
    period: Option<Duration>,
    stop: bool,
}

#[derive(Default)]
pub struct Pace {
    state: Mutex<State>,
    changed: Condvar,
}

impl Pace {
    /// Asks for a reading every `period` (None: the quiet period); wakes the sleeper when
    /// that changes.
    pub fn set_period(&self, period: Option<Duration>) {
        let mut s = self.lock();
        if s.period != period {
            s.period = period;
            self.changed.notify_all();
        }
    }

    pub fn period(&self) -> Option<Duration> {
        self.lock().period
    }

    /// Ends the sleeper's loop.
    pub fn stop(&self) {
        self.lock().stop = true;
        self.changed.notify_all();
    }

    pub fn is_stopped(&self) -> bool {
        self.lock().stop
    }

    /// Sleeps for `d` or until the pace changes or the sleeper is stopped.
    pub fn sleep(&self, d: Duration) {
        let s = self.lock();
        let before = *s;
        let _unused = self
            .changed
            .wait_timeout_while(s, d, |now| *now == before)
            .map_err(|_| ());
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is two flags, valid whatever a panicking holder left.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::Arc,
        thread,
        time::{Duration, Instant},
    };

    use super::Pace;

    #[test]
    fn a_change_of_pace_wakes_a_long_sleep_at_once() {
        let pace = Arc::new(Pace::default());
        let p = Arc::clone(&pace);
        let sleeper = thread::spawn(move || {
            let t = Instant::now();
            p.sleep(Duration::from_secs(30));
            t.elapsed()
        });
        thread::sleep(Duration::from_millis(50));
        pace.set_period(Some(Duration::from_millis(1)));
        let slept = sleeper.join().expect("sleeper");
        assert!(slept < Duration::from_secs(10), "slept {slept:?}");
        assert_eq!(pace.period(), Some(Duration::from_millis(1)));
    }

    #[test]
    fn a_sleep_lasts_its_period_when_nothing_changes() {
        let pace = Pace::default();
        pace.set_period(Some(Duration::from_millis(1)));
        let t = Instant::now();
        pace.sleep(Duration::from_millis(30));
        assert!(t.elapsed() >= Duration::from_millis(30));
    }
}
