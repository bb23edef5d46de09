//! The kernel's own accounting of eBPF program runs (`kernel.bpf_stats_enabled`): how often each
//! of linger's programs ran and how long it took, read from its program descriptors. Turned on
//! only around an untimed check run (the accounting itself costs a clock read per run).

use std::{collections::HashMap, fs};

use anyhow::{Context, Result};
use serde_json::{json, Value};

const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Program run accounting, on while this lives; the previous setting comes back on drop.
pub struct Accounting {
    previous: String,
}

impl Accounting {
    pub fn on() -> Result<Self> {
        let previous = fs::read_to_string(SYSCTL).context(SYSCTL)?;
        fs::write(SYSCTL, "1").with_context(|| format!("writing {SYSCTL} (as root)"))?;
        Ok(Self { previous })
    }
}

impl Drop for Accounting {
    fn drop(&mut self) {
        let _ = fs::write(SYSCTL, self.previous.trim());
    }
}

/// One program: runs and time in them since the accounting was turned on.
pub struct Program {
    pub name: String,
    pub runs: u64,
    pub ns: u64,
}

impl Program {
    pub fn to_json(&self) -> Value {
        json!({ "name": self.name, "runs": self.runs, "ns": self.ns })
    }
}

/// The eBPF programs process `pid` holds, by name (from the JIT's symbol in /proc/kallsyms).
pub fn programs(pid: u32) -> Result<Vec<Program>> {
    let names = jit_names()?;
    let mut by_name: HashMap<String, Program> = HashMap::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fd"))? {
        let entry = entry?;
        if fs::read_link(entry.path()).ok().as_deref()
            != Some(std::path::Path::new("anon_inode:bpf-prog"))
        {
            continue;
        }
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            entry.file_name().to_string_lossy()
        ))?;
        let field = |key: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_string())
        };
        let tag = field("prog_tag:").unwrap_or_default();
        let num = |key: &str| field(key).and_then(|v| v.parse().ok()).unwrap_or(0);
        let name = names.get(&tag).cloned().unwrap_or(tag);
        let p = by_name.entry(name.clone()).or_insert(Program {
            name,
            runs: 0,
            ns: 0,
        });
        // A program attached through several descriptors is still one program.
        p.runs = p.runs.max(num("run_cnt:"));
        p.ns = p.ns.max(num("run_time_ns:"));
    }
    let mut all: Vec<Program> = by_name.into_values().filter(|p| p.runs > 0).collect();
    all.sort_by_key(|p| std::cmp::Reverse(p.ns));
    Ok(all)
}

/// Program tag → name, from the JIT's `bpf_prog_<tag>_<name>` symbols.
fn jit_names() -> Result<HashMap<String, String>> {
    let syms = fs::read_to_string("/proc/kallsyms")?;
    Ok(syms
        .lines()
        .filter_map(|l| {
            let sym = l.split_whitespace().nth(2)?;
            let (tag, name) = sym.strip_prefix("bpf_prog_")?.split_once('_')?;
            Some((tag.to_string(), name.to_string()))
        })
        .collect())
}
