//! The rules where others hold the memory: the dead process's files, its imported memory,
//! or, without driver calls, an import that cannot be told from other jobs' allocations.

use super::{
    facts::{Context, Facts},
    gib, Verdict, VerdictKind,
};
use crate::analysis::{
    holders::{Holder, How},
    incident::Incident,
    memory::ImportVia,
};

/// Other live processes hold its GPU files: known ones, or references no known holder accounts
/// for (where nobody imported its memory either). Holders that were dying themselves (killed
/// beside it) let go with their own exit: the memory's return is timed as usual.
pub(super) fn shared_fd(f: &Facts) -> Option<Verdict> {
    let alive: Vec<&Holder> = f
        .fd_holders
        .iter()
        .filter(|h| h.t_dead_ns.is_none())
        .copied()
        .collect();
    let unaccounted = (f.gpu.unaccounted_references > 0).then(|| {
        format!(
            "{} reference(s) to its GPU files are held outside it through descriptors linger has \
             not seen: by a process it has not found (a descriptor received over a unix socket \
             or taken with pidfd_getfd is seen by no hook){}; the processes holding GPU files \
             are walked to find them",
            f.gpu.unaccounted_references,
            if alive.is_empty() {
                ""
            } else {
                ", or by the holders above"
            }
        )
    });
    (!alive.is_empty() || (f.importers.is_empty() && unaccounted.is_some()))
        .then(|| shared_fd_verdict(&alive, unaccounted))
}

/// Other processes imported part of its memory and hold it.
pub(super) fn imported(f: &Facts) -> Option<Verdict> {
    (!f.importers.is_empty()).then(|| imported_verdict(f.inc, &f.importers, f.cx))
}

/// Without driver calls, other processes' NVML figures rose as it left NVML's list.
pub(super) fn ambiguous(f: &Facts) -> Option<Verdict> {
    (!f.cx.ambiguous.is_empty()).then(|| ambiguous_verdict(f.inc, &f.cx.ambiguous))
}

/// Other processes hold its GPU files (known ones, or references nobody known accounts for).
fn shared_fd_verdict(fd_holders: &[&Holder], unaccounted: Option<String>) -> Verdict {
    let mut evidence: Vec<String> = fd_holders
        .iter()
        .map(|h| match h.t_killed_ns {
            Some(_) => format!(
                "{}[{}] holds fds {:?} ({}), killed with it and not dead yet",
                h.comm,
                h.pid,
                h.fds,
                how(h)
            ),
            None => format!("{}[{}] holds fds {:?} ({})", h.comm, h.pid, h.fds, how(h)),
        })
        .collect();
    evidence.extend(unaccounted);
    if fd_holders.is_empty() {
        return Verdict {
            kind: VerdictKind::SharedFd,
            evidence,
            hint: "the memory is freed when the last holder closes the files; `linger \
                   holders` lists who holds GPU files now"
                .into(),
        };
    }
    // Only a holder that still holds the files and was not killed is one to kill.
    let pids = |which: fn(&Holder) -> bool| -> Vec<String> {
        fd_holders
            .iter()
            .filter(|h| which(h))
            .map(|h| h.pid.to_string())
            .collect()
    };
    let to_kill = pids(|h| h.t_killed_ns.is_none() && h.t_released_ns.is_none());
    let killed = pids(|h| h.t_killed_ns.is_some() && h.t_released_ns.is_none());
    // A holder killed with it is no process to kill again: it cannot die yet.
    let dying = (!killed.is_empty()).then(|| {
        format!(
            "{} killed with it and not dead yet: a thread blocked uninterruptibly cannot \
             die (its own incident says where)",
            killed.join(", ")
        )
    });
    let hint = match (to_kill.is_empty(), dying) {
        (false, dying) => format!(
            "the memory is freed when the last holder closes the files: kill {} (or have \
             children close GPU descriptors; start DataLoader workers with the spawn \
             method){}",
            to_kill.join(", "),
            dying.map(|d| format!("; {d}")).unwrap_or_default()
        ),
        (true, Some(dying)) => {
            format!("the memory is freed when the last holder's exit closes the files; {dying}")
        }
        (true, None) => "the memory was freed when the last holder let go of the files: have \
                         children close GPU descriptors (start DataLoader workers with the \
                         spawn method)"
            .into(),
    };
    Verdict {
        kind: VerdictKind::SharedFd,
        evidence,
        hint,
    }
}

