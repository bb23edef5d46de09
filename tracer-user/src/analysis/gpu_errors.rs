//! GPU errors (Xids) tied to what they name: the process in the driver's message, its GPU,
//! and that process's incident. An Xid no incident takes within [`LINK_WAIT_NS`] is reported
//! on its own (the process survived it, or none was named).

use std::collections::VecDeque;

use serde::Serialize;

pub use super::incident::GpuError;
use super::{
    incident::{ExitStatus, Incident},
    xid_catalog,
};
use crate::event::{GpuInfo, XidSource};

/// How long an Xid waits for an incident of the process it names (or, naming none, of a
/// process on its GPU) before it is reported on its own.
pub const LINK_WAIT_NS: u64 = 5_000_000_000;
/// How far back an incident looks for Xids of its process or GPU.
pub const LOOK_BACK_NS: u64 = 600_000_000_000;
/// The driver's tracepoint and its log line of one Xid are this close (the line is printed
/// just after the tracepoint fires; the log reader may see it first).
const TWIN_NS: u64 = 2_000_000_000;
/// Xids kept for incidents to cite; a GPU spraying errors keeps only its latest.
const KEEP: usize = 1024;

/// A `gpu_error` record: an Xid no incident took.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuErrorRecord {
    #[serde(flatten)]
    pub head: super::incident::Head,
    #[serde(flatten)]
    pub error: GpuError,
}

/// Where an Xid stands.
struct Entry {
    error: GpuError,
    /// An incident took it; otherwise it is reported on its own once its wait is over.
    linked: bool,
}

/// The Xids seen, newest last.
#[derive(Default)]
pub struct XidBook {
    gpus: Vec<GpuInfo>,
    recent: VecDeque<Entry>,
    /// Entries not linked yet: while none are, nothing needs linking.
    waiting: usize,
}

impl XidBook {
    pub fn set_gpus(&mut self, gpus: &[GpuInfo]) {
        self.gpus = gpus.to_vec();
    }

    /// The GPUs NVML named at the start.
    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    /// A new Xid; its GPU resolved through NVML's bus ids. The driver's tracepoint and its
    /// log line report the same error, and only the line names the process ("pid=468,
    /// name=python3, " before the same text): the second of the two fills in the first.
    pub fn add(
        &mut self,
        t_ns: u64,
        xid: u32,
        pci: &str,
        message: &str,
        truncated: bool,
        source: XidSource,
    ) {
        let gpu = device(&self.gpus, pci);
        let (pid, process_name) = named(message);
        let error = GpuError {
            xid,
            meaning: meaning(xid),
            action: xid_catalog::action(xid, message),
            recommended: xid_catalog::recommended(xid, message),
            t_ns,
            at_ms: None,
            pci: pci.to_string(),
            gpu: gpu.map(|g| g.index),
            uuid: gpu.map(|g| g.uuid.clone()),
            pid,
            process_name,
            message: message.to_string(),
            truncated,
            source,
        };
        if let Some(twin) = self
            .recent
            .iter_mut()
            .rev()
            .find(|e| e.error.source != source && same_report(&e.error, &error))
        {
            let (log, traced) = match source {
                XidSource::Kmsg => (error, &mut twin.error),
                XidSource::Tracepoint => {
                    (std::mem::replace(&mut twin.error, error), &mut twin.error)
                }
            };
            traced.pid = log.pid;
            traced.process_name = log.process_name;
            // The line's whole text may name what the tracepoint's cut off (Xid 154's action).
            traced.action = xid_catalog::action(xid, &log.message);
            traced.recommended = xid_catalog::recommended(xid, &log.message);
            traced.message = log.message;
            traced.truncated = false;
            return;
        }
        if self.recent.len() >= KEEP {
            if let Some(old) = self.recent.pop_front() {
                self.waiting -= usize::from(!old.linked);
            }
        }
        self.recent.push_back(Entry {
            error,
            linked: false,
        });
        self.waiting += 1;
    }

    /// Whether some Xid still waits for an incident.
    pub fn waiting(&self) -> bool {
        self.waiting > 0
    }

