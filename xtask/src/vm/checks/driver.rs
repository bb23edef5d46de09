//! The stand-in driver's functions, timed by kprobes: an ioctl, a close whose RM cleanup sleeps,
//! a close the driver defers to its worker, and a UVM release that sleeps in the exit path.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::trace::{duration, Trace};

/// `delay_ms` given to the stand-in module in init.sh.
const DELAY_NS: u64 = 200_000_000;
/// The stand-in sleeps `DELAY_NS` by jiffies (msleep); the guest's clock, which the hooks'
/// timestamps read, counted such a sleep as little as 179-199 ms under TCG (6.1 on a busy
/// host, 6.12 on an idle one): a sleep counts as taken when it measured at least this.
pub const SLEPT_NS: u64 = DELAY_NS / 10 * 8;
const NVIDIA0: u64 = 195 << 20;
const NVIDIA1: u64 = 195 << 20 | 1;
/// TCGETS, stty's ioctl; the stand-in answers -ENOTTY.
const TCGETS: i64 = 0x5401;
const ENOTTY: i64 = 25;

const FUNCTIONS: [&str; 5] = [
    "nvidia_close",
    "rm_cleanup_file_private",
    "nvidia_close_deferred",
    "uvm_release_entry",
    "nvidia_unlocked_ioctl",
];

pub fn check(t: &Trace, strategy: &Value) -> Result<()> {
    let hooked = strategy["driver_functions"]
        .as_array()
        .context("strategy without driver_functions")?;
    if FUNCTIONS.iter().any(|f| !hooked.iter().any(|h| h == f)) {
        bail!("the strategy did not hook every driver function: {strategy}");
    }
    ioctl(t)?;
    let close = slow_close(t)?;
    let deferred = deferred_close(t)?;
    let release = uvm_release_at_exit(t)?;
    eprintln!(
        "xtask vm:   nvidia_close with RM cleanup {} ms; deferred close on a worker {} ms; \
         UVM release after SIGKILL {} ms",
        close / 1_000_000,
        deferred / 1_000_000,
        release / 1_000_000
    );
    Ok(())
}

fn ioctl(t: &Trace) -> Result<()> {
    let entry = t.find("nvidia_unlocked_ioctl entry", |e| {
        let d = &e["data"];
        d["func"] == "nvidia_unlocked_ioctl" && d["exit"] == false && d["dev"] == NVIDIA0
    })?;
    if entry["data"]["value"] != TCGETS {
        bail!("nvidia_unlocked_ioctl entry without the command TCGETS: {entry}");
    }
    let exit = t.find("nvidia_unlocked_ioctl exit", |e| {
        e["data"]["func"] == "nvidia_unlocked_ioctl"
            && e["data"]["exit"] == true
            && e["tid"] == entry["tid"]
            && e["ts_ns"].as_u64() >= entry["ts_ns"].as_u64()
    })?;
    if exit["data"]["value"] != -ENOTTY || exit["data"]["file"] != entry["data"]["file"] {
        bail!("nvidia_unlocked_ioctl exit {exit} does not return -ENOTTY for entry {entry}");
    }
    duration(entry, exit)?;
    Ok(())
}

/// nvidia0 closed as fd 5: __fput > nvidia_close > rm_cleanup_file_private, nested on the
/// closing thread, the cleanup sleeping `DELAY_NS` (`SLEPT_NS` by the guest's clock).
fn slow_close(t: &Trace) -> Result<u64> {
    let closed = &t.closed(5, NVIDIA0)?;
    let tid = Some(&closed["tid"]);
    let mut at = closed;
    let mut calls = Vec::new();
    for (func, exit) in [
        ("fput", false),
        ("nvidia_close", false),
        ("rm_cleanup_file_private", false),
        ("rm_cleanup_file_private", true),
        ("nvidia_close", true),
        ("fput", true),
    ] {
        at = t.call(func, exit, closed, at, tid)?;
        calls.push(at);
    }
    let cleanup = duration(calls[2], calls[3])?;
    let close = duration(calls[1], calls[4])?;
    let fput = duration(calls[0], calls[5])?;
    if !(SLEPT_NS <= cleanup && cleanup <= close && close <= fput) {
        bail!("nested durations out of order: cleanup {cleanup}, close {close}, __fput {fput}");
    }
    Ok(close)
}

/// nvidia1 closed as fd 6: nvidia_close returns at once; nvidia_close_deferred runs the
/// cleanup on another thread, and names the same file.
fn deferred_close(t: &Trace) -> Result<u64> {
    let closed = &t.closed(6, NVIDIA1)?;
    let entry = t.call("nvidia_close", false, closed, closed, Some(&closed["tid"]))?;
    let exit = t.call("nvidia_close", true, closed, entry, Some(&entry["tid"]))?;
    if duration(entry, exit)? >= DELAY_NS {
        bail!("nvidia_close of nvidia1 waited for the cleanup it should have deferred");
    }
    let deferred = t.call("nvidia_close_deferred", false, closed, entry, None)?;
    if deferred["pid"].as_u64() == Some(t.holder()) {
        bail!("the deferred close ran in the holder: {deferred}");
    }
    let worker = Some(&deferred["tid"]);
    let cleanup = t.call("rm_cleanup_file_private", false, closed, deferred, worker)?;
    let cleaned = t.call("rm_cleanup_file_private", true, closed, cleanup, worker)?;
    let done = t.call("nvidia_close_deferred", true, closed, cleaned, worker)?;
    let total = duration(deferred, done)?;
    if duration(cleanup, cleaned)? < SLEPT_NS || total < SLEPT_NS {
        bail!("the deferred cleanup did not take the stand-in's delay: {done}");
    }
    Ok(total)
}

/// nvidia-uvm held as fd 7 when killed: its release runs in the exit path, inside __fput.
fn uvm_release_at_exit(t: &Trace) -> Result<u64> {
    let held = t.find("GpuFd held_at_exit of fd 7", |e| {
        e["pid"].as_u64() == Some(t.holder())
            && e["data"]["op"] == "held_at_exit"
            && e["data"]["fd"] == 7
    })?;
    let tid = Some(&held["tid"]);
    let fput = t.call("fput", false, held, t.kill()?, tid)?;
    let entry = t.call("uvm_release_entry", false, held, fput, tid)?;
    let exit = t.call("uvm_release_entry", true, held, entry, tid)?;
    let fput_exit = t.call("fput", true, held, exit, tid)?;
    let release = duration(entry, exit)?;
    if exit["data"]["value"] != 0 || release < SLEPT_NS || duration(fput, fput_exit)? < release {
        bail!("the UVM release {entry} .. {exit} is not a slow release inside __fput");
    }
    Ok(release)
}
