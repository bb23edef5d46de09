//! GPU holders' threads stuck in the driver, found once a second in the programs'
//! `HOLDERS_ASLEEP` map (each thread's latest uninterruptible sleep, see tracer-ebpf's
//! asleep.rs): a sleep older than the threshold whose thread /proc still shows in state D, with
//! the voluntary context switches it had when it went to sleep, is stuck, and if the driver is
//! on its stack it becomes a [`EventData::Stuck`] event; when the thread is seen out of that
//! sleep, a [`EventData::StuckCleared`]. The count matters: a process that closed its last GPU
//! file is no holder, so its thread's later sleeps replace no entry, and one of them (an exec's
//! wait) seen at a look would read as the old sleep going on. /proc is read only for sleeps past
//! the threshold, each once, and for the threads reported stuck.

use std::collections::{BTreeSet, HashMap};

use aya::maps::{HashMap as BpfHashMap, MapData, StackTraceMap};
use log::debug;
use tracer_common::asleep::Asleep;

use super::kallsyms::Kallsyms;
use crate::{
    analysis::teardown::is_driver_frame,
    clock::boottime_ns,
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
    /// Threads reported stuck: tid → the sleep reported.
    stuck: HashMap<u32, Asleep>,
    /// Stack ids entries named at the last look: those no entry names any more leave the map.
    stack_ids: BTreeSet<u32>,
    /// Sleeps begun before tracing did (found in /proc at the start), by tid, followed like
    /// the map's until they end.
    before_start: HashMap<u32, Asleep>,
}

impl AsleepWatch {
    /// `before_start`: the threads already asleep in the driver when tracing began.
    pub fn new(
        sleeps: BpfHashMap<MapData, u32, Asleep>,
        stacks: StackTraceMap<MapData>,
        after_ns: u64,
        before_start: Vec<(u32, Asleep)>,
    ) -> Self {
        Self {
            before_start: before_start.into_iter().collect(),
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
        let mut entries: Vec<(u32, Asleep)> = self.sleeps.iter().filter_map(Result::ok).collect();
        // A sleep begun before the start is followed until the thread leaves it (a later sleep
        // of its own is in the map).
        self.before_start.retain(|tid, sleep| {
            !entries.iter().any(|(t, _)| t == tid)
                && now_in(sleep.tgid, *tid).is_some_and(|now| still_in(now, sleep))
        });
        entries.extend(self.before_start.iter().map(|(tid, s)| (*tid, *s)));
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
            match now_in(sleep.tgid, *tid) {
                None => gone.push(*tid),
                Some(now) if still_in(now, sleep) => {
                    // Named now: the first stack loads the kernel's symbols, which takes
                    // seconds on a slow machine, and the thread may have moved on by then.
                    let comm = comm(sleep.tgid, *tid);
                    match self.in_driver(*tid, sleep) {
                        Some(frames) => {
                            self.stuck.insert(*tid, *sleep);
                            let early = self.before_start.contains_key(tid);
                            out.push(stuck_event(now_ns, *tid, sleep, comm, frames, early));
                        }
                        None => {
                            self.judged.insert(*tid, sleep.since_ns);
                        }
                    }
                }
                Some(_) => {
                    self.judged.insert(*tid, sleep.since_ns);
                }
            }
        }
        // Looked at as it is now, and dated so: naming a stack above may have taken seconds.
        out.extend(self.cleared(boottime_ns(), &entries));
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
        self.stuck.retain(|tid, sleep| {
            // No entry at all: evicted from the full map, the sleep itself goes on.
            let same_entry = entries
                .iter()
                .find(|(t, _)| t == tid)
                .is_none_or(|(_, s)| s.since_ns == sleep.since_ns);
            if same_entry && now_in(sleep.tgid, *tid).is_some_and(|now| still_in(now, sleep)) {
                return true;
            }
            out.push(Event {
                ts_ns: now_ns,
                cpu: 0,
                pid: sleep.tgid,
                tid: *tid,
                data: EventData::StuckCleared {
                    since_ns: sleep.since_ns,
                },
            });
            false
        });
        out
    }

    /// The sleep's stack, named, if the NVIDIA driver is on it. A stack the map could not
    /// keep is read from /proc (the thread still sleeps in it); one read from neither is
    /// reported all the same, said lost: a GPU holder's thread asleep uninterruptibly this long.
    fn in_driver(&mut self, tid: u32, sleep: &Asleep) -> Option<Vec<String>> {
        let frames = self
            .kept_stack(sleep)
            .or_else(|| proc_stack(sleep.tgid, tid))
            .unwrap_or_else(|| vec![STACK_LOST.to_string()]);
        let lost = frames.first().is_some_and(|f| f == STACK_LOST);
        (lost || frames.iter().any(|f| is_driver_frame(f))).then_some(frames)
    }

    /// The sleep's stack from the programs' map, named; None where it could not keep it.
    fn kept_stack(&mut self, sleep: &Asleep) -> Option<Vec<String>> {
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
        let frames = trace
            .frames()
            .iter()
            .map(|f| symbols.name(f.ip))
            .skip_while(|f| f.ends_with("[bpf]") || f.starts_with("bpf_trace_run"))
            .collect();
        Some(frames)
    }
}

