//! The human report: incidents, their updates, and signals a process survived.

use std::fmt::Write as _;

use super::text_line::{e, INDENT};
use super::text_records as records;

use crate::{
    analysis::{
        holders::How,
        incident::{Action, GpuImpact, GpuPart, Incident, Outcome, ReapHow, Source},
        memory::ImportVia,
        termination::{self, Mode},
        verdict::{gib, VerdictKind},
        Output, SignalNotice,
    },
    clock::WallAnchor,
    event::LossKind,
};

pub fn render(out: &Output, anchor: &WallAnchor) -> String {
    match out {
        Output::Incident(inc) if inc.record_type == "incident_update" => render_update(inc, anchor),
        Output::Incident(inc) => render_incident(inc, anchor),
        Output::Signal(n) => render_notice(n, anchor),
        Output::GpuError(r) => records::gpu_error(&r.error, anchor),
        Output::Stuck(r) => records::stuck(r, anchor),
        Output::Unheld(r) => records::unheld(r, anchor),
    }
}

fn render_incident(inc: &Incident, anchor: &WallAnchor) -> String {
    let mut s = String::new();
    render_headline(&mut s, inc, anchor);
    let t = &inc.termination;
    if t.signals.len() > 1 || matches!(t.mode, Mode::Escalated | Mode::Term | Mode::Oom) {
        let _ = writeln!(s, "{INDENT}termination: {}", e(&termination::describe(t)));
    }
    let _ = writeln!(s, "{INDENT}{}", steps(inc).join(" · "));
    for x in &inc.gpu_errors {
        let _ = writeln!(
            s,
            "{INDENT}gpu error: {} at {:+.1} ms: {}",
            x.describe(),
            x.at_ms.unwrap_or(0.0),
            e(&x.message)
        );
    }
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
    if let Some(storm) = &inc.storm {
        let back = storm.t_device_back_ns.map_or("not back yet".into(), |t| {
            format!("all back at +{}", ms(inc.ms_after_signal(t)))
        });
        let _ = writeln!(
            s,
            "{INDENT}storm: {} teardowns overlapped on GPU{} (used {} before the first); {back}",
            storm.incidents,
            storm.gpu,
            gib(storm.used_before)
        );
    }
    render_verdict(&mut s, inc);
    render_caveats(&mut s, inc);
    s
}

/// The signal (or exit), who sent it to whom, and the termination's mode.
fn render_headline(s: &mut String, inc: &Incident, anchor: &WallAnchor) {
    let threads = match inc.target.threads {
        1 => "1 thread".to_string(),
        n => format!("{n} threads"),
    };
    let from = match &inc.sender {
        Some(snd) if snd.pid == 0 => format!(
            "{} -> ",
            format!("kernel ({:?} code {:#x})", inc.origin, inc.si_code).to_lowercase()
        ),
        Some(snd) => format!("{}[{}] -> ", e(&snd.comm), snd.pid),
        None => String::new(),
    };
    let headline = match inc.termination.mode {
        Mode::Exit => "EXIT".to_string(),
        _ => inc.signal_name.clone(),
    };
    let _ = writeln!(
        s,
        "{}  {:<8} {from}{}[{}] ({threads}) · {}",
        anchor.format_local(inc.t_signal_ns),
        headline,
        e(&inc.target.comm),
        inc.target.pid,
        inc.termination.mode.label(),
    );
}

/// The verdict with its hint, and its evidence where the lines above do not show it.
fn render_verdict(s: &mut String, inc: &Incident) {
    if let Some(v) = &inc.verdict {
        let kind = serde_json::to_value(v.kind)
            .ok()
            .and_then(|k| k.as_str().map(String::from))
            .unwrap_or_default();
        let _ = writeln!(s, "{INDENT}verdict: {kind} — {}", e(&v.hint));
        // Holders and importers are listed above already.
        let listed = matches!(v.kind, VerdictKind::SharedFd | VerdictKind::Imported);
        if !listed && v.kind != VerdictKind::Released && v.kind != VerdictKind::SlowTeardown {
            for line in &v.evidence {
                let _ = writeln!(s, "{INDENT}  {}", e(line));
            }
        }
    }
}