    /// Marks as linked the Xids an incident of `pid` on `gpu` (when known), counting from
    /// `t_ns`, cites: those naming `pid`, and those naming no process on its GPU.
    pub fn link(&mut self, pid: u32, gpu: Option<u32>, t_ns: u64) {
        for e in &mut self.recent {
            if !e.linked && cites(&e.error, pid, gpu, t_ns, false) {
                e.linked = true;
                self.waiting -= 1;
            }
        }
    }

    /// The Xids an incident of `pid` on `gpu` counting from `t_ns` cites, `at_ms` filled; with
    /// `whole_gpu` also those naming other processes on its GPU (a stuck teardown).
    pub fn cited(&self, pid: u32, gpu: Option<u32>, t_ns: u64, whole_gpu: bool) -> Vec<GpuError> {
        self.recent
            .iter()
            .filter(|e| cites(&e.error, pid, gpu, t_ns, whole_gpu))
            .map(|e| {
                let mut error = e.error.clone();
                error.at_ms = Some((e.error.t_ns as f64 - t_ns as f64) / 1e6);
                error
            })
            .collect()
    }

    /// Xids whose wait ended at `now` without an incident (all of them with `all`), for their
    /// own records; and forgets those too old for any incident to cite.
    pub fn unlinked(&mut self, now: u64, all: bool) -> Vec<GpuError> {
        let mut out = Vec::new();
        if self.recent.is_empty() {
            return out;
        }
        for e in &mut self.recent {
            if !e.linked && (all || now.saturating_sub(e.error.t_ns) >= LINK_WAIT_NS) {
                e.linked = true;
                self.waiting -= 1;
                out.push(e.error.clone());
            }
        }
        while self
            .recent
            .front()
            .is_some_and(|e| e.linked && now.saturating_sub(e.error.t_ns) > LOOK_BACK_NS)
        {
            self.recent.pop_front();
        }
        out
    }
}

/// The incident's GPU errors and what followed, in one line: "Xid 31 (MMU fault) on GPU0 at
/// -41.2 ms, then the process exited with status 1 at +0.0 ms, memory back at +153.0 ms".
pub fn story(inc: &Incident) -> String {
    let ms = |t: u64| (t as f64 - inc.t_signal_ns as f64) / 1e6;
    let errors: Vec<String> = inc
        .gpu_errors
        .iter()
        .map(|e| {
            let whose = match (e.pid, e.pid == Some(inc.target.pid)) {
                (Some(p), false) => format!(" naming pid {p}"),
                _ => String::new(),
            };
            format!(
                "{}{whose} at {:+.1} ms",
                e.describe(),
                e.at_ms.unwrap_or(0.0)
            )
        })
        .collect();
    let mut then = Vec::new();
    if let Some(dead) = inc.t_group_dead_ns {
        let how = match &inc.exit {
            Some(ExitStatus {
                signal: Some(sig), ..
            }) => format!("the process died of {}", super::signals::name(*sig)),
            Some(ExitStatus {
                status: Some(st), ..
            }) => format!("the process exited with status {st}"),
            _ => "the process died".to_string(),
        };
        then.push(format!("{how} at {:+.1} ms", ms(dead)));
    }
    if let Some(back) = inc.gpu.as_ref().and_then(|g| g.t_memory_back_ns) {
        then.push(format!("memory back at {:+.1} ms", ms(back)));
    }
    let mut line = errors.join("; ");
    if !then.is_empty() {
        line.push_str(", then ");
        line.push_str(&then.join(", "));
    }
    line
}

/// Whether a tracepoint record and a log line are the same report: same number and device,
/// close in time, and the line's text ends with the record's (less what the record cut).
fn same_report(a: &GpuError, b: &GpuError) -> bool {
    let (traced, logged) = match a.source {
        XidSource::Tracepoint => (a, b),
        XidSource::Kmsg => (b, a),
    };
    let text = traced.message.trim_end();
    let tail = if traced.truncated {
        // The record kept the start of the text: look for it in the line.
        logged.message.contains(text)
    } else {
        logged.message.ends_with(text)
    };
    a.xid == b.xid
        && a.t_ns.abs_diff(b.t_ns) <= TWIN_NS
        && same_device(&a.pci, &b.pci)
        && !text.is_empty()
        && tail
}

