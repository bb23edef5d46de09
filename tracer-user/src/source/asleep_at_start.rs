//! Threads already asleep uninterruptibly when tracing began. The programs record a sleep at
//! its switch-out, so a thread that went to sleep before they were attached (an agent
//! restarted on a wedged node) is in no map entry: one look through /proc at the start finds
//! the threads in state D with the NVIDIA driver on their stack, and the stuck watch follows
//! them as it follows the map's sleeps, dated from that look (they slept at least that long).

use std::{fs, path::Path};

use tracer_common::asleep::Asleep;

use super::asleep::{now_in, proc_stack};
use crate::analysis::teardown::is_driver_frame;

/// At most this many threads are looked at: a node's /proc may list hundreds of thousands,
/// and each look reads a small file (the stack only of those in state D).
pub const THREADS_LOOKED_AT: usize = 262_144;

/// What the look at the start found.
#[derive(Debug, Default)]
pub struct AtStart {
    /// Each thread asleep in the driver: (tid, its sleep as a map entry would hold it, dated
    /// at the look, its stack not kept).
    pub sleeps: Vec<(u32, Asleep)>,
    /// Threads not looked at (beyond [`THREADS_LOOKED_AT`]).
    pub not_looked_at: usize,
}

/// The threads asleep uninterruptibly now with the driver on their stack, looking at `limit`
/// threads at most, linger's own aside.
pub fn asleep_now(now_ns: u64, limit: usize) -> AtStart {
    let me = std::process::id();
    let mut found = AtStart::default();
    let mut looked = 0;
    for (tgid, tid) in threads().filter(|&(tgid, _)| tgid != me) {
        if looked == limit {
            found.not_looked_at += 1;
            continue;
        }
        looked += 1;
        let Some(now) = now_in(tgid, tid).filter(|n| n.state == 'D') else {
            continue;
        };
        let in_driver = proc_stack(tgid, tid).is_some_and(|f| f.iter().any(|f| is_driver_frame(f)));
        if in_driver {
            let sleep = Asleep {
                since_ns: now_ns,
                tgid,
                stack_id: -1,
                switches: now.switches,
            };
            found.sleeps.push((tid, sleep));
        }
    }
    found
}

/// Every (process, thread) in /proc.
fn threads() -> impl Iterator<Item = (u32, u32)> {
    let numbered = |dir: &Path| -> Vec<u32> {
        fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    };
    let proc = Path::new("/proc");
    numbered(proc).into_iter().flat_map(move |tgid| {
        numbered(&proc.join(tgid.to_string()).join("task"))
            .into_iter()
            .map(move |tid| (tgid, tid))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No driver here: nothing is asleep in it; the threads beyond the limit are counted.
    #[test]
    fn looks_at_threads_up_to_its_limit_and_counts_the_rest() {
        let all = asleep_now(7, usize::MAX);
        assert_eq!(all.not_looked_at, 0);
        assert!(all.sleeps.is_empty());
        let few = asleep_now(7, 1);
        assert!(few.not_looked_at > 0, "more than one thread in /proc");
        assert!(threads().any(|(tgid, _)| tgid == std::process::id()));
    }
}
