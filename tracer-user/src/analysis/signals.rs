//! Signal names and origins.

pub const SIGKILL: u32 = 9;
pub const SIGTERM: u32 = 15;
pub const SIGCHLD: u32 = 17;

const NAMES: [&str; 32] = [
    "SIG0",
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGILL",
    "SIGTRAP",
    "SIGABRT",
    "SIGBUS",
    "SIGFPE",
    "SIGKILL",
    "SIGUSR1",
    "SIGSEGV",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGWINCH",
    "SIGIO",
    "SIGPWR",
    "SIGSYS",
];

pub fn name(sig: u32) -> String {
    NAMES
        .get(sig as usize)
        .map(|s| s.to_string())
        .unwrap_or_else(|| format!("SIGRT{}", sig.saturating_sub(32)))
}

/// Parses `9`, `KILL` or `SIGKILL` (any case).
pub fn parse(s: &str) -> Option<u32> {
    if let Ok(n) = s.parse::<u32>() {
        return (1..64).contains(&n).then_some(n);
    }
    let upper = s.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    NAMES
        .iter()
        .position(|n| *n == full)
        .map(|i| i as u32)
        .filter(|&i| i > 0)
}

/// Who originated a signal, from its `si_code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// kill(2), tgkill(2), sigqueue(3) and kin: a user process sent it.
    User,
    /// The kernel on its own behalf (OOM killer, SIGKILL on exec, rlimits): SI_KERNEL.
    Kernel,
    /// A hardware fault of the target itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL): si_code > 0.
    Fault,
}

pub fn origin(code: i32) -> Origin {
    match code {
        0x80 => Origin::Kernel,
        c if c > 0 => Origin::Fault,
        _ => Origin::User,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for sig in 1..32 {
            assert_eq!(parse(&name(sig)), Some(sig));
        }
        assert_eq!(parse("kill"), Some(SIGKILL));
        assert_eq!(parse("0"), None);
        assert_eq!(parse("SIGNOPE"), None);
    }
}
