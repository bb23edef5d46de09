//! Why the memory lingered (or did not): one primary verdict per incident, with its evidence
//! and what to do about it.

pub use super::incident::{Verdict, VerdictKind};
use super::{
    holders::{Holder, How},
    incident::{GpuImpact, Incident, Source},
    memory::ImportVia,
};

/// What the verdict needs beyond the incident itself.
pub struct Context {
    /// Evidence that the driver deferred the release to its own thread.
    pub deferral: Option<String>,
    /// Threads asleep when the incident closed: (tid, since, innermost frames).
    pub asleep: Vec<(u32, u64, Vec<String>)>,
    /// NVML pids on the target's GPUs that no traced process matches.
    pub unknown_nvml_pids: Vec<u32>,
    /// Importers only NVML suggests whose driver calls linger traces and sees no import in:
    /// the sources disagree.
    pub unreconciled: Vec<u32>,
    /// Without driver calls (`--lean`): the processes whose NVML figures rose as the target
    /// left the list (pid, comm, bytes), where other processes' rose at the same time.
    pub ambiguous: Vec<(u32, String, u64)>,
    /// Whether NVML still lists the target's pid (None without NVML).
    pub still_listed: Option<bool>,
    /// Other teardowns on its GPU are under way: NVML lags behind them.
    pub others_in_flight: bool,
    pub slow_after_ns: u64,
    pub now_ns: u64,
}

