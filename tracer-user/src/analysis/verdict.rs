//! Why the memory lingered (or did not): one primary verdict per incident, with its evidence
//! and what to do about it.

use serde::Serialize;

use super::{
    incident::Incident,
    teardown::{Phase, PhaseTime},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// The memory came back in the usual way.
    Released,
    /// Other processes held the dead process's GPU files.
    SharedFd,
    /// The driver handed the release to one of its kthreads.
    DeferredClose,
    /// A thread sleeps uninterruptibly inside the driver.
    StuckInDriver,
    /// The memory came back, but slowly.
    SlowTeardown,
    /// The fatal signal is pending but the process does not exit.
    NotDelivered,
    /// NVML accounts the memory to a pid that cannot be seen here.
    PidUnresolved,
    /// Memory still in use though no known process holds the files.
    UnknownHolder,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    /// Facts that support it, in words.
    pub evidence: Vec<String>,
    /// What to do.
    pub hint: String,
}

/// What the verdict needs beyond the incident itself.
pub struct Context<'a> {
    pub phases: &'a [PhaseTime],
    /// Driver kthreads the process woke: (when, tid, comm).
    pub wakeups: &'a [(u64, u32, String)],
    /// Threads asleep when the incident closed: (tid, since, innermost frames).
    pub asleep: Vec<(u32, u64, Vec<String>)>,
    /// NVML pids on the target's GPUs that no traced process matches.
    pub unknown_nvml_pids: Vec<u32>,
    pub slow_after_ns: u64,
    pub now_ns: u64,
}

pub fn decide(inc: &Incident, cx: &Context) -> Option<Verdict> {
    let ms = |ns: u64| ns as f64 / 1e6;
    let Some(dead) = inc.t_group_dead_ns else {
        return undead(inc, cx);
    };
    let gpu = inc.gpu.as_ref()?;
    if !inc.holders.is_empty() {
        let evidence = inc
            .holders
            .iter()
            .map(|h| {
                let how = serde_json::to_value(h.how)
                    .ok()
                    .and_then(|v| v.get("how").and_then(|s| s.as_str()).map(String::from))
                    .unwrap_or_default();
                format!("{}[{}] holds fds {:?} ({how})", h.comm, h.pid, h.fds)
            })
            .collect();
        let pids: Vec<String> = inc.holders.iter().map(|h| h.pid.to_string()).collect();
        return Some(Verdict {
            kind: VerdictKind::SharedFd,
            evidence,
            hint: format!(
                "the memory is freed when the last holder closes the files: kill {} (or have \
                 children close GPU descriptors; start DataLoader workers with the spawn method)",
                pids.join(", ")
            ),
        });
    }
    let back = gpu.t_memory_back_ns;
    if back.is_none() && gpu.nvml_used_before.is_some() {
        if !cx.unknown_nvml_pids.is_empty() {
            return Some(Verdict {
                kind: VerdictKind::PidUnresolved,
                evidence: vec![format!(
                    "NVML lists pid(s) {:?} on the GPU, which no traced process matches",
                    cx.unknown_nvml_pids
                )],
                hint: "those pids live in another pid namespace or are gone; run linger on the \
                       host, or look them up with `linger holders`"
                    .into(),
            });
        }
        return Some(Verdict {
            kind: VerdictKind::UnknownHolder,
            evidence: vec![format!(
                "NVML still accounts memory to pid {} {:.1} ms after its last GPU file holder went",
                inc.target.pid,
                ms(cx
                    .now_ns
                    .saturating_sub(gpu.t_files_released_ns.unwrap_or(dead)))
            )],
            hint: "something outside linger's view keeps it: a CUDA IPC importer, an MPS server, \
                   or a process in another namespace; see `linger holders`"
                .into(),
        });
    }
    // Without NVML's word, the dying task is done with its files when it becomes a zombie.
    let end = back
        .or(inc.t_zombie_ns)
        .or(gpu.t_files_released_ns)
        .unwrap_or(dead);
    let took = end.saturating_sub(dead);
    let dominant = cx.phases.first();
    let breakdown: Vec<String> = cx
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
    if let Some((t, tid, comm)) = cx.wakeups.first() {
        let deferred = cx.phases.iter().any(|p| p.name == Phase::QueueFlush);
        if comm.starts_with("nv_queue") || deferred {
            return Some(Verdict {
                kind: VerdictKind::DeferredClose,
                evidence: vec![format!(
                    "woke {comm}[{tid}] at +{:.1} ms; memory back {:.1} ms after the group died",
                    ms(t.saturating_sub(inc.t_signal_ns)),
                    ms(took)
                )],
                hint: "the driver finished the release in its own thread; repeated deferrals \
                       point at a suspend/resume or a busy driver lock"
                    .into(),
            });
        }
    }
    let kind = if took > cx.slow_after_ns {
        VerdictKind::SlowTeardown
    } else {
        VerdictKind::Released
    };
    let hint = match (kind, dominant) {
        (VerdictKind::SlowTeardown, Some(p)) => format!(
            "teardown took {:.0} ms, mostly {}: large allocations and GSP firmware calls cost \
             time; free GPU memory before exiting to shorten it",
            ms(took),
            p.name.label()
        ),
        (VerdictKind::SlowTeardown, None) => format!("teardown took {:.0} ms", ms(took)),
        _ => match back {
            Some(b) => format!(
                "nothing to do: the memory was back {:.1} ms after the kill",
                ms(b.saturating_sub(inc.t_signal_ns))
            ),
            None => format!(
                "nothing to do: it finished releasing its GPU files {:.1} ms after the kill",
                ms(end.saturating_sub(inc.t_signal_ns))
            ),
        },
    };
    Some(Verdict {
        kind,
        evidence: breakdown,
        hint,
    })
}

