//! The agent's incident log, followed: each file read once from where the last read stopped
//! (rotated files too: `incidents.jsonl.N` is a file already read under another name, known
//! by its inode), a damaged line (not UTF-8, not JSON) skipped and counted. Incidents are
//! kept by boot and pid, so that a pid reused, or reused after a reboot, does not get another
//! process's verdict.

use std::{
    collections::HashMap,
    fs::{File, OpenOptions},
    io::{Read, Seek, SeekFrom},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use crate::output::INCIDENT_LOG;
use serde::Serialize;
use serde_json::Value;

/// Rotated files looked for: `incidents.jsonl.1` to `.9`.
const ROTATED: usize = 9;

/// What the log says about one death.
#[derive(Clone, Debug, PartialEq)]
pub struct Logged {
    pub id: u64,
    pub pid: u32,
    pub comm: String,
    pub t_signal_ns: u64,
    pub verdict: String,
    pub hint: String,
    pub holders: Vec<LoggedHolder>,
    /// The GPU memory it was to give back.
    pub share_bytes: Option<u64>,
    /// From the signal (or death) to the memory back; None while held.
    pub release_ns: Option<u64>,
}

/// A holder the log names, and how it got the memory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoggedHolder {
    pub pid: u32,
    pub comm: String,
    pub how: String,
    /// It let go (its release is in the log).
    #[serde(skip)]
    pub released: bool,
}

/// How much of the log was read, for the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Reading {
    pub files: usize,
    pub lines: u64,
    /// Lines skipped: not UTF-8, not JSON, or an incident without its fields.
    pub damaged: u64,
}

#[derive(Debug)]
pub struct Log {
    dir: PathBuf,
    boot_id: Option<String>,
    /// Where each file (by device and inode) was read to.
    offsets: HashMap<(u64, u64), u64>,
    /// This boot's incidents by pid, oldest first; an update replaces its incident.
    incidents: HashMap<u32, Vec<Logged>>,
    pub reading: Reading,
}

impl Log {
    /// The log in `dir`, for incidents of the boot `boot_id`.
    pub fn new(dir: &Path, boot_id: Option<String>) -> Self {
        Self {
            dir: dir.to_path_buf(),
            boot_id,
            offsets: HashMap::new(),
            incidents: HashMap::new(),
            reading: Reading::default(),
        }
    }

    /// Reads what was written since the last call, oldest file first.
    pub fn catch_up(&mut self) {
        let main = self.dir.join(INCIDENT_LOG);
        let mut paths: Vec<PathBuf> = (1..=ROTATED)
            .rev()
            .map(|n| PathBuf::from(format!("{}.{n}", main.display())))
            .collect();
        paths.push(main);
        let mut present = Vec::new();
        for path in paths {
            // O_NOFOLLOW: the state directory's files are the agent's, not links planted there.
            let Ok(mut file) = OpenOptions::new()
                .read(true)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&path)
            else {
                continue;
            };
            let Ok(meta) = file.metadata() else {
                continue;
            };
            let id = (meta.dev(), meta.ino());
            present.push(id);
            let mut from = self.offsets.get(&id).copied().unwrap_or(0);
            if meta.len() < from {
                // Truncated in place (logrotate's copytruncate): read it again.
                from = 0;
            }
            if meta.len() > from {
                let to = self.read(&mut file, from);
                self.offsets.insert(id, to);
            } else {
                self.offsets.insert(id, from);
            }
        }
        self.offsets.retain(|id, _| present.contains(id));
        self.reading.files = present.len();
    }

    /// Reads `file`'s whole lines from `from`; returns where the next read starts.
    fn read(&mut self, file: &mut File, from: u64) -> u64 {
        let mut bytes = Vec::new();
        if file.seek(SeekFrom::Start(from)).is_err() || file.read_to_end(&mut bytes).is_err() {
            return from;
        }
        // A line still being written waits for its newline.
        let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else {
            return from;
        };
        for line in bytes[..end].split(|&b| b == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            self.reading.lines += 1;
            self.take(line);
        }
        from + end as u64 + 1
    }

    fn take(&mut self, line: &[u8]) {
        let Ok(record) = serde_json::from_slice::<Value>(line) else {
            self.reading.damaged += 1;
            return;
        };
        if !record["type"]
            .as_str()
            .is_some_and(|t| t == "incident" || t == "incident_update")
        {
            return;
        }
        if record["node"]["boot_id"].as_str() != self.boot_id.as_deref() || self.boot_id.is_none() {
            return;
        }
        let Some(logged) = logged(&record) else {
            self.reading.damaged += 1;
            return;
        };
        let list = self.incidents.entry(logged.pid).or_default();
        match list
            .iter_mut()
            .find(|l| l.id == logged.id && l.t_signal_ns == logged.t_signal_ns)
        {
            Some(old) => *old = logged,
            None => list.push(logged),
        }
    }

    /// The latest incident of `pid` on this boot at or after `since_ns` (the process's start,
    /// when known: an older one is another process's that had the pid before).
    pub fn incident(&self, pid: u32, since_ns: Option<u64>) -> Option<&Logged> {
        self.incidents
            .get(&pid)?
            .iter()
            .filter(|l| since_ns.is_none_or(|s| l.t_signal_ns >= s))
            .max_by_key(|l| l.t_signal_ns)
    }

    /// Past releases: (bytes, ns from the signal to the memory back).
    pub fn releases(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.incidents
            .values()
            .flatten()
            .filter_map(|l| Some((l.share_bytes.filter(|&b| b > 0)?, l.release_ns?)))
    }
}

