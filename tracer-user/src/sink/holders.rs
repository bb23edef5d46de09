//! `linger holders`' answer: every process holding GPU files now, and the memory NVML
//! accounts to pids that hold none, as one JSON object or a table.

use serde::Serialize;

use crate::{
    analysis::{holders::Holders, unheld},
    escape,
    event::{Event, NvmlGpu},
    probe::devices::GpuDevices,
    source::{nvml, procfs},
};

#[derive(Serialize)]
pub struct Row {
    pid: u32,
    comm: String,
    ppid: u32,
    cmdline: String,
    cgroup: String,
    ns_pid: Option<u32>,
    /// Descriptors as `fd:major:minor`.
    fds: Vec<String>,
    /// Open files this process shares with others (same group = same open file).
    file_groups: Vec<u64>,
    /// What NVML accounts to this pid; null when NVML does not list it.
    nvml_bytes: Option<u64>,
}

/// Memory NVML accounts to a pid that holds no GPU file here.
#[derive(Serialize)]
pub struct Unresolved {
    pid: u32,
    gpu: u32,
    bytes: Option<u64>,
    /// "dead": no such process; "no_gpu_files": alive but holds no GPU file we can see.
    state: &'static str,
}

/// A GPU with memory in use that NVML lists no process for and nobody here holds the file of.
#[derive(Serialize)]
pub struct Unheld {
    gpu: u32,
    used_bytes: u64,
    /// "nobody", or "not_visible" where this /proc is not the host's.
    holder: &'static str,
}

#[derive(Serialize)]
pub struct Report {
    #[serde(rename = "type")]
    record_type: &'static str,
    holders: Vec<Row>,
    nvml: Option<String>,
    nvml_unresolved: Vec<Unresolved>,
    busy_no_holder: Vec<Unheld>,
}

/// Who holds GPU files of `devices` now, from /proc, with NVML's figures.
pub fn now(devices: &GpuDevices) -> Report {
    let mut holders = Holders::default();
    for data in procfs::snapshot(devices, &procfs::Describe::default()) {
        holders.on_event(&Event::collector(0, data));
    }
    let (gpus, minors, nvml_note) = match nvml::Reader::open() {
        Ok(reader) => {
            let minors = reader.identities().into_iter().map(|(i, _, m)| (i, m));
            (reader.read(), minors.collect(), None)
        }
        Err(e) => (Vec::new(), Vec::new(), Some(e)),
    };
    let nvml_bytes = |pid: u32| -> Option<u64> {
        let listed: Vec<Option<u64>> = gpus
            .iter()
            .flat_map(|g| g.processes.iter().filter(|p| p.pid == pid).map(|p| p.used))
            .collect();
        (!listed.is_empty()).then(|| listed.iter().flatten().sum())
    };
    let mut rows: Vec<Row> = holders
        .all()
        .map(|(pid, p)| {
            let info = p.info.clone().unwrap_or_default();
            let mut file_groups: Vec<u64> = p.fds.values().map(|f| f.file).collect();
            file_groups.sort_unstable();
            file_groups.dedup();
            Row {
                pid,
                comm: p.comm.clone(),
                ppid: p.ppid,
                cmdline: info.cmdline,
                cgroup: info.cgroup,
                ns_pid: info.ns_pid,
                fds: p
                    .fds
                    .iter()
                    .map(|(n, f)| format!("{n}:{}:{}", f.dev >> 20, f.dev & 0xfffff))
                    .collect(),
                file_groups,
                nvml_bytes: nvml_bytes(pid),
            }
        })
        .collect();
    rows.sort_by_key(|r| r.pid);
    let nvml_unresolved = unresolved(&gpus, &holders);
    let holder = if procfs::partial_pid_view().is_some() {
        "not_visible"
    } else {
        "nobody"
    };
    let busy_no_holder = gpus
        .iter()
        .filter(|g| {
            let minor = minors.iter().find(|(i, _)| *i == g.index).and_then(|m| m.1);
            unheld::is_unheld(g, minor, &holders)
        })
        .map(|g| Unheld {
            gpu: g.index,
            used_bytes: g.used,
            holder,
        })
        .collect();
    Report {
        record_type: "holders",
        holders: rows,
        nvml: nvml_note,
        nvml_unresolved,
        busy_no_holder,
    }
}

fn unresolved(gpus: &[NvmlGpu], holders: &Holders) -> Vec<Unresolved> {
    gpus.iter()
        .flat_map(|g| g.processes.iter().map(move |p| (g.index, p)))
        .filter(|(_, p)| !holders.holds_gpu_files(p.pid))
        .map(|(gpu, p)| Unresolved {
            pid: p.pid,
            gpu,
            bytes: p.used,
            state: if procfs::exists(p.pid) {
                "no_gpu_files"
            } else {
                "dead"
            },
        })
        .collect()
}