/// What this incident hurt or could not see: collateral failures, what the mode leaves
/// unseen, what the kernel lost meanwhile.
fn render_caveats(s: &mut String, inc: &Incident) {
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
    if !inc.unseen.is_empty() {
        let _ = writeln!(
            s,
            "{INDENT}not seen in this mode: {}",
            unseen_subjects(&inc.unseen)
        );
    }
    let (stacks, facts): (Vec<_>, Vec<_>) =
        inc.losses.iter().partition(|l| l.what == LossKind::Stacks);
    if !facts.is_empty() {
        let lost: Vec<String> = facts
            .iter()
            .map(|l| format!("{} {}", l.count, l.what.name()))
            .collect();
        let _ = writeln!(
            s,
            "{INDENT}the kernel lost records meanwhile: {}; facts may be missing",
            lost.join(", ")
        );
    }
    if let Some(l) = stacks.first() {
        let _ = writeln!(
            s,
            "{INDENT}{} kernel stack(s) could not be kept meanwhile: the phases may miss some time",
            l.count
        );
    }
}

/// Exits, zombie and reap, in order.
fn steps(inc: &Incident) -> Vec<String> {
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
            e(r.comm.as_deref().unwrap_or("?")),
            r.pid.unwrap_or(0)
        )),
        (Some(t), Some(r)) if r.how == ReapHow::Parent => steps.push(format!(
            "reaped by its parent {}[{}] between +{} and +{}",
            e(r.comm.as_deref().unwrap_or("?")),
            r.pid.unwrap_or(0),
            ms(inc.ms_after_signal(inc.t_zombie_ns.unwrap_or(t))),
            ms(inc.ms_after_signal(t))
        )),
        (Some(t), _) => steps.push(format!("freed by +{}", ms(inc.ms_after_signal(t)))),
        (None, _) if inc.outcome == Outcome::Exited => steps.push("reap not seen yet".into()),
        _ => {}
    }
    if inc.outcome == Outcome::Pending {
        steps.push("still alive".into());
    }
    steps
}

/// `teardown: UVM teardown 52 ms (GSP waits 41 ms) · RM client 43 ms · mm 33 ms`, with bars.
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
    let coverage = inc.phases_coverage.map_or(String::new(), |c| {
        format!(" ({:.0}% of death to release)", c * 100.0)
    });
    let _ = writeln!(s, "{INDENT}teardown: {}{coverage}", parts.join(" · "));
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

/// One GPU's line of an incident on several.
fn render_gpu_part(s: &mut String, inc: &Incident, part: &GpuPart) {
    let name = match (part.index, part.minor) {
        (Some(i), _) => format!("GPU{i}"),
        (None, Some(m)) => format!("/dev/nvidia{m}"),
        (None, None) => "GPU?".into(),
    };
    let mut facts = vec![gib(part.share_bytes)];
    if let Some(b) = part.bytes_nvml {
        facts.push(format!("NVML {}", gib(b)));
    }
    if let Some(b) = part.bytes_ledger {
        facts.push(format!("ledger {}", gib(b)));
    }
    if !part.fds.is_empty() {
        let fds: Vec<String> = part.fds.iter().map(i32::to_string).collect();
        facts.push(format!("fd {}", fds.join(",")));
    }
    match part.t_memory_back_ns {
        Some(t) => facts.push(format!("back at +{}", ms(inc.ms_after_signal(t)))),
        None if part.index.is_some() && inc.t_group_dead_ns.is_some() => facts.push(format!(
            "still held: {} of {} back",
            gib(part.released_bytes),
            gib(part.share_bytes)
        )),
        None => {}
    }
    let _ = writeln!(s, "{INDENT}  {name:<6} {}", facts.join(" · "));
}