fn logged(r: &Value) -> Option<Logged> {
    let t_signal_ns = r["t_signal_ns"].as_u64()?;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let holders = r["holders"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| {
            Some(LoggedHolder {
                pid: h["pid"].as_u64()?.try_into().ok()?,
                comm: text(&h["comm"]),
                how: text(&h["how"]),
                released: !h["t_released_ns"].is_null(),
            })
        })
        .collect();
    Some(Logged {
        id: r["id"].as_u64()?,
        pid: r["target"]["pid"].as_u64()?.try_into().ok()?,
        comm: text(&r["target"]["comm"]),
        t_signal_ns,
        verdict: text(&r["verdict"]["kind"]),
        hint: text(&r["verdict"]["hint"]),
        holders,
        share_bytes: r["gpu"]["share_bytes"].as_u64(),
        release_ns: r["gpu"]["t_memory_back_ns"]
            .as_u64()
            .map(|t| t.saturating_sub(t_signal_ns)),
    })
}

#[cfg(test)]
mod tests {
    use std::{fs, io::Write};

    use super::*;

    /// An empty directory of the test's own.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("linger-log-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    const BOOT: &str = "b00t";

    fn line(kind: &str, id: u64, pid: u32, boot: &str, t: u64, verdict: &str) -> String {
        format!(
            r#"{{"type":"{kind}","id":{id},"node":{{"boot_id":"{boot}"}},"target":{{"pid":{pid},"comm":"py"}},"t_signal_ns":{t},"verdict":{{"kind":"{verdict}","hint":"h"}},"holders":[{{"pid":5,"comm":"w","how":"fork"}}],"gpu":{{"share_bytes":1000,"t_memory_back_ns":{}}}}}"#,
            t + 50
        ) + "\n"
    }

    fn append(path: &Path, text: &[u8]) {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open");
        f.write_all(text).expect("write");
    }

    #[test]
    fn matched_by_pid_boot_and_time_and_updated_in_place() {
        let dir = scratch("match");
        let main = dir.join(INCIDENT_LOG);
        append(
            &main,
            line("incident", 1, 7, BOOT, 100, "shared_fd").as_bytes(),
        );
        append(
            &main,
            line("incident", 9, 7, "other-boot", 500, "imported").as_bytes(),
        );
        append(
            &main,
            line("incident", 2, 7, BOOT, 300, "slow_teardown").as_bytes(),
        );
        let mut log = Log::new(&dir, Some(BOOT.into()));
        log.catch_up();
        assert_eq!(log.incident(7, None).map(|l| l.id), Some(2));
        // A process that started after both: neither is its.
        assert!(log.incident(7, Some(301)).is_none());
        assert_eq!(log.incident(7, Some(200)).map(|l| l.id), Some(2));
        append(
            &main,
            line("incident_update", 2, 7, BOOT, 300, "released").as_bytes(),
        );
        log.catch_up();
        assert_eq!(
            log.incident(7, None).map(|l| l.verdict.as_str()),
            Some("released")
        );
        assert_eq!(log.incidents[&7].len(), 2);
        assert_eq!(log.reading.lines, 4);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn damaged_lines_are_counted_and_the_rest_kept() {
        let dir = scratch("damaged");
        let main = dir.join(INCIDENT_LOG);
        append(
            &main,
            line("incident", 1, 7, BOOT, 100, "shared_fd").as_bytes(),
        );
        append(&main, b"{\"type\":\"incident\",\"x\":\"\xff\xfe\"}\n");
        append(&main, b"not json\n");
        // An incident of this boot without its fields.
        append(
            &main,
            b"{\"type\":\"incident\",\"node\":{\"boot_id\":\"b00t\"}}\n",
        );
        append(
            &main,
            line("incident", 2, 8, BOOT, 100, "imported").as_bytes(),
        );
        // Half a line: still being written.
        append(
            &main,
            &line("incident", 3, 9, BOOT, 100, "x").as_bytes()[..20],
        );
        let mut log = Log::new(&dir, Some(BOOT.into()));
        log.catch_up();
        assert_eq!(log.reading.damaged, 3);
        assert!(log.incident(7, None).is_some() && log.incident(8, None).is_some());
        assert!(log.incident(9, None).is_none());
        append(
            &main,
            &line("incident", 3, 9, BOOT, 100, "x").as_bytes()[20..],
        );
        log.catch_up();
        assert!(log.incident(9, None).is_some(), "the line finished is read");
        assert_eq!(log.reading.damaged, 3);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn rotation_is_followed_without_reading_a_line_twice() {
        let dir = scratch("rotate");
        let main = dir.join(INCIDENT_LOG);
        append(&main, line("incident", 1, 7, BOOT, 100, "a").as_bytes());
        let mut log = Log::new(&dir, Some(BOOT.into()));
        log.catch_up();
        // More written, then rotated: .1 is the file already half read.
        append(&main, line("incident", 2, 8, BOOT, 100, "b").as_bytes());
        fs::rename(&main, dir.join(format!("{INCIDENT_LOG}.1"))).expect("rotate");
        append(&main, line("incident", 3, 9, BOOT, 100, "c").as_bytes());
        log.catch_up();
        assert_eq!(log.reading.lines, 3, "each line once");
        assert!([7, 8, 9].iter().all(|&p| log.incident(p, None).is_some()));
        assert_eq!(log.releases().count(), 3);
        // A fresh reader takes the rotated file first.
        let mut fresh = Log::new(&dir, Some(BOOT.into()));
        fresh.catch_up();
        assert_eq!((fresh.reading.files, fresh.reading.lines), (2, 3));
        let _ = fs::remove_dir_all(&dir);
    }
}
