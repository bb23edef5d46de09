//! The gate's answer: one JSON object, or lines for a person whose first line (also the
//! JSON's `summary`) fits a scheduler's one-line reason, e.g. Slurm's drain reason.

use crate::escape;
use serde::Serialize;

use super::{
    decision::Gate,
    findings::{Blocker, Dead, Kind},
    log::Reading,
};

#[derive(Serialize)]
pub struct Report {
    #[serde(rename = "type")]
    pub record_type: &'static str,
    pub clean: bool,
    /// `released` when clean; else the worst blocker's kind, or for memory of dead
    /// processes the agent's verdict, `not_reaped`, `unknown_holder` or `pid_unresolved`.
    pub verdict: String,
    pub summary: String,
    pub waited_ms: u64,
    /// `nvml_and_files`, or `files` where NVML is missing.
    pub decided_by: &'static str,
    pub notes: Vec<String>,
    pub scope: ScopeReport,
    pub holders: Vec<Blocker>,
    pub dead: Vec<Dead>,
    /// Without the agent's word on dead memory: live processes holding GPU files that NVML
    /// does not list (whoever inherited or received the dead processes' files among them).
    pub candidates: Vec<Candidate>,
    /// How much of the agent's incident log was read; null without one.
    pub log: Option<Reading>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ScopeReport {
    pub pids: Vec<u32>,
    pub pgids: Vec<u32>,
    pub cgroups: Vec<String>,
    pub slurm_jobs: Vec<u64>,
    pub pods: Vec<String>,
    /// The GPUs looked at (all when empty and `gpus_from` is null).
    pub gpus: Vec<GpuReport>,
    /// The variable `--job-gpus` read them from.
    pub gpus_from: Option<&'static str>,
    pub unresolved_gpus: Vec<String>,
    /// Device files looked at besides the GPUs' own (`--gpu-device`), as `major:minor`.
    pub devices: Vec<String>,
    pub any_process: bool,
    pub allowed: Vec<u32>,
    /// Processes found in the scope so far.
    pub members: usize,
    /// Named pids already gone when the gate first looked.
    pub unseen: Vec<u32>,
}

#[derive(Clone, Debug, Serialize)]
pub struct GpuReport {
    pub index: u32,
    pub uuid: Option<String>,
    pub minor: Option<u32>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    pub pid: u32,
    pub comm: String,
}

pub fn report(gate: &Gate, mut scope: ScopeReport, notes: Vec<String>, waited_ms: u64) -> Report {
    scope.members = gate.scope().members().count();
    scope.unseen = gate.scope().unseen.clone();
    let clean = gate.is_clean();
    let verdict = verdict(gate);
    let mut r = Report {
        record_type: "wait",
        clean,
        summary: String::new(),
        verdict,
        waited_ms,
        decided_by: if gate.has_nvml() {
            "nvml_and_files"
        } else {
            "files"
        },
        notes,
        scope,
        holders: gate.blockers.clone(),
        dead: gate.dead.clone(),
        candidates: gate
            .candidates
            .iter()
            .map(|(pid, comm)| Candidate {
                pid: *pid,
                comm: comm.clone(),
            })
            .collect(),
        log: gate.log().map(|l| l.reading.clone()),
    };
    r.summary = summary(&r);
    r
}

fn verdict(gate: &Gate) -> String {
    let worst = gate.blockers.first();
    match worst {
        Some(b) if b.kind <= Kind::SharedFd => return b.kind.name().into(),
        _ => {}
    }
    if !gate.dead.is_empty() {
        if let Some(k) = gate.dead.iter().find_map(|d| d.incident.as_ref()) {
            return k.verdict.clone();
        }
        return if gate.dead.iter().all(|d| d.state == "zombie") {
            "not_reaped"
        } else if !gate.candidates.is_empty() {
            "unknown_holder"
        } else {
            "pid_unresolved"
        }
        .into();
    }
    match worst {
        Some(b) => b.kind.name().into(),
        None if gate.is_clean() => "released".into(),
        None => "cannot_tell".into(),
    }
}

/// One line: the verdict and who.
fn summary(r: &Report) -> String {
    if r.clean {
        return format!("linger: clean after {} ms", r.waited_ms);
    }
    let verdict = escape::terminal(&r.verdict);
    let who = if let Some(b) = r.holders.first().filter(|b| b.kind.name() == r.verdict) {
        let what = match b.kind {
            Kind::NotDead => format!("is still alive (state {})", b.state),
            Kind::LiveHolder => format!(
                "holds the GPU files ({}{})",
                b.scope.as_deref().unwrap_or("in the scope"),
                if b.session == b.pid { ", setsid" } else { "" }
            ),
            Kind::SharedFd => "holds an open GPU file of the scope's".into(),
            Kind::GpuBusy => "holds GPU files or memory here".into(),
            Kind::Unattributed => format!(
                "holds GPU files (pid {} gone before the gate looked)",
                join(&r.scope.unseen)
            ),
        };
        format!("{}[{}] {what}", escape::terminal(&b.comm), b.pid)
    } else if let Some(d) = r.dead.first() {
        let bytes = d
            .bytes
            .map_or("memory".into(), |b| format!("{} MiB", b >> 20));
        let held = d
            .incident
            .as_ref()
            .and_then(|k| k.holders.first())
            .map(|h| format!(", held by {}[{}]", escape::terminal(&h.comm), h.pid))
            .unwrap_or_default();
        format!("{bytes} on GPU{} of dead pid {}{held}", d.gpu, d.pid)
    } else {
        "NVML failed to read the GPUs".into()
    };
    let more = r.holders.len().saturating_sub(1) + r.dead.len().saturating_sub(1);
    let more = if more > 0 {
        format!(" (+{more} more)")
    } else {
        String::new()
    };
    format!("linger: {verdict}: {who}{more}")
}

fn join(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// For a person: the summary, then each holder and dead process with what to do.
pub fn render(r: &Report) -> String {
    let t = |s: &str| escape::terminal(s).into_owned();
    let mut s = format!("{}\n", r.summary);
    for b in &r.holders {
        s.push_str(&format!(
            "  {}[{}] {}: state {}, parent {}, session {}\n    {}\n",
            t(&b.comm),
            b.pid,
            b.kind.name(),
            b.state,
            b.ppid,
            b.session,
            t(&b.how)
        ));
        if !b.cgroup.is_empty() {
            s.push_str(&format!("    cgroup {}\n", t(&b.cgroup)));
        }
        s.push_str(&format!("    what to do: {}\n", t(&b.hint)));
    }
    for d in &r.dead {
        let bytes = d.bytes.map_or("?".into(), |b| format!("{} MiB", b >> 20));
        s.push_str(&format!(
            "  GPU{}: {bytes} accounted to pid {} ({})\n",
            d.gpu,
            d.pid,
            match d.state {
                "zombie" => "dead, not reaped yet: its parent has not waited for it",
                "unlisted" => "NVML no longer lists it; the device's memory has not come down yet",
                _ => "no such process here: dead, or in a pid namespace this one does not see",
            }
        ));
        if let Some(k) = &d.incident {
            let holders: Vec<String> = k
                .holders
                .iter()
                .map(|h| format!("{}[{}] ({})", t(&h.comm), h.pid, t(&h.how)))
                .collect();
            s.push_str(&format!(
                "    incident {} ({}): {}{}\n",
                k.id,
                t(&k.verdict),
                t(&k.hint),
                if holders.is_empty() {
                    String::new()
                } else {
                    format!("; held by {}", holders.join(", "))
                }
            ));
        }
        if let Some(e) = &d.estimate {
            s.push_str(&format!(
                "    past teardowns of about its size took {} ms (median of {}){}\n",
                e.release_ms,
                e.from_incidents,
                e.remaining_ms
                    .map(|ms| format!(": expected back in about {ms} ms"))
                    .unwrap_or_default()
            ));
        }
    }
    if r.verdict == "not_reaped" {
        s.push_str("  the parent must reap it (or exit) first\n");
    }
    if !r.candidates.is_empty() {
        let names: Vec<String> = r
            .candidates
            .iter()
            .map(|c| format!("{}[{}]", t(&c.comm), c.pid))
            .collect();
        s.push_str(&format!(
            "  processes holding GPU files NVML does not list (a child that inherited them, a \
             process that received them, or one only reading NVML): {}; `linger agent` would \
             know which\n",
            names.join(", ")
        ));
    }
    for n in &r.notes {
        s.push_str(&format!("  note: {}\n", t(n)));
    }
    if let Some(l) = r.log.as_ref().filter(|l| l.damaged > 0) {
        s.push_str(&format!(
            "  the incident log had {} damaged line(s), skipped\n",
            l.damaged
        ));
    }
    s
}
