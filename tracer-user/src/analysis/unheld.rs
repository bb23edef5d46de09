//! GPUs busy with no holder: NVML says memory is in use, lists no process for it, and no
//! process linger sees holds the GPU's device file. Lasting [`UNHELD_AFTER_NS`] it becomes a
//! `busy_no_holder` record, and again when it ends. Where linger's /proc is not the host's (a
//! pod without hostPID), processes in other PID namespaces are invisible from here: NVML
//! leaves them out of its list too, so the record says so instead of "nobody".

use std::collections::BTreeMap;

use serde::Serialize;

use super::{holders::Holders, incident::Head};
use crate::event::NvmlGpu;

/// How long a GPU must stay busy with no holder before it is reported: longer than any
/// release in flight (NVML's figure trails a teardown by well under a second).
pub const UNHELD_AFTER_NS: u64 = 60_000_000_000;
/// Memory below this counts as idle (NVML's `used` of an idle H200 on driver 580 is 0; older
/// drivers count a reserve of a few hundred MiB as used).
pub const IDLE_BYTES: u64 = 1 << 30;
/// The NVIDIA driver's character major: `/dev/nvidiaN` is (195, N).
const NVIDIA_MAJOR: u32 = 195;
/// `/dev/nvidiactl`'s minor, which names no GPU.
const NVIDIACTL_MINOR: u32 = 255;

/// A GPU busy with no holder, or no longer (`cleared`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnheldRecord {
    #[serde(flatten)]
    pub head: Head,
    pub t_ns: u64,
    pub gpu: u32,
    /// NVML's `used` at `t_ns` (for a cleared record, the last busy reading's).
    pub used_bytes: u64,
    /// The first reading that showed it.
    pub since_ns: u64,
    pub busy_s: f64,
    pub cleared: bool,
    /// "nobody": linger sees every process and none holds it; "not_visible": processes in
    /// other PID namespaces may (this /proc is not the host's).
    pub holder: &'static str,
    pub hint: &'static str,
}

const HINT_NOBODY: &str = "no process holds this GPU's files and NVML lists none, yet its \
     memory is in use: a context the driver never freed; only a GPU reset (or a reboot) gets it \
     back";
const HINT_NOT_VISIBLE: &str = "NVML lists no process and none visible here holds the GPU's \
     files; processes in other PID namespaces are not visible from here: run `linger holders` \
     on the host (hostPID) before resetting";

/// Each GPU's busy spell with no holder: (first reading, its latest used bytes, reported).
#[derive(Default)]
pub struct UnheldWatch {
    spells: BTreeMap<u32, (u64, u64, bool)>,
    /// This /proc is not the host's.
    pub partial_view: bool,
}

impl UnheldWatch {
    /// A reading: the records it makes due. `minor` maps a GPU index to its `/dev/nvidiaN`.
    pub fn reading(
        &mut self,
        t_ns: u64,
        gpus: &[NvmlGpu],
        minor: &dyn Fn(u32) -> Option<u32>,
        holders: &Holders,
    ) -> Vec<UnheldRecord> {
        let mut out = Vec::new();
        for g in gpus {
            let unheld = is_unheld(g, minor(g.index), holders);
            match (unheld, self.spells.get_mut(&g.index)) {
                (true, None) => {
                    self.spells.insert(g.index, (t_ns, g.used, false));
                }
                (true, Some((since, used, reported))) => {
                    *used = g.used;
                    if !*reported && t_ns.saturating_sub(*since) >= UNHELD_AFTER_NS {
                        *reported = true;
                        let since = *since;
                        out.push(self.record(t_ns, g.index, since, g.used, false));
                    }
                }
                (false, Some(&mut (since, used, reported))) => {
                    self.spells.remove(&g.index);
                    if reported {
                        out.push(self.record(t_ns, g.index, since, used, true));
                    }
                }
                (false, None) => {}
            }
        }
        out
    }

