//! The events of one kill scenario, as the guest recorded them, and the driver calls and
//! durations the checks look for among them.

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The events of one scenario.
pub struct Trace<'a> {
    pub events: Vec<&'a Value>,
    pub holder: u64,
    /// The strategy forced: the hook kind of `__fput` records.
    pub mode: &'a str,
}

impl<'a> Trace<'a> {
    /// The first event that `pred` accepts.
    pub fn find(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Result<&'a Value> {
        self.events
            .iter()
            .copied()
            .find(|e| pred(e))
            .with_context(|| format!("no {what} event"))
    }

    pub fn holder(&self) -> u64 {
        self.holder
    }

    pub fn kill(&self) -> Result<&'a Value> {
        self.find("SIGKILL of the holder", |e| {
            e["data"]["kind"] == "signal_generate"
                && e["data"]["sig"] == 9
                && e["data"]["target_pid"] == self.holder
        })
    }

    /// The holder's close of descriptor `fd` of device `dev`. Closes are recorded at the
    /// call's exit, by number only: the file is the one its last open or dup of `fd` named.
    pub fn closed(&self, fd: i64, dev: u64) -> Result<Value> {
        let mut file = None;
        for e in &self.events {
            let d = &e["data"];
            if e["pid"] != self.holder || d["kind"] != "gpu_fd" || d["fd"] != fd {
                continue;
            }
            match d["op"].as_str() {
                Some("open" | "dup") if d["dev"] == dev => file = Some(d["file"].clone()),
                Some("close") if file.is_some() => {
                    let mut closed = (*e).clone();
                    closed["data"]["file"] = file.take().unwrap_or_default();
                    closed["data"]["dev"] = dev.into();
                    return Ok(closed);
                }
                _ => {}
            }
        }
        bail!("no close of fd {fd} after its open of device {dev:#x}")
    }

    /// The holder's GpuFd record `op` of descriptor `fd` on device `dev`.
    pub fn fd(&self, op: &str, fd: i64, dev: u64) -> Result<&'a Value> {
        self.find(&format!("GpuFd {op} of fd {fd}"), |e| {
            e["pid"] == self.holder
                && e["data"]["kind"] == "gpu_fd"
                && e["data"]["op"] == op
                && e["data"]["fd"] == fd
                && e["data"]["dev"] == dev
        })
    }

    /// The first entry (or exit) of `func` on the file of `fd_event` at or after `after`, on
    /// `tid` when given. `__fput` must come from the forced hook kind, the driver's functions
    /// from kprobes. "First after": a freed file's address may come back for the next open.
    pub fn call(
        &self,
        func: &str,
        exit: bool,
        fd_event: &Value,
        after: &Value,
        tid: Option<&Value>,
    ) -> Result<&'a Value> {
        let hook = if func == "fput" { self.mode } else { "kprobe" };
        let kind = if exit { "exit" } else { "entry" };
        self.find(&format!("{func} {kind} after {after}"), |e| {
            let d = &e["data"];
            d["kind"] == "driver_call"
                && d["func"] == func
                && d["exit"] == exit
                && d["hook"] == hook
                && d["file"] == fd_event["data"]["file"]
                && tid.is_none_or(|t| e["tid"] == *t)
                && e["ts_ns"].as_u64() >= after["ts_ns"].as_u64()
        })
    }

    /// `__fput` of the file of a close record, on the closing thread; its duration.
    pub fn fput(&self, closed: &Value, path: &str) -> Result<u64> {
        self.fput_after(closed, closed, path)
    }

    pub fn fput_after(&self, after: &Value, fd_event: &Value, path: &str) -> Result<u64> {
        let entry = self.call("fput", false, fd_event, after, Some(&fd_event["tid"]))?;
        let exit = self.call("fput", true, fd_event, entry, Some(&entry["tid"]))?;
        duration(entry, exit).with_context(|| format!("__fput on the {path}"))
    }
}

/// The exit's own duration, which must match the two records' times: both are clock readings a
/// few instructions from the record's header.
pub fn duration(entry: &Value, exit: &Value) -> Result<u64> {
    let ts = |e: &Value| e["ts_ns"].as_u64().context("event without ts_ns");
    let between = ts(exit)? - ts(entry)?;
    let duration = exit["data"]["duration_ns"]
        .as_u64()
        .context("exit without duration_ns")?;
    if duration == 0 || duration.abs_diff(between) > 1_000_000 {
        bail!(
            "exit duration {duration} ns, but {between} ns between entry {entry} and exit {exit}"
        );
    }
    Ok(duration)
}
