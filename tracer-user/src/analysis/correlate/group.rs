//! Processes killed together: one killpg, a `cgroup.kill`, `systemctl kill`, a Slurm step's
//! end, or the kernel's own kill of what is left of a pid namespace as its init exits. The
//! holders of a victim's files killed with it are victims letting go with their own exits,
//! not holders to kill: its report waits for them, and its verdict is the one their deaths
//! give.

use crate::analysis::{
    holders::Holder,
    signals::{Origin, SIGKILL},
    termination::SignalSent,
};

use super::{
    case::{Case, CoVictim},
    Correlator,
};

/// A holder whose group dies this soon after the victim's, of its own, went with it: its exit
/// raced the victim's kill, and nothing lingered because of it.
const WENT_WITH_NS: u64 = 50_000_000;

/// Whether `sent`, to a holder of victim `c`'s files, kills it with the victim: a SIGKILL
/// before the victim let go of its files, one of the same kill as the victim's, or one the
/// kernel sent in the victim's own context as it exited (its pid namespace torn down, after
/// its files' release).
fn kills_with(sent: &SignalSent, c: &Case) -> bool {
    let released_ns = c.kernel_release.map(|k| k.0);
    sent.sig == SIGKILL
        && !sent.discarded
        && (released_ns.is_none_or(|t| sent.t_ns <= t)
            || same_kill(sent, &c.signals)
            || in_teardown_of(sent, c.inc.target.pid))
}

/// Whether `sent` is of the same kill as one of the victim's SIGKILLs: from the same thread,
/// at most [`WENT_WITH_NS`] later. A `cgroup.kill` write, a killpg or a supervisor's loop
/// signals its processes one after another; on a slow machine the victim's exit can be over
/// before the last of them is signalled.
fn same_kill(sent: &SignalSent, victim_signals: &[SignalSent]) -> bool {
    sent.sender.pid != 0
        && victim_signals.iter().any(|v| {
            v.sig == SIGKILL
                && v.sender.pid == sent.sender.pid
                && v.sender.tid == sent.sender.tid
                && (v.t_ns..=v.t_ns.saturating_add(WENT_WITH_NS)).contains(&sent.t_ns)
        })
}

/// Whether `sent` is the kernel's kill of what is left of `victim`'s pid namespace as the
/// victim, its init, exits (zap_pid_ns_processes, run in its context).
fn in_teardown_of(sent: &SignalSent, victim: u32) -> bool {
    sent.origin == Origin::Kernel && sent.sender.context_pid == Some(victim)
}

/// When holder `pid` of victim `c`'s files, killed in its pid namespace's teardown, had let go
/// at the latest: the init's zombie transition, which its exit reaches only once every process
/// of the namespace is released (before their final switches and frees, which can come tens of
/// ms later).
pub(super) fn released_in_teardown(c: &Case, pid: u32) -> Option<u64> {
    c.co_victims
        .get(&pid)
        .filter(|v| v.in_teardown)
        .and(c.inc.t_zombie_ns)
}

impl Correlator {
    /// Case `id`'s process died with `holders` holding its files: those already SIGKILLed are
    /// killed with it.
    pub(super) fn co_victims_at_death(&mut self, id: u64, holders: &[Holder]) {
        let Some(c) = self.cases.get(&id) else {
            return;
        };
        let victim = c.inc.target.pid;
        let found: Vec<(u32, CoVictim)> = holders
            .iter()
            .filter_map(|h| {
                let case = self.holder_case(h.pid)?;
                let killed = case.signals.iter().find(|s| kills_with(s, c))?;
                let dead_ns = h.t_dead_ns.or(case.inc.t_group_dead_ns);
                Some((
                    h.pid,
                    CoVictim {
                        killed_ns: Some(killed.t_ns),
                        dead_ns,
                        in_teardown: in_teardown_of(killed, victim),
                    },
                ))
            })
            .collect();
        if let Some(c) = self.cases.get_mut(&id) {
            c.co_victims.extend(found);
        }
    }

    /// `sent` reached `pid`: the dead victims whose files it holds may have it killed with them.
    pub(super) fn killed_holder(&mut self, pid: u32, sent: &SignalSent) {
        for id in self.cases.held_by(pid) {
            let Some(c) = self.cases.get_mut(&id) else {
                continue;
            };
            let victim = c.inc.target.pid;
            if c.holder_gone.get(&pid) == Some(&None) && kills_with(sent, c) {
                c.co_victims.entry(pid).or_insert(CoVictim {
                    killed_ns: Some(sent.t_ns),
                    dead_ns: None,
                    in_teardown: in_teardown_of(sent, victim),
                });
                self.agenda.touch(id);
            }
        }
    }

    /// Holder `pid`'s group died at `t_ns`: the victims it was killed with know when, and
    /// those it died right after went with it.
    pub(super) fn co_victim_died(&mut self, pid: u32, t_ns: u64, victims: &[u64]) {
        for id in victims {
            let Some(c) = self.cases.get_mut(id) else {
                continue;
            };
            let soon = c
                .inc
                .t_group_dead_ns
                .is_some_and(|d| t_ns <= d.saturating_add(WENT_WITH_NS));
            match c.co_victims.get_mut(&pid) {
                Some(v) => {
                    v.dead_ns.get_or_insert(t_ns);
                }
                None if soon && c.holder_gone.get(&pid) == Some(&None) => {
                    c.co_victims.insert(
                        pid,
                        CoVictim {
                            killed_ns: None,
                            dead_ns: Some(t_ns),
                            in_teardown: false,
                        },
                    );
                }
                None => {}
            }
        }
    }

    /// Whether case `id`'s report waits for holders of its files that are letting go with
    /// their own exits (killed with it, or dead before it): each does within milliseconds,
    /// and the verdict is theirs to give.
    pub(super) fn awaits_co_victims(&self, id: u64) -> bool {
        self.cases.get(&id).is_some_and(|c| {
            c.fd_holders.iter().any(|h| {
                c.holder_gone.get(&h.pid) == Some(&None)
                    && (h.t_dead_ns.is_some() || c.co_victims.contains_key(&h.pid))
            }) || self.killed_with_unseen(c)
        })
    }

    /// Whether victim `c` holds references nobody known accounts for while processes of the
    /// same kill live on: linger may not have seen them get its files (they forked before it
    /// began), and their exits' walks will show it within milliseconds.
    fn killed_with_unseen(&self, c: &Case) -> bool {
        let victim = c.inc.target.pid;
        c.unaccounted.any()
            && self.cases.iter().any(|(_, o)| {
                o.inc.t_group_dead_ns.is_none()
                    && o.inc.target.pid != victim
                    && o.signals.iter().any(|s| {
                        s.sig == SIGKILL
                            && !s.discarded
                            && (same_kill(s, &c.signals) || in_teardown_of(s, victim))
                    })
            })
    }

    /// The live or dead case of holder `pid`.
    fn holder_case(&self, pid: u32) -> Option<&Case> {
        match self.cases.of_alive(pid) {
            Some(id) => self.cases.get(&id),
            None => self.case_of_dead(pid),
        }
    }
}

/// A holder as the victim's record shows it: one killed with it says when, and when it died.
pub(super) fn mark_co_victim(h: &mut Holder, c: &Case) {
    if let Some(v) = c.co_victims.get(&h.pid) {
        h.t_killed_ns = v.killed_ns;
        h.t_dead_ns = h.t_dead_ns.or(v.dead_ns);
    }
}
