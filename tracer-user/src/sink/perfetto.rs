//! Chrome trace event JSON, which the Perfetto UI and chrome://tracing open: a track per
//! process and thread, incidents and their phases as slices, signals and other events as
//! instants. Written as it goes, so memory stays bounded by the number of tasks. Names that
//! label tracks and slices are shown escaped (see [`escape`]); arguments keep the exact
//! strings, in JSON's own escapes.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write,
};

use serde::Serialize;
use serde_json::{json, Value};

use super::{
    json,
    phases::{self, end_ns, phases},
};
use crate::{
    analysis::{gpu_errors, signals, Incident},
    escape,
    event::{Event, EventData, GpuInfo, LossKind, NvmlGpu, XidSource},
    trace::snapshot::Process,
};

pub struct ChromeTrace<W: Write> {
    out: W,
    first: bool,
    processes: BTreeMap<u32, String>,
    threads: BTreeMap<(u32, u32), String>,
    /// (GPU, pid) pairs NVML listed in its last sample: a pair that leaves the list has
    /// freed its memory, drawn as a drop to zero.
    nvml_holders: BTreeSet<(u32, u32)>,
    /// NVML's GPUs, to place GPU errors by the device they name.
    gpus: Vec<GpuInfo>,
    /// GPU errors come from the driver's tracepoint: their log lines repeat them.
    xid_tracepoint: bool,
}

/// Pid of the track holding whole-GPU counters.
const GPUS_PID: u32 = 0;

/// One trace event; `ts` and `dur` in microseconds.
#[derive(Serialize)]
struct TraceEvent<'a> {
    name: &'a str,
    cat: &'a str,
    ph: &'a str,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: u32,
    tid: u32,
    /// Instant scope: `t` thread, `p` process, `g` global.
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'a str>,
    #[serde(skip_serializing_if = "Value::is_null")]
    args: Value,
}