pub fn decide(inc: &Incident, cx: &Context) -> Option<Verdict> {
    let ms = |ns: u64| ns as f64 / 1e6;
    let Some(dead) = inc.t_group_dead_ns else {
        return undead(inc, cx);
    };
    let gpu = inc.gpu.as_ref()?;
    let (importers, fd_holders): (Vec<&Holder>, Vec<&Holder>) = inc
        .holders
        .iter()
        .partition(|h| matches!(h.how, How::Import { .. }));
    let unaccounted = (gpu.unaccounted_references > 0).then(|| {
        format!(
            "{} reference(s) to its GPU files are held outside it through descriptors linger has \
             not seen: by a process it has not found (a descriptor received over a unix socket \
             or taken with pidfd_getfd is seen by no hook){}; the processes holding GPU files \
             are walked to find them",
            gpu.unaccounted_references,
            if fd_holders.is_empty() {
                ""
            } else {
                ", or by the holders above"
            }
        )
    });
    if !fd_holders.is_empty() || (importers.is_empty() && unaccounted.is_some()) {
        return Some(shared_fd(&fd_holders, unaccounted));
    }
    if !importers.is_empty() {
        return Some(imported(inc, &importers, cx));
    }
    if !cx.ambiguous.is_empty() {
        return Some(ambiguous(inc, &cx.ambiguous));
    }
    let Some(back) = gpu.t_memory_back_ns else {
        return not_back(inc, gpu, cx, dead);
    };
    let took = back.saturating_sub(dead);
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
    // Records that may have named a holder or a close were lost: the kernel's account of the
    // release cannot be trusted alone (lost stack samples only thin the teardown's phases).
    let hiding: Vec<_> = inc
        .losses
        .iter()
        .filter(|l| l.what.hides_holders())
        .collect();
    if !hiding.is_empty() && gpu.memory_back_by != Some(Source::Nvml) {
        let lost: Vec<String> = hiding
            .iter()
            .map(|l| format!("{} {}", l.count, l.what.name()))
            .collect();
        return Some(Verdict {
            kind: VerdictKind::Incomplete,
            evidence: vec![format!(
                "the kernel lost records while this was traced ({}); holders may be missing",
                lost.join(", ")
            )],
            hint: "raise --ring-size, or run linger where NVML can confirm the release".into(),
        });
    }
    if let Some(deferred) = &cx.deferral {
        return Some(Verdict {
            kind: VerdictKind::DeferredClose,
            evidence: vec![
                deferred.clone(),
                format!("memory back {:.1} ms after the group died", ms(took)),
            ],
            hint: "the driver finished the release in its own thread; repeated deferrals \
                   point at a suspend/resume or a busy driver lock"
                .into(),
        });
    }
    let dominant = inc.phases.first();
    let kind = if took > cx.slow_after_ns {
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
    Some(Verdict {
        kind,
        evidence: breakdown,
        hint,
    })
}

/// Other processes hold its GPU files (known ones, or references nobody known accounts for).
fn shared_fd(fd_holders: &[&Holder], unaccounted: Option<String>) -> Verdict {
    let mut evidence: Vec<String> = fd_holders
        .iter()
        .map(|h| format!("{}[{}] holds fds {:?} ({})", h.comm, h.pid, h.fds, how(h)))
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
    let pids: Vec<String> = fd_holders.iter().map(|h| h.pid.to_string()).collect();
    Verdict {
        kind: VerdictKind::SharedFd,
        evidence,
        hint: format!(
            "the memory is freed when the last holder closes the files: kill {} (or have \
             children close GPU descriptors; start DataLoader workers with the spawn method)",
            pids.join(", ")
        ),
    }
}

/// The memory is not back: a teardown still under way, or, once NVML no longer lists the
/// process and nothing else is in flight, a holder linger cannot see.
fn not_back(inc: &Incident, gpu: &GpuImpact, cx: &Context, dead: u64) -> Option<Verdict> {
    let ms = |ns: u64| ns as f64 / 1e6;
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

/// Other processes imported part of its memory: who holds how much, and how it was seen; or,
/// where NVML alone says so against the traced driver calls, that the sources disagree.
fn imported(inc: &Incident, importers: &[&Holder], cx: &Context) -> Verdict {
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
/// other jobs' allocations at the same moment.
fn ambiguous(inc: &Incident, rose: &[(u32, String, u64)]) -> Verdict {
    let who: Vec<String> = rose
        .iter()
        .map(|(pid, comm, bytes)| format!("{comm}[{pid}] by {}", gib(*bytes)))
        .collect();
    Verdict {
        kind: VerdictKind::Incomplete,
        evidence: vec![format!(
            "as pid {} left NVML's list, NVML's figures rose for {} while other processes' \
             rose too: without driver calls (--lean), an import of its memory cannot be told \
             from those processes' own allocations",
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

/// Bytes as GiB with one decimal (MiB below 1 GiB).
pub fn gib(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if bytes as f64 >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// The process never died: blocked in the driver, or the signal was never taken.
fn undead(inc: &Incident, cx: &Context) -> Option<Verdict> {
    let in_driver = cx.asleep.iter().find(|(_, _, frames)| {
        frames
            .iter()
            .any(|f| f.ends_with("[nvidia]") || f.ends_with("[nvidia_uvm]"))
    });
    if let Some((tid, since, frames)) = in_driver {
        let top: Vec<&str> = frames.iter().take(6).map(String::as_str).collect();
        return Some(Verdict {
            kind: VerdictKind::StuckInDriver,
            evidence: vec![format!(
                "thread {tid} asleep in the driver for {:.1} s: {}",
                cx.now_ns.saturating_sub(*since) as f64 / 1e9,
                top.join(" <- ")
            )],
            hint: "a thread in uninterruptible sleep in the NVIDIA driver cannot die; check \
                   dmesg for Xid errors; the GPU may need an administrator's reset"
                .into(),
        });
    }
    Some(Verdict {
        kind: VerdictKind::NotDelivered,
        evidence: vec![format!(
            "{} deliveries, {} thread exits, no group death after {:.1} s",
            inc.deliveries.len(),
            inc.exits.len(),
            cx.now_ns.saturating_sub(inc.t_signal_ns) as f64 / 1e9
        )],
        hint: "the signal is pending but no thread took it: a thread is blocked \
               uninterruptibly (see /proc/PID/stack) or the process is stopped or traced"
            .into(),
    })
}
