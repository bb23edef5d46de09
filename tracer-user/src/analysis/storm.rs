//! Teardowns that overlapped on one GPU (a kill storm): each victim's incident says how many
//! there were, the device's level before the first, and when the last one's memory was back.

use std::collections::BTreeMap;

use super::incident::Storm;

/// One GPU teardown: from the group's death to its own release of the files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Teardown {
    pub gpu: u32,
    pub dead_ns: u64,
    /// None while under way.
    pub released_ns: Option<u64>,
    pub back_ns: Option<u64>,
    /// The device's used memory before it began.
    pub used_before: Option<u64>,
}

impl Teardown {
    fn overlaps(&self, other: &Teardown) -> bool {
        self.gpu == other.gpu
            && self.dead_ns <= other.released_ns.unwrap_or(u64::MAX)
            && other.dead_ns <= self.released_ns.unwrap_or(u64::MAX)
    }
}

/// Teardowns of incidents (by id) recent enough to overlap an open one.
#[derive(Default)]
pub struct StormLog {
    done: BTreeMap<u64, Teardown>,
}

impl StormLog {
    /// An incident is done: its teardown stays for the others it overlapped.
    pub fn done(&mut self, id: u64, t: Teardown) {
        self.done.insert(id, t);
    }

    /// The storm `id`'s teardown `mine` was part of, given the open ones.
    pub fn view(&self, id: u64, mine: &Teardown, open: &[(u64, Teardown)]) -> Option<Storm> {
        let all: Vec<&Teardown> = self
            .done
            .iter()
            .chain(open.iter().map(|(k, t)| (k, t)))
            .filter(|(k, _)| **k != id)
            .map(|(_, t)| t)
            .filter(|t| t.overlaps(mine))
            .chain(std::iter::once(mine))
            .collect();
        if all.len() < 2 {
            return None;
        }
        let first = all.iter().min_by_key(|t| t.dead_ns)?;
        let back: Option<Vec<u64>> = all.iter().map(|t| t.back_ns).collect();
        Some(Storm {
            gpu: mine.gpu,
            incidents: all.len() as u32,
            t_first_ns: first.dead_ns,
            used_before: first.used_before.unwrap_or(0),
            t_device_back_ns: back.and_then(|b| b.into_iter().max()),
        })
    }

    /// Forgets teardowns whose memory was back before `before`.
    pub fn prune(&mut self, before: u64) {
        self.done
            .retain(|_, t| t.back_ns.unwrap_or(u64::MAX) >= before);
    }
}
