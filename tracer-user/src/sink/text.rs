//! The human report of an incident.

use std::fmt::Write as _;

use crate::{
    analysis::{
        holders::How,
        incident::{GpuImpact, Incident, Outcome, ReapHow},
        verdict::VerdictKind,
    },
    clock::WallAnchor,
};

const INDENT: &str = "              ";

pub fn render(inc: &Incident, anchor: &WallAnchor) -> String {
    let mut s = String::new();
    if inc.record_type == "incident_update" {
        return render_update(inc, anchor);
    }
    let sender = if inc.sender.pid == 0 {
        format!("kernel ({:?} code {:#x})", inc.origin, inc.si_code).to_lowercase()
    } else {
        format!("{}[{}]", inc.sender.comm, inc.sender.pid)
    };
    let threads = match inc.target.threads {
        1 => "1 thread".to_string(),
        n => format!("{n} threads"),
    };
    let _ = writeln!(
        s,
        "{}  {:<8} {} -> {}[{}] ({threads})",
        anchor.format_local(inc.t_signal_ns),
        inc.signal_name,
        sender,
        inc.target.comm,
        inc.target.pid,
    );
    let mut steps = Vec::new();
    // A thread can leave the group's live count before another one's exit tracepoint fires,
    // so "all exited" is the latest exit seen, which may come after the group-dead one.
    if let Some(dead) = inc.t_group_dead_ns {
        let dead = inc
            .exits
            .iter()
            .map(|x| x.t_ns)
            .max()
            .unwrap_or(dead)
            .max(dead);
        let how = match &inc.exit {
            Some(e) if e.signal.is_some() => String::new(),
            Some(e) => format!(" (exit status {})", e.status.unwrap_or(0)),
            None => String::new(),
        };
        steps.push(format!(
            "+{} all threads exited{how}",
            ms(inc.ms_after_signal(dead))
        ));
    }
    if let Some(z) = inc.t_zombie_ns {
        steps.push(format!("zombie +{}", ms(inc.ms_after_signal(z))));
    }
    match (inc.t_reaped_ns, &inc.reaper) {
        (Some(t), Some(r)) if r.how == ReapHow::Wait => steps.push(format!(
            "reaped +{} by {}[{}]",
            ms(inc.ms_after_signal(t)),
            r.comm.as_deref().unwrap_or("?"),
            r.pid.unwrap_or(0)
        )),
        (Some(t), _) => steps.push(format!("freed by +{}", ms(inc.ms_after_signal(t)))),
        (None, _) if inc.outcome == Outcome::Exited => steps.push("not reaped yet".into()),
        _ => {}
    }
    match inc.outcome {
        Outcome::Survived => steps.push(if inc.handled() {
            "survived: the signal was handled".into()
        } else {
            "survived: the signal was ignored or blocked".into()
        }),
        Outcome::Pending => steps.push("still alive when tracing stopped".into()),
        Outcome::Exited => {}
    }
    if inc.repeats > 0 {
        steps.push(format!("{} more fatal signal(s) meanwhile", inc.repeats));
    }
    let _ = writeln!(s, "{INDENT}{}", steps.join(" · "));
    if let Some(gpu) = &inc.gpu {
        render_gpu(&mut s, inc, gpu, anchor);
    }
    render_phases(&mut s, inc);
    if let Some(r) = &inc.release {
        let calls: Vec<String> = r
            .functions
            .iter()
            .map(|f| format!("{} {}", f.function, ms(f.ns as f64 / 1e6)))
            .collect();
        let _ = writeln!(
            s,
            "{INDENT}driver release +{} → +{}: {}",
            ms(inc.ms_after_signal(r.start_ns)),
            ms(inc.ms_after_signal(r.end_ns)),
            calls.join(" · ")
        );
    }

    if let Some(v) = &inc.verdict {
        let kind = serde_json::to_value(v.kind)
            .ok()
            .and_then(|k| k.as_str().map(String::from))
            .unwrap_or_default();
        let _ = writeln!(s, "{INDENT}verdict: {kind} — {}", v.hint);
        if v.kind != VerdictKind::Released && v.kind != VerdictKind::SlowTeardown {
            for e in &v.evidence {
                let _ = writeln!(s, "{INDENT}  {e}");
            }
        }
    }
    for f in &inc.collateral {
        let _ = writeln!(
            s,
            "{INDENT}collateral: pid {} was refused {} of class {} ({}) at +{}",
            f.pid,
            gib(f.size),
            f.class,
            f.status,
            ms(inc.ms_after_signal(f.t_ns))
        );
    }
    s
}

