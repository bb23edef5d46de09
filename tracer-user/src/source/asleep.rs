//! GPU holders' threads stuck in the driver, found once a second in the programs'
//! `HOLDERS_ASLEEP` map (each thread's latest uninterruptible sleep, see tracer-ebpf's
//! asleep.rs): a sleep older than the threshold whose thread /proc still shows in state D is
//! stuck, and if the driver is on its stack it becomes a [`EventData::Stuck`] event; when the
//! thread is seen out of that sleep, a [`EventData::StuckCleared`]. /proc is read only for
//! sleeps past the threshold, each once, and for the threads reported stuck.

use std::collections::{BTreeSet, HashMap};

use aya::maps::{HashMap as BpfHashMap, MapData, StackTraceMap};
use log::debug;
use tracer_common::asleep::Asleep;

use super::kallsyms::Kallsyms;
use crate::{
    analysis::teardown::is_driver_frame,
    event::{Event, EventData},
};

pub struct AsleepWatch {
    sleeps: BpfHashMap<MapData, u32, Asleep>,
    stacks: StackTraceMap<MapData>,
    after_ns: u64,
    /// Loaded at the first stuck thread: most machines never need it.
    symbols: Option<Kallsyms>,
    /// Sleeps past the threshold already looked at (tid → since) that were not stuck in the
    /// driver: not looked at again.
    judged: HashMap<u32, u64>,
    /// Threads reported stuck: tid → (tgid, since).
    stuck: HashMap<u32, (u32, u64)>,
    /// Stack ids entries named at the last look: those no entry names any more leave the map.
    stack_ids: BTreeSet<u32>,
}

impl AsleepWatch {
    pub fn new(
        sleeps: BpfHashMap<MapData, u32, Asleep>,
        stacks: StackTraceMap<MapData>,
        after_ns: u64,
    ) -> Self {
        Self {
            sleeps,
            stacks,
            after_ns,
            symbols: None,
            judged: HashMap::new(),
            stuck: HashMap::new(),
            stack_ids: BTreeSet::new(),
        }
    }

    /// One look at `now_ns`: the threads newly stuck and those no longer.
    pub fn poll(&mut self, now_ns: u64) -> Vec<Event> {
        let mut out = Vec::new();
        let entries: Vec<(u32, Asleep)> = self.sleeps.iter().filter_map(Result::ok).collect();
        let mut named = BTreeSet::new();
        let mut gone = Vec::new();
        for (tid, sleep) in &entries {
            if sleep.stack_id >= 0 {
                named.insert(sleep.stack_id as u32);
            }
            if self.stuck.contains_key(tid)
                || now_ns.saturating_sub(sleep.since_ns) < self.after_ns
                || self.judged.get(tid) == Some(&sleep.since_ns)
            {
                continue;
            }
            match state(sleep.tgid, *tid) {
                None => gone.push(*tid),
                Some('D') => match self.in_driver(sleep) {
                    Some(frames) => {
                        self.stuck.insert(*tid, (sleep.tgid, sleep.since_ns));
                        out.push(stuck_event(now_ns, *tid, sleep, frames));
                    }
                    None => {
                        self.judged.insert(*tid, sleep.since_ns);
                    }
                },
                Some(_) => {
                    self.judged.insert(*tid, sleep.since_ns);
                }
            }
        }
        out.extend(self.cleared(now_ns, &entries));
        for tid in gone {
            let _ = self.sleeps.remove(&tid);
        }
        let live: BTreeSet<u32> = entries.iter().map(|(tid, _)| *tid).collect();
        self.judged.retain(|tid, _| live.contains(tid));
        // A stack no entry names any more frees its bucket (ids are hash buckets: a full map
        // refuses new stacks that collide).
        for id in self.stack_ids.difference(&named) {
            let _ = self.stacks.remove(id);
        }
        self.stack_ids = named;
        out
    }

    /// The stuck threads that left their sleep: a newer sleep in the map, or /proc showing
    /// them in another state, or gone.
    fn cleared(&mut self, now_ns: u64, entries: &[(u32, Asleep)]) -> Vec<Event> {
        let mut out = Vec::new();
        self.stuck.retain(|tid, (tgid, since)| {
            // No entry at all: evicted from the full map, the sleep itself goes on.
            let same_sleep = entries
                .iter()
                .find(|(t, _)| t == tid)
                .is_none_or(|(_, s)| s.since_ns == *since);
            if same_sleep && state(*tgid, *tid) == Some('D') {
                return true;
            }
            out.push(Event {
                ts_ns: now_ns,
                cpu: 0,
                pid: *tgid,
                tid: *tid,
                data: EventData::StuckCleared { since_ns: *since },
            });
            false
        });
        out
    }

    /// The sleep's stack, named, if the NVIDIA driver is on it.
    fn in_driver(&mut self, sleep: &Asleep) -> Option<Vec<String>> {
        if sleep.stack_id < 0 {
            return None;
        }
        let trace = match self.stacks.get(&(sleep.stack_id as u32), 0) {
            Ok(t) => t,
            Err(e) => {
                debug!("stack {} of a sleep: {e}", sleep.stack_id);
                return None;
            }
        };
        let symbols = self.symbols.get_or_insert_with(Kallsyms::load);
        // The stack was taken inside linger's own program on the scheduler's tracepoint: its
        // innermost frames are that program and the tracepoint's call of it.
        let frames: Vec<String> = trace
            .frames()
            .iter()
            .map(|f| symbols.name(f.ip))
            .skip_while(|f| f.ends_with("[bpf]") || f.starts_with("bpf_trace_run"))
            .collect();
        frames.iter().any(|f| is_driver_frame(f)).then_some(frames)
    }
}

fn stuck_event(now_ns: u64, tid: u32, sleep: &Asleep, frames: Vec<String>) -> Event {
    Event {
        ts_ns: now_ns,
        cpu: 0,
        pid: sleep.tgid,
        tid,
        data: EventData::Stuck {
            since_ns: sleep.since_ns,
            comm: comm(sleep.tgid, tid),
            frames,
        },
    }
}

/// The thread's state letter from /proc (`R`, `S`, `D`, `T`, ...); None when it is gone.
fn state(tgid: u32, tid: u32) -> Option<char> {
    let stat = std::fs::read(format!("/proc/{tgid}/task/{tid}/stat")).ok()?;
    // "tid (comm) S ...": the comm may hold spaces and parentheses; the state follows the
    // last ')'.
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).map(|&b| b as char)
}

fn comm(tgid: u32, tid: u32) -> String {
    std::fs::read(format!("/proc/{tgid}/task/{tid}/comm"))
        .map(|c| crate::escape::bytes(&c).trim_end().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_state_of_a_thread_whose_name_has_parentheses() {
        // "PID/task/TID" of the thread reading it, which is running.
        let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
        let tid: u32 = link
            .file_name()
            .and_then(|t| t.to_str()?.parse().ok())
            .expect("a tid");
        let me = std::process::id();
        assert_eq!(state(me, tid), Some('R'));
        assert_eq!(state(me, u32::MAX - 1), None);
        assert!(is_driver_frame("nvidia_close[nvidia]"));
        assert!(is_driver_frame("uvm_tracker_wait[nvidia_uvm]"));
        assert!(!is_driver_frame("msleep"));
    }
}
