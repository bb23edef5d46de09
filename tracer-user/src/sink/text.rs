//! The human report of an incident.

use std::fmt::Write as _;

use crate::{
    analysis::incident::{Incident, Outcome, ReapHow},
    clock::WallAnchor,
};

const INDENT: &str = "              ";

pub fn render(inc: &Incident, anchor: &WallAnchor) -> String {
    let mut s = String::new();
    let sender = if inc.sender.pid == 0 {
        format!("kernel ({:?} code {:#x})", inc.origin, inc.si_code).to_lowercase()
    } else {
        format!("{}[{}]", inc.sender.comm, inc.sender.pid)
    };
    let threads = match inc.target.threads {
        1 => "1 thread".to_string(),
        n => format!("{n} threads"),
    };
    let _ = writeln!(
        s,
        "{}  {:<8} {} -> {}[{}] ({threads})",
        anchor.format_local(inc.t_signal_ns),
        inc.signal_name,
        sender,
        inc.target.comm,
        inc.target.pid,
    );
    let mut steps = Vec::new();
    // A thread can leave the group's live count before another one's exit tracepoint fires,
    // so "all exited" is the latest exit seen, which may come after the group-dead one.
    if let Some(dead) = inc.t_group_dead_ns {
        let dead = inc.exits.iter().map(|x| x.t_ns).max().unwrap_or(dead).max(dead);
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
            r.comm.as_deref().unwrap_or("?"),
            r.pid.unwrap_or(0)
        )),
        (Some(t), _) => steps.push(format!("freed by +{}", ms(inc.ms_after_signal(t)))),
        (None, _) if inc.outcome == Outcome::Exited => steps.push("not reaped yet".into()),
        _ => {}
    }
    match inc.outcome {
        Outcome::Survived => steps.push(if inc.handled() {
            "survived: the signal was handled".into()
        } else {
            "survived: the signal was ignored or blocked".into()
        }),
        Outcome::Pending => steps.push("still alive when tracing stopped".into()),
        Outcome::Exited => {}
    }
    if inc.repeats > 0 {
        steps.push(format!("{} more fatal signal(s) meanwhile", inc.repeats));
    }
    let _ = writeln!(s, "{INDENT}{}", steps.join(" · "));
    s
}

fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.1} ms")
    }
}
