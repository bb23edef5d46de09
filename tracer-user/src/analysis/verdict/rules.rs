//! The rules that decide an incident's verdict, in order of precedence: the first that
//! applies decides. Who holds the memory comes before when it came back.

use super::{
    facts::{Context, Facts},
    gib, held, undead, Verdict, VerdictKind,
};
use crate::analysis::{
    holders::How,
    incident::{Incident, Source},
};

type Rule = fn(&Facts) -> Option<Verdict>;

const RULES: [Rule; 7] = [
    held::shared_fd,
    held::imported,
    held::ambiguous,
    not_back,
    lost_records,
    deferred_close,
    timed,
];

/// The verdict of an incident: None for a process that held no GPU memory.
pub fn decide(inc: &Incident, cx: &Context) -> Option<Verdict> {
    let Some(dead) = inc.t_group_dead_ns else {
        return Some(undead::undead(inc, cx));
    };
    let gpu = inc.gpu.as_ref()?;
    let (importers, fd_holders) = inc
        .holders
        .iter()
        .partition(|h| matches!(h.how, How::Import { .. }));
    let facts = Facts {
        inc,
        gpu,
        cx,
        dead,
        importers,
        fd_holders,
    };
    RULES.iter().find_map(|rule| rule(&facts))
}

/// The memory is not back: a teardown still under way, or, once NVML no longer lists the
/// process and nothing else is in flight, a holder linger cannot see.
fn not_back(f: &Facts) -> Option<Verdict> {
    if f.gpu.t_memory_back_ns.is_some() {
        return None;
    }
    let (inc, gpu, cx, dead) = (f.inc, f.gpu, f.cx, f.dead);
    let released = gpu.t_files_released_ns.is_some();
    if released && cx.still_listed == Some(false) && !cx.others_in_flight {
        if !cx.unknown_nvml_pids.is_empty() {
            return Some(Verdict {
                kind: VerdictKind::PidUnresolved,
                evidence: vec![format!(
                    "NVML lists pid(s) {:?} on the GPU, which no traced process matches",
                    cx.unknown_nvml_pids
                )],
                hint: "those pids live in another pid namespace or are gone; run linger on \
                       the host, or look them up with `linger holders`"
                    .into(),
            });
        }
        return Some(Verdict {
            kind: VerdictKind::UnknownHolder,
            evidence: vec![format!(
                "NVML no longer lists pid {}, but the device's used memory has not come down \
                 by its share ({} of {} back) {:.1} ms after its files were released",
                inc.target.pid,
                gib(gpu.released_bytes),
                gib(gpu.share_bytes),
                ms(cx
                    .now_ns
                    .saturating_sub(gpu.t_files_released_ns.unwrap_or(dead)))
            )],
            hint: "something outside linger's view keeps it: an importer seen by neither \
                   ioctls nor NVML, an MPS server, or a process in another namespace; see \
                   `linger holders`"
                .into(),
        });
    }
    Some(Verdict {
        kind: VerdictKind::SlowTeardown,
        evidence: vec![format!(
            "its teardown is still under way {:.0} ms after the group died",
            ms(cx.now_ns.saturating_sub(dead))
        )],
        hint: "large allocations, pinned host memory and other processes' teardowns \
               (lock waits) slow the driver; an update follows when the memory is back"
            .into(),
    })
}

/// Records that may have named a holder or a close were lost: the kernel's account of the
/// release cannot be trusted alone (lost stack samples only thin the teardown's phases).
fn lost_records(f: &Facts) -> Option<Verdict> {
    let hiding: Vec<_> = f
        .inc
        .losses
        .iter()
        .filter(|l| l.what.hides_holders())
        .collect();
    if hiding.is_empty() || f.gpu.memory_back_by == Some(Source::Nvml) {
        return None;
    }
    let lost: Vec<String> = hiding
        .iter()
        .map(|l| format!("{} {}", l.count, l.what.name()))
        .collect();
    Some(Verdict {
        kind: VerdictKind::Incomplete,
        evidence: vec![format!(
            "the kernel lost records while this was traced ({}); holders may be missing",
            lost.join(", ")
        )],
        hint: "raise --ring-size, or run linger where NVML can confirm the release".into(),
    })
}

/// The driver finished the release in one of its own threads.
fn deferred_close(f: &Facts) -> Option<Verdict> {
    let deferred = f.cx.deferral.as_ref()?;
    let took = f.gpu.t_memory_back_ns?.saturating_sub(f.dead);
    Some(Verdict {
        kind: VerdictKind::DeferredClose,
        evidence: vec![
            deferred.clone(),
            format!("memory back {:.1} ms after the group died", ms(took)),
        ],
        hint: "the driver finished the release in its own thread; repeated deferrals \
               point at a suspend/resume or a busy driver lock"
            .into(),
    })
}

/// The memory came back in its own teardown: in time, or after `slow_after`.
fn timed(f: &Facts) -> Option<Verdict> {
    let inc = f.inc;
    let back = f.gpu.t_memory_back_ns?;
    let took = back.saturating_sub(f.dead);
    let breakdown: Vec<String> = inc
        .phases
        .iter()
        .map(|p| match p.gsp_ns {
            0 => format!("{} {:.1} ms", p.name.label(), ms(p.ns)),
            g => format!(
                "{} {:.1} ms (GSP waits {:.1} ms)",
                p.name.label(),
                ms(p.ns),
                ms(g)
            ),
        })
        .collect();
    let dominant = inc.phases.first();
    let kind = if took > f.cx.slow_after_ns {
        VerdictKind::SlowTeardown
    } else {
        VerdictKind::Released
    };
    let hint = match (kind, dominant) {
        (VerdictKind::SlowTeardown, Some(p)) => format!(
            "teardown took {:.0} ms, mostly {}: large allocations, pinned host memory and GSP \
             firmware calls cost time; free GPU memory before exiting to shorten it",
            ms(took),
            p.name.label()
        ),
        (VerdictKind::SlowTeardown, None) => format!("teardown took {:.0} ms", ms(took)),
        _ => format!(
            "nothing to do: the memory was back {:.1} ms after {}",
            ms(back.saturating_sub(inc.t_signal_ns)),
            if inc.signal == 0 {
                "the exit"
            } else {
                "the kill"
            }
        ),
    };
    let mut evidence = breakdown;
    evidence.extend(f.fd_holders.iter().filter_map(|h| {
        let dead = h.t_dead_ns?;
        let when = match (dead <= f.dead, h.t_killed_ns) {
            (true, _) => format!("dead {:.1} ms before it", ms(f.dead - dead)),
            (false, Some(_)) => {
                format!("killed with it, dead {:.1} ms after it", ms(dead - f.dead))
            }
            (false, None) => format!("dead {:.1} ms after it", ms(dead - f.dead)),
        };
        Some(format!(
            "{}[{}], {when}, held its files until its own exit closed them{}",
            h.comm,
            h.pid,
            h.t_released_ns
                .map(|t| format!(" (+{:.1} ms)", ms(t.saturating_sub(f.dead))))
                .unwrap_or_default()
        ))
    }));
    Some(Verdict {
        kind,
        evidence,
        hint,
    })
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}
