//! `linger wait`: for schedulers, CI, init containers and job epilogs. Blocks until no GPU
//! memory is accounted to dead processes (NVML's figures for pids that are gone or zombies),
//! or until the timeout; then says who still holds what, and why.

use std::{
    path::PathBuf,
    process::ExitCode,
    thread,
    time::{Duration, Instant},
};

use serde::Serialize;
use tracer_user::{
    analysis::holders::Holders,
    error::Error,
    escape,
    event::{Event, NvmlGpu},
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
}

/// Memory NVML accounts to a dead pid.
#[derive(Serialize)]
struct Dead {
    pid: u32,
    gpu: u32,
    bytes: Option<u64>,
    /// `gone` (no such process) or `zombie` (dead, not reaped yet).
    state: &'static str,
}

/// A live process holding GPU files that NVML does not list: what keeps a dead process's
/// memory, when it inherited or received its files.
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
    holders: Vec<Holder>,
    /// `released`, `shared_fd` (live holders of GPU files NVML does not list), `not_reaped`
    /// (the dead processes are zombies), or `pid_unresolved` (nobody visible holds it).
    verdict: &'static str,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    privileges::require("naming the holders of GPU files", privileges::PROC)
        .map_err(Error::from)?;
    let devices = GpuDevices::discover(&args.gpu_devices)?;
    let reader = nvml::Reader::open()
        .map_err(|e| anyhow::anyhow!("{e}: linger wait needs NVML to see the GPUs' memory"))?;
    let start = Instant::now();
    loop {
        let gpus: Vec<NvmlGpu> = reader
            .read()
            .into_iter()
            .filter(|g| args.gpus.is_empty() || args.gpus.contains(&g.index))
            .collect();
        let dead = dead_of(&gpus);
        let timed_out = args.timeout.is_some_and(|t| start.elapsed() >= t);
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

fn dead_of(gpus: &[NvmlGpu]) -> Vec<Dead> {
    gpus.iter()
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
        })
        .collect()
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
    let holders: Vec<Holder> = if dead.is_empty() {
        Vec::new()
    } else {
        table
            .all()
            // Another linger holds nvidiactl for its own NVML reads, never GPU memory.
            .filter(|(pid, p)| !listed(*pid) && p.comm != "linger" && !p.fds.is_empty())
            .map(|(pid, p)| Holder {
                pid,
                comm: p.comm.clone(),
            })
            .collect()
    };
    let verdict = match () {
        _ if dead.is_empty() => "released",
        _ if !holders.is_empty() => "shared_fd",
        _ if dead.iter().all(|d| d.state == "zombie") => "not_reaped",
        _ => "pid_unresolved",
    };
    Report {
        record_type: "wait",
        clean: dead.is_empty(),
        waited_ms: waited.as_millis() as u64,
        dead,
        holders,
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
    match r.verdict {
        "shared_fd" => {
            let who: Vec<String> = r
                .holders
                .iter()
                .map(|h| format!("{}[{}]", escape::terminal(&h.comm), h.pid))
                .collect();
            s.push_str(&format!(
                "  held through its GPU files by {}: the memory comes back when they close \
                 them or exit\n",
                who.join(", ")
            ));
        }
        "not_reaped" => s.push_str("  the parent must reap it (or exit) first\n"),
        _ => s.push_str(
            "  no visible process holds GPU files NVML does not list (another pid namespace, \
             or a teardown still under way): `linger holders` lists who holds what\n",
        ),
    }
    s
}
