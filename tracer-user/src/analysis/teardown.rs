//! Where a dying GPU process's teardown time went, from its kernel stacks: the timeline of the
//! thread that ends the group (it runs the exit path's release of the files) is cut at its
//! samples, each piece classified into a phase by the frames of the stack that ends it: an
//! on-CPU sample covers the time since the thread's previous sample, a sleep its length. The
//! phases partition the interval; what no sample covers is left out (`phases_coverage`). A
//! piece whose stack the kernel could not keep (a counted loss) takes the phase of the driver
//! call the hooks timed on that thread meanwhile, where they run; `other` otherwise.
//!
//! A sample's weight is not capped: the driver spins with interrupts off for tens of
//! milliseconds (GSP RPC polling; a 43 ms gap was seen on the H200), and the timer fires only
//! afterwards, inside the same work. Time a thread waited for a CPU counts the same way.

use std::{cell::OnceCell, collections::HashMap, sync::Arc};

use serde::Serialize;

use super::id_map::IdMap;
use crate::event::{DriverFunc, SampleKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Waiting for a lock (rwsem, mutex, semaphore, spinlock): in a storm, for another
    /// process's teardown inside the driver.
    LockWait,
    /// `uvm_release_entry` and the va_space destroy below it.
    UvmTeardown,
    /// `nvidia_close` → `rm_cleanup_file_private`: freeing the RM clients.
    RmClient,
    /// `exit_mmap`: unmapping the process's memory (under UVM's release, which holds the mm).
    Mm,
    /// Sleeping in a driver queue flush (`nv_kthread_q_flush`, `os_flush_work_queue`).
    QueueFlush,
    /// Unpinning and freeing host memory the GPU used (pinned buffers: `os_unlock_user_pages`,
    /// `unpin_user_page`; their shmem backing).
    HostMemory,
    Other,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Self::LockWait => "lock wait",
            Self::UvmTeardown => "UVM teardown",
            Self::RmClient => "RM client",
            Self::Mm => "mm",
            Self::QueueFlush => "queue flush",
            Self::HostMemory => "host memory",
            Self::Other => "other",
        }
    }
}

/// Frames of a task waiting for a lock, asleep or spinning.
const LOCK_SLOWPATHS: [&str; 9] = [
    "rwsem_down_",
    "rwsem_spin_on_owner",
    "__mutex_lock",
    "mutex_spin_on_owner",
    "osq_lock",
    "__down_common",
    "native_queued_spin_lock_slowpath",
    "__pv_queued_spin_lock_slowpath",
    "queued_spin_lock_slowpath",
];

/// Frames of host memory the GPU used being unpinned and freed.
const HOST_MEMORY: [&str; 4] = [
    "os_unlock_user_pages",
    "unpin_user_page",
    "shmem_evict_inode",
    "shmem_undo_range",
];

/// Frames of the driver freeing a file's RM clients, whose memory the device still counts.
const RM_CLIENT_FREE: [&str; 2] = ["rm_cleanup_file_private", "nvidia_close"];

/// Frames of the driver's release of a file: called only once its last reference went.
const FILE_RELEASE: [&str; 3] = ["nvidia_close", "rm_cleanup_file_private", "uvm_release"];

/// Frames of a release the driver handed to its own thread.
const DEFERRED_RELEASE: [&str; 2] = ["nvidia_close_deferred", "uvm_release_deferred"];

/// A symbolized kernel stack (innermost frame first) with what the analysis reads of it,
/// worked out once, when first asked: every report of a teardown goes over all of its
/// samples' stacks, and most stacks belong to no report. Shared with the reports.
#[derive(Clone, Debug)]
pub struct Stack {
    pub frames: Arc<[String]>,
    /// Its phase, and whether it waits on the GPU's firmware.
    class: OnceCell<(Phase, bool)>,
    /// Its frame that runs a release the driver handed to its own thread, if any.
    deferred: OnceCell<Option<usize>>,
}