fn render_gpu(s: &mut String, inc: &Incident, gpu: &GpuImpact, anchor: &WallAnchor) {
    let nvml = match gpu.bytes_nvml {
        Some(b) => format!("NVML {}", gib(b)),
        None if gpu.nvml_used_before.is_some() => "NVML never listed it".into(),
        None => "no NVML figure".into(),
    };
    // The ledger only knows what was allocated while tracing.
    let ledger = if gpu.bytes_ledger == 0 && gpu.bytes_nvml.is_some_and(|b| b > 0) {
        "ledger: allocated before tracing began".to_string()
    } else {
        format!("ledger {} B video", gpu.bytes_ledger)
    };
    if gpu.share_from == "none" && !gpu.evidence.is_empty() {
        // No memory of its own: say whose it is.
        let _ = writeln!(
            s,
            "{INDENT}GPU  {} GPU file descriptor(s): {}",
            gpu.files.len(),
            e(&gpu.evidence[0])
        );
    } else {
        let _ = writeln!(
            s,
            "{INDENT}GPU  {} ({nvml}; {ledger}) in {} GPU file descriptor(s)",
            gib(gpu.share_bytes),
            gpu.files.len(),
        );
    }
    if gpu.gpus.len() > 1 {
        for part in &gpu.gpus {
            render_gpu_part(s, inc, part);
        }
    }
    let steps = gpu_steps(inc, gpu);
    if !steps.is_empty() {
        let _ = writeln!(s, "{INDENT}{}", steps.join(" · "));
    }
    render_holders(s, inc, anchor);
}

/// When the memory came back (`back`, after the signal): `at` it where the moment is known
/// to 2 ms, else between the last moment it was seen held and that bound.
fn when_back(inc: &Incident, gpu: &GpuImpact, back: u64, at: &str) -> String {
    match (gpu.known_moment(), gpu.t_memory_held_until_ns) {
        (None, Some(held)) => format!(
            "between +{} and +{}",
            ms(inc.ms_after_signal(held)),
            ms(inc.ms_after_signal(back))
        ),
        _ => format!("{at}+{}", ms(inc.ms_after_signal(back))),
    }
}

/// When the memory and the files came back, or that they have not.
fn gpu_steps(inc: &Incident, gpu: &GpuImpact) -> Vec<String> {
    let mut steps = Vec::new();
    match (gpu.t_memory_back_ns, gpu.memory_back_by) {
        (Some(t), by) => {
            let by = match by {
                Some(Source::Nvml) => "NVML",
                Some(Source::Confirmed) => "kernel; NVML no longer lists it",
                _ => "kernel: no NVML to confirm",
            };
            steps.push(format!(
                "memory back {} ({by})",
                when_back(inc, gpu, t, "at ")
            ));
        }
        (None, _) if inc.t_group_dead_ns.is_some() => {
            let held = if gpu.released_bytes > 0 {
                format!(
                    "memory still held: {} of {} back",
                    gib(gpu.released_bytes),
                    gib(gpu.share_bytes)
                )
            } else {
                "memory still held".into()
            };
            steps.push(held)
        }
        _ => {}
    }
    if let (Some(t), Some(by)) = (gpu.t_files_released_ns, gpu.files_released_by) {
        let how = match by {
            Source::Fput => "__fput",
            Source::Exited => "by its exit",
            Source::LeftDriver => "leaving the driver",
            _ => "by its zombie",
        };
        steps.push(format!(
            "its files released +{} ({how})",
            ms(inc.ms_after_signal(t))
        ));
    }
    if let Some(h) = gpu.held_elsewhere_ns {
        steps.push(format!("held by others {} after", ms(h as f64 / 1e6)));
    }
    if inc.lingering {
        steps.push("lingering".into());
    }
    steps
}

/// Who else holds the dead process's files or memory, and how they got them.
fn render_holders(s: &mut String, inc: &Incident, anchor: &WallAnchor) {
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
            How::Import { bytes, via, .. } => {
                let via = match via {
                    ImportVia::DupObject => "RM_DUP_OBJECT: a CUDA IPC handle",
                    ImportVia::FdImport => "imported from an exported file descriptor",
                    ImportVia::Nvml => "by NVML's figures only",
                };
                let released = h.t_released_ns.map_or(String::new(), |t| {
                    format!(", let go at +{}", ms(inc.ms_after_signal(t)))
                });
                let _ = writeln!(
                    s,
                    "{INDENT}importer {}[{}] holds {} of its memory ({via}){released}",
                    e(&h.comm),
                    h.pid,
                    gib(bytes)
                );
                continue;
            }
        };
        // A child of the dead target was reparented; its new parent is not in the stream.
        let parent = if h.ppid == inc.target.pid {
            "reparented when its parent died".to_string()
        } else {
            format!("ppid {}", h.ppid)
        };
        let released = h.t_released_ns.map_or(String::new(), |t| {
            format!("; let go at +{}", ms(inc.ms_after_signal(t)))
        });
        // The driver's open hook sees the file before its descriptor number exists.
        let fds = if h.fds.is_empty() {
            "its files (descriptor numbers not seen)".to_string()
        } else {
            format!("fds {}", fd_ranges(&h.fds))
        };
        let _ = writeln!(
            s,
            "{INDENT}holder {}[{}] ({how}; {parent}) holds {fds}{released}",
            e(&h.comm),
            h.pid,
        );
    }
}

