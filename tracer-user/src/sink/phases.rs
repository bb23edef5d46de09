//! An incident as consecutive phases on its time line: what the exports draw and weigh.
//! New teardown phases (driver release, NVML memory freed) belong here, so every export
//! shows them.

use crate::analysis::incident::Incident;

/// From the group's death until its GPU memory is back (or its files released).
pub const RELEASING: &str = "releasing GPU memory";
/// After its own release, while other processes hold its memory.
pub const HELD_ELSEWHERE: &str = "GPU memory held by others";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    pub name: &'static str,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Signal to last thread exit ("exiting"), then dead until the parent is told ("dying"), then
/// zombie until reaped. A phase whose end was not seen is left out.
pub fn phases(inc: &Incident) -> Vec<Phase> {
    let mut out = Vec::new();
    let mut push = |name, start_ns: u64, end_ns: Option<u64>| {
        if let Some(end_ns) = end_ns {
            out.push(Phase {
                name,
                start_ns,
                end_ns: end_ns.max(start_ns),
            });
        }
    };
    let exited = inc
        .t_group_dead_ns
        .map(|dead| inc.exits.iter().map(|x| x.t_ns).fold(dead, u64::max));
    push("exiting", inc.t_signal_ns, exited);
    let Some(exited) = exited else {
        return out;
    };
    // The GPU memory comes back inside the dying task's teardown, before it is a zombie,
    // unless others hold it.
    let gpu = inc.gpu.as_ref();
    let back = gpu.and_then(|g| g.t_memory_back_ns);
    let released = back
        .filter(|&b| b > exited && inc.t_zombie_ns.is_none_or(|z| b <= z))
        .or(gpu.and_then(|g| g.t_files_released_ns))
        .filter(|&r| r > exited);
    let exited = match released {
        Some(r) => {
            push(RELEASING, exited, Some(r));
            r
        }
        None => exited,
    };
    match inc.t_zombie_ns {
        Some(zombie) => {
            push("dying", exited, Some(zombie));
            push("zombie", zombie.max(exited), inc.t_reaped_ns);
        }
        None => push("dead", exited, inc.t_reaped_ns),
    }
    if let Some(b) = back.filter(|&b| b > exited && inc.t_zombie_ns.is_some_and(|z| b > z)) {
        push(HELD_ELSEWHERE, exited, Some(b));
    }
    out
}

/// When the incident's last known phase ends.
pub fn end_ns(inc: &Incident) -> u64 {
    phases(inc)
        .last()
        .map_or(inc.t_signal_ns, |p| p.end_ns)
        .max(inc.t_signal_ns)
}
