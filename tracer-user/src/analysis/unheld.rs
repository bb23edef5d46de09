//! GPUs busy with nobody, in two ways NVML shows, each reported once it has lasted
//! [`UNHELD_AFTER_NS`], and again when it ends:
//! - `busy_no_holder`: memory in use, NVML lists no process for it, and no process linger sees
//!   holds the GPU's device file. Where linger's /proc is not the host's (a pod without
//!   hostPID), processes in other PID namespaces are invisible from here: NVML leaves them out
//!   of its list too, so the record says so instead of "nobody"; where linger may have missed a
//!   holder (records lost, opens not traced, a process /proc did not show), it says "unknown".
//! - `utilized_without_work`: at least [`BUSY_PERCENT`] utilization with no memory in use and
//!   no process: work a killed context left running, as users report after kills mid-kernel
//!   (utilization stuck at 100 % until a fresh context opens and closes on that GPU).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{holders::Holders, incident::Head};
use crate::event::NvmlGpu;

/// How long a GPU must stay busy with nobody before it is reported: longer than any release
/// in flight (NVML's figure trails a teardown by well under a second) or any kernel's tail.
pub const UNHELD_AFTER_NS: u64 = 60_000_000_000;
/// Memory below this counts as idle (NVML's `used` of an idle H200 on driver 580 is 0; older
/// drivers count a reserve of a few hundred MiB as used).
pub const IDLE_BYTES: u64 = 1 << 30;
/// Utilization from which an idle GPU counts as running work nobody owns.
pub const BUSY_PERCENT: u32 = 90;
/// The NVIDIA driver's character major: `/dev/nvidiaN` is (195, N).
const NVIDIA_MAJOR: u32 = 195;
/// `/dev/nvidiactl`'s minor, which names no GPU.
const NVIDIACTL_MINOR: u32 = 255;

/// The two ways a GPU is busy with nobody.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Spell {
    /// Memory in use, nobody holding it.
    NoHolder,
    /// Utilization with no memory and no process.
    NoWork,
}

/// How far linger's view of GPU holders reaches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HolderView {
    /// Every process, and every GPU file opened since tracing began.
    #[default]
    Complete,
    /// This /proc is not the host's: processes in other PID namespaces are invisible.
    NotVisible,
    /// Holders may have gone unseen, for this reason.
    Incomplete(&'static str),
}

/// A GPU busy with nobody, or no longer (`cleared`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnheldRecord {
    #[serde(flatten)]
    pub head: Head,
    pub t_ns: u64,
    pub gpu: u32,
    /// NVML's `used` at `t_ns` (for a cleared record, the last busy reading's).
    pub used_bytes: u64,
    /// `utilized_without_work`: NVML's utilization at `t_ns` (the last busy reading's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utilization_pct: Option<u32>,
    /// The first reading that showed it.
    pub since_ns: u64,
    pub busy_s: f64,
    pub cleared: bool,
    /// "nobody": linger sees every process and none holds it; "not_visible": processes in
    /// other PID namespaces may (this /proc is not the host's); "unknown": linger may have
    /// missed a holder (`holder_view` says why).
    pub holder: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder_view: Option<&'static str>,
    pub hint: &'static str,
}

const HINT_NOBODY: &str = "no process holds this GPU's files and NVML lists none, yet its \
     memory is in use: a context the driver never freed; only a GPU reset (or a reboot) gets it \
     back";
const HINT_NOT_VISIBLE: &str = "NVML lists no process and none visible here holds the GPU's \
     files; processes in other PID namespaces are not visible from here: run `linger holders` \
     on the host (hostPID) before resetting";
const HINT_UNKNOWN: &str = "NVML lists no process and none linger knows of holds the GPU's \
     files, but linger may have missed a holder (see holder_view): run `linger holders` or \
     `fuser -v /dev/nvidia*` before resetting";
