//! The driver registers after linger started: no system call tracepoint until then, and once
//! /proc/devices lists it, the tracepoints come and the holder and the ledger are right.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{
    by_driver::{allocates_a_gib, events_of, find_event, last_incidents, GIB, NVIDIA0},
    Guest,
};

pub fn check(guest: &Guest) -> Result<()> {
    guest.succeeded("late")?;
    let holder: u64 = guest.one("late-holder")?.parse()?;
    let child: u64 = guest.one("late-child")?.parse()?;
    let out = guest.json("late-out")?;
    let events = events_of(&out);
    let strategies: Vec<&Value> = events
        .iter()
        .map(|e| &e["data"])
        .filter(|d| d["kind"] == "strategy")
        .collect();
    let [first, then] = strategies[..] else {
        bail!("expected two strategy records, got {}", strategies.len());
    };
    let syscalls = |s: &Value| {
        s["hooks"].as_array().into_iter().flatten().any(|h| {
            h.as_str()
                .is_some_and(|h| h.starts_with("tracepoint/syscalls/"))
        })
    };
    if first["no_driver"] != true || syscalls(first) {
        bail!("without a driver, the strategy still has system call tracepoints: {first}");
    }
    let came = then["reasons"].as_array().into_iter().flatten().any(|r| {
        r.as_str()
            .is_some_and(|r| r.contains("registered after start") && r.contains("attached"))
    });
    if then["no_driver"] != false || !syscalls(then) || !came {
        bail!("once the driver registered, no system call tracepoints: {then}");
    }
    let find = |what: &str, pred: &dyn Fn(&Value) -> bool| find_event(&events, what, pred);
    find("open of nvidia0 seen by the tracepoints", &|e| {
        let d = &e["data"];
        e["pid"] == holder
            && d["kind"] == "gpu_fd"
            && d["op"] == "open"
            && d["fd"].as_i64().is_some_and(|fd| fd >= 0)
            && d["dev"] == NVIDIA0
    })?;
    find("RM_ALLOC of 1 GiB", &|e| allocates_a_gib(e, holder))?;
    let incidents = last_incidents(&out);
    let parent = incidents
        .get(&holder)
        .with_context(|| format!("no incident for the GPU process {holder}"))?;
    if parent["gpu"]["bytes_ledger"] != GIB {
        bail!(
            "the GPU process's ledger is not its 1 GiB: {}",
            parent["gpu"]
        );
    }
    let kept = parent["holders"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|h| h["pid"] == child && h["how"] == "fork");
    if !kept {
        bail!("the GPU process's incident does not name the forked child {child}: {parent}");
    }
    eprintln!(
        "xtask vm:   driver registered late: system call tracepoints attached then; holder and \
         1 GiB ledger right"
    );
    Ok(())
}
