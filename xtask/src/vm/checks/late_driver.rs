//! The driver registers after linger started: no system call tracepoint until then, and once
//! /proc/devices lists it, its own functions are hooked (this kernel allows kprobes); with
//! `--driver-hooks off`, the NVIDIA library that came with it (the stand-in libcuda) is hooked
//! (a cuda-compat copy of it too: compat.rs), or without one the system call tracepoints come;
//! each way the holder and the ledger are right.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{
    by_driver::{
        allocates_a_gib, events_of, find_event, incident_of, last_incidents, ANSWERING, GIB,
        NVIDIA0,
    },
    console::Guest,
};

/// What answers once the driver registered.
#[derive(Clone, Copy, PartialEq)]
enum Answer {
    Tracepoints,
    Library,
    Driver,
}

pub fn check(guest: &Guest) -> Result<()> {
    scenario(guest, "late-tp", Answer::Tracepoints).context("with --driver-hooks off")?;
    guest.succeeded("late-rmmod")?;
    scenario(guest, "late-lib", Answer::Library)
        .context("with --driver-hooks off and the library")?;
    guest.succeeded("late-lib-rmmod")?;
    scenario(guest, "late-compat", Answer::Library)
        .and_then(|()| super::compat::check(guest))
        .context("with --driver-hooks off and a cuda-compat library")?;
    guest.succeeded("late-compat-rmmod")?;
    scenario(guest, "late", Answer::Driver)?;
    eprintln!(
        "xtask vm:   driver registered late: its functions hooked then (with --driver-hooks off \
         the library that came with it, else system call tracepoints); holder and 1 GiB \
         ledger right"
    );
    Ok(())
}

fn scenario(guest: &Guest, tag: &str, answer: Answer) -> Result<()> {
    guest.succeeded(tag)?;
    let holder: u64 = guest.one(&format!("{tag}-holder"))?.parse()?;
    let child: u64 = guest.one(&format!("{tag}-child"))?.parse()?;
    let out = guest.json(&format!("{tag}-out"))?;
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
    let libraries = |s: &Value| s["libraries"].as_array().map_or(0, Vec::len);
    if first["no_driver"] != true || syscalls(first) || libraries(first) > 0 {
        bail!("without a driver, the strategy still hooks system calls or libraries: {first}");
    }
    let came = then["reasons"].as_array().into_iter().flatten().any(|r| {
        r.as_str()
            .is_some_and(|r| r.contains("registered after start") && r.contains("snapshot"))
    });
    if then["no_driver"] != false || !came {
        bail!("the driver's registration is not in the strategy: {then}");
    }
    match answer {
        Answer::Driver => {
            let hooked = then["driver_functions"].as_array().into_iter().flatten();
            let hooked: Vec<&str> = hooked.filter_map(Value::as_str).collect();
            if then["by_driver"] != true
                || syscalls(then)
                || ANSWERING.iter().any(|f| !hooked.contains(f))
            {
                bail!("once the driver registered, its functions do not answer: {then}");
            }
        }
        Answer::Library => {
            let stand_in = then["libraries"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|l| l.as_str().is_some_and(|l| l.ends_with("/libcuda.so.1")));
            if then["by_driver"] == true || syscalls(then) || !stand_in {
                bail!("once the driver and its library came, the library is not hooked: {then}");
            }
        }
        Answer::Tracepoints => {
            if then["by_driver"] == true || libraries(then) > 0 || !syscalls(then) {
                bail!("once the driver registered, no system call tracepoints: {then}");
            }
        }
    }
    let find = |what: &str, pred: &dyn Fn(&Value) -> bool| find_event(&events, what, pred);
    // Inside the driver the open is seen before its descriptor exists.
    find("open of nvidia0", &|e| {
        let d = &e["data"];
        let fd = d["fd"].as_i64();
        e["pid"] == holder
            && d["kind"] == "gpu_fd"
            && d["op"] == "open"
            && (if answer == Answer::Driver {
                fd == Some(-1)
            } else {
                fd.is_some_and(|fd| fd >= 0)
            })
            && d["dev"] == NVIDIA0
    })?;
    find("RM_ALLOC of 1 GiB", &|e| allocates_a_gib(e, holder))?;
    let incidents = last_incidents(&out);
    let parent = incident_of(&incidents, holder)?;
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
    Ok(())
}