/// Other processes imported part of its memory: who holds how much, and how it was seen; or,
/// where NVML alone says so against the traced driver calls, that the sources disagree.
fn imported_verdict(inc: &Incident, importers: &[&Holder], cx: &Context) -> Verdict {
    if importers.iter().all(|h| cx.unreconciled.contains(&h.pid)) {
        return unreconciled(inc, importers);
    }
    let evidence = importers
        .iter()
        .map(|h| match h.how {
            How::Import { bytes, via, .. } => format!(
                "{}[{}] holds {} it imported ({})",
                h.comm,
                h.pid,
                gib(bytes),
                match via {
                    ImportVia::DupObject => "RM_DUP_OBJECT of its memory: a CUDA IPC handle",
                    ImportVia::FdImport => "objects imported from a file descriptor it exported",
                    ImportVia::Nvml => "NVML accounts it to that pid now; no ioctl evidence",
                }
            ),
            _ => String::new(),
        })
        .collect();
    let pids: Vec<String> = importers.iter().map(|h| h.pid.to_string()).collect();
    Verdict {
        kind: VerdictKind::Imported,
        evidence,
        hint: format!(
            "the importer keeps it until it frees the handle or exits: stop {} or have it \
             release the shared tensor",
            pids.join(", ")
        ),
    }
}

/// NVML charges the memory to processes whose traced driver calls show no import of it.
fn unreconciled(inc: &Incident, importers: &[&Holder]) -> Verdict {
    let evidence = importers
        .iter()
        .map(|h| {
            format!(
                "NVML's figure for {}[{}] rose by {} as pid {} left its list, but its driver \
                 calls, which linger traces, show no import of pid {}'s objects and nothing of \
                 its own that explains the rise: NVML and the driver calls disagree",
                h.comm,
                h.pid,
                gib(match h.how {
                    How::Import { bytes, .. } => bytes,
                    _ => 0,
                }),
                inc.target.pid,
                inc.target.pid
            )
        })
        .collect();
    Verdict {
        kind: VerdictKind::Incomplete,
        evidence,
        hint: "linger cannot tell whether that process holds the memory or NVML has not matched \
               its own allocation yet: `linger holders` and nvidia-smi show who holds what now"
            .into(),
    }
}

/// Without driver calls, NVML's figures cannot tell an import of the target's memory from
/// other jobs' allocations at the same moment, or from an import of another victim's leaving
/// NVML's list with it.
fn ambiguous_verdict(inc: &Incident, rose: &[(u32, String, u64)]) -> Verdict {
    let who: Vec<String> = rose
        .iter()
        .map(|(pid, comm, bytes)| format!("{comm}[{pid}] by {}", gib(*bytes)))
        .collect();
    Verdict {
        kind: VerdictKind::Incomplete,
        evidence: vec![format!(
            "as pid {} left NVML's list, NVML's figures rose for {}, with other processes \
             rising or other victims leaving at the same time: without driver calls (--lean), \
             an import of its memory cannot be told from those processes' own allocations or \
             from an import of another victim's",
            inc.target.pid,
            who.join(", ")
        )],
        hint: "run linger without --lean on a busy node: its driver calls show imports; \
               `linger holders` and nvidia-smi show who holds what now"
            .into(),
    }
}

fn how(h: &Holder) -> &'static str {
    match h.how {
        How::Open { .. } => "opened the device itself",
        How::Dup { .. } => "dup",
        How::Fork { .. } => "inherited at fork",
        How::SharedTable { .. } => "shares the descriptor table",
        How::Snapshot => "held before tracing began",
        How::Seen { .. } => {
            "found in its descriptor table: it got them in a way no hook sees (a unix socket, \
             pidfd_getfd)"
        }
        How::Import { .. } => "imported",
    }
}