/// Whether an incident of `pid` on `gpu` counting from `t_ns` cites this Xid.
fn cites(e: &GpuError, pid: u32, gpu: Option<u32>, t_ns: u64, whole_gpu: bool) -> bool {
    if e.t_ns.saturating_add(LOOK_BACK_NS) < t_ns {
        return false;
    }
    let same_gpu = gpu.is_some() && e.gpu == gpu;
    match e.pid {
        Some(p) => p == pid || (whole_gpu && same_gpu),
        // Unnamed: only shortly before the incident or during it, on its GPU.
        None => same_gpu && e.t_ns.saturating_add(LINK_WAIT_NS) >= t_ns,
    }
}

/// The process an Xid message names: "pid=1234, name=python3, ...".
fn named(message: &str) -> (Option<u32>, Option<String>) {
    let field = |key: &str| {
        message.split(", ").find_map(|part| {
            let part = part.trim();
            part.strip_prefix(key).map(|v| v.trim().to_string())
        })
    };
    let pid = field("pid=").and_then(|v| v.parse().ok());
    let name = field("name=").filter(|n| !n.is_empty() && n != "<unknown>");
    (pid, name)
}

/// The GPU of NVML's list at the driver's PCI name.
pub fn device<'a>(gpus: impl IntoIterator<Item = &'a GpuInfo>, pci: &str) -> Option<&'a GpuInfo> {
    gpus.into_iter().find(|g| same_device(&g.pci_bus_id, pci))
}

/// Whether NVML's bus id ("00000000:3B:00.0") and the driver's PCI name ("0000:3b:00.0", or
/// "0000:3b:00" in its log lines) are the same device.
fn same_device(nvml: &str, pci: &str) -> bool {
    fn parts(s: &str) -> Option<(u32, u32, u32)> {
        let mut it = s.split([':', '.']);
        let domain = u32::from_str_radix(it.next()?, 16).ok()?;
        let bus = u32::from_str_radix(it.next()?, 16).ok()?;
        let device = u32::from_str_radix(it.next()?, 16).ok()?;
        Some((domain, bus, device))
    }
    parts(nvml).is_some_and(|a| parts(pci) == Some(a))
}