/// The only frame of a stuck thread's stack that neither the programs' map nor /proc gave.
pub const STACK_LOST: &str = "(stack lost: the stack map was full and /proc did not give it)";

/// A sleeping thread's kernel stack as /proc gives it (root only), named as the symbolizer
/// names frames ("nvidia_close[nvidia]"); None where it does not.
pub(super) fn proc_stack(tgid: u32, tid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/stack")).ok()?;
    let frames = proc_frames(&text);
    (!frames.is_empty()).then_some(frames)
}

/// Frames of a /proc stack file: "[<0>] os_acquire_mutex+0x2a/0x40 [nvidia]" is
/// "os_acquire_mutex[nvidia]", as the symbolizer names it from kallsyms.
fn proc_frames(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let frame = l.split_once("] ").map_or(l, |(_, f)| f).trim();
            let (name, rest) = frame.split_once('+').unwrap_or((frame, ""));
            let module = rest.split_once(' ').map(|(_, m)| m.trim());
            (!name.is_empty()).then(|| match module {
                Some(m) if m.starts_with('[') => format!("{name}{m}"),
                _ => name.to_string(),
            })
        })
        .collect()
}

fn stuck_event(
    now_ns: u64,
    tid: u32,
    sleep: &Asleep,
    comm: String,
    frames: Vec<String>,
    before_start: bool,
) -> Event {
    Event {
        ts_ns: now_ns,
        cpu: 0,
        pid: sleep.tgid,
        tid,
        data: EventData::Stuck {
            since_ns: sleep.since_ns,
            comm,
            frames,
            before_start,
        },
    }
}

/// A thread as /proc shows it now: its state letter (`R`, `S`, `D`, `T`, ...) and its
/// voluntary context switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Now {
    pub state: char,
    pub switches: u64,
}

/// The thread now; None when it is gone (or /proc does not say).
pub(super) fn now_in(tgid: u32, tid: u32) -> Option<Now> {
    let status = std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/status")).ok()?;
    parse_status(&status)
}

/// From a /proc status file ("State:\tD (disk sleep)", "voluntary_ctxt_switches:\t12"; the
/// name line escapes newlines, so lines are lines).
fn parse_status(status: &str) -> Option<Now> {
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .map(str::trim)
    };
    Some(Now {
        state: field("State")?.chars().next()?,
        switches: field("voluntary_ctxt_switches")?.parse().ok()?,
    })
}

/// Whether a thread is still in the sleep recorded: uninterruptible, and not switched out
/// voluntarily since (each sleep counts one before the programs see it).
fn still_in(now: Now, sleep: &Asleep) -> bool {
    now.state == 'D' && now.switches == sleep.switches
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
    fn a_proc_stack_reads_as_the_symbolizer_names_frames() {
        let text = "[<0>] os_acquire_mutex+0x2a/0x40 [nvidia]\n[<0>] nvidia_close+0x5c/0x1f0 \
                    [nvidia]\n[<0>] __fput+0xe6/0x2b0\n[<0>] do_exit+0x2f1/0xb20\n";
        assert_eq!(
            proc_frames(text),
            [
                "os_acquire_mutex[nvidia]",
                "nvidia_close[nvidia]",
                "__fput",
                "do_exit"
            ]
        );
        assert!(proc_frames("").is_empty());
    }

    #[test]
    fn reads_the_state_and_switches_of_a_thread() {
        // "PID/task/TID" of the thread reading it, which is running.
        let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
        let tid: u32 = link
            .file_name()
            .and_then(|t| t.to_str()?.parse().ok())
            .expect("a tid");
        let me = std::process::id();
        let now = now_in(me, tid).expect("this thread");
        assert_eq!(now.state, 'R');
        std::thread::sleep(std::time::Duration::from_millis(1));
        let later = now_in(me, tid).expect("this thread");
        assert!(later.switches > now.switches, "{now:?} then {later:?}");
        assert_eq!(now_in(me, u32::MAX - 1), None);
        let status = "Name:\tx) D (\\n\nState:\tD (disk sleep)\nvoluntary_ctxt_switches:\t7\n";
        let now = parse_status(status).expect("parsed");
        assert_eq!((now.state, now.switches), ('D', 7));
        // The sleep recorded with 7 switches goes on only while the thread shows 7 in D:
        // 8 is a later sleep no program saw (an exec's wait after its last GPU file's close).
        let sleep = Asleep {
            switches: 7,
            ..Asleep::default()
        };
        assert!(still_in(now, &sleep));
        assert!(!still_in(Now { switches: 8, ..now }, &sleep));
        assert!(!still_in(Now { state: 'S', ..now }, &sleep));
        assert!(is_driver_frame("nvidia_close[nvidia]"));
        assert!(is_driver_frame("uvm_tracker_wait[nvidia_uvm]"));
        assert!(!is_driver_frame("msleep"));
    }
}
