//! `linger wait`: for schedulers, CI, init containers and job epilogs. Blocks until no GPU
//! memory is accounted to dead processes (NVML's figures for pids that are gone or zombies),
//! or until the timeout; then says who still holds what, and why.

use std::{
    fs,
    path::{Path, PathBuf},
    process::ExitCode,
    thread,
    time::{Duration, Instant},
};

use serde::Serialize;
use serde_json::Value;
use tracer_user::{
    analysis::holders::Holders,
    error::Error,
    escape,
    event::{Event, NvmlGpu},
    output::INCIDENT_LOG,
    privileges,
    probe::devices::GpuDevices,
    sink::json,
    source::{nvml, procfs},
};

use super::duration;

/// How often NVML is read while waiting.
const POLL: Duration = Duration::from_millis(100);

#[derive(clap::Args)]
pub struct Args {
    /// Only this GPU (NVML index; repeatable). Default: every GPU.
    #[arg(long = "gpu", value_name = "N")]
    gpus: Vec<u32>,
    /// Give up after this long (exit code 1). Default: wait as long as it takes.
    #[arg(long, value_parser = duration::parse)]
    timeout: Option<Duration>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Treat this char device as a GPU file too (repeatable), when naming holders.
    #[arg(long = "gpu-device", value_name = "PATH")]
    gpu_devices: Vec<PathBuf>,
    /// The agent's state directory: its incident log says who holds a dead process's memory
    /// and why (without it, only the processes that might).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/linger")]
    state_dir: PathBuf,
}

/// Memory NVML accounts to a dead pid.
#[derive(Serialize)]
struct Dead {
    pid: u32,
    gpu: u32,
    bytes: Option<u64>,
    /// `gone` (no such process) or `zombie` (dead, not reaped yet).
    state: &'static str,
    /// The agent's latest word on its death, when its incident log has it.
    incident: Option<Known>,
}

/// What the agent's incident log says about a death.
#[derive(Serialize)]
struct Known {
    id: u64,
    verdict: String,
    hint: String,
    /// Holders still alive.
    holders: Vec<Holder>,
}

/// A live process holding GPU files.
#[derive(Serialize)]
struct Holder {
    pid: u32,
    comm: String,
}

#[derive(Serialize)]
struct Report {
    #[serde(rename = "type")]
    record_type: &'static str,
    clean: bool,
    waited_ms: u64,
    dead: Vec<Dead>,
    /// Without the agent's word: live processes holding GPU files that NVML does not list,
    /// among them whoever inherited or received the dead processes' files (and processes
    /// that only read NVML).
    candidates: Vec<Holder>,
    /// `released`; the agent's verdict (`shared_fd`, `imported`, ...) when its log has the
    /// death; else `not_reaped` (the dead are zombies), `unknown_holder` (candidates exist),
    /// or `pid_unresolved` (nobody visible holds GPU files).
    verdict: String,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    privileges::require("naming the holders of GPU files", privileges::PROC)
        .map_err(Error::from)?;
    let devices = GpuDevices::discover(&args.gpu_devices)?;
    let reader = nvml::Reader::open()
        .map_err(|e| anyhow::anyhow!("{e}: linger wait needs NVML to see the GPUs' memory"))?;
    let start = Instant::now();
    let wanted = |i: u32| args.gpus.is_empty() || args.gpus.contains(&i);
    let expected = (0..reader.count()).filter(|i| wanted(*i)).count();
    loop {
        let gpus: Vec<NvmlGpu> = reader
            .read()
            .into_iter()
            .filter(|g| wanted(g.index))
            .collect();
        let timed_out = args.timeout.is_some_and(|t| start.elapsed() >= t);
        // A GPU NVML failed to read is not clean: read again, and in the end say so.
        if gpus.len() < expected {
            if timed_out {
                anyhow::bail!(
                    "NVML failed to read {} of {expected} GPU(s) until the timeout: cannot tell",
                    expected - gpus.len()
                );
            }
            thread::sleep(POLL);
            continue;
        }
        let dead = dead_of(&gpus, &args.state_dir);
        if dead.is_empty() || timed_out {
            let report = report(dead, &gpus, &devices, start.elapsed());
            if args.json {
                json::write_line(&mut std::io::stdout().lock(), &report)?;
            } else {
                print!("{}", render(&report));
            }
            return Ok(if report.clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            });
        }
        thread::sleep(POLL);
    }
}