/// The Xids operators meet most, in NVIDIA's words (shortened).
pub fn meaning(xid: u32) -> &'static str {
    match xid {
        8 => "GPU stopped responding",
        13 => "graphics engine exception",
        31 => "MMU fault",
        32 => "invalid or corrupted push buffer stream",
        38 => "driver firmware error",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup after previous errors",
        48 => "double-bit ECC error",
        61 | 62 => "internal micro-controller error",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping failed",
        68 => "video processor exception",
        69 => "graphics engine class error",
        74 => "NVLink error",
        79 => "GPU fell off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        109 => "context switch timeout",
        119 | 120 => "GSP error",
        121 => "C2C link error",
        140 => "unrecovered ECC error",
        154 => "GPU recovery action changed",
        _ => xid_catalog::entry(xid)
            .map(|e| e.description)
            .filter(|d| !d.is_empty() && *d != "Unused")
            .unwrap_or("see NVIDIA's Xid catalog"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_process_of_an_mmu_fault() {
        let m = "pid=4242, name=python3, channel 0x00000002, intr 00000000. MMU Fault: ENGINE \
                 GRAPHICS GPC0 GPCCLIENT_T1_0 faulted @ 0x0_00000000";
        assert_eq!(named(m), (Some(4242), Some("python3".into())));
        assert_eq!(
            named("Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)"),
            (None, None)
        );
        assert_eq!(named("pid=7, name=<unknown>, Ch 00000008"), (Some(7), None));
    }

    #[test]
    fn matches_bus_ids_across_spellings() {
        assert!(same_device("00000000:3B:00.0", "0000:3b:00.0"));
        assert!(same_device("00000000:3B:00.0", "0000:3b:00"));
        assert!(!same_device("00000000:3B:00.0", "0000:3c:00.0"));
        assert!(!same_device("", "0000:3b:00.0"));
    }

    fn book() -> XidBook {
        let mut b = XidBook::default();
        b.set_gpus(&[GpuInfo {
            index: 0,
            uuid: "GPU-1".into(),
            model: "H200".into(),
            pci_bus_id: "00000000:3B:00.0".into(),
            minor: Some(0),
        }]);
        b
    }

    #[test]
    fn an_xid_naming_a_process_goes_to_its_incident_not_to_its_own_record() {
        let mut b = book();
        b.add(
            1_000,
            31,
            "0000:3b:00.0",
            "pid=9, name=p, channel 2",
            false,
            XidSource::Tracepoint,
        );
        b.link(9, None, 2_000);
        assert!(b.unlinked(10_000_000_000, false).is_empty());
        let cited = b.cited(9, Some(0), 2_000, false);
        assert_eq!(cited.len(), 1);
        assert_eq!(cited[0].gpu, Some(0));
        assert_eq!(cited[0].at_ms, Some(-0.001));
        assert!(b.cited(10, Some(0), 2_000, false).is_empty());
        assert_eq!(b.cited(10, Some(0), 2_000, true).len(), 1);
    }

    #[test]
    fn the_log_line_names_the_process_of_the_tracepoint_record() {
        // As on the H200: the tracepoint's text lacks the "pid=, name=" the log line has.
        let text = "channel 0x0000000a, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC1";
        let line = format!("pid=468, name=python3, {text}");
        for (first, second) in [
            (XidSource::Tracepoint, XidSource::Kmsg),
            (XidSource::Kmsg, XidSource::Tracepoint),
        ] {
            let mut b = book();
            let msg = |s| {
                if s == XidSource::Kmsg {
                    line.as_str()
                } else {
                    text
                }
            };
            b.add(1_000_000, 31, "0000:3b:00.0", msg(first), false, first);
            b.add(2_000_000, 31, "0000:3b:00", msg(second), false, second);
            let cited = b.cited(468, Some(0), 3_000_000, false);
            assert_eq!(cited.len(), 1, "one report, not two ({first:?} first)");
            let x = &cited[0];
            assert_eq!(
                (x.pid, x.process_name.as_deref()),
                (Some(468), Some("python3"))
            );
            assert_eq!(x.source, XidSource::Tracepoint);
            // The tracepoint's time: the moment the driver reported it.
            let traced_at = if first == XidSource::Tracepoint {
                1_000_000
            } else {
                2_000_000
            };
            assert_eq!(x.t_ns, traced_at);
        }
        // Another error of the same number and device is its own report.
        let mut b = book();
        b.add(
            1_000,
            31,
            "0000:3b:00.0",
            text,
            false,
            XidSource::Tracepoint,
        );
        b.add(
            2_000,
            31,
            "0000:3b:00",
            "pid=5, name=x, channel 0x0000000b, intr 0",
            false,
            XidSource::Kmsg,
        );
        assert_eq!(b.unlinked(u64::MAX / 2, true).len(), 2);
    }

    #[test]
    fn an_xid_nobody_dies_of_is_reported_once_its_wait_is_over() {
        let mut b = book();
        b.add(
            1_000,
            13,
            "0000:3b:00.0",
            "pid=9, name=p",
            false,
            XidSource::Kmsg,
        );
        assert!(b.unlinked(1_000 + LINK_WAIT_NS - 1, false).is_empty());
        let own = b.unlinked(1_000 + LINK_WAIT_NS, false);
        assert_eq!(own.len(), 1);
        assert!(b.unlinked(1_000 + 2 * LINK_WAIT_NS, true).is_empty());
        // Still there for a later incident of the process to cite, until too old.
        assert_eq!(b.cited(9, None, 2_000, false).len(), 1);
        b.unlinked(1_000 + LOOK_BACK_NS + 1, false);
        assert!(b.cited(9, None, 2_000, false).is_empty());
    }
}
