//! Kernel stacks of teardown samples, read from the STACKS map once per id and symbolized
//! while the machine is at hand, so a trace replays anywhere.

use std::collections::HashSet;

use aya::maps::{MapData, StackTraceMap};
use log::debug;

use super::kallsyms::Kallsyms;
use crate::event::{Event, EventData};

pub struct StackResolver {
    map: StackTraceMap<MapData>,
    symbols: Kallsyms,
    seen: HashSet<i32>,
}

impl StackResolver {
    pub fn new(map: StackTraceMap<MapData>) -> Self {
        Self {
            map,
            symbols: Kallsyms::load(),
            seen: HashSet::new(),
        }
    }

    /// Empties the kernel's stack map once no incident needs its stacks any more: ids are
    /// hash buckets, so a full map loses every new stack that collides.
    pub fn forget_all(&mut self) {
        for id in self.seen.drain() {
            let _ = self.map.remove(&(id as u32));
        }
    }

    /// A [`EventData::Stack`] the first time a sample names a stack id.
    pub fn resolve(&mut self, e: &Event) -> Option<Event> {
        let EventData::TeardownSample { stack_id, .. } = e.data else {
            return None;
        };
        if stack_id < 0 || !self.seen.insert(stack_id) {
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