/// An ioctl's escape name for the timeline.
fn ioctl_name(cmd: u32) -> String {
    use tracer_common::driver as d;
    let name = match if cmd <= 0xff { cmd } else { d::ioc_nr(cmd) } {
        _ if cmd > 0xff && d::ioc_type(cmd) != d::NV_IOCTL_MAGIC => return format!("UVM {cmd:#x}"),
        d::RM_ALLOC => "RM_ALLOC",
        d::RM_FREE => "RM_FREE",
        d::RM_CONTROL => "RM_CONTROL",
        d::RM_ALLOC_MEMORY => "RM_ALLOC_MEMORY",
        d::RM_MAP_MEMORY => "RM_MAP_MEMORY",
        d::RM_UNMAP_MEMORY => "RM_UNMAP_MEMORY",
        d::RM_DUP_OBJECT => "RM_DUP_OBJECT",
        d::RM_SHARE => "RM_SHARE",
        d::RM_VID_HEAP_CONTROL => "RM_VID_HEAP_CONTROL",
        d::CARD_INFO => "CARD_INFO",
        d::REGISTER_FD => "REGISTER_FD",
        d::ALLOC_OS_EVENT => "ALLOC_OS_EVENT",
        d::FREE_OS_EVENT => "FREE_OS_EVENT",
        d::CHECK_VERSION_STR => "CHECK_VERSION_STR",
        d::ATTACH_GPUS_TO_FD => "ATTACH_GPUS_TO_FD",
        d::EXPORT_TO_DMABUF_FD => "EXPORT_TO_DMABUF_FD",
        d::WAIT_OPEN_COMPLETE => "WAIT_OPEN_COMPLETE",
        nr if cmd > 0xff => return format!("NV escape {nr:#x}"),
        _ => return format!("UVM {cmd:#x}"),
    };
    name.to_string()
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

impl<W: Write> ChromeTrace<W> {
    pub fn new(mut out: W) -> std::io::Result<Self> {
        out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
        Ok(Self {
            out,
            first: true,
            processes: BTreeMap::new(),
            threads: BTreeMap::new(),
            nvml_holders: BTreeSet::new(),
            gpus: Vec::new(),
            xid_tracepoint: false,
        })
    }

    /// Names processes that existed before the trace began.
    pub fn name_processes(&mut self, processes: &[Process]) {
        for p in processes {
            self.processes
                .entry(p.pid)
                .or_insert_with(|| escape::terminal(&p.comm).into_owned());
        }
    }

    pub fn on_event(&mut self, e: &Event) -> std::io::Result<()> {
        let (pid, tid) = (e.pid, e.tid);
        match &e.data {
            EventData::SignalGenerate {
                sig,
                code,
                result,
                target_pid,
                target_tid,
                sender_comm,
                target_comm,
                ..
            } => {
                self.name(pid, None, sender_comm);
                self.name(*target_pid, None, target_comm);
                let args = json!({"sender_pid": pid, "sender_tid": tid, "sender_comm": sender_comm,
                                  "si_code": code, "result": result});
                self.instant(
                    &signals::name(*sig),
                    *target_pid,
                    *target_tid,
                    e.ts_ns,
                    args,
                )
            }
            EventData::SignalDeliver { sig, handler, .. } => {
                let name = format!("deliver {}", signals::name(*sig));
                self.instant(&name, pid, tid, e.ts_ns, json!({"handler": handler}))
            }
            EventData::Fork {
                child_pid, comm, ..
            } => {
                self.name(*child_pid, None, comm);
                self.instant("fork", pid, tid, e.ts_ns, json!({"child_pid": child_pid}))
            }
            EventData::Exec { comm, .. } => {
                self.processes
                    .insert(pid, escape::terminal(comm).into_owned());
                self.instant("exec", pid, tid, e.ts_ns, json!({"comm": comm}))
            }
            EventData::TaskExit {
                exit_code,
                group_dead,
                comm,
                ..
            } => {
                self.name(pid, Some(tid), comm);
                let args = json!({"exit_code": exit_code, "group_dead": group_dead});
                self.instant("exit", pid, tid, e.ts_ns, args)
            }
            EventData::Reap { reaped_pid, .. } => {
                self.instant("reap", pid, tid, e.ts_ns, json!({"reaped_pid": reaped_pid}))
            }
            EventData::Loss { count, what, .. } => self.on_loss(e.ts_ns, *count, *what),
            EventData::Nvml { gpus } => self.on_nvml(e.ts_ns, gpus),
            EventData::ProcInfo(info) => {
                self.name(info.pid, None, &info.comm);
                Ok(())
            }
            EventData::Gpus { gpus } => {
                self.gpus = gpus.clone();
                Ok(())
            }
            EventData::Strategy(st) => {
                self.xid_tracepoint = st.xid_tracepoint;
                self.instant(
                    "strategy",
                    pid,
                    tid,
                    e.ts_ns,
                    serde_json::to_value(&e.data)?,
                )
            }
            EventData::GpuXid {
                source: XidSource::Kmsg,
                ..
            } if self.xid_tracepoint => Ok(()),
            // On the GPUs' track, at the moment the driver reported it.
            EventData::GpuXid {
                xid, pci, message, ..
            } => self.on_xid(e.ts_ns, *xid, pci, message),
            // Samples feed the flamegraph (`--format svg`); on a timeline they are noise.
            EventData::Tick
            | EventData::BenchTick
            | EventData::TeardownSample { .. }
            | EventData::Stack { .. } => Ok(()),
            // A driver call as a slice on its thread, ending when the ioctl returned.
            EventData::GpuIoctl {
                cmd, duration_ns, ..
            } => self.on_ioctl(e, *cmd, *duration_ns),
            // Kinds without a drawing of their own: an instant named by the kind, its fields
            // as arguments.
            other => {
                let args = serde_json::to_value(other)?;
                let kind = args["kind"].as_str().unwrap_or("event").to_string();
                self.instant(&kind, pid, tid, e.ts_ns, args)
            }
        }
    }

    fn on_loss(&mut self, ts_ns: u64, count: u64, what: LossKind) -> std::io::Result<()> {
        self.write(&TraceEvent {
            name: "kernel lost records",
            cat: "loss",
            ph: "i",
            ts: us(ts_ns),
            dur: None,
            pid: 0,
            tid: 0,
            s: Some("g"),
            args: json!({"count": count, "what": what}),
        })
    }

    /// Each GPU's used memory on the GPUs' track, each process's share on its own; a share
    /// NVML no longer lists drops to 0.
    fn on_nvml(&mut self, ts_ns: u64, gpus: &[NvmlGpu]) -> std::io::Result<()> {
        let mut holders = BTreeSet::new();
        for gpu in gpus {
            let name = format!("GPU{} memory used", gpu.index);
            self.counter(&name, GPUS_PID, ts_ns, gpu.used)?;
            for p in &gpu.processes {
                if let Some(used) = p.used {
                    holders.insert((gpu.index, p.pid));
                    self.counter(&format!("GPU{} memory", gpu.index), p.pid, ts_ns, used)?;
                }
            }
        }
        let gone: Vec<(u32, u32)> = self.nvml_holders.difference(&holders).copied().collect();
        for (gpu, pid) in gone {
            self.counter(&format!("GPU{gpu} memory"), pid, ts_ns, 0)?;
        }
        self.nvml_holders = holders;
        self.processes
            .entry(GPUS_PID)
            .or_insert_with(|| "GPUs (NVML)".into());
        Ok(())
    }

    /// A GPU error on the GPUs' track, at the moment the driver reported it.
    fn on_xid(&mut self, ts_ns: u64, xid: u32, pci: &str, message: &str) -> std::io::Result<()> {
        let gpu = gpu_errors::device(&self.gpus, pci).map(|g| g.index);
        let on = gpu.map_or_else(|| format!("PCI {pci}"), |i| format!("GPU{i}"));
        let name = format!("Xid {xid} ({}) on {on}", gpu_errors::meaning(xid));
        self.processes
            .entry(GPUS_PID)
            .or_insert_with(|| "GPUs (NVML)".into());
        self.write(&TraceEvent {
            name: &name,
            cat: "gpu_error",
            ph: "i",
            ts: us(ts_ns),
            dur: None,
            pid: GPUS_PID,
            tid: 0,
            s: Some("p"),
            args: json!({"xid": xid, "pci": pci, "gpu": gpu, "message": message}),
        })
    }

    /// A driver call as a slice on its thread, ending when the ioctl returned.
    fn on_ioctl(&mut self, e: &Event, cmd: u32, duration_ns: u64) -> std::io::Result<()> {
        let name = ioctl_name(cmd);
        self.name(e.pid, Some(e.tid), "");
        self.write(&TraceEvent {
            name: &name,
            cat: "ioctl",
            ph: "X",
            ts: us(e.ts_ns.saturating_sub(duration_ns)),
            dur: Some(us(duration_ns)),
            pid: e.pid,
            tid: e.tid,
            s: None,
            args: serde_json::to_value(&e.data)?,
        })
    }

    /// The incident as a slice on the target's main thread, its phases nested inside.
    pub fn on_incident(&mut self, inc: &Incident) -> std::io::Result<()> {
        let pid = inc.target.pid;
        let title = match &inc.sender {
            Some(s) if s.pid == 0 => format!("{} from the kernel", inc.signal_name),
            Some(s) => format!(
                "{} from {}[{}]",
                inc.signal_name,
                escape::terminal(&s.comm),
                s.pid
            ),
            None => format!("{} ({})", inc.signal_name, inc.termination.mode.label()),
        };
        let end = end_ns(inc);
        self.write(&TraceEvent {
            name: &title,
            cat: "incident",
            ph: "X",
            ts: us(inc.t_signal_ns),
            dur: Some(us(end - inc.t_signal_ns)),
            pid,
            tid: pid,
            s: None,
            args: serde_json::to_value(inc)?,
        })?;
        for phase in phases(inc) {
            // The GPU release carries where its time went (sampled, so not placed in time).
            let args = if phase.name == phases::RELEASING && !inc.phases.is_empty() {
                json!({ "teardown": inc.phases, "verdict": inc.verdict })
            } else {
                Value::Null
            };
            self.write(&TraceEvent {
                name: phase.name,
                cat: "phase",
                ph: "X",
                ts: us(phase.start_ns),
                dur: Some(us(phase.end_ns - phase.start_ns)),
                pid,
                tid: pid,
                s: None,
                args,
            })?;
        }
        Ok(())
    }

    /// Writes the track names and closes the JSON document.
    pub fn finish(mut self) -> std::io::Result<W> {
        let processes = std::mem::take(&mut self.processes);
        for (pid, name) in &processes {
            self.metadata("process_name", *pid, *pid, name)?;
        }
        let threads = std::mem::take(&mut self.threads);
        for ((pid, tid), name) in &threads {
            self.metadata("thread_name", *pid, *tid, name)?;
        }
        self.out.write_all(b"\n]}\n")?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn name(&mut self, pid: u32, tid: Option<u32>, comm: &str) {
        if pid == 0 || comm.is_empty() {
            return;
        }
        let comm = escape::terminal(comm);
        self.processes
            .entry(pid)
            .or_insert_with(|| comm.to_string());
        if let Some(tid) = tid {
            self.threads.insert((pid, tid), comm.into_owned());
        }
    }

    fn instant(
        &mut self,
        name: &str,
        pid: u32,
        tid: u32,
        ts_ns: u64,
        args: Value,
    ) -> std::io::Result<()> {
        self.write(&TraceEvent {
            name,
            cat: "event",
            ph: "i",
            ts: us(ts_ns),
            dur: None,
            pid,
            tid,
            s: Some("t"),
            args,
        })
    }

    /// A point of a counter track of process `pid`.
    fn counter(&mut self, name: &str, pid: u32, ts_ns: u64, bytes: u64) -> std::io::Result<()> {
        self.write(&TraceEvent {
            name,
            cat: "nvml",
            ph: "C",
            ts: us(ts_ns),
            dur: None,
            pid,
            tid: 0,
            s: None,
            args: json!({ "bytes": bytes }),
        })
    }

    fn metadata(&mut self, kind: &str, pid: u32, tid: u32, name: &str) -> std::io::Result<()> {
        self.write(&TraceEvent {
            name: kind,
            cat: "__metadata",
            ph: "M",
            ts: 0.0,
            dur: None,
            pid,
            tid,
            s: None,
            args: json!({ "name": name }),
        })
    }

    fn write(&mut self, event: &TraceEvent) -> std::io::Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        json::to_writer(&mut self.out, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{NvmlGpu, NvmlProcess};

    fn nvml(ts_ns: u64, holders: &[(u32, u64)]) -> Event {
        let processes = holders
            .iter()
            .map(|&(pid, used)| NvmlProcess {
                pid,
                used: Some(used),
            })
            .collect();
        Event {
            ts_ns,
            cpu: 0,
            pid: 0,
            tid: 0,
            data: EventData::Nvml {
                gpus: vec![NvmlGpu {
                    utilization: None,
                    index: 0,
                    used: holders.iter().map(|h| h.1).sum(),
                    total: 1 << 34,
                    processes,
                }],
            },
        }
    }

    #[test]
    fn hostile_names_label_tracks_escaped_and_stay_exact_in_arguments() {
        let hostile = "\x1b]0;pwn\x07\\xff\u{9b}";
        let mut t = ChromeTrace::new(Vec::new()).expect("in memory");
        let exec = Event {
            ts_ns: 1_000,
            cpu: 0,
            pid: 42,
            tid: 43,
            data: EventData::Exec {
                comm: hostile.into(),
            },
        };
        t.on_event(&exec).expect("in memory");
        let exit = Event {
            data: EventData::TaskExit {
                exit_code: 9,
                group_dead: true,
                comm: hostile.into(),
            },
            ..exec
        };
        t.on_event(&exit).expect("in memory");
        let out = t.finish().expect("in memory");
        let text = String::from_utf8(out).expect("UTF-8");
        assert!(!text.contains(['\x1b', '\x07', '\u{9b}']), "{text}");
        let doc: Value = serde_json::from_str(&text).expect("JSON");
        let events = doc["traceEvents"].as_array().expect("events");
        let shown = "\\x1b]0;pwn\\x07\\xff\\u{9b}";
        for kind in ["process_name", "thread_name"] {
            let track = events
                .iter()
                .find(|e| e["name"] == kind)
                .unwrap_or_else(|| panic!("no {kind}: {text}"));
            assert_eq!(track["args"]["name"], shown, "{kind}");
        }
        let exec = events.iter().find(|e| e["name"] == "exec").expect("exec");
        assert_eq!(exec["args"]["comm"], hostile);
    }

    #[test]
    fn nvml_memory_is_a_counter_that_drops_when_a_holder_leaves() {
        let mut t = ChromeTrace::new(Vec::new()).expect("in memory");
        t.on_event(&nvml(1_000, &[(42, 1 << 30)]))
            .expect("in memory");
        t.on_event(&nvml(2_000, &[])).expect("in memory");
        let doc: Value = serde_json::from_slice(&t.finish().expect("in memory")).expect("JSON");
        let counters: Vec<(u64, f64, u64)> = doc["traceEvents"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == "GPU0 memory")
            .map(|e| {
                let pid = e["pid"].as_u64().expect("pid");
                let bytes = e["args"]["bytes"].as_u64().expect("bytes");
                (pid, e["ts"].as_f64().expect("ts"), bytes)
            })
            .collect();
        assert_eq!(counters, vec![(42, 1.0, 1 << 30), (42, 2.0, 0)]);
    }
}