/// What changed about an incident already reported.
fn render_update(inc: &Incident, anchor: &WallAnchor) -> String {
    let gpu = inc.gpu.as_ref();
    let back = gpu.and_then(|g| g.t_memory_back_ns);
    let when = anchor.format_local(back.unwrap_or_else(|| {
        inc.holders
            .iter()
            .filter_map(|h| h.t_released_ns)
            .max()
            .unwrap_or(inc.t_signal_ns)
    }));
    let who = format!(
        "{}[{}] (incident {})",
        e(&inc.target.comm),
        inc.target.pid,
        inc.id
    );
    let after = if inc.signal == 0 {
        "the exit"
    } else {
        "the kill"
    };
    // With the memory back, "once ... let go" below says who went.
    let mut parts: Vec<String> = inc
        .changes
        .iter()
        .filter(|c| c.as_str() != "memory back" && (back.is_none() || !c.starts_with("let go")))
        .map(|c| e(c).into_owned())
        .collect();
    if let (Some(b), Some(g)) = (back, gpu) {
        let holders: Vec<String> = inc
            .holders
            .iter()
            .map(|h| format!("{}[{}]", e(&h.comm), h.pid))
            .collect();
        let once = if holders.is_empty() {
            String::new()
        } else {
            format!(", once {} let go", holders.join(", "))
        };
        let when = when_back(inc, g, b, "");
        parts.push(format!("GPU memory back {when} after {after}{once}"));
    } else if let Some(g) = gpu {
        let still: Vec<String> = inc
            .holders
            .iter()
            .filter(|h| h.t_released_ns.is_none())
            .map(|h| format!("{}[{}]", e(&h.comm), h.pid))
            .collect();
        let by = if still.is_empty() {
            String::new()
        } else {
            format!(" by {}", still.join(", "))
        };
        if g.share_from == "none" {
            parts.push(format!("still held{by}"));
        } else {
            parts.push(format!(
                "still held{by}: {} of {} back",
                gib(g.released_bytes),
                gib(g.share_bytes)
            ));
        }
    }
    if let Some(v) = &inc.verdict {
        let kind = serde_json::to_value(v.kind)
            .ok()
            .and_then(|k| k.as_str().map(String::from))
            .unwrap_or_default();
        parts.push(format!("verdict {kind}"));
    }
    format!("{when}  update   {who}: {}\n", parts.join(" · "))
}

fn render_notice(n: &SignalNotice, anchor: &WallAnchor) -> String {
    let s = &n.signal;
    let sender = if s.sender.pid == 0 {
        "kernel".to_string()
    } else {
        format!("{}[{}]", e(&s.sender.comm), s.sender.pid)
    };
    let how = match (s.discarded, s.action) {
        (true, _) => "ignored: discarded by the kernel",
        (false, Some(Action::Ignore)) => "ignored",
        (false, Some(Action::Handler)) => "handled",
        (false, Some(Action::Default)) => "default action taken",
        (false, None) => "still pending: blocked, or the process is stopped",
    };
    let gpu = if n.gpu_holder { " · GPU holder" } else { "" };
    format!(
        "{}  {:<8} {sender} -> {}[{}]: survived {} ({how}){gpu}; its death soon after would be \
         incident {}\n",
        anchor.format_local(s.t_ns),
        s.name,
        e(&n.target.comm),
        n.target.pid,
        ms(n.survived_ns as f64 / 1e6),
        n.incident
    )
}