    fn record(&self, t_ns: u64, gpu: u32, since: u64, used: u64, cleared: bool) -> UnheldRecord {
        UnheldRecord {
            head: Head::new("busy_no_holder"),
            t_ns,
            gpu,
            used_bytes: used,
            since_ns: since,
            busy_s: t_ns.saturating_sub(since) as f64 / 1e9,
            cleared,
            holder: if self.partial_view {
                "not_visible"
            } else {
                "nobody"
            },
            hint: if self.partial_view {
                HINT_NOT_VISIBLE
            } else {
                HINT_NOBODY
            },
        }
    }
}

/// Memory in use on `g`, no process listed for it, and nobody here holding its device file
/// (with its minor unknown, any GPU's device file counts).
pub fn is_unheld(g: &NvmlGpu, minor: Option<u32>, holders: &Holders) -> bool {
    if g.used < IDLE_BYTES || !g.processes.is_empty() {
        return false;
    }
    let names_gpu = |dev: u32| {
        dev >> 20 == NVIDIA_MAJOR
            && match minor {
                Some(m) => dev & 0xfffff == m,
                None => dev & 0xfffff != NVIDIACTL_MINOR,
            }
    };
    !holders
        .all()
        .any(|(_, p)| p.fds.values().any(|fd| names_gpu(fd.dev)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, EventData, NvmlProcess};

    const S: u64 = 1_000_000_000;

    fn gpu(used: u64, listed: bool) -> NvmlGpu {
        NvmlGpu {
            index: 0,
            used,
            total: 80 << 30,
            processes: if listed {
                vec![NvmlProcess {
                    pid: 9,
                    used: Some(used),
                }]
            } else {
                Vec::new()
            },
        }
    }

    fn holding(minor: u32) -> Holders {
        let mut h = Holders::default();
        h.on_event(&Event::collector(
            0,
            EventData::SnapshotFd {
                holder: 7,
                fd: 3,
                dev: NVIDIA_MAJOR << 20 | minor,
                cloexec: false,
                group: 1,
            },
        ));
        h
    }

    #[test]
    fn a_gpu_busy_with_nobody_listed_or_holding_is_reported_after_a_minute_and_cleared() {
        let mut w = UnheldWatch::default();
        let none = Holders::default();
        let minor = |_| Some(0);
        assert!(w
            .reading(0, &[gpu(4 << 30, false)], &minor, &none)
            .is_empty());
        assert!(w
            .reading(59 * S, &[gpu(4 << 30, false)], &minor, &none)
            .is_empty());
        let r = w.reading(60 * S, &[gpu(5 << 30, false)], &minor, &none);
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].used_bytes, r[0].busy_s, r[0].holder),
            (5 << 30, 60.0, "nobody")
        );
        assert!(w
            .reading(61 * S, &[gpu(5 << 30, false)], &minor, &none)
            .is_empty());
        let c = w.reading(70 * S, &[gpu(0, false)], &minor, &none);
        assert!(c.len() == 1 && c[0].cleared && c[0].busy_s == 70.0);
    }

    #[test]
    fn a_listed_process_a_holder_of_its_file_or_idle_memory_is_not_unheld() {
        let none = Holders::default();
        assert!(!is_unheld(&gpu(4 << 30, true), Some(0), &none));
        assert!(!is_unheld(&gpu(IDLE_BYTES - 1, false), Some(0), &none));
        assert!(!is_unheld(&gpu(4 << 30, false), Some(0), &holding(0)));
        // Holding another GPU's file, or only nvidiactl, is not holding this one.
        assert!(is_unheld(&gpu(4 << 30, false), Some(0), &holding(1)));
        assert!(is_unheld(
            &gpu(4 << 30, false),
            None,
            &holding(NVIDIACTL_MINOR)
        ));
        assert!(!is_unheld(&gpu(4 << 30, false), None, &holding(1)));
    }

    #[test]
    fn without_the_hosts_processes_it_says_they_may_be_invisible() {
        let mut w = UnheldWatch {
            partial_view: true,
            ..Default::default()
        };
        let none = Holders::default();
        w.reading(0, &[gpu(4 << 30, false)], &|_| None, &none);
        let r = w.reading(60 * S, &[gpu(4 << 30, false)], &|_| None, &none);
        assert_eq!(r[0].holder, "not_visible");
    }
}
