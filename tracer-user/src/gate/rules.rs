//! The gate's rules, plain data in and answers out: whether a live process keeps the GPUs
//! from being clean (its kind, how it holds them, what to do), and what `linger wait`
//! answers with its exit code. `decision.rs` gathers what they take from /proc, the GPU files
//! and NVML; `mod.rs` refuses what cannot be decided before it waits.

use super::{findings::Kind, holdings::Holding};

/// What `linger wait` answers, each with its exit code (docs/gate.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The GPUs are clean for the next job.
    Clean,
    /// The timeout came first: the report names who holds what, and what to do.
    Held,
    /// Not allowed to read other users' processes.
    NotPermitted,
    /// Nothing can decide: NVML failed throughout, /proc hides other pid namespaces, or
    /// neither NVML nor a GPU file is there to look at.
    CannotTell,
}

impl Answer {
    /// 1 is the timeout a script waits out; errors come apart from it.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Clean => 0,
            Self::Held => 1,
            Self::NotPermitted => 2,
            Self::CannotTell => 3,
        }
    }
}

/// The answer after a look that found `blockers` live processes in the way, `dead` dead
/// processes' memory not back, and `nvml_failures` failed NVML answers: clean only when NVML
/// answered; its failures with nothing else found leave nothing to tell.
pub fn answer(blockers: usize, dead: usize, nvml_failures: u64) -> Answer {
    match (blockers + dead, nvml_failures) {
        (0, 0) => Answer::Clean,
        (0, _) => Answer::CannotTell,
        _ => Answer::Held,
    }
}

/// Before waiting, where /proc shows only pid namespace `namespace` (a pod without
/// hostPID): a holder outside it cannot be seen, so nothing can be called clean unless
/// `--allow-partial-view` takes that on; then the report's note of it.
pub fn partial_view(namespace: u64, allowed: bool) -> Result<String, String> {
    if !allowed {
        return Err(format!(
            "/proc shows only the processes of pid namespace {namespace}, not the host's: a \
             holder outside it (another pod's worker) cannot be seen, so no GPU can be called \
             clean from here: cannot tell. Run in the host's pid namespace (hostPID: true in a \
             pod, as deploy/kubernetes/examples/gpu-pod-gated.yaml does), or pass \
             --allow-partial-view to decide from this namespace's processes and NVML alone"
        ));
    }
    Ok(format!(
        "/proc shows only pid namespace {namespace} (--allow-partial-view): holders outside \
         it are not seen"
    ))
}

/// Before waiting, where NVML is missing (`nvml_error`): why nothing could decide, if so.
/// The GPU files alone decide only for processes named (`names_processes`: a selector or
/// `--any-process`).
pub fn without_nvml(
    nvml_error: &str,
    has_gpu_files: bool,
    names_processes: bool,
) -> Result<(), String> {
    if !has_gpu_files {
        Err(format!(
            "{nvml_error}, and no GPU device file to look at: cannot tell"
        ))
    } else if !names_processes {
        Err(format!(
            "{nvml_error}: without NVML, name what to wait for (--pid, --pgid, --cgroup, \
             --slurm-job, --pod or --any-process)"
        ))
    } else {
        Ok(())
    }
}

/// A process's part in the scope.
#[derive(Clone, Copy, Debug)]
pub struct InScope<'a> {
    /// Named with `--pid`: it must be dead, not only rid of its GPU files.
    pub named: bool,
    /// Why it belongs (`child of 1234`, `in cgroup …`).
    pub why: &'a str,
}

/// What a look found of one live process.
#[derive(Clone, Copy, Debug)]
pub struct Process<'a> {
    pub pid: u32,
    /// Its /proc state letter (`D`: asleep in the kernel where no signal reaches it).
    pub state: char,
    pub session: u32,
    pub ppid: u32,
    /// Its exit is under way (/proc still lists it).
    pub exiting: bool,
    pub scope: Option<InScope<'a>>,
    /// Its GPU descriptors and mappings, where it has some.
    pub holding: Option<&'a Holding>,
    /// Listed by NVML, with the memory NVML accounts to it where NVML says.
    pub nvml_bytes: Option<Option<u64>>,
    /// Another process of the scope that holds the same open GPU file (for a member).
    pub shares_with: Option<u32>,
    /// Outside the scope: how it got an open GPU file a member holds (seen by the gate, or
    /// named by the agent's incident of a named process).
    pub got_from_scope: Option<&'a str>,
    /// `--allow-pid`.
    pub allowed: bool,
}

