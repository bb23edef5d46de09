//! How a process came to die: every fatal signal that led to its death, and the mode they
//! add up to (a plain exit, a stop that succeeded, a kill, a stop escalated to SIGKILL, the
//! OOM killer, a fault of its own).

pub use super::incident::{Mode, SignalSent, Termination};
use super::{
    incident::{Action, ExitStatus, Sender},
    signals::{self, Origin, SIGKILL},
};

/// Signals whose default action is a fault of the process itself (core dump).
const FAULT_SIGNALS: [u32; 7] = [4, 5, 6, 7, 8, 11, 31];

/// The mode of a death: `signals` in the order generated, `exit` as the kernel recorded it,
/// `oom` whether the OOM killer marked the process.
pub fn decide(
    target: u32,
    signals: &[SignalSent],
    exit: Option<&ExitStatus>,
    oom: bool,
) -> Termination {
    let from_others: Vec<&SignalSent> = signals
        .iter()
        .filter(|s| !s.self_sent(target) && s.origin != Origin::Fault)
        .collect();
    let first_catchable = from_others.iter().find(|s| s.catchable());
    let first_kill = signals.iter().find(|s| s.sig == SIGKILL);
    let killed_by = exit.and_then(|e| e.signal);
    let mut grace_ns = None;
    let mode = if oom {
        Mode::Oom
    } else if let Some(sig) = killed_by {
        // The signal that killed it, as the kernel says; the list may lack it (a signal outside
        // the traced set, or one sent before tracing began).
        let sent = signals.iter().rev().find(|s| s.sig == sig);
        let own = sent.is_some_and(|s| s.self_sent(target) || s.origin == Origin::Fault);
        if own || (sent.is_none() && FAULT_SIGNALS.contains(&sig)) {
            Mode::Fault
        } else if sig == SIGKILL {
            match (first_catchable, first_kill) {
                (Some(c), Some(k)) if c.t_ns <= k.t_ns => {
                    grace_ns = Some(k.t_ns - c.t_ns);
                    Mode::Escalated
                }
                _ => Mode::Kill,
            }
        } else {
            Mode::Term
        }
    } else if first_catchable.is_some() {
        // A handler ran and the process exited with a status.
        Mode::Term
    } else if signals.iter().any(|s| s.self_sent(target)) {
        Mode::Fault
    } else {
        Mode::Exit
    };
    Termination {
        mode,
        signals: signals.to_vec(),
        grace_ns,
    }
}

/// One line: `SIGTERM (ignored) +0 → SIGKILL +2000.0 ms: escalated after 2.0 s`.
pub fn describe(t: &Termination) -> String {
    let Some(first) = t.signals.first() else {
        return "exited on its own".into();
    };
    // The same signal from the same sender within a millisecond (to the process and to its
    // group, as `timeout` sends them) is one step.
    let mut steps: Vec<(String, u32)> = Vec::new();
    let mut killed = false;
    let mut last: Option<&SignalSent> = None;
    for s in &t.signals {
        let action = match (s.discarded, s.action) {
            (true, _) if killed => " (already dying)",
            (true, _) | (false, Some(Action::Ignore)) => " (ignored)",
            (false, Some(Action::Handler)) => " (handled)",
            _ => "",
        };
        killed |= s.sig == SIGKILL;
        let same = last.is_some_and(|l| {
            l.sig == s.sig && l.sender.pid == s.sender.pid && s.t_ns - l.t_ns < 1_000_000
        });
        last = Some(s);
        if same {
            if let Some(step) = steps.last_mut() {
                step.1 += 1;
            }
            continue;
        }
        let step = format!(
            "{}{action} from {} +{:.1} ms",
            s.name,
            sender(&s.sender),
            (s.t_ns - first.t_ns) as f64 / 1e6
        );
        steps.push((step, 1));
    }
    let steps: Vec<String> = steps
        .into_iter()
        .map(|(s, n)| if n > 1 { format!("{s} (×{n})") } else { s })
        .collect();
    let tail = match (t.mode, t.grace_ns) {
        (Mode::Escalated, Some(g)) => format!(
            "graceful stop failed, escalated to SIGKILL after {:.1} s",
            g as f64 / 1e9
        ),
        (mode, _) => mode.label().to_string(),
    };
    format!("{} · {tail}", steps.join(" → "))
}

fn sender(s: &Sender) -> String {
    if s.pid == 0 {
        "kernel".into()
    } else {
        format!("{}[{}]", s.comm, s.pid)
    }
}

/// A signal as generated, before its delivery is known.
pub fn sent(sig: u32, code: i32, sender: Sender, t_ns: u64, discarded: bool) -> SignalSent {
    SignalSent {
        sig,
        name: signals::name(sig),
        origin: signals::origin(code),
        si_code: code,
        sender,
        t_ns,
        action: discarded.then_some(Action::Ignore),
        discarded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pid: u32) -> Sender {
        Sender {
            pid,
            tid: pid,
            comm: "x".into(),
            context_pid: None,
        }
    }

    fn killed(sig: u32) -> ExitStatus {
        ExitStatus {
            signal: Some(sig),
            status: None,
        }
    }

    const STATUS_0: ExitStatus = ExitStatus {
        signal: None,
        status: Some(0),
    };

    #[test]
    fn a_stop_escalated_by_timeout_is_one_escalation_with_its_grace() {
        // timeout -k 2 12: SIGTERM to the child and to the group, SIGKILL 2 s later, twice.
        let signals = [
            sent(15, 0, from(10), 1_000, false),
            sent(15, 0, from(10), 1_010, false),
            sent(9, 0, from(10), 2_000_001_000, false),
            sent(9, 0, from(10), 2_000_001_010, false),
        ];
        let t = decide(11, &signals, Some(&killed(9)), false);
        assert_eq!(t.mode, Mode::Escalated);
        assert_eq!(t.grace_ns, Some(2_000_000_000));
        assert!(describe(&t).contains("escalated to SIGKILL after 2.0 s"));
    }

    #[test]
    fn modes_of_the_other_deaths() {
        let kill = [sent(9, 0, from(10), 5, false)];
        assert_eq!(decide(11, &kill, Some(&killed(9)), false).mode, Mode::Kill);
        assert_eq!(decide(11, &kill, Some(&killed(9)), true).mode, Mode::Oom);
        let term = [sent(15, 0, from(10), 5, false)];
        assert_eq!(decide(11, &term, Some(&killed(15)), false).mode, Mode::Term);
        assert_eq!(decide(11, &term, Some(&STATUS_0), false).mode, Mode::Term);
        assert_eq!(decide(11, &[], Some(&STATUS_0), false).mode, Mode::Exit);
        // abort(): SIGABRT from itself; a segfault: SIGSEGV with a fault code.
        let abort = [sent(6, -6, from(11), 5, false)];
        assert_eq!(
            decide(11, &abort, Some(&killed(6)), false).mode,
            Mode::Fault
        );
        let segv = [sent(11, 1, from(11), 5, false)];
        assert_eq!(
            decide(11, &segv, Some(&killed(11)), false).mode,
            Mode::Fault
        );
        assert_eq!(decide(11, &[], Some(&killed(11)), false).mode, Mode::Fault);
    }
}