/// `released: UVM teardown 52 ms (GSP waits 41 ms) · RM client 43 ms · mm 33 ms`, with a bar.
fn render_phases(s: &mut String, inc: &Incident) {
    let total: u64 = inc.phases.iter().map(|p| p.ns).sum();
    if total == 0 {
        return;
    }
    let parts: Vec<String> = inc
        .phases
        .iter()
        .map(|p| {
            let gsp = match p.gsp_ns {
                0 => String::new(),
                g => format!(" (GSP waits {})", ms(g as f64 / 1e6)),
            };
            format!("{} {}{gsp}", p.name.label(), ms(p.ns as f64 / 1e6))
        })
        .collect();
    let _ = writeln!(s, "{INDENT}teardown: {}", parts.join(" · "));
    for p in &inc.phases {
        let share = p.ns as f64 / total as f64;
        let bar = "█".repeat((share * 40.0).round() as usize);
        let _ = writeln!(
            s,
            "{INDENT}  {:<13}{:>9} {:>5.1}% {bar}",
            p.name.label(),
            ms(p.ns as f64 / 1e6),
            share * 100.0
        );
    }
}

fn render_gpu(s: &mut String, inc: &Incident, gpu: &GpuImpact, anchor: &WallAnchor) {
    let nvml = match gpu.bytes_nvml {
        Some(0) if gpu.nvml_used_before.is_none() => "NVML lists no memory for this pid".into(),
        Some(b) => format!("NVML {}", gib(b)),
        None => "no NVML".into(),
    };
    // The ledger only knows what was allocated while tracing.
    let ledger = if gpu.bytes_ledger == 0 && gpu.bytes_nvml.is_some_and(|b| b > 0) {
        "ledger: allocated before tracing began".to_string()
    } else {
        format!("ledger {} B video", gpu.bytes_ledger)
    };
    let _ = writeln!(
        s,
        "{INDENT}GPU  {} ({ledger}; {nvml}) in {} GPU file descriptor(s)",
        gib(gpu.bytes_ledger.max(gpu.bytes_nvml.unwrap_or(0))),
        gpu.files.len(),
    );
    let mut steps = Vec::new();
    if let Some(t) = gpu.t_memory_back_ns {
        steps.push(format!("memory back at +{}", ms(inc.ms_after_signal(t))));
    }
    // When others held the files, or NVML cannot tell, the last holder's end is the news.
    if let Some(t) = gpu.t_files_released_ns {
        if !inc.holders.is_empty() || gpu.t_memory_back_ns.is_none() {
            steps.push(format!(
                "last holder of its GPU files gone at +{}",
                ms(inc.ms_after_signal(t))
            ));
        }
    }
    if gpu.t_memory_back_ns.is_none() && inc.t_group_dead_ns.is_some() {
        if gpu.t_files_released_ns.is_none() && !inc.holders.is_empty() {
            steps.push("memory still in use: other processes hold its GPU files".to_string());
        } else if gpu.nvml_used_before.is_some() {
            steps.push("NVML did not show the memory back".to_string());
        }
    }
    if !steps.is_empty() {
        let _ = writeln!(s, "{INDENT}{}", steps.join(" · "));
    }
    for h in &inc.holders {
        let how = match h.how {
            How::Fork { from, t_ns } => {
                format!("forked from {from} at {}", anchor.format_local(t_ns))
            }
            How::SharedTable { from, .. } => format!("shares the descriptor table of {from}"),
            How::Snapshot => "held before tracing began".into(),
            How::Open { .. } | How::Dup { .. } | How::Seen { .. } => {
                "holds the same open file".into()
            }
        };
        // A child of the dead target was reparented; its new parent is not in the stream.
        let parent = if h.ppid == inc.target.pid {
            "reparented when its parent died".to_string()
        } else {
            format!("ppid {}", h.ppid)
        };
        let _ = writeln!(
            s,
            "{INDENT}holder {}[{}] ({how}; {parent}) holds fds {:?}",
            h.comm, h.pid, h.fds
        );
    }
}

/// The memory of an incident reported as lingering came back.
fn render_update(inc: &Incident, anchor: &WallAnchor) -> String {
    let gpu = inc.gpu.as_ref();
    let back = gpu.and_then(|g| g.t_memory_back_ns.or(g.t_files_released_ns));
    let when = back.map_or("?".into(), |t| anchor.format_local(t));
    let after = back.map_or("?".into(), |t| ms(inc.ms_after_signal(t)));
    let holders: Vec<String> = inc
        .holders
        .iter()
        .map(|h| format!("{}[{}]", h.comm, h.pid))
        .collect();
    format!(
        "{when}  update   {}[{}] (incident {}): GPU memory back {after} after the kill, once {} let go\n",
        inc.target.comm,
        inc.target.pid,
        inc.id,
        if holders.is_empty() { "its last holder".to_string() } else { holders.join(", ") }
    )
}

/// Bytes as GiB with one decimal (MiB below 1 GiB).
fn gib(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if bytes as f64 >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.1} ms")
    }
}
