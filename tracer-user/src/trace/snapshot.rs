//! The processes alive when recording starts, so that a replay can name processes whose
//! fork and exec happened before the trace.

use std::fs;

use serde::{Deserialize, Serialize};

use crate::escape;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// Arguments; only the program when command lines are redacted; empty for kernel threads.
    pub cmdline: Vec<String>,
}

/// Reads /proc. Processes that exit while it is read are left out.
pub fn processes(redact_cmdline: bool) -> Vec<Process> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<Process> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| read(pid, redact_cmdline))
        .collect();
    out.sort_by_key(|p| p.pid);
    out
}

fn read(pid: u32, redact_cmdline: bool) -> Option<Process> {
    // Comm and arguments are the process's choice: bytes that are not UTF-8 stay as `\xNN`.
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    let (comm, ppid) = parse_stat(&escape::bytes(&stat))?;
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut cmdline: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| escape::bytes(a).into_owned())
        .collect();
    if redact_cmdline {
        cmdline.truncate(1);
    }
    Some(Process {
        pid,
        ppid,
        comm,
        cmdline,
    })
}

/// `pid (comm) state ppid ...`; the comm may itself hold spaces and parentheses.
fn parse_stat(stat: &str) -> Option<(String, u32)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let ppid = stat
        .get(close + 1..)?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((comm, ppid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_comm() {
        assert_eq!(
            parse_stat("42 (a) b (c)) S 7 42 42 0"),
            Some(("a) b (c)".to_string(), 7))
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn redaction_keeps_only_the_program() {
        let me = std::process::id();
        let full = read(me, false).expect("own process");
        let redacted = read(me, true).expect("own process");
        assert!(full.cmdline.len() >= redacted.cmdline.len());
        assert!(redacted.cmdline.len() <= 1);
        assert_eq!(redacted.cmdline.first(), full.cmdline.first());
    }
}