/// The process never died: blocked in the driver, or the signal was never taken.
fn undead(inc: &Incident, cx: &Context) -> Option<Verdict> {
    if inc.outcome == super::incident::Outcome::Survived {
        return None;
    }
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

#[cfg(test)]
mod tests {
    //! The decision on incidents shaped like the rare cases, which need a broken driver or
    //! another pid namespace to happen for real; the common ones (released, shared_fd) are
    //! tested on H200 recordings (tests/tests/h200_replay.rs).

    use super::*;
    use crate::analysis::{
        incident::{GpuImpact, Incident, Outcome, Sender, Target},
        signals::Origin,
    };

    fn incident(dead: Option<u64>, back: Option<u64>, listed_before: bool) -> Incident {
        Incident {
            record_type: "incident",
            id: 1,
            signal: 9,
            signal_name: "SIGKILL".into(),
            origin: Origin::User,
            si_code: 0,
            sender: Sender {
                pid: 1,
                tid: 1,
                comm: "bash".into(),
                context_pid: None,
            },
            target: Target {
                pid: 42,
                comm: "python3".into(),
                threads: 2,
            },
            t_signal_ns: 1_000,
            repeats: 0,
            deliveries: Vec::new(),
            exits: Vec::new(),
            t_group_dead_ns: dead,
            exit: None,
            t_zombie_ns: None,
            t_reaped_ns: None,
            reaper: None,
            outcome: Outcome::Pending,
            gpu: Some(GpuImpact {
                bytes_ledger: 1 << 30,
                ledger: Default::default(),
                classes: Vec::new(),
                bytes_nvml: Some(1 << 30),
                nvml_used_before: listed_before.then_some(2 << 30),
                t_memory_back_ns: back,
                t_files_released_ns: dead,
                files: Vec::new(),
            }),
            holders: Vec::new(),
            phases: Vec::new(),
            release: None,
            verdict: None,
            collateral: Vec::new(),
            teardown_stacks: Vec::new(),
        }
    }

    fn cx<'a>(phases: &'a [PhaseTime], wakeups: &'a [(u64, u32, String)]) -> Context<'a> {
        Context {
            phases,
            wakeups,
            asleep: Vec::new(),
            unknown_nvml_pids: Vec::new(),
            slow_after_ns: 1_000_000_000,
            now_ns: 40_000_000_000,
        }
    }

    fn kind(inc: &Incident, cx: &Context) -> VerdictKind {
        decide(inc, cx).expect("a verdict").kind
    }

    #[test]
    fn a_thread_asleep_in_the_driver_is_stuck_and_one_that_never_took_the_signal_is_not_delivered()
    {
        let inc = incident(None, None, true);
        let mut c = cx(&[], &[]);
        assert_eq!(kind(&inc, &c), VerdictKind::NotDelivered);
        c.asleep = vec![(43, 2_000, vec!["nv_kthread_q_flush[nvidia]".into()])];
        assert_eq!(kind(&inc, &c), VerdictKind::StuckInDriver);
    }

    #[test]
    fn memory_nvml_keeps_without_holders_is_unknown_or_unresolved() {
        let inc = incident(Some(5_000), None, true);
        let mut c = cx(&[], &[]);
        assert_eq!(kind(&inc, &c), VerdictKind::UnknownHolder);
        c.unknown_nvml_pids = vec![777];
        assert_eq!(kind(&inc, &c), VerdictKind::PidUnresolved);
    }

    #[test]
    fn teardown_speed_and_deferral() {
        let quick = incident(Some(5_000), Some(130_000_000), true);
        let slow = incident(Some(5_000), Some(3_000_000_000), true);
        let phases = [PhaseTime {
            name: Phase::UvmTeardown,
            ns: 2_900_000_000,
            gsp_ns: 0,
        }];
        assert_eq!(kind(&quick, &cx(&[], &[])), VerdictKind::Released);
        let verdict = decide(&slow, &cx(&phases, &[])).expect("a verdict");
        assert_eq!(verdict.kind, VerdictKind::SlowTeardown);
        assert!(verdict.hint.contains("UVM teardown"), "{}", verdict.hint);
        let woke = [(6_000, 99, "nv_queue".to_string())];
        assert_eq!(kind(&quick, &cx(&[], &woke)), VerdictKind::DeferredClose);
    }
}