/// `[8-14, 17, 22-24]`.
fn fd_ranges(fds: &[i32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < fds.len() {
        let start = fds[i];
        let mut end = start;
        while i + 1 < fds.len() && fds[i + 1] == end + 1 {
            i += 1;
            end = fds[i];
        }
        parts.push(if end > start {
            format!("{start}-{end}")
        } else {
            start.to_string()
        });
        i += 1;
    }
    format!("[{}]", parts.join(", "))
}

/// What each `unseen` entry is about (its text before the colon), for one line; the JSON
/// output has the whole entries, with how the answer is still obtained.
fn unseen_subjects(unseen: &[String]) -> String {
    let subjects: Vec<&str> = unseen
        .iter()
        .map(|u| u.split_once(':').map_or(u.as_str(), |(subject, _)| subject))
        .collect();
    e(&subjects.join("; ")).into_owned()
}

fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.1} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::incident::Target;

    const GIB: u64 = 1 << 30;

    /// What the recording's mode did not see is said from its own list, not as `--lean`'s.
    #[test]
    fn an_incident_says_what_its_mode_did_not_see() {
        let unseen = |list: &[&str]| {
            unseen_subjects(&list.iter().map(|u| u.to_string()).collect::<Vec<_>>())
        };
        let library = unseen(&crate::event::BY_LIBRARY_UNSEEN);
        assert!(library.starts_with("opens, dups, closes and ioctls of GPU files made outside the NVIDIA libraries hooked; closes of GPU descriptors by the program itself (not the library); wait4"), "{library}");
        assert!(!library.contains("no ledger"), "{library}");
        let lean = unseen(&crate::event::LEAN_UNSEEN);
        assert!(
            lean.starts_with("GPU ioctls; opens, dups and closes of GPU files; wait4"),
            "{lean}"
        );
    }

    /// A moment known to 2 ms is said as one; a bound as the window from the last moment
    /// the memory was seen held.
    #[test]
    fn a_bound_is_said_as_the_window_it_leaves() {
        let target = Target {
            pid: 10,
            comm: "python3".into(),
            threads: 1,
            workload: None,
        };
        let inc = Incident::new(1, target, 1_000_000_000);
        let mut gpu = GpuImpact {
            t_memory_back_ns: Some(1_040_000_000),
            t_memory_held_until_ns: Some(1_010_000_000),
            ..Default::default()
        };
        assert_eq!(
            when_back(&inc, &gpu, 1_040_000_000, "at "),
            "between +10.0 ms and +40.0 ms"
        );
        gpu.memory_back_known_to_ns = Some(100_000);
        assert_eq!(when_back(&inc, &gpu, 1_040_000_000, "at "), "at +40.0 ms");
    }

    /// Memory on two GPUs, GPU0's part back and GPU1's held: a line for each.
    #[test]
    fn an_incident_on_two_gpus_has_a_line_per_gpu() {
        let target = Target {
            pid: 10,
            comm: "python3".into(),
            threads: 1,
            workload: None,
        };
        let mut inc = Incident::new(1, target, 1_000_000_000);
        inc.t_group_dead_ns = Some(1_001_000_000);
        let part = |index, minor, share, back: Option<u64>, fds: &[i32]| GpuPart {
            index: Some(index),
            minor: Some(minor),
            share_bytes: share,
            released_bytes: if back.is_some() { share } else { 0 },
            t_memory_back_ns: back,
            fds: fds.to_vec(),
            ..Default::default()
        };
        inc.gpu = Some(GpuImpact {
            index: Some(0),
            share_bytes: 12 * GIB,
            share_from: "nvml",
            released_bytes: 4 * GIB,
            gpus: vec![
                part(0, 0, 4 * GIB, Some(1_150_000_000), &[11, 12]),
                GpuPart {
                    bytes_ledger: Some(8 * GIB),
                    ..part(1, 1, 8 * GIB, None, &[13])
                },
            ],
            ..Default::default()
        });
        let mut s = String::new();
        let gpu = inc.gpu.clone().expect("gpu");
        let anchor = WallAnchor {
            realtime_minus_boottime_ns: 0,
        };
        render_gpu(&mut s, &inc, &gpu, &anchor);
        let lines: Vec<&str> = s
            .lines()
            .filter(|l| l.contains("GPU0 ") || l.contains("GPU1 "))
            .collect();
        assert_eq!(lines.len(), 2, "{s}");
        assert!(
            lines[0].contains("GPU0") && lines[0].contains("fd 11,12"),
            "{s}"
        );
        assert!(lines[0].contains("back at +150"), "{s}");
        assert!(
            lines[1].contains("GPU1")
                && lines[1].contains("ledger 8.0 GiB")
                && lines[1].contains("still held"),
            "{s}"
        );
    }
}