const HINT_NO_WORK: &str = "the GPU reports kernels running with no memory in use and no \
     process: work a killed context left running (seen after kills mid-kernel); opening and \
     closing a fresh CUDA context on this GPU (any small CUDA program) has cleared it in the \
     field; if utilization stays up, reset the GPU";

/// A busy spell: (first reading, the latest used bytes and utilization, reported).
struct Busy {
    since: u64,
    used: u64,
    utilization: Option<u32>,
    reported: bool,
}

/// Each GPU's busy spells with nobody.
#[derive(Default)]
pub struct UnheldWatch {
    spells: BTreeMap<(u32, Spell), Busy>,
    /// This /proc is not the host's.
    pub partial_view: bool,
}

impl UnheldWatch {
    /// A reading: the records it makes due. `minor` maps a GPU index to its `/dev/nvidiaN`;
    /// `missed` says why linger may have missed a holder, if it may have.
    pub fn reading(
        &mut self,
        t_ns: u64,
        gpus: &[NvmlGpu],
        minor: &dyn Fn(u32) -> Option<u32>,
        holders: &Holders,
        missed: Option<&'static str>,
    ) -> Vec<UnheldRecord> {
        let view = match (self.partial_view, missed) {
            (true, _) => HolderView::NotVisible,
            (false, Some(why)) => HolderView::Incomplete(why),
            (false, None) => HolderView::Complete,
        };
        let mut out = Vec::new();
        for g in gpus {
            let now = [
                (Spell::NoHolder, is_unheld(g, minor(g.index), holders)),
                (Spell::NoWork, is_running_unowned(g)),
            ];
            for (spell, on) in now {
                out.extend(self.spell(t_ns, g, spell, on, view));
            }
        }
        out
    }

    /// One spell's course at a reading: its record, if one is due.
    fn spell(
        &mut self,
        t_ns: u64,
        g: &NvmlGpu,
        spell: Spell,
        on: bool,
        view: HolderView,
    ) -> Option<UnheldRecord> {
        let key = (g.index, spell);
        if !on {
            let busy = self.spells.remove(&key)?;
            return busy
                .reported
                .then(|| record(t_ns, g.index, spell, &busy, true, view));
        }
        let busy = self.spells.entry(key).or_insert(Busy {
            since: t_ns,
            used: g.used,
            utilization: g.utilization,
            reported: false,
        });
        busy.used = g.used;
        busy.utilization = g.utilization;
        if busy.reported || t_ns.saturating_sub(busy.since) < UNHELD_AFTER_NS {
            return None;
        }
        busy.reported = true;
        Some(record(t_ns, g.index, spell, busy, false, view))
    }
}

fn record(
    t_ns: u64,
    gpu: u32,
    spell: Spell,
    busy: &Busy,
    cleared: bool,
    view: HolderView,
) -> UnheldRecord {
    let (holder, holder_view, hint) = match view {
        HolderView::NotVisible => ("not_visible", None, HINT_NOT_VISIBLE),
        HolderView::Incomplete(why) => ("unknown", Some(why), HINT_UNKNOWN),
        HolderView::Complete => ("nobody", None, HINT_NOBODY),
    };
    let (record_type, utilization_pct, hint) = match spell {
        Spell::NoHolder => ("busy_no_holder", None, hint),
        Spell::NoWork => ("utilized_without_work", busy.utilization, HINT_NO_WORK),
    };
    UnheldRecord {
        head: Head::new(record_type),
        t_ns,
        gpu,
        used_bytes: busy.used,
        utilization_pct,
        since_ns: busy.since,
        busy_s: t_ns.saturating_sub(busy.since) as f64 / 1e9,
        cleared,
        holder,
        holder_view,
        hint,
    }
}

/// No memory in use and no process listed: the readings a GPU's utilization is read at.
pub fn looks_idle(g: &NvmlGpu) -> bool {
    g.used < IDLE_BYTES && g.processes.is_empty()
}