/// The gate's settings for every process of a look.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// `--any-process`: any holder but those allowed keeps the GPUs.
    pub any_process: bool,
    /// Without NVML, a named process was gone before the gate looked and the agent's log
    /// says nothing of it: any holder may be holding its files.
    pub unattributed: bool,
}

/// Whether `p` keeps the GPUs from being clean: why, and how it holds them, in words.
pub fn blocks(p: &Process, policy: &Policy) -> Option<(Kind, String)> {
    let holds = p.holding.is_some() || p.nvml_bytes.is_some();
    let (h, nvml_bytes) = (p.holding, p.nvml_bytes);
    Some(match (p.scope, p.got_from_scope) {
        (Some(m), _) if m.named => (Kind::NotDead, held_how(h, nvml_bytes, "alive")),
        (Some(m), _) if holds => (Kind::LiveHolder, member_how(p, m)),
        // Its exit closes what it held after /proc stopped listing it, and a close stuck in
        // a driver keeps it: gone only once it is.
        (Some(_), _) if p.exiting => (
            Kind::NotDead,
            "exiting: what its exit closes may still be held".into(),
        ),
        _ if !holds => return None,
        (None, Some(how)) => (Kind::SharedFd, how.into()),
        _ if policy.any_process && !p.allowed => {
            (Kind::GpuBusy, held_how(h, nvml_bytes, "not allowed here"))
        }
        (None, _) if policy.unattributed && !p.allowed => (
            Kind::Unattributed,
            held_how(h, nvml_bytes, "whose, nothing says"),
        ),
        _ => return None,
    })
}

/// How a member came to hold what it holds.
fn member_how(p: &Process, m: InScope) -> String {
    let got = match p.shares_with {
        Some(other) => format!("the same open GPU file as {other} (inherited or passed)"),
        None if m.why.starts_with("child of") => {
            "inherited from its parent, or opened itself".into()
        }
        None => "opened itself, or inherited in the scope".into(),
    };
    let mut how = format!("{} ({}): {got}", held_how(p.holding, None, "holds"), m.why);
    if p.session == p.pid {
        how.push_str("; in a session of its own (setsid)");
    }
    if p.ppid == 1 {
        how.push_str("; orphaned (its parent is gone, init adopted it)");
    }
    how
}

/// What a process holds, in words: its descriptors, mappings and NVML memory.
fn held_how(h: Option<&Holding>, nvml_bytes: Option<Option<u64>>, lead: &str) -> String {
    let mut parts = Vec::new();
    if let Some(h) = h {
        if !h.fds.is_empty() {
            parts.push(format!("{} GPU descriptor(s)", h.fds.len()));
        }
        if !h.mapped.is_empty() {
            parts.push(format!("{} mapping(s) of GPU files", h.mapped.len()));
        }
    }
    match nvml_bytes {
        Some(Some(b)) => parts.push(format!("{} MiB NVML accounts to it", b >> 20)),
        Some(None) => parts.push("memory NVML accounts to it".into()),
        None => {}
    }
    if parts.is_empty() {
        lead.to_string()
    } else {
        format!("{lead}: {}", parts.join(", "))
    }
}

/// What to do about `p`, a blocker of `kind`.
pub fn hint(kind: Kind, p: &Process) -> String {
    let pid = p.pid;
    if p.state == 'D' {
        return format!(
            "{pid} sleeps in the kernel where no signal reaches it (a driver call?): a SIGKILL \
             waits for the call to return; if it does not, drain the node"
        );
    }
    match kind {
        Kind::NotDead => format!("{pid} is still alive: SIGKILL it"),
        Kind::LiveHolder => format!(
            "{pid} outlived the job and keeps its GPU memory: SIGKILL it (and fix whatever \
             forked it to let its workers die with it)"
        ),
        Kind::SharedFd => format!("stop {pid}, or have it close the GPU files it got"),
        Kind::GpuBusy => format!("stop {pid}, or allow it with --allow-pid {pid}"),
        Kind::Unattributed => format!(
            "stop {pid} if it is the job's; to know, start the gate before the kill, scope it \
             by cgroup, job or pod, or run `linger agent`"
        ),
    }
}

#[cfg(test)]
mod tests;