impl Stack {
    pub fn new(frames: Vec<String>) -> Self {
        Self {
            frames: frames.into(),
            class: OnceCell::new(),
            deferred: OnceCell::new(),
        }
    }

    fn class(&self) -> (Phase, bool) {
        *self.class.get_or_init(|| classify(&self.frames))
    }

    /// Its frame that runs a deferred release, if any.
    fn deferred(&self) -> Option<&String> {
        let at = self.deferred.get_or_init(|| {
            self.frames
                .iter()
                .position(|f| DEFERRED_RELEASE.iter().any(|d| f.starts_with(d)))
        });
        self.frames.get((*at)?)
    }
}

/// A frame in the NVIDIA driver: its RM module or UVM (kallsyms names them `func[nvidia]`,
/// `func[nvidia_uvm]`).
pub fn is_driver_frame(frame: &str) -> bool {
    frame.ends_with("[nvidia]") || frame.ends_with("[nvidia_uvm]")
}

/// A stack's phase (innermost frame first), and whether it waits on the GPU's firmware.
pub fn classify(frames: &[String]) -> (Phase, bool) {
    let any = |pred: &dyn Fn(&str) -> bool| frames.iter().any(|f| pred(f));
    let gsp = any(&|f| f.contains("_GSP") || f.contains("kgspRpc"));
    let phase = if any(&|f| LOCK_SLOWPATHS.iter().any(|l| f.starts_with(l))) {
        Phase::LockWait
    } else if any(&|f| f.starts_with("exit_mmap") || f.starts_with("unmap_vmas")) {
        Phase::Mm
    } else if any(&|f| f.starts_with("nv_kthread_q_flush") || f.starts_with("os_flush_work_queue"))
    {
        Phase::QueueFlush
    } else if any(&|f| HOST_MEMORY.iter().any(|h| f.starts_with(h))) {
        Phase::HostMemory
    } else if any(&|f| f.starts_with("uvm_") || f.ends_with("[nvidia_uvm]")) {
        Phase::UvmTeardown
    } else if any(&|f| f.ends_with("[nvidia]")) {
        Phase::RmClient
    } else {
        Phase::Other
    };
    (phase, gsp)
}

/// Time of one phase.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PhaseTime {
    pub name: Phase,
    pub ns: u64,
    /// Part of `ns` spent waiting on GSP firmware RPCs.
    pub gsp_ns: u64,
}

#[derive(Clone, Debug)]
struct Sample {
    t_ns: u64,
    tid: u32,
    kind: SampleKind,
    stack_id: i32,
    blocked_ns: u64,
}

/// One driver release call timed by the driver hooks (fentry/kprobe), on the dying process's
/// thread or a driver worker doing its deferred close.
#[derive(Clone, Copy, Debug)]
pub struct DriverSpan {
    pub func: DriverFunc,
    /// The thread that ran it.
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The driver's release of a dying process's GPU files as the hooks saw it: exact start and
/// end, and each function's time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DriverRelease {
    pub start_ns: u64,
    pub end_ns: u64,
    /// `{function, ns, calls}` per hooked function (nested ones overlap their callers).
    pub functions: Vec<FunctionTime>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FunctionTime {
    pub function: &'static str,
    pub ns: u64,
    pub calls: u32,
}

/// A dying process's leaving of the driver, as its threads' sights place it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leaving {
    /// Its first sight outside the driver after the last inside.
    pub at: u64,
    /// That last sight inside: the leaving came between the two.
    pub since: u64,
    /// Whether a sight inside the driver's release of a file came before it (the release of
    /// the file's last reference: every other holder had let go).
    pub closing: bool,
}

