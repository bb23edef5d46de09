//! The stock kernel's default strategy: the driver's own open and ioctl entries answer in place
//! of system call tracepoints, and the holders, the ledger and the release are still right.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::console::Guest;

pub(super) const NVIDIA0: u64 = 195 << 20;
/// What the scenario's GPU process allocates (init.sh).
pub(super) const GIB: u64 = 1 << 30;
const NV01_MEMORY_LOCAL_USER: u64 = 0x40;
/// The driver hooks that replace the system call tracepoints.
pub(super) const ANSWERING: [&str; 3] = ["nvidia_open", "uvm_open_entry", "nvidia_unlocked_ioctl"];

pub fn check(guest: &Guest) -> Result<()> {
    guest.succeeded("driver")?;
    let holder: u64 = guest.one("driver-holder")?.parse()?;
    let child: u64 = guest.one("driver-child")?.parse()?;
    let out = guest.json("driver-out")?;
    let events = events_of(&out);
    let find = |what: &str, pred: &dyn Fn(&Value) -> bool| find_event(&events, what, pred);
    let strategy = &find("strategy", &|e| e["data"]["kind"] == "strategy")?["data"];
    if strategy["by_driver"] != true {
        bail!("the default strategy does not answer through the driver's hooks: {strategy}");
    }
    let hooks = strategy["hooks"]
        .as_array()
        .context("strategy without hooks")?;
    if let Some(syscall) = hooks.iter().find(|h| {
        h.as_str()
            .is_some_and(|h| h.starts_with("tracepoint/syscalls/"))
    }) {
        bail!("the default strategy attached {syscall}: {strategy}");
    }
    let hooked = strategy["driver_functions"]
        .as_array()
        .context("strategy without driver_functions")?;
    if let Some(missing) = ANSWERING.iter().find(|f| !hooked.iter().any(|h| h == *f)) {
        bail!("{missing} is not hooked: {strategy}");
    }
    // Its opens, seen inside the driver before the descriptor exists.
    find("driver open of nvidia0", &|e| {
        let d = &e["data"];
        e["pid"] == holder
            && d["kind"] == "gpu_fd"
            && d["op"] == "open"
            && d["fd"] == -1
            && d["dev"] == NVIDIA0
    })?;
    // The ledger: the allocation, decoded at the driver's return.
    find("RM_ALLOC of 1 GiB", &|e| allocates_a_gib(e, holder))?;
    let incidents = last_incidents(&out);
    let parent = incident_of(&incidents, holder)?;
    let kept = parent["holders"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|h| h["pid"] == child && h["how"] == "fork");
    if kept.is_none_or(|h| h["t_released_ns"].as_u64().is_none()) {
        bail!("the parent's incident does not name the forked child {child} and its release");
    }
    if parent["gpu"]["bytes_ledger"] != GIB {
        bail!("the parent's ledger is not its 1 GiB: {}", parent["gpu"]);
    }
    per_device(parent)?;
    ledger_device(parent)?;
    let own = incidents
        .get(&child)
        .with_context(|| format!("no incident for the child {child}"))?;
    if own["gpu"]["files_released_by"] != "fput" {
        bail!(
            "the child's release is not the hooked __fput: {}",
            own["gpu"]
        );
    }
    gpu_error(strategy, parent, holder)?;
    guest.succeeded("driver-replay")?;
    if last_incidents(&guest.json("driver-replay-out")?) != incidents {
        bail!("the replay's incidents differ from live's");
    }
    eprintln!(
        "xtask vm:   no system call tracepoint; holder, 1 GiB ledger and release from the \
         driver's hooks; its files on two GPUs told apart; its memory on device instance 1"
    );
    Ok(())
}

