//! Which open cases the correlator's pass after an event must look at. A kill storm keeps
//! hundreds of processes' cases open at once (each until its reap), and a pass over all of
//! them after every event made the collector's work quadratic in the storm. A case the pass
//! found nothing to do for may say until when nothing can happen to it unless an event
//! touches it; it is left out of the passes until then.

use std::collections::BTreeSet;

use super::id_map::IdMap;

#[derive(Default)]
pub(super) struct Agenda {
    /// Cases the next pass looks at: touched since the last one, or with no quiet time.
    due: BTreeSet<u64>,
    /// Quiet cases, by the time from which a pass must look at them again.
    quiet: BTreeSet<(u64, u64)>,
    quiet_until: IdMap<u64, u64>,
    /// Open cases by when they opened: the oldest bounds what may be pruned.
    opened: BTreeSet<(u64, u64)>,
    /// Cases the passes looked at, in all: what the tests hold the passes' work to.
    #[cfg(test)]
    pub taken: usize,
}

impl Agenda {
    pub fn open(&mut self, id: u64, t_ns: u64) {
        self.opened.insert((t_ns, id));
        self.due.insert(id);
    }

    pub fn close(&mut self, id: u64, opened_ns: u64) {
        self.opened.remove(&(opened_ns, id));
        self.due.remove(&id);
        self.wake(id);
    }

    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Something happened to case `id`: the next pass looks at it.
    pub fn touch(&mut self, id: u64) {
        self.wake(id);
        self.due.insert(id);
    }

    /// Something that may concern any case happened (an NVML reading, the strategy).
    pub fn touch_all(&mut self) {
        self.due.extend(self.quiet_until.drain().map(|(id, _)| id));
        self.quiet.clear();
    }

    /// The pass found nothing to do for `id`, and nothing can happen to it before `until`
    /// unless an event touches it.
    pub fn quiet(&mut self, id: u64, until: u64) {
        self.due.remove(&id);
        self.wake(id);
        self.quiet_until.insert(id, until);
        self.quiet.insert((until, id));
    }

    /// The cases a pass at `now_ns` looks at, in the order they opened (their ids'); they stay
    /// due until they are quieted or closed.
    pub fn take(&mut self, now_ns: u64) -> Vec<u64> {
        while let Some(&(until, id)) = self.quiet.first() {
            if until > now_ns {
                break;
            }
            self.quiet.pop_first();
            self.quiet_until.remove(&id);
            self.due.insert(id);
        }
        #[cfg(test)]
        {
            self.taken += self.due.len();
        }
        self.due.iter().copied().collect()
    }

    /// When the oldest open case opened.
    pub fn oldest(&self) -> Option<u64> {
        self.opened.first().map(|(t, _)| *t)
    }

    fn wake(&mut self, id: u64) {
        if let Some(until) = self.quiet_until.remove(&id) {
            self.quiet.remove(&(until, id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_case_comes_back_at_its_time_or_when_touched() {
        let mut a = Agenda::default();
        a.open(1, 10);
        a.open(2, 20);
        assert_eq!(a.take(30), vec![1, 2]);
        a.quiet(1, 100);
        a.quiet(2, 200);
        assert!(a.take(99).is_empty());
        assert_eq!(a.take(100), vec![1]);
        a.touch(2);
        assert_eq!(a.take(101), vec![1, 2]);
        a.close(1, 10);
        assert_eq!(a.oldest(), Some(20));
        a.quiet(2, 500);
        a.touch_all();
        assert_eq!(a.take(102), vec![2]);
    }
}
