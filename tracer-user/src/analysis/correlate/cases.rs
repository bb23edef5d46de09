//! The open cases and every index over them, kept in step here alone: a case opens, changes
//! role (alive, dead until reaped, holding for others) and closes through this table.

use std::collections::{btree_map, BTreeMap, BTreeSet};

use crate::analysis::id_map::IdMap;

use super::case::Case;

#[derive(Default)]
pub(in crate::analysis) struct CaseTable {
    last_id: u64,
    /// Boxed: a B-tree node shifts its entries on every insert and removal, and a case is
    /// over a kilobyte.
    cases: BTreeMap<u64, Box<Case>>,
    /// Live processes with a case.
    alive: IdMap<u32, u64>,
    /// Dead processes with a case, until reaped.
    unreaped: IdMap<u32, u64>,
    /// Holder pid → the cases whose `holder_gone` names it: an exit finds the cases it may
    /// release without a walk over every case (thousands in a kill storm under `--lean`).
    held_for: IdMap<u32, BTreeSet<u64>>,
    /// Open cases per target pid (a pid may be reused while its old case is open).
    of_pid: IdMap<u32, usize>,
    /// Dead cases waiting for a reading taken since their death or their files' release:
    /// the next reading looks at them.
    awaiting_reading: BTreeSet<u64>,
}

impl CaseTable {
    /// Opens a case for a live process: `make` builds it under its new id.
    pub fn open(&mut self, pid: u32, make: impl FnOnce(u64) -> Case) -> u64 {
        self.last_id += 1;
        let id = self.last_id;
        self.alive.insert(pid, id);
        self.cases.insert(id, Box::new(make(id)));
        *self.of_pid.entry(pid).or_default() += 1;
        id
    }

    /// Closes a case: every index forgets it. Also says whether it was its pid's last.
    pub fn close(&mut self, id: u64) -> Option<(Box<Case>, bool)> {
        self.awaiting_reading.remove(&id);
        let c = self.cases.remove(&id)?;
        for holder in c.holder_gone.keys() {
            if let Some(ids) = self.held_for.get_mut(holder) {
                ids.remove(&id);
                if ids.is_empty() {
                    self.held_for.remove(holder);
                }
            }
        }
        let pid = c.inc.target.pid;
        if self.alive.get(&pid) == Some(&id) {
            self.alive.remove(&pid);
        }
        if self.unreaped.get(&pid) == Some(&id) {
            self.unreaped.remove(&pid);
        }
        let left = self.of_pid.get_mut(&pid).map(|n| {
            *n -= 1;
            *n
        });
        if left == Some(0) {
            self.of_pid.remove(&pid);
        }
        Some((c, left == Some(0)))
    }

    /// Closes every case at the end of the stream.
    pub fn clear(&mut self) {
        let last_id = self.last_id;
        *self = Self {
            last_id,
            ..Default::default()
        };
    }

    pub fn get(&self, id: &u64) -> Option<&Case> {
        self.cases.get(id).map(|c| &**c)
    }

    pub fn get_mut(&mut self, id: &u64) -> Option<&mut Case> {
        self.cases.get_mut(id).map(|c| &mut **c)
    }

    pub fn iter(&self) -> btree_map::Iter<'_, u64, Box<Case>> {
        self.cases.iter()
    }

    pub fn keys(&self) -> btree_map::Keys<'_, u64, Box<Case>> {
        self.cases.keys()
    }

    pub fn values(&self) -> btree_map::Values<'_, u64, Box<Case>> {
        self.cases.values()
    }

    pub fn is_empty(&self) -> bool {
        self.cases.is_empty()
    }

    /// The case of a live process.
    pub fn of_alive(&self, pid: u32) -> Option<u64> {
        self.alive.get(&pid).copied()
    }

    /// Its group died: no longer a live process's case.
    pub fn no_longer_alive(&mut self, pid: u32) -> Option<u64> {
        self.alive.remove(&pid)
    }

    /// Dead, waiting for its reap.
    pub fn unreaped(&mut self, pid: u32, id: u64) {
        self.unreaped.insert(pid, id);
    }

    /// The case of a dead process not reaped yet.
    pub fn of_unreaped(&self, pid: u32) -> Option<u64> {
        self.unreaped.get(&pid).copied()
    }

    /// Reaped: the case of the dead process, if it had one.
    pub fn reaped(&mut self, pid: u32) -> Option<u64> {
        self.unreaped.remove(&pid)
    }

    /// `holder` holds files of case `id`'s: its exit may release them.
    pub fn holds_for(&mut self, holder: u32, id: u64) {
        self.held_for.entry(holder).or_default().insert(id);
    }

    /// The cases whose files `holder` holds.
    pub fn held_by(&self, holder: u32) -> Vec<u64> {
        self.held_for
            .get(&holder)
            .map(|ids| ids.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Every case whose files another process holds.
    pub fn held_by_others(&self) -> BTreeSet<u64> {
        self.held_for.values().flatten().copied().collect()
    }

    /// Case `id` waits for the next reading.
    pub fn await_reading(&mut self, id: u64) {
        self.awaiting_reading.insert(id);
    }

    /// The cases waiting for this reading, no longer waiting.
    pub fn take_awaiting_reading(&mut self) -> BTreeSet<u64> {
        std::mem::take(&mut self.awaiting_reading)
    }
}
