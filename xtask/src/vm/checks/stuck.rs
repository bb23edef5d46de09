//! A wedge without a kill (init.sh's stuck scenario): the GPU process whose close sleeps
//! uninterruptibly in the stand-in driver's queue flush is reported stuck within 2 s of the
//! threshold, with that function on its stack, and cleared once the close returns; the
//! stopped GPU process beside it never is. A close already asleep there when linger starts is
//! found by its look at the start and reported the same way, said to have begun before.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::console::Guest;

/// `--stuck-after` in the scenario.
const AFTER_NS: u64 = 2_000_000_000;
/// How much later than the threshold the report may come: the collector looks once a second.
const LATE_NS: u64 = 2_000_000_000;
const FUNCTION: &str = "nv_kthread_q_flush";

pub fn check(guest: &Guest) -> Result<()> {
    let (holder, records) = scenario(guest, "stuck")?;
    let stopped: u64 = guest.one("stuck-stopped")?.parse()?;
    if let Some(r) = records.iter().find(|r| r["pid"] == stopped) {
        bail!("the stopped process {stopped} was reported stuck: {r}");
    }
    let (stuck, cleared) = stuck_then_cleared(&records, holder)?;
    let asleep = cleared["asleep_s"].as_f64().context("asleep_s")?;
    if !(5.0..=15.0).contains(&asleep) {
        bail!("the 6 s stall cleared after {asleep} s asleep: {cleared}");
    }
    if stuck["asleep_before_start"] != Value::Null {
        bail!("a sleep that began while linger traced is said to have begun before: {stuck}");
    }
    Ok(())
}

/// The wedge older than linger (init.sh's `early` scenario): reported stuck from the look at
/// the start, within 2 s of the threshold counted from that look (its `since_ns`), with the
/// flush on its /proc stack, and cleared once the stall is lifted.
pub fn before_start(guest: &Guest) -> Result<()> {
    let (holder, records) = scenario(guest, "early")?;
    let (stuck, cleared) = stuck_then_cleared(&records, holder)?;
    if stuck["asleep_before_start"] != true || cleared["asleep_before_start"] != true {
        bail!("the records do not say the sleep began before tracing: {records:?}");
    }
    // Found at the start: before linger said it was tracing.
    let tracing: f64 = guest.one("early-tracing")?.parse()?;
    let since = stuck["since_ns"].as_u64().context("since_ns")?;
    if since as f64 > tracing * 1e9 {
        bail!("found {since} ns after boot, after tracing began at {tracing} s: {stuck}");
    }
    Ok(())
}

/// A scenario that ended well, its stalled close returned: its holder and its stuck records.
fn scenario(guest: &Guest, name: &str) -> Result<(u64, Vec<Value>)> {
    guest.succeeded(name)?;
    if guest.one(&format!("{name}-closed"))? != "closed" {
        bail!("{name}: the stalled close never returned");
    }
    let holder = guest.one(&format!("{name}-holder"))?.parse()?;
    let records = guest
        .json(&format!("{name}-out"))?
        .into_iter()
        .filter(|r| r["type"] == "stuck")
        .collect();
    Ok((holder, records))
}

/// The holder's stuck record, within 2 s of the threshold after its `since_ns`, naming the
/// queue flush it sleeps in, and the record of that sleep cleared.
fn stuck_then_cleared(records: &[Value], holder: u64) -> Result<(&Value, &Value)> {
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
            "reported {} ms after its since_ns, not within 2 s of the 2 s threshold: {stuck}",
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
    Ok((stuck, cleared))
}
