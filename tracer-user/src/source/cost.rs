//! The collector's own CPU time, by part of its work: where its cost goes under load shows on
//! a machine without a profiler (`linger_collector_cpu_seconds_total`). The parts switch for
//! every kernel record (decoding it, recording it), so their bounds are read from the
//! monotonic clock (vDSO, tens of nanoseconds; the thread's CPU clock is a system call of a
//! few hundred, which cost a busy node's collector 2 ms a kill); before the thread waits, the
//! CPU time it spent since it last waited is shared out among the parts by their time.

use std::{
    cell::Cell,
    rc::Rc,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use nix::time::{clock_gettime, ClockId};

use crate::clock::monotonic_ns;

/// A part of the collector's work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Reading and decoding the kernel's records.
    Ring,
    /// Writing the `--record` trace.
    Record,
    /// /proc facts read while a process is at hand.
    Enrich,
    /// Teardown stacks read from the kernel's map and symbolized.
    Stacks,
    /// Correlation and the incidents' output.
    Analysis,
    /// What runs beside the analysis: the agent's metrics and flight recorder.
    Companion,
    /// Looking through /proc for who holds a dead process's files.
    Search,
    /// NVML readings, on their own thread.
    Nvml,
    /// Of those, the process lists (included in `Nvml`).
    NvmlProcesses,
    /// Switching the stack sampler on and off.
    Sampler,
    /// Searches, the kernel's hints and loss counters.
    Housekeeping,
}

impl Part {
    pub const ALL: [Part; 11] = [
        Part::Ring,
        Part::Record,
        Part::Enrich,
        Part::Stacks,
        Part::Analysis,
        Part::Companion,
        Part::Search,
        Part::Nvml,
        Part::NvmlProcesses,
        Part::Sampler,
        Part::Housekeeping,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Part::Ring => "ring",
            Part::Record => "record",
            Part::Enrich => "enrich",
            Part::Stacks => "stacks",
            Part::Analysis => "analysis",
            Part::Companion => "companion",
            Part::Search => "search",
            Part::Nvml => "nvml",
            Part::NvmlProcesses => "nvml_processes",
            Part::Sampler => "sampler",
            Part::Housekeeping => "housekeeping",
        }
    }
}

/// CPU nanoseconds spent in each part so far, shared between the threads that spend them
/// and the metrics that show them.
#[derive(Clone, Default)]
pub struct Cost(Arc<[AtomicU64; Part::ALL.len()]>);

impl Cost {
    pub fn add(&self, part: Part, ns: u64) {
        self.0[part as usize].fetch_add(ns, Ordering::Relaxed);
    }

    /// Each part's CPU nanoseconds so far.
    pub fn totals(&self) -> [(Part, u64); Part::ALL.len()] {
        Part::ALL.map(|p| (p, self.0[p as usize].load(Ordering::Relaxed)))
    }

    /// A stopwatch for the calling thread, charging `part` from now on.
    pub fn watch(&self, part: Part) -> Stopwatch {
        Stopwatch(Rc::new(Watch {
            cost: self.clone(),
            at: Cell::new(monotonic_ns()),
            part: Cell::new(part),
            waited: Cell::new(false),
            spans: Default::default(),
            cpu_at: Cell::new(thread_cpu_ns()),
        }))
    }
}

/// Charges one thread's CPU time to the part it is in; clones share the clock, so whoever
/// runs a part (the loop, a sink, a tap) switches to it.
#[derive(Clone)]
pub struct Stopwatch(Rc<Watch>);

struct Watch {
    cost: Cost,
    at: Cell<u64>,
    part: Cell<Part>,
    /// The thread waited since the last switch: that time was nobody's work.
    waited: Cell<bool>,
    /// Each part's time since the thread last waited.
    spans: [Cell<u64>; Part::ALL.len()],
    /// The thread's CPU clock when it last waited.
    cpu_at: Cell<u64>,
}

impl Stopwatch {
    /// Counts the time since the last switch to the part then current, and makes `to`
    /// current; returns the part it was.
    pub fn switch(&self, to: Part) -> Part {
        let w = &self.0;
        let now = monotonic_ns();
        let was = w.part.replace(to);
        let span = now.saturating_sub(w.at.replace(now));
        if !w.waited.replace(false) {
            let s = &w.spans[was as usize];
            s.set(s.get() + span);
        }
        was
    }

    /// The thread is about to wait: the CPU time it spent since it last waited goes to the
    /// parts in proportion to their time (to the current part when none was counted).
    pub fn settle(&self) {
        let w = &self.0;
        self.switch(w.part.get());
        w.waited.set(true);
        let cpu = thread_cpu_ns();
        let spent = cpu.saturating_sub(w.cpu_at.replace(cpu));
        let spans = w.spans.each_ref().map(Cell::take);
        let total: u64 = spans.iter().sum();
        if total == 0 {
            w.cost.add(w.part.get(), spent);
            return;
        }
        for (part, span) in Part::ALL.into_iter().zip(spans) {
            let share = u128::from(spent) * u128::from(span) / u128::from(total);
            if share > 0 {
                w.cost.add(part, share as u64);
            }
        }
    }

    /// Runs `f` as `part`, then goes back to the part it was in.
    pub fn within<T>(&self, part: Part, f: impl FnOnce() -> T) -> T {
        let was = self.switch(part);
        let out = f();
        self.switch(was);
        out
    }
}

/// The calling thread's CPU time so far.
pub fn thread_cpu_ns() -> u64 {
    // Every thread has this clock; a failure reads as no time spent.
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|ts| ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{Cost, Part};

    #[test]
    fn work_is_charged_to_the_part_that_did_it() {
        let cost = Cost::default();
        let watch = cost.watch(Part::Ring);
        watch.within(Part::Analysis, || {
            let mut x = 0u64;
            for i in 0..20_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
        });
        watch.switch(Part::Ring);
        watch.settle();
        let totals = cost.totals();
        let of = |p: Part| totals.iter().find(|(q, _)| *q == p).map(|(_, ns)| *ns);
        assert!(of(Part::Analysis) > Some(1_000_000), "{totals:?}");
        assert!(of(Part::Ring) < of(Part::Analysis), "{totals:?}");
        assert_eq!(of(Part::Nvml), Some(0));
    }
}