fn dead_of(gpus: &[NvmlGpu], state_dir: &Path) -> Vec<Dead> {
    let mut dead: Vec<Dead> = gpus
        .iter()
        .flat_map(|g| g.processes.iter().map(move |p| (g.index, p)))
        .filter(|(_, p)| procfs::dead_or_invisible(p.pid))
        .map(|(gpu, p)| Dead {
            pid: p.pid,
            gpu,
            bytes: p.used,
            state: if procfs::exists(p.pid) {
                "zombie"
            } else {
                "gone"
            },
            incident: None,
        })
        .collect();
    if !dead.is_empty() {
        let log = agent_log(state_dir);
        for d in &mut dead {
            d.incident = log.iter().rev().find_map(|r| known(r, d.pid));
        }
    }
    dead
}

/// The agent's incident log, oldest record first; empty when there is none.
fn agent_log(state_dir: &Path) -> Vec<Value> {
    fs::read_to_string(state_dir.join(INCIDENT_LOG))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn known(record: &Value, pid: u32) -> Option<Known> {
    if record["target"]["pid"] != pid || !record["type"].as_str()?.starts_with("incident") {
        return None;
    }
    let holders = record["holders"]
        .as_array()?
        .iter()
        .filter(|h| h["t_released_ns"].is_null())
        .filter_map(|h| {
            Some(Holder {
                pid: h["pid"].as_u64()? as u32,
                comm: h["comm"].as_str()?.to_string(),
            })
        })
        .filter(|h| procfs::exists(h.pid))
        .collect();
    Some(Known {
        id: record["id"].as_u64()?,
        verdict: record["verdict"]["kind"].as_str()?.to_string(),
        hint: record["verdict"]["hint"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        holders,
    })
}

fn report(dead: Vec<Dead>, gpus: &[NvmlGpu], devices: &GpuDevices, waited: Duration) -> Report {
    let mut table = Holders::default();
    for data in procfs::snapshot(devices, &procfs::Describe::default()) {
        table.on_event(&Event::collector(0, data));
    }
    let listed = |pid: u32| {
        gpus.iter()
            .any(|g| g.processes.iter().any(|p| p.pid == pid))
    };
    let candidates: Vec<Holder> = if dead.is_empty() {
        Vec::new()
    } else {
        table
            .all()
            .filter(|(pid, p)| !listed(*pid) && !p.fds.is_empty())
            .map(|(pid, p)| Holder {
                pid,
                comm: p.comm.clone(),
            })
            .collect()
    };
    let agent = dead.iter().find_map(|d| d.incident.as_ref());
    let verdict = match (dead.is_empty(), agent) {
        (true, _) => "released".to_string(),
        (false, Some(k)) => k.verdict.clone(),
        _ if dead.iter().all(|d| d.state == "zombie") => "not_reaped".into(),
        _ if !candidates.is_empty() => "unknown_holder".into(),
        _ => "pid_unresolved".into(),
    };
    Report {
        record_type: "wait",
        clean: dead.is_empty(),
        waited_ms: waited.as_millis() as u64,
        dead,
        candidates,
        verdict,
    }
}

fn render(r: &Report) -> String {
    if r.clean {
        return format!(
            "no GPU memory of dead processes (waited {} ms)\n",
            r.waited_ms
        );
    }
    let mut s = format!(
        "still held after {} ms: {}\n",
        r.waited_ms,
        r.verdict.replace('_', " ")
    );
    for d in &r.dead {
        let bytes = d.bytes.map_or("?".into(), |b| format!("{} MiB", b >> 20));
        s.push_str(&format!(
            "  GPU{}: {bytes} accounted to pid {} ({})\n",
            d.gpu,
            d.pid,
            if d.state == "zombie" {
                "dead, not reaped yet: its parent has not waited for it"
            } else {
                "no such process"
            }
        ));
    }
    let names = |hs: &[Holder]| -> String {
        hs.iter()
            .map(|h| format!("{}[{}]", escape::terminal(&h.comm), h.pid))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for k in r.dead.iter().filter_map(|d| d.incident.as_ref()) {
        s.push_str(&format!(
            "  incident {}: {}{}\n",
            k.id,
            escape::terminal(&k.hint),
            if k.holders.is_empty() {
                String::new()
            } else {
                format!(" (held by {})", names(&k.holders))
            }
        ));
    }
    match r.verdict.as_str() {
        _ if r.dead.iter().any(|d| d.incident.is_some()) => {}
        "not_reaped" => s.push_str("  the parent must reap it (or exit) first\n"),
        "unknown_holder" => s.push_str(&format!(
            "  processes holding GPU files NVML does not list (a child that inherited them, a \
             process that received them, or one only reading NVML): {}; `linger agent` would \
             know which\n",
            names(&r.candidates)
        )),
        _ => s.push_str(
            "  no visible process holds GPU files NVML does not list (another pid namespace, \
             or a teardown still under way): `linger holders` lists who holds what\n",
        ),
    }
    s
}
