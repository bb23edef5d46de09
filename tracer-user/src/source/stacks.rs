//! Kernel stacks of teardown samples, read from the STACKS map once per id and symbolized
//! while the machine is at hand, so a trace replays anywhere.

use std::collections::HashMap;

use aya::maps::{MapData, StackTraceMap};
use log::{debug, warn};

use super::kallsyms::Kallsyms;
use crate::event::{Event, EventData};

/// A stack no sample has named for this long leaves the kernel's map even while incidents are
/// open (a busy node always has some): its bucket is free again for new stacks, and what it
/// was is in the stream already. Teardowns name their stacks again within milliseconds.
const STALE_NS: u64 = 10_000_000_000;

pub struct StackResolver {
    map: StackTraceMap<MapData>,
    symbols: Kallsyms,
    /// Stack ids resolved, with the last time a sample named each.
    seen: HashMap<i32, u64>,
    /// When the stale ones were last looked for (a pass over all of them: once a second).
    swept_ns: u64,
}

impl StackResolver {
    pub fn new(map: StackTraceMap<MapData>) -> Self {
        let symbols = Kallsyms::load();
        if symbols.is_empty() {
            warn!(
                "kernel stacks stay unnamed: /proc/kallsyms shows no addresses (CAP_SYSLOG \
                 missing, or kernel.kptr_restrict=2), so the teardowns' phases and the driver \
                 functions their samples show are lost"
            );
        }
        Self {
            map,
            symbols,
            seen: HashMap::new(),
            swept_ns: 0,
        }
    }

    /// Empties the kernel's stack map once no incident needs its stacks any more: ids are
    /// hash buckets, so a full map loses every new stack that collides.
    pub fn forget_all(&mut self) {
        for (id, _) in self.seen.drain() {
            let _ = self.map.remove(&(id as u32));
        }
    }

    /// Empties the kernel's map of the stacks no sample named lately.
    pub fn forget_stale(&mut self, now_ns: u64) {
        if now_ns.saturating_sub(self.swept_ns) < 1_000_000_000 {
            return;
        }
        self.swept_ns = now_ns;
        for id in stale(&self.seen, now_ns) {
            self.seen.remove(&id);
            let _ = self.map.remove(&(id as u32));
        }
    }

    /// A [`EventData::Stack`] the first time a sample names a stack id.
    pub fn resolve(&mut self, e: &Event) -> Option<Event> {
        let EventData::TeardownSample { stack_id, .. } = e.data else {
            return None;
        };
        if stack_id < 0 || self.seen.insert(stack_id, e.ts_ns).is_some() {
            return None;
        }
        let trace = match self.map.get(&(stack_id as u32), 0) {
            Ok(t) => t,
            Err(err) => {
                debug!("stack {stack_id}: {err}");
                return None;
            }
        };
        let frames = trace
            .frames()
            .iter()
            .map(|f| self.symbols.name(f.ip))
            .collect();
        Some(Event {
            ts_ns: e.ts_ns,
            cpu: e.cpu,
            pid: 0,
            tid: 0,
            data: EventData::Stack {
                id: stack_id,
                frames,
            },
        })
    }
}

/// The ids no sample named for `STALE_NS` before `now_ns`.
fn stale(seen: &HashMap<i32, u64>, now_ns: u64) -> Vec<i32> {
    seen.iter()
        .filter(|(_, t)| now_ns.saturating_sub(**t) >= STALE_NS)
        .map(|(id, _)| *id)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::{stale, STALE_NS};

    #[test]
    fn only_stacks_no_sample_named_lately_are_stale() {
        let seen = HashMap::from([(1, 0), (2, STALE_NS), (3, 2 * STALE_NS - 1)]);
        let mut old = stale(&seen, 2 * STALE_NS);
        old.sort_unstable();
        assert_eq!(old, vec![1, 2]);
        assert!(stale(&seen, STALE_NS - 1).is_empty());
    }
}
