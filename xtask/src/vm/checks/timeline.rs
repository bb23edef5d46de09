//! When a forced-strategy scenario's steps happened in the guest (`$mode-times`, seconds since
//! boot): a scenario whose linger ended before the holder was killed sees nothing of it, and
//! this says so instead of leaving a missing event to guess at.

use std::fmt;

use super::console::Guest;

pub struct Timeline {
    started: Option<f64>,
    tracing: Option<f64>,
    killed: Option<f64>,
    ended: Option<f64>,
    /// The guest stopped linger with SIGINT: it had not ended a minute after the kill.
    stopped: bool,
    /// The holder was killed without its deferred close counted: the wait for it ran out.
    no_deferred_close: bool,
}

impl Timeline {
    pub fn read(guest: &Guest, mode: &str) -> Self {
        let line = guest.one(&format!("{mode}-times")).unwrap_or_default();
        Self {
            no_deferred_close: guest.one(&format!("{mode}-no-deferred-close")).is_ok(),
            ..Self::parse(line, guest.one(&format!("{mode}-stopped")).is_ok())
        }
    }

    /// `started=12.3 tracing=40.1 killed=44.0 ended=45.2`; a step that did not happen is empty.
    fn parse(line: &str, stopped: bool) -> Self {
        let at = |key: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
        };
        Self {
            started: at("started"),
            tracing: at("tracing"),
            killed: at("killed"),
            ended: at("ended"),
            stopped,
            no_deferred_close: false,
        }
    }
}

impl fmt::Display for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let (Some(started), Some(ended)) = (self.started, self.ended) else {
            return write!(f, "the guest said no times");
        };
        match self.tracing {
            Some(t) => write!(f, "linger tracing {:.1} s after its start", t - started)?,
            None => write!(f, "linger never said it was tracing")?,
        }
        match self.killed {
            Some(k) if ended < k => write!(f, ", ended before the holder was killed")?,
            Some(k) => write!(
                f,
                ", the holder killed {:.1} s later, linger ended {:.1} s after the kill",
                k - self.tracing.unwrap_or(started),
                ended - k
            )?,
            None => write!(
                f,
                ", no holder killed, linger ended {:.1} s after its start",
                ended - started
            )?,
        }
        if self.stopped {
            write!(f, " (stopped by SIGINT: no incident ended it)")?;
        }
        if self.no_deferred_close {
            write!(f, " (the holder's deferred close never came)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_how_long_each_step_took() {
        let t = Timeline::parse(
            "started=10.00 tracing=40.50 killed=44.00 ended=45.25",
            false,
        );
        assert_eq!(
            t.to_string(),
            "linger tracing 30.5 s after its start, the holder killed 3.5 s later, linger ended \
             1.2 s after the kill"
        );
    }

    #[test]
    fn says_when_linger_was_gone_before_the_kill_or_stopped() {
        let before = Timeline::parse("started=1 tracing=2 killed=200 ended=150", false);
        assert!(before
            .to_string()
            .ends_with("ended before the holder was killed"));
        let stopped = Timeline::parse("started=1 tracing=2 killed=3 ended=63", true);
        assert!(stopped
            .to_string()
            .ends_with("(stopped by SIGINT: no incident ended it)"));
        let refused = Timeline::parse("started=1 tracing= killed= ended=2", false);
        assert_eq!(
            refused.to_string(),
            "linger never said it was tracing, no holder killed, linger ended 1.0 s after its start"
        );
        assert_eq!(
            Timeline::parse("", false).to_string(),
            "the guest said no times"
        );
    }
}