/// Kernels running on an idle-looking GPU.
fn is_running_unowned(g: &NvmlGpu) -> bool {
    looks_idle(g) && g.utilization.is_some_and(|u| u >= BUSY_PERCENT)
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
            utilization: None,
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
            .reading(0, &[gpu(4 << 30, false)], &minor, &none, None)
            .is_empty());
        assert!(w
            .reading(59 * S, &[gpu(4 << 30, false)], &minor, &none, None)
            .is_empty());
        let r = w.reading(60 * S, &[gpu(5 << 30, false)], &minor, &none, None);
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].used_bytes, r[0].busy_s, r[0].holder),
            (5 << 30, 60.0, "nobody")
        );
        assert!(w
            .reading(61 * S, &[gpu(5 << 30, false)], &minor, &none, None)
            .is_empty());
        let c = w.reading(70 * S, &[gpu(0, false)], &minor, &none, None);
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
        w.reading(0, &[gpu(4 << 30, false)], &|_| None, &none, None);
        let r = w.reading(60 * S, &[gpu(4 << 30, false)], &|_| None, &none, None);
        assert_eq!(r[0].holder, "not_visible");
    }

    /// With a holder possibly missed, "nobody" would send the operator to a reset for memory a
    /// living process holds: the record says "unknown", why, and no reset.
    #[test]
    fn with_a_holder_possibly_missed_it_says_unknown_and_why() {
        let mut w = UnheldWatch::default();
        let none = Holders::default();
        let why = Some("records lost");
        w.reading(0, &[gpu(4 << 30, false)], &|_| Some(0), &none, why);
        let r = w.reading(60 * S, &[gpu(4 << 30, false)], &|_| Some(0), &none, why);
        assert_eq!(
            (r[0].holder, r[0].holder_view, r[0].hint),
            ("unknown", why, HINT_UNKNOWN)
        );
        assert!(!r[0].hint.contains("only a GPU reset"));
    }

    /// Utilization with no memory and no process for a minute is a record of its own kind;
    /// a GPU below the threshold, with memory, or with a process listed is not.
    #[test]
    fn a_gpu_utilized_with_nothing_on_it_for_a_minute_is_reported_and_cleared() {
        let idle = |utilization: Option<u32>, used: u64, listed: bool| NvmlGpu {
            utilization,
            ..gpu(used, listed)
        };
        let none = Holders::default();
        let run = |readings: &[NvmlGpu]| {
            let mut w = UnheldWatch::default();
            readings
                .iter()
                .enumerate()
                .flat_map(|(s, g)| {
                    w.reading(
                        s as u64 * 30 * S,
                        std::slice::from_ref(g),
                        &|_| Some(0),
                        &none,
                        None,
                    )
                })
                .collect::<Vec<_>>()
        };
        let r = run(&[
            idle(Some(100), 0, false),
            idle(Some(97), 0, false),
            idle(Some(99), 0, false),
            idle(Some(0), 0, false),
        ]);
        let kinds: Vec<_> = r
            .iter()
            .map(|r| (r.head.record_type, r.cleared, r.utilization_pct, r.busy_s))
            .collect();
        assert_eq!(
            kinds,
            [
                ("utilized_without_work", false, Some(99), 60.0),
                ("utilized_without_work", true, Some(99), 90.0)
            ]
        );
        assert_eq!(r[0].hint, HINT_NO_WORK);
        for quiet in [
            idle(Some(BUSY_PERCENT - 1), 0, false),
            idle(None, 0, false),
            idle(Some(100), 0, true),
        ] {
            assert!(run(&[quiet.clone(), quiet.clone(), quiet]).is_empty());
        }
        // With memory in use it is the other kind only.
        let busy = idle(Some(100), 4 << 30, false);
        let r = run(&[busy.clone(), busy.clone(), busy]);
        assert!(r.iter().all(|r| r.head.record_type == "busy_no_holder") && r.len() == 1);
    }
}
