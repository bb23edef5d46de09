//! Threads of GPU holders asleep uninterruptibly in the NVIDIA driver past the collector's
//! threshold, without any kill: `stuck` records, one when a thread is found stuck and one when
//! it runs again. A stopped process (SIGSTOP, a debugger) is not stuck: only uninterruptible
//! sleeps are ever reported, and only those with the driver on their stack.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    holders::Holders,
    incident::Head,
    teardown::{classify, is_driver_frame, Phase},
};
use crate::event::NvmlGpu;

/// How many frames a record keeps, innermost first.
const FRAMES_KEPT: usize = 16;

/// A thread stuck in the driver, or one that was and ran again (`cleared`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StuckRecord {
    #[serde(flatten)]
    pub head: Head,
    /// When it was found stuck, or found running again.
    pub t_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// When its sleep began (its switch out), or, for a sleep begun before tracing did, when
    /// the collector found it.
    pub since_ns: u64,
    /// How long it had slept at `t_ns` (at least, with `asleep_before_start`).
    pub asleep_s: f64,
    /// The sleep began before tracing did (an agent started on a wedged node).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub asleep_before_start: bool,
    /// It ran again (or is gone): the sleep lasted at most `asleep_s`.
    pub cleared: bool,
    /// What the stack says it waits on, and the driver's innermost function.
    pub waits_on: Phase,
    pub in_function: Option<String>,
    /// Its kernel stack at the sleep, innermost first (the first 16 frames).
    pub frames: Vec<String>,
    /// Its GPU files (device numbers), as the holders' book knows them.
    pub gpu_files: Vec<u32>,
    /// What NVML's latest reading lists for it: (GPU index, bytes; None when NVML cannot tell).
    pub gpu_memory: Vec<GpuUse>,
    pub hint: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuUse {
    pub gpu: u32,
    pub bytes: Option<u64>,
}

const HINT: &str = "a thread in uninterruptible sleep in the NVIDIA driver: its process cannot \
                    be killed and its GPU work does not progress; check dmesg for Xid errors \
                    and nvidia-smi (which may hang too); the GPU may need a reset or the node \
                    a reboot";

/// The stuck threads now, by tid: what their clearing record repeats.
#[derive(Default)]
pub struct StuckBook {
    now: BTreeMap<u32, StuckRecord>,
}

/// A stuck thread as the collector found it.
pub struct Found<'a> {
    pub t_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub since_ns: u64,
    pub before_start: bool,
    pub comm: &'a str,
    pub frames: &'a [String],
}

impl StuckBook {
    /// A thread found stuck: its record, with what its process holds.
    pub fn stuck(
        &mut self,
        found: &Found,
        holders: &Holders,
        nvml: &mut dyn Iterator<Item = &NvmlGpu>,
    ) -> StuckRecord {
        let (waits_on, _) = classify(found.frames);
        let in_function = found
            .frames
            .iter()
            .find(|f| is_driver_frame(f))
            .map(|f| f.split('[').next().unwrap_or(f).to_string());
        let gpu_files = holders.process(found.pid).map_or_else(Vec::new, |p| {
            let mut devs: Vec<u32> = p.fds.values().map(|fd| fd.dev).collect();
            devs.sort_unstable();
            devs.dedup();
            devs
        });
        let gpu_memory = nvml
            .flat_map(|g| {
                g.processes
                    .iter()
                    .filter(|p| p.pid == found.pid)
                    .map(|p| GpuUse {
                        gpu: g.index,
                        bytes: p.used,
                    })
            })
            .collect();
        let record = StuckRecord {
            head: Head::new("stuck"),
            t_ns: found.t_ns,
            pid: found.pid,
            tid: found.tid,
            comm: found.comm.to_string(),
            since_ns: found.since_ns,
            asleep_s: seconds(found.t_ns, found.since_ns),
            asleep_before_start: found.before_start,
            cleared: false,
            waits_on,
            in_function,
            frames: found.frames.iter().take(FRAMES_KEPT).cloned().collect(),
            gpu_files,
            gpu_memory,
            hint: HINT,
        };
        self.now.insert(found.tid, record.clone());
        record
    }

    /// The thread `tid`, stuck since `since_ns`, ran again (or is gone) by `t_ns`.
    pub fn cleared(&mut self, t_ns: u64, tid: u32, since_ns: u64) -> Option<StuckRecord> {
        if self.now.get(&tid)?.since_ns != since_ns {
            return None;
        }
        let mut record = self.now.remove(&tid)?;
        record.t_ns = t_ns;
        record.asleep_s = seconds(t_ns, since_ns);
        record.cleared = true;
        Some(record)
    }

    /// The threads stuck now.
    #[cfg(test)]
    fn current(&self) -> impl Iterator<Item = &StuckRecord> {
        self.now.values()
    }
}

fn seconds(t_ns: u64, since_ns: u64) -> f64 {
    t_ns.saturating_sub(since_ns) as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::NvmlProcess;

    fn frames() -> Vec<String> {
        [
            "__schedule",
            "schedule",
            "schedule_timeout",
            "msleep",
            "nvidia_close[nvidia]",
            "__fput",
            "task_work_run",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn a_stuck_thread_names_its_driver_function_and_memory_and_clears_once() {
        let mut book = StuckBook::default();
        let frames = frames();
        let found = Found {
            t_ns: 12_000_000_000,
            pid: 7,
            tid: 8,
            since_ns: 1_000_000_000,
            before_start: false,
            comm: "python3",
            frames: &frames,
        };
        let gpus = [NvmlGpu {
            utilization: None,
            index: 1,
            used: 10,
            total: 80,
            processes: vec![
                NvmlProcess {
                    pid: 7,
                    used: Some(5 << 30),
                },
                NvmlProcess { pid: 9, used: None },
            ],
        }];
        let r = book.stuck(&found, &Holders::default(), &mut gpus.iter());
        assert_eq!(r.in_function.as_deref(), Some("nvidia_close"));
        assert_eq!(r.waits_on, Phase::RmClient);
        assert_eq!(r.asleep_s, 11.0);
        assert_eq!(
            r.gpu_memory,
            vec![GpuUse {
                gpu: 1,
                bytes: Some(5 << 30)
            }]
        );
        assert_eq!(book.current().count(), 1);
        // A later sleep of the same thread is not the one reported.
        assert!(book.cleared(13_000_000_000, 8, 2).is_none());
        let c = book
            .cleared(13_000_000_000, 8, 1_000_000_000)
            .expect("cleared");
        assert!(c.cleared);
        assert_eq!(c.asleep_s, 12.0);
        assert!(book.cleared(14_000_000_000, 8, 1_000_000_000).is_none());
        assert_eq!(book.current().count(), 0);
    }
}