/// The samples of one dying process.
#[derive(Clone, Debug, Default)]
pub struct TeardownLog {
    samples: Vec<Sample>,
    /// Driver kthreads it woke: (when, tid, comm).
    pub wakeups: Vec<(u64, u32, String)>,
    /// Release calls timed by the driver hooks.
    pub calls: Vec<DriverSpan>,
    /// Its threads' final switches (their exits over): (when, tid).
    exited: Vec<(u64, u32)>,
    /// Its threads seen leaving the driver: (when first seen outside, when last inside).
    left_driver: Vec<(u64, u64)>,
}

impl TeardownLog {
    pub fn sample(
        &mut self,
        t_ns: u64,
        tid: u32,
        kind: SampleKind,
        stack_id: i32,
        blocked_ns: u64,
    ) {
        match kind {
            SampleKind::Exited => return self.exited.push((t_ns, tid)),
            SampleKind::LeftDriver => {
                return self
                    .left_driver
                    .push((t_ns, t_ns.saturating_sub(blocked_ns)));
            }
            _ => {}
        }
        self.samples.push(Sample {
            t_ns,
            tid,
            kind,
            stack_id,
            blocked_ns,
        });
    }

    /// Whether thread `tid` made its final switch.
    pub fn has_exited(&self, tid: u32) -> bool {
        self.exited.iter().any(|(_, t)| *t == tid)
    }

    /// The last of its threads' final switches at or before `t_ns`: by then, every exit of
    /// the group was over, the release of its files with them.
    pub fn exits_over_by(&self, t_ns: u64) -> Option<u64> {
        self.exited
            .iter()
            .map(|(t, _)| *t)
            .filter(|t| *t <= t_ns)
            .max()
    }

    /// When its release of a GPU file within `[from, to]` was over, where its threads'
    /// sights tell it: the last leaving of the driver seen (the first sight outside after one
    /// inside), after a sight inside the driver's release of a file (which runs only once the
    /// file's last reference went: every other holder had let go), or a last sight inside
    /// during its exit (since `dead`, its group's death: the exit enters the driver only to
    /// release files and unmap; a stack the kernel could not keep still tells inside from
    /// outside), with no sight inside the driver after it (of its threads or the driver
    /// kthreads it woke).
    pub fn left_driver_by(
        &self,
        stacks: &IdMap<i32, Stack>,
        (from, to): (u64, u64),
        dead: Option<u64>,
    ) -> Option<Leaving> {
        let (at, since) = self
            .left_driver
            .iter()
            .copied()
            .filter(|(at, _)| (from..=to).contains(at))
            .max()?;
        let seen = |t: u64, s: &Sample, frames: &dyn Fn(&str) -> bool| {
            let sight = matches!(
                s.kind,
                SampleKind::BlockEnd | SampleKind::OnCpu | SampleKind::BlockStart
            );
            sight
                && s.t_ns > t
                && stacks
                    .get(&s.stack_id)
                    .is_some_and(|st| st.frames.iter().any(|f| frames(f)))
        };
        let releasing = |f: &str| FILE_RELEASE.iter().any(|r| f.starts_with(r));
        let released = self
            .samples
            .iter()
            .any(|s| s.t_ns <= at && seen(from, s, &releasing));
        let in_exit = dead.is_some_and(|d| since >= d);
        let inside_after = self
            .samples
            .iter()
            .any(|s| s.t_ns <= to && seen(at, s, &is_driver_frame));
        ((released || in_exit) && !inside_after).then_some(Leaving {
            at,
            since,
            closing: released,
        })
    }

