//! The human report's lines for records beside incidents: GPU errors no incident took,
//! threads stuck in the driver, GPUs busy with no holder.

use std::fmt::Write as _;

use super::text_line::{e, INDENT};
use crate::{
    analysis::{gpu_errors::GpuError, stuck::StuckRecord, unheld::UnheldRecord},
    clock::WallAnchor,
};

/// A thread stuck in the driver, or running again.
pub fn stuck(r: &StuckRecord, anchor: &WallAnchor) -> String {
    let what = if r.cleared { "UNSTUCK " } else { "STUCK   " };
    // A sleep begun before tracing: only its lower bound is known.
    let at_least = if r.asleep_before_start {
        "at least "
    } else {
        ""
    };
    let state = if r.cleared {
        format!("ran again after {at_least}{:.1} s asleep", r.asleep_s)
    } else {
        format!(
            "asleep in the driver for {at_least}{:.1} s ({}{})",
            r.asleep_s,
            r.waits_on.label(),
            r.in_function
                .as_deref()
                .map_or_else(String::new, |f| format!(", in {}", e(f)))
        )
    };
    let mut s = format!(
        "{}  {what} {}[{}] thread {} · {state}\n",
        anchor.format_local(r.t_ns),
        e(&r.comm),
        r.pid,
        r.tid
    );
    if !r.cleared {
        let top: Vec<&str> = r.frames.iter().take(6).map(String::as_str).collect();
        let _ = writeln!(s, "{INDENT}stack: {}", e(&top.join(" <- ")));
        let _ = writeln!(s, "{INDENT}hint: {}", r.hint);
    }
    s
}

/// An Xid no incident took.
pub fn gpu_error(x: &GpuError, anchor: &WallAnchor) -> String {
    let whose = match (x.pid, &x.process_name) {
        (Some(p), Some(n)) => format!(" · {}[{p}]", e(n)),
        (Some(p), None) => format!(" · pid {p}"),
        (None, _) => String::new(),
    };
    let advice = x
        .advice()
        .map_or_else(String::new, |a| format!("{INDENT}{a}\n"));
    format!(
        "{}  XID      {}{whose} · no incident followed\n{INDENT}{}\n{advice}",
        anchor.format_local(x.t_ns),
        x.describe(),
        e(&x.message)
    )
}

/// A GPU busy with nobody, or no longer.
pub fn unheld(r: &UnheldRecord, anchor: &WallAnchor) -> String {
    let gib = r.used_bytes as f64 / (1u64 << 30) as f64;
    let no_work = r.head.record_type == "utilized_without_work";
    let (tag, what) = if no_work {
        ("BUSY    ", "utilized with no memory and no process")
    } else {
        ("UNHELD  ", "busy with no holder")
    };
    if r.cleared {
        return format!(
            "{}  {tag} GPU{} · no longer {what}, after {:.0} s\n",
            anchor.format_local(r.t_ns),
            r.gpu,
            r.busy_s
        );
    }
    let state = if no_work {
        let pct = r.utilization_pct.unwrap_or_default();
        format!(
            "{pct} % utilized for {:.0} s with no memory in use and no process",
            r.busy_s
        )
    } else {
        let who = match (r.holder, r.holder_view) {
            ("not_visible", _) => "no process visible here holds it".to_string(),
            (_, Some(why)) => format!("none linger knows of holds it, but {why}"),
            _ => "no process holds it".to_string(),
        };
        format!(
            "{gib:.1} GiB in use for {:.0} s, NVML lists no process, {who}",
            r.busy_s
        )
    };
    format!(
        "{}  {tag} GPU{} · {state}\n{INDENT}hint: {}\n",
        anchor.format_local(r.t_ns),
        r.gpu,
        r.hint
    )
}
