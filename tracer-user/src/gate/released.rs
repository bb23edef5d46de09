//! When NVML stops listing a dead process, its memory is not back yet: the driver may still
//! be freeing it. It is back once the device's used memory came down by the process's share
//! (as `linger live` calls it back: to within the larger of 32 MiB and 1 % of the share),
//! corrected by what the other processes' NVML figures did meanwhile, so that another job
//! allocating at the same moment does not hide the release.

use std::collections::HashMap;

use crate::event::NvmlGpu;

const TOLERANCE_MIN: u64 = 32 << 20;

/// A dead process NVML no longer lists whose memory has not come down yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unlisted {
    pub pid: u32,
    pub gpu: u32,
    pub share: u64,
    /// The device's used memory, and the other processes' figures, in the last reading that
    /// listed it.
    used_then: u64,
    others_then: u64,
}

#[derive(Debug, Default)]
pub struct Releases {
    /// The last reading of each GPU.
    previous: HashMap<u32, NvmlGpu>,
    pub pending: Vec<Unlisted>,
}

impl Releases {
    /// Takes a reading (GPUs NVML failed to read are left as they were); `dead` tells which
    /// pids are dead.
    pub fn take(&mut self, gpus: &[NvmlGpu], dead: impl Fn(u32) -> bool) {
        for g in gpus {
            if let Some(before) = self.previous.get(&g.index) {
                for p in &before.processes {
                    let still = g.processes.iter().any(|q| q.pid == p.pid);
                    // Without a figure NVML says nothing to wait for.
                    if let (false, Some(share)) = (still, p.used) {
                        if dead(p.pid) {
                            self.pending.push(Unlisted {
                                pid: p.pid,
                                gpu: g.index,
                                share,
                                used_then: before.used,
                                others_then: figures(before, Some(p.pid)),
                            });
                        }
                    }
                }
            }
            self.pending.retain(|u| u.gpu != g.index || !back(u, g));
            self.previous.insert(g.index, g.clone());
        }
    }
}

/// The sum of the figures of the processes `gpu` lists, but `except`.
fn figures(gpu: &NvmlGpu, except: Option<u32>) -> u64 {
    gpu.processes
        .iter()
        .filter(|p| Some(p.pid) != except)
        .filter_map(|p| p.used)
        .sum()
}

/// Whether `u`'s memory is back in the reading `now`.
fn back(u: &Unlisted, now: &NvmlGpu) -> bool {
    let others = figures(now, None) as i128 - u.others_then as i128;
    let corrected = now.used as i128 - others;
    let tolerance = TOLERANCE_MIN.max(u.share / 100) as i128;
    corrected <= u.used_then as i128 - u.share as i128 + tolerance
}

#[cfg(test)]
mod tests {
    use crate::event::NvmlProcess;

    use super::*;

    const GIB: u64 = 1 << 30;

    fn gpu(used: u64, procs: &[(u32, u64)]) -> NvmlGpu {
        NvmlGpu {
            utilization: None,
            index: 0,
            used,
            total: 141 * GIB,
            processes: procs
                .iter()
                .map(|&(pid, b)| NvmlProcess { pid, used: Some(b) })
                .collect(),
        }
    }

    #[test]
    fn unlisted_is_not_back_until_used_comes_down() {
        let mut r = Releases::default();
        r.take(&[gpu(33 * GIB, &[(7, 32 * GIB)])], |_| true);
        assert!(r.pending.is_empty());
        // Gone from the list, the driver still freeing.
        r.take(&[gpu(33 * GIB, &[])], |_| true);
        assert_eq!(r.pending.len(), 1);
        r.take(&[gpu(20 * GIB, &[])], |_| true);
        assert_eq!(r.pending.len(), 1);
        r.take(&[gpu(GIB + (8 << 20), &[])], |_| true);
        assert!(r.pending.is_empty(), "back to within the tolerance");
    }

    #[test]
    fn another_job_allocating_meanwhile_does_not_hide_the_release() {
        let mut r = Releases::default();
        r.take(&[gpu(33 * GIB, &[(7, 32 * GIB)])], |_| true);
        // 7 freed, while 9 took 10 GiB: used went down by 22 GiB only.
        r.take(&[gpu(11 * GIB, &[(9, 10 * GIB)])], |_| true);
        assert!(r.pending.is_empty());
    }

    #[test]
    fn a_live_process_that_leaves_the_list_and_a_failed_reading_are_not_waited_for() {
        let mut r = Releases::default();
        r.take(&[gpu(5 * GIB, &[(7, 4 * GIB)])], |_| false);
        r.take(&[gpu(5 * GIB, &[])], |_| false);
        assert!(r.pending.is_empty(), "alive: not a death's memory");
        let mut r = Releases::default();
        r.take(&[gpu(5 * GIB, &[(7, 4 * GIB)])], |_| true);
        r.take(&[], |_| true);
        r.take(&[gpu(5 * GIB, &[])], |_| true);
        assert_eq!(
            r.pending.len(),
            1,
            "the reading that failed changed nothing"
        );
    }
}
