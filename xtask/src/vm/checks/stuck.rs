//! A wedge without a kill (init.sh's stuck scenario): the GPU process whose close sleeps
//! uninterruptibly in the stand-in driver's queue flush is reported stuck within 2 s of the
//! threshold, with that function on its stack, and cleared once the close returns; the
//! stopped GPU process beside it never is.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::console::Guest;

/// `--stuck-after` in the scenario.
const AFTER_NS: u64 = 2_000_000_000;
/// How much later than the threshold the report may come: the collector looks once a second.
const LATE_NS: u64 = 2_000_000_000;
const FUNCTION: &str = "nv_kthread_q_flush";

pub fn check(guest: &Guest) -> Result<()> {
    guest.succeeded("stuck")?;
    if guest.one("stuck-closed")? != "closed" {
        bail!("the stalled close never returned");
    }
    let holder: u64 = guest.one("stuck-holder")?.parse()?;
    let stopped: u64 = guest.one("stuck-stopped")?.parse()?;
    let records: Vec<Value> = guest
        .json("stuck-out")?
        .into_iter()
        .filter(|r| r["type"] == "stuck")
        .collect();
    if let Some(r) = records.iter().find(|r| r["pid"] == stopped) {
        bail!("the stopped process {stopped} was reported stuck: {r}");
    }
    let of_holder = |cleared: bool| {
        records
            .iter()
            .find(|r| r["pid"] == holder && r["cleared"] == cleared)
            .with_context(|| {
                format!("no stuck record (cleared: {cleared}) of {holder}; records: {records:?}")
            })
    };
    let stuck = of_holder(false)?;
    let t = stuck["t_ns"].as_u64().context("t_ns")?;
    let since = stuck["since_ns"].as_u64().context("since_ns")?;
    let late = t.saturating_sub(since + AFTER_NS);
    if t < since + AFTER_NS || late > LATE_NS {
        bail!(
            "reported {} ms after the sleep began, not within 2 s of the 2 s threshold: {stuck}",
            (t - since) / 1_000_000
        );
    }
    let on_stack = stuck["frames"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == &format!("{FUNCTION}[nvidia]")));
    if !on_stack || stuck["in_function"] != FUNCTION || stuck["waits_on"] != "queue_flush" {
        bail!("the stuck record does not name {FUNCTION} and its queue flush: {stuck}");
    }
    let cleared = of_holder(true)?;
    if cleared["tid"] != stuck["tid"] || cleared["since_ns"] != stuck["since_ns"] {
        bail!("the clearing record is of another sleep: {cleared}");
    }
    let asleep = cleared["asleep_s"].as_f64().context("asleep_s")?;
    if !(5.0..=15.0).contains(&asleep) {
        bail!("the 6 s stall cleared after {asleep} s asleep: {cleared}");
    }
    Ok(())
}