pub fn render(r: &Report) -> String {
    let mut s = format!(
        "{:>8} {:>8} {:<16} {:>10}  {:<24} {}\n",
        "PID", "PPID", "COMM", "NVML", "FILES", "CMDLINE"
    );
    for row in &r.holders {
        let nvml = row.nvml_bytes.map_or("-".into(), mib);
        let files = format!(
            "{} fds, {} open files",
            row.fds.len(),
            row.file_groups.len()
        );
        s.push_str(&format!(
            "{:>8} {:>8} {:<16} {:>10}  {:<24} {}\n",
            row.pid,
            row.ppid,
            escape::terminal(&row.comm),
            nvml,
            files,
            escape::terminal(&row.cmdline)
        ));
    }
    if r.holders.is_empty() {
        s.push_str("no process holds a GPU file\n");
    }
    if let Some(note) = &r.nvml {
        s.push_str(&format!("{}\n", escape::terminal(note)));
    }
    let shared: Vec<&Row> = r
        .holders
        .iter()
        .filter(|a| {
            r.holders
                .iter()
                .any(|b| b.pid != a.pid && b.file_groups.iter().any(|g| a.file_groups.contains(g)))
        })
        .collect();
    if !shared.is_empty() {
        let pids: Vec<String> = shared.iter().map(|r| r.pid.to_string()).collect();
        s.push_str(&format!(
            "processes sharing open GPU files (memory freed only when all close): {}\n",
            pids.join(", ")
        ));
    }
    for u in &r.nvml_unresolved {
        let unlisted: Vec<String> = r
            .holders
            .iter()
            // Another linger holds nvidiactl for its own NVML reads, never GPU memory.
            .filter(|h| h.nvml_bytes.is_none() && h.comm != "linger")
            .map(|h| format!("{}[{}]", escape::terminal(&h.comm), h.pid))
            .collect();
        let what = if u.state == "dead" {
            "a dead process"
        } else {
            "a process holding no GPU file here"
        };
        s.push_str(&format!(
            "NVML accounts {} on GPU{} to pid {} ({what}); real holder among: {}\n",
            u.bytes.map_or("?".into(), mib),
            u.gpu,
            u.pid,
            if unlisted.is_empty() {
                "none visible (another pid namespace?)".into()
            } else {
                unlisted.join(", ")
            }
        ));
    }
    for u in &r.busy_no_holder {
        s.push_str(&format!(
            "GPU{}: {} in use, NVML lists no process and {}\n",
            u.gpu,
            mib(u.used_bytes),
            if u.holder == "not_visible" {
                "no process visible here holds it (processes in other PID namespaces are not)"
            } else {
                "no process holds its files: only a reset gets it back"
            }
        ));
    }
    s
}

fn mib(b: u64) -> String {
    format!("{} MiB", b >> 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_escapes_names_and_command_lines() {
        let row = |pid, comm: &str, cmdline: &str| Row {
            pid,
            comm: comm.into(),
            ppid: 1,
            cmdline: cmdline.into(),
            cgroup: "/\x1b[2J".into(),
            ns_pid: None,
            fds: vec!["3:195:0".into()],
            file_groups: vec![1],
            nvml_bytes: None,
        };
        let report = Report {
            record_type: "holders",
            holders: vec![
                row(7, "\x1b]0;pwn\x07\\xff", "python3 -c \u{9b}2J\nforged line"),
                row(8, "ok", "ok"),
            ],
            nvml: Some("NVML says \x1b[31mred".into()),
            nvml_unresolved: vec![Unresolved {
                pid: 9,
                gpu: 0,
                bytes: Some(1 << 30),
                state: "dead",
            }],
            busy_no_holder: vec![Unheld {
                gpu: 1,
                used_bytes: 4 << 30,
                holder: "nobody",
            }],
        };
        let text = render(&report);
        assert!(
            text.contains("GPU1: 4096 MiB in use, NVML lists no process and no process holds"),
            "{text}"
        );
        assert!(!text.contains(['\x1b', '\x07', '\u{9b}']), "{text:?}");
        assert!(
            text.contains("python3 -c \\u{9b}2J\\x0aforged line\n"),
            "{text}"
        );
        assert!(text.contains("NVML says \\x1b[31mred\n"), "{text}");
        assert!(
            text.contains("among: \\x1b]0;pwn\\x07\\xff[7], ok[8]"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 7, "no line forged: {text}");
    }
}