    /// Phase times of thread `tid` within `[from, to]`, largest first, and the share of the
    /// interval they cover. Each sample ends a piece of the thread's timeline: an on-CPU one
    /// the time since the previous sample, a sleep's start the time it ran before sleeping,
    /// a sleep's end the sleep.
    pub fn phases(
        &self,
        stacks: &IdMap<i32, Stack>,
        tid: u32,
        from: u64,
        to: u64,
    ) -> (Vec<PhaseTime>, Option<f64>) {
        if to <= from {
            return (Vec::new(), None);
        }
        let mut by: HashMap<Phase, (u64, u64)> = HashMap::new();
        let mut last = from;
        for s in self.samples.iter().filter(|s| s.tid == tid) {
            let end = s.t_ns.min(to);
            let start = match s.kind {
                SampleKind::BlockEnd => s.t_ns.saturating_sub(s.blocked_ns).max(last),
                SampleKind::OnCpu
                | SampleKind::BlockStart
                | SampleKind::Exited
                | SampleKind::LeftDriver => last,
            }
            .max(from);
            if end > start {
                let (phase, gsp) = stacks
                    .get(&s.stack_id)
                    .map_or_else(|| (self.hooked_phase(tid, start, end), false), Stack::class);
                let e = by.entry(phase).or_default();
                e.0 += end - start;
                if gsp {
                    e.1 += end - start;
                }
            }
            last = last.max(s.t_ns);
            if last >= to {
                break;
            }
        }
        let mut v: Vec<PhaseTime> = by
            .into_iter()
            .map(|(name, (ns, gsp_ns))| PhaseTime { name, ns, gsp_ns })
            .collect();
        v.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.name.cmp(&b.name)));
        let covered: u64 = v.iter().map(|p| p.ns).sum();
        let coverage = (!v.is_empty()).then(|| covered as f64 / (to - from) as f64);
        (v, coverage)
    }

    /// The phase of a piece of thread `tid`'s timeline whose stack is unknown (the kernel
    /// could not store it: its map's bucket held another stack): the hooked driver call of that
    /// thread covering most of it, where the driver hooks (fentry, kprobes) timed one.
    fn hooked_phase(&self, tid: u32, start: u64, end: u64) -> Phase {
        self.calls
            .iter()
            .filter(|c| c.tid == tid)
            .filter_map(|c| {
                let phase = match c.func {
                    DriverFunc::UvmReleaseEntry => Phase::UvmTeardown,
                    DriverFunc::NvidiaClose | DriverFunc::RmCleanupFilePrivate => Phase::RmClient,
                    _ => return None,
                };
                let overlap = c.end_ns.min(end).saturating_sub(c.start_ns.max(start));
                (overlap > 0).then_some((overlap, phase))
            })
            .max_by_key(|(overlap, _)| *overlap)
            .map_or(Phase::Other, |(_, phase)| phase)
    }

    /// Evidence that the driver deferred the release to its own thread: the hooks saw
    /// `nvidia_close_deferred`, a sampled stack ran a deferred release, or the process woke
    /// UVM's deferred release queue. Ordinary wake-ups of UVM's bottom-half and channel
    /// threads are not.
    pub fn deferral(&self, stacks: &IdMap<i32, Stack>) -> Option<String> {
        if let Some(c) = self
            .calls
            .iter()
            .find(|c| c.func == DriverFunc::NvidiaCloseDeferred)
        {
            return Some(format!(
                "the driver hooks timed nvidia_close_deferred ({:.1} ms) on a driver thread",
                (c.end_ns - c.start_ns) as f64 / 1e6
            ));
        }
        let sampled = self.samples.iter().find_map(|s| {
            let frame = stacks.get(&s.stack_id)?.deferred()?;
            Some((s.tid, frame.clone()))
        });
        if let Some((tid, frame)) = sampled {
            return Some(format!("thread {tid} ran {frame} for it"));
        }
        self.wakeups
            .iter()
            .find(|(_, _, comm)| comm.starts_with("UVM deferred"))
            .map(|(_, tid, comm)| format!("it handed its release to {comm}[{tid}]"))
    }

    /// The last sample within `[from, to]` of a thread of the process inside the driver's
    /// free of its RM clients: its memory was not all back before then. Any thread: the one
    /// that closes the files last need not be the one that ended the group.
    pub fn last_rm_client_free(
        &self,
        stacks: &IdMap<i32, Stack>,
        from: u64,
        to: u64,
    ) -> Option<u64> {
        self.samples
            .iter()
            .filter(|s| (from..=to).contains(&s.t_ns))
            .filter(|s| {
                stacks.get(&s.stack_id).is_some_and(|st| {
                    st.frames
                        .iter()
                        .any(|f| RM_CLIENT_FREE.iter().any(|r| f.starts_with(r)))
                })
            })
            .map(|s| s.t_ns)
            .max()
    }

    /// The end of the driver's release of a file (`nvidia_close`, `uvm_release_entry`) that
    /// the hooks timed inside `fput`, an `__fput` on the same thread.
    pub fn driver_release_within(&self, fput: &DriverSpan) -> Option<u64> {
        self.calls
            .iter()
            .filter(|c| {
                matches!(
                    c.func,
                    DriverFunc::NvidiaClose | DriverFunc::UvmReleaseEntry
                )
            })
            .filter(|c| c.tid == fput.tid && c.start_ns >= fput.start_ns && c.end_ns <= fput.end_ns)
            .map(|c| c.end_ns)
            .max()
    }

    /// The hooked release within `[from, to]`, if the hooks saw one.
    pub fn driver_release(&self, from: u64, to: u64) -> Option<DriverRelease> {
        let calls: Vec<&DriverSpan> = self
            .calls
            .iter()
            .filter(|c| c.end_ns >= from && c.start_ns <= to)
            .collect();
        let start_ns = calls.iter().map(|c| c.start_ns).min()?;
        let end_ns = calls.iter().map(|c| c.end_ns).max()?;
        let mut by: Vec<FunctionTime> = Vec::new();
        for c in calls {
            let function = c.func.symbol();
            match by.iter_mut().find(|f| f.function == function) {
                Some(f) => {
                    f.ns += c.end_ns - c.start_ns;
                    f.calls += 1;
                }
                None => by.push(FunctionTime {
                    function,
                    ns: c.end_ns - c.start_ns,
                    calls: 1,
                }),
            }
        }
        by.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.function.cmp(b.function)));
        Some(DriverRelease {
            start_ns,
            end_ns,
            functions: by,
        })
    }

    /// Phases from the hooked calls alone, for when no stacks were sampled: UVM release,
    /// RM client teardown (nvidia_close, deferred or not), and the rest of `__fput`.
    pub fn hooked_phases(&self, from: u64, to: u64) -> Vec<PhaseTime> {
        let mut by: HashMap<Phase, u64> = HashMap::new();
        let mut fput = 0;
        let mut inside = 0;
        for c in self
            .calls
            .iter()
            .filter(|c| c.end_ns >= from && c.start_ns <= to)
        {
            let ns = c.end_ns.min(to).saturating_sub(c.start_ns.max(from));
            match c.func {
                DriverFunc::UvmReleaseEntry => *by.entry(Phase::UvmTeardown).or_default() += ns,
                DriverFunc::NvidiaClose | DriverFunc::NvidiaCloseDeferred => {
                    *by.entry(Phase::RmClient).or_default() += ns
                }
                DriverFunc::Fput => fput += ns,
                DriverFunc::RmCleanupFilePrivate
                | DriverFunc::NvidiaUnlockedIoctl
                | DriverFunc::NvidiaOpen
                | DriverFunc::UvmOpenEntry => continue,
            }
            if c.func != DriverFunc::Fput {
                inside += ns;
            }
        }
        // __fput time outside the driver's own functions.
        if fput > inside {
            by.insert(Phase::Other, fput - inside);
        }
        let mut v: Vec<PhaseTime> = by
            .into_iter()
            .filter(|(_, ns)| *ns > 0)
            .map(|(name, ns)| PhaseTime {
                name,
                ns,
                gsp_ns: 0,
            })
            .collect();
        v.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.name.cmp(&b.name)));
        v
    }

    /// Threads asleep at `at` (a BlockStart without its BlockEnd): (tid, since, stack id).
    pub fn asleep(&self, at: u64) -> Vec<(u32, u64, i32)> {
        let mut open: HashMap<u32, (u64, i32)> = HashMap::new();
        for s in self.samples.iter().filter(|s| s.t_ns <= at) {
            match s.kind {
                SampleKind::BlockStart => {
                    open.insert(s.tid, (s.t_ns, s.stack_id));
                }
                SampleKind::BlockEnd
                | SampleKind::OnCpu
                | SampleKind::Exited
                | SampleKind::LeftDriver => {
                    open.remove(&s.tid);
                }
            }
        }
        let mut v: Vec<_> = open
            .into_iter()
            .map(|(tid, (t, id))| (tid, t, id))
            .collect();
        v.sort_unstable();
        v
    }

    /// Stack ids with their sample weight in `[from, to]`, for flamegraphs: (stack, ns).
    pub fn weighted_stacks(&self, from: u64, to: u64) -> Vec<(i32, u64)> {
        let mut out: HashMap<i32, u64> = HashMap::new();
        let mut last: HashMap<u32, u64> = HashMap::new();
        for s in &self.samples {
            let ns = match s.kind {
                SampleKind::OnCpu => {
                    let prev = last.insert(s.tid, s.t_ns).unwrap_or(from).max(from);
                    s.t_ns.saturating_sub(prev)
                }
                SampleKind::BlockEnd => {
                    last.insert(s.tid, s.t_ns);
                    s.t_ns
                        .min(to)
                        .saturating_sub(s.t_ns.saturating_sub(s.blocked_ns).max(from))
                }
                SampleKind::BlockStart | SampleKind::Exited | SampleKind::LeftDriver => {
                    last.insert(s.tid, s.t_ns);
                    0
                }
            };
            if ns > 0 && (from..=to).contains(&s.t_ns.min(to)) {
                *out.entry(s.stack_id).or_default() += ns;
            }
        }
        let mut v: Vec<_> = out.into_iter().collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(s: &str) -> Vec<String> {
        s.split(';').rev().map(String::from).collect()
    }

    /// Stacks as recorded on the H200 (../shared/data/h200-kill-teardown-stacks.log).
    #[test]
    fn h200_stacks_fall_in_their_phases() {
        let log = include_str!("../../../tests/data/h200/teardown-stacks-sample.txt");
        let mut seen = std::collections::HashSet::new();
        for line in log.lines().filter(|l| !l.starts_with('#')) {
            let Some((want, stack)) = line.split_once(' ') else {
                continue;
            };
            let (phase, gsp) = classify(&frames(stack));
            let got = format!("{phase:?}{}", if gsp { "+gsp" } else { "" });
            assert_eq!(got, want, "{stack}");
            seen.insert(phase);
        }
        assert!(seen.len() >= 4, "the sample covers most phases: {seen:?}");
    }

    /// A sleep whose stack the kernel could not store (id -1) takes the phase of the driver
    /// call the hooks timed on that thread meanwhile; another thread's call says nothing of it.
    #[test]
    fn a_piece_without_its_stack_takes_its_threads_hooked_call() {
        let ms = 1_000_000;
        let log = |call_tid| {
            let mut log = TeardownLog::default();
            log.sample(100 * ms, 11, SampleKind::BlockStart, -1, 0);
            log.sample(300 * ms, 11, SampleKind::BlockEnd, -1, 200 * ms);
            log.calls.push(DriverSpan {
                func: DriverFunc::UvmReleaseEntry,
                tid: call_tid,
                start_ns: 99 * ms,
                end_ns: 301 * ms,
            });
            log
        };
        let stacks = IdMap::default();
        let (phases, _) = log(11).phases(&stacks, 11, 90 * ms, 310 * ms);
        assert_eq!(phases[0].name, Phase::UvmTeardown);
        assert_eq!(phases[0].ns, 210 * ms);
        let (phases, _) = log(12).phases(&stacks, 11, 90 * ms, 310 * ms);
        assert_eq!(phases[0].name, Phase::Other);
    }
}