/// The driver's tracepoint attached, and the stand-in's Xid 31 naming the GPU process is in
/// its incident, before the kill.
fn gpu_error(strategy: &Value, incident: &Value, holder: u64) -> Result<()> {
    if strategy["xid_tracepoint"] != true {
        bail!("nvidia/nvidia_dev_xid is not traced: {strategy}");
    }
    let errors = incident["gpu_errors"].as_array().into_iter().flatten();
    let Some(x) = errors.into_iter().find(|x| x["xid"] == 31) else {
        bail!("the GPU process's incident has no Xid 31: {incident}");
    };
    if x["pid"] != holder || x["source"] != "tracepoint" || x["pci"] != "0000:00:00.0" {
        bail!("the Xid does not name the GPU process from the tracepoint: {x}");
    }
    if x["at_ms"].as_f64().is_none_or(|at| at >= 0.0) {
        bail!("the Xid is not before the kill: {x}");
    }
    Ok(())
}

/// Its files on two GPUs, told apart by the device files' minors (no NVML here to name the
/// GPUs): nvidia1 as fd 9, nvidia0 on a part of its own.
fn per_device(incident: &Value) -> Result<()> {
    let parts = incident["gpu"]["gpus"].as_array().into_iter().flatten();
    let minors: BTreeMap<u64, Vec<u64>> = parts
        .filter_map(|p| {
            let fds = p["fds"].as_array()?.iter().filter_map(Value::as_u64);
            Some((p["minor"].as_u64()?, fds.collect()))
        })
        .collect();
    let on_nvidia0 = minors
        .get(&0)
        .is_some_and(|fds| !fds.is_empty() && !fds.contains(&9));
    if minors.get(&1) != Some(&vec![9]) || !on_nvidia0 || minors.len() != 2 {
        bail!(
            "the GPU process's files are not told apart by GPU (nvidia0; nvidia1 as fd 9): {}",
            incident["gpu"]
        );
    }
    Ok(())
}

/// Its 1 GiB below the device object of instance 1, which GET_ID_INFO named as PCI 00:05.0:
/// a part of its own (no NVML here to say which GPU that is), and the evidence says so.
fn ledger_device(incident: &Value) -> Result<()> {
    let gpu = &incident["gpu"];
    let part = gpu["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["device_instance"] == 1);
    let placed = part.is_some_and(|p| p["bytes_ledger"] == GIB && p["index"].is_null());
    let said = gpu["evidence"].as_array().into_iter().flatten().any(|e| {
        e.as_str()
            .is_some_and(|e| e.contains("device instance 1, PCI 0000:05:00.0"))
    });
    if !placed || !said {
        bail!("the ledger's 1 GiB is not on device instance 1 (PCI 0000:05:00.0): {gpu}");
    }
    Ok(())
}

/// The last version of each target's incident.
pub(super) fn last_incidents(lines: &[Value]) -> BTreeMap<u64, Value> {
    lines
        .iter()
        .filter(|l| matches!(l["type"].as_str(), Some("incident" | "incident_update")))
        .filter_map(|l| Some((l["target"]["pid"].as_u64()?, l.clone())))
        .collect()
}

/// The events of a `linger live --json --events` output.
/// The last record of the incident of `pid` among `incidents`.
pub(super) fn incident_of(incidents: &BTreeMap<u64, Value>, pid: u64) -> Result<&Value> {
    incidents
        .get(&pid)
        .with_context(|| format!("no incident for the GPU process {pid}"))
}

pub(super) fn events_of(lines: &[Value]) -> Vec<&Value> {
    lines
        .iter()
        .filter(|l| l["type"] == "event")
        .map(|l| &l["event"])
        .collect()
}

pub(super) fn find_event<'a>(
    events: &[&'a Value],
    what: &str,
    pred: &dyn Fn(&Value) -> bool,
) -> Result<&'a Value> {
    events
        .iter()
        .copied()
        .find(|e| pred(e))
        .with_context(|| format!("no {what} event"))
}

/// The scenario's GPU process allocating its 1 GiB of video memory, decoded from the ioctl.
pub(super) fn allocates_a_gib(e: &Value, holder: u64) -> bool {
    let d = &e["data"];
    e["pid"] == holder
        && d["kind"] == "gpu_ioctl"
        && d["h_class"] == NV01_MEMORY_LOCAL_USER
        && d["size"] == GIB
        && d["status"] == 0
}
