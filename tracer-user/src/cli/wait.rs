//! `linger wait`: a gate for schedulers, serving frameworks, init containers and job
//! epilogs. Blocks until the GPUs are clean for the next job, or until the timeout; then says
//! who still holds what, how it got it, and what to do.
//!
//! What clean means depends on the scope: with processes named (`--pid`, `--pgid`,
//! `--cgroup`, `--slurm-job`, `--pod`), the named ones dead and no process of the scope (their
//! children, every process that ran in the cgroup, job or pod) nor any process that got their
//! open GPU files still holding GPU files or memory; with `--any-process`, no process at all
//! holding any on the GPUs but those allowed; always, no GPU memory NVML accounts to a dead
//! process. Without NVML the GPU files alone decide (descriptors and memory mappings).

mod estimate;
mod findings;
mod gate;
mod gpus;
mod holdings;
mod log;
mod released;
mod report;
mod scope;

use std::{
    fs,
    path::PathBuf,
    process::ExitCode,
    thread,
    time::{Duration, Instant},
};

use tracer_user::{
    error::Error,
    privileges,
    probe::devices::GpuDevices,
    sink::json,
    source::{machine, nvml, procfs},
};

use self::{
    gate::{Config, Gate, NvmlScope},
    gpus::{GpuRef, Identity},
    report::{GpuReport, ScopeReport},
    scope::Selectors,
};
use super::duration;

/// How often the gate looks while waiting.
const POLL: Duration = Duration::from_millis(40);

#[derive(clap::Args)]
pub struct Args {
    /// Wait for this process (repeatable) to be dead, with its GPU memory back and no process
    /// it forked or gave its GPU files to still holding them.
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Every process of this process group (repeatable).
    #[arg(long = "pgid", value_name = "PGID")]
    pgids: Vec<u32>,
    /// Every process that ran in this cgroup or below it (repeatable): the path /proc/PID/cgroup
    /// shows, or the directory under /sys/fs/cgroup.
    #[arg(long = "cgroup", value_name = "PATH")]
    cgroups: Vec<String>,
    /// Every process that ran for this Slurm job (repeatable): in its cgroup, or with its
    /// SLURM_JOB_ID in the environment.
    #[arg(long = "slurm-job", value_name = "N")]
    jobs: Vec<u64>,
    /// Every process that ran in this Kubernetes pod (repeatable), by pod UID.
    #[arg(long = "pod", value_name = "UID")]
    pods: Vec<String>,
    /// Only this GPU (NVML index; repeatable). Default: every GPU.
    #[arg(long = "gpu", value_name = "N")]
    gpus: Vec<u32>,
    /// Only this GPU, by UUID (`GPU-...`, or a unique prefix; repeatable).
    #[arg(long = "uuid", value_name = "UUID")]
    uuids: Vec<String>,
    /// Only the GPUs this environment was given: SLURM_JOB_GPUS (device file numbers, as
    /// gres.conf's File=/dev/nvidia[0-N]), else NVIDIA_VISIBLE_DEVICES, else
    /// CUDA_VISIBLE_DEVICES (NVML indices or UUIDs).
    #[arg(long)]
    job_gpus: bool,
    /// Clean means no process at all holds GPU files or memory on the GPUs, alive or dead,
    /// but those allowed.
    #[arg(long)]
    any_process: bool,
    /// With --any-process: this process may hold the GPUs (repeatable).
    #[arg(long = "allow-pid", value_name = "PID", requires = "any_process")]
    allowed: Vec<u32>,
    /// Give up after this long (exit code 1). Default: wait as long as it takes.
    #[arg(long, value_parser = duration::parse)]
    timeout: Option<Duration>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Treat this char device as a GPU file too (repeatable). Where GPUs are named by device
    /// number (`SLURM_JOB_GPUS`), one whose name ends in a number is that GPU's file, looked
    /// at only when it is named (as Slurm numbers gres.conf's `File=`); any other is looked at
    /// whatever GPUs are named.
    #[arg(long = "gpu-device", value_name = "PATH")]
    gpu_devices: Vec<PathBuf>,
    /// The agent's state directory: its incident log says who holds a dead process's memory
    /// and why.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/linger")]
    state_dir: PathBuf,
    /// Decide from the processes /proc shows even where it shows only a pid namespace of its
    /// own (a pod without hostPID): holders outside it are not seen, and NVML's figures for
    /// pids it cannot resolve are all that speaks for them.
    #[arg(long)]
    allow_partial_view: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    privileges::require("naming the holders of GPU files", privileges::PROC)
        .map_err(Error::from)?;
    let mut notes = Vec::new();
    if let Some(ns) = procfs::partial_pid_view() {
        anyhow::ensure!(
            args.allow_partial_view,
            "/proc shows only the processes of pid namespace {ns}, not the host's: a holder \
             outside it (another pod's worker) cannot be seen, so no GPU can be called clean \
             from here: cannot tell. Run in the host's pid namespace (hostPID: true in a pod, \
             as deploy/kubernetes/examples/gpu-pod-gated.yaml does), or pass \
             --allow-partial-view to decide from this namespace's processes and NVML alone"
        );
        notes.push(format!(
            "/proc shows only pid namespace {ns} (--allow-partial-view): holders outside it \
             are not seen"
        ));
    }
    let reader = nvml::Reader::open();
    let known = known_gpus(&reader, &mut notes);
    let discovered = GpuDevices::discover(&args.gpu_devices)?;
    let (gpu_scope, gpus_from) = gpu_scope(&args)?;
    let files: Vec<(PathBuf, u32)> = args
        .gpu_devices
        .iter()
        .cloned()
        .zip(discovered.devs.iter().copied())
        .collect();
    let scoped = scope_gpus(gpu_scope.as_deref(), &known, &discovered, &files)?;
    if !scoped.unresolved.is_empty() {
        notes.push(format!(
            "not found on this machine, so not looked at: {}",
            scoped.unresolved.join(", ")
        ));
    }
    let selectors = selectors(&args)?;
    let devices = &scoped.devices;
    let nvml = match reader {
        Ok(reader) => Some(NvmlScope {
            reader,
            indices: scoped.indices.clone(),
        }),
        Err(e) if devices.majors.is_empty() && devices.devs.is_empty() => {
            anyhow::bail!("{e}, and no GPU device file to look at: cannot tell")
        }
        Err(e) if selectors.is_empty() && !args.any_process => anyhow::bail!(
            "{e}: without NVML, name what to wait for (--pid, --pgid, --cgroup, --slurm-job, \
             --pod or --any-process)"
        ),
        Err(_) => None,
    };
    let scope_report = scope_report(&args, &selectors, &scoped, gpus_from, &discovered);
    let log = args
        .state_dir
        .is_dir()
        .then(|| log::Log::new(&args.state_dir, machine::read().boot_id));
    let mut node_paths = holdings::nvidia_nodes();
    node_paths.extend(args.gpu_devices.iter().cloned());
    let mut gate = Gate::new(Config {
        selectors,
        any_process: args.any_process,
        allowed: args.allowed.clone(),
        devices: scoped.devices,
        node_paths,
        nvml,
        log,
    });
    let waited = wait(&mut gate, args.timeout);
    if !gate.is_clean() && gate.blockers.is_empty() && gate.dead.is_empty() {
        anyhow::bail!(
            "NVML failed to read the GPUs ({} failed answer(s)) until the timeout: cannot tell",
            gate.nvml_failures
        );
    }
    gate.estimate_dead();
    if !gate.scope().unseen.is_empty() {
        notes.push(unseen_note(&gate));
    }
    let mut report = report::report(&gate, scope_report, notes, waited.as_millis() as u64);
    report.log = report.log.filter(|l| l.files > 0);
    if args.json {
        json::write_line(&mut std::io::stdout().lock(), &report)?;
    } else {
        print!("{}", report::render(&report));
    }
    Ok(if report.clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The GPUs NVML lists; without NVML, those the driver lists (and a note of what that
/// leaves unseen).
fn known_gpus(reader: &Result<nvml::Reader, String>, notes: &mut Vec<String>) -> Vec<Identity> {
    let e = match reader {
        Ok(r) => {
            return r
                .identities()
                .into_iter()
                .map(|(index, uuid, minor)| Identity { index, uuid, minor })
                .collect()
        }
        Err(e) => e,
    };
    notes.push(format!(
        "NVML is not available ({e}): decided from the GPU files alone (their \
         descriptors and memory mappings in /proc); memory the driver still frees \
         after the last file closed is not seen"
    ));
    gpus::driver_identities(std::path::Path::new("/proc/driver/nvidia/gpus"))
}

/// The GPUs the gate looks at.
struct ScopedGpus {
    /// Their device files, and those declared with `--gpu-device`.
    devices: GpuDevices,
    /// Their NVML indices; None: every GPU.
    indices: Option<Vec<u32>>,
    /// Those named and found.
    shown: Vec<Identity>,
    /// Those named and not found.
    unresolved: Vec<String>,
}

/// Every GPU when none is named; else those named that are here (an error when none is), with
/// the `--gpu-device` files they take (`files`, path and device).
fn scope_gpus(
    named: Option<&[GpuRef]>,
    known: &[Identity],
    discovered: &GpuDevices,
    files: &[(PathBuf, u32)],
) -> anyhow::Result<ScopedGpus> {
    let Some(refs) = named else {
        return Ok(ScopedGpus {
            devices: discovered.clone(),
            indices: None,
            shown: Vec::new(),
            unresolved: Vec::new(),
        });
    };
    let (found, unresolved) = gpus::resolve(refs, known);
    let (devs, answered) = gpus::named_files(refs, files);
    let unresolved: Vec<String> = unresolved
        .into_iter()
        .filter(|u| {
            !answered
                .iter()
                .any(|n| *u == gpus::describe(&GpuRef::Minor(*n)))
        })
        .collect();
    let extra = GpuDevices {
        majors: Vec::new(),
        devs,
    };
    if found.is_empty() && extra.devs.is_empty() {
        anyhow::bail!(
            "none of the GPUs named is on this machine ({}): cannot tell",
            unresolved.join(", ")
        );
    }
    Ok(ScopedGpus {
        devices: gpus::devices_of(&found, &extra),
        indices: Some(found.iter().map(|g| g.index).collect()),
        shown: found,
        unresolved,
    })
}

/// What was waited for, as the report says it.
fn scope_report(
    args: &Args,
    selectors: &Selectors,
    scoped: &ScopedGpus,
    gpus_from: Option<&'static str>,
    discovered: &GpuDevices,
) -> ScopeReport {
    ScopeReport {
        pids: selectors.pids.clone(),
        pgids: selectors.pgids.clone(),
        cgroups: selectors.cgroups.clone(),
        slurm_jobs: selectors.jobs.clone(),
        pods: selectors.pods.clone(),
        gpus: scoped
            .shown
            .iter()
            .map(|g| GpuReport {
                index: g.index,
                uuid: g.uuid.clone(),
                minor: g.minor,
            })
            .collect(),
        gpus_from,
        unresolved_gpus: scoped.unresolved.clone(),
        devices: discovered
            .devs
            .iter()
            .map(|d| format!("{}:{}", d >> 20, d & 0xfffff))
            .collect(),
        any_process: args.any_process,
        allowed: args.allowed.clone(),
        ..ScopeReport::default()
    }
}

/// Polls the gate until it is clean or `timeout` passes (then looks once more); how long
/// it waited.
fn wait(gate: &mut Gate, timeout: Option<Duration>) -> Duration {
    let start = Instant::now();
    loop {
        if gate.tick() {
            break;
        }
        if timeout.is_some_and(|t| start.elapsed() >= t) {
            gate.look_again();
            break;
        }
        thread::sleep(POLL);
    }
    start.elapsed()
}

/// The GPUs named, and the variable `--job-gpus` read; None: every GPU.
fn gpu_scope(args: &Args) -> anyhow::Result<(Option<Vec<GpuRef>>, Option<&'static str>)> {
    let mut refs: Vec<GpuRef> = args.gpus.iter().map(|&i| GpuRef::Index(i)).collect();
    refs.extend(args.uuids.iter().map(|u| GpuRef::Uuid(u.clone())));
    let mut from = None;
    if args.job_gpus {
        let (name, named) =
            gpus::from_environment(|v| std::env::var(v).ok()).map_err(anyhow::Error::msg)?;
        from = Some(name);
        match named {
            Some(named) => refs.extend(named),
            // Every GPU: as if none were named, unless other options name some.
            None if refs.is_empty() => return Ok((None, from)),
            None => {}
        }
    }
    Ok(((!refs.is_empty()).then_some(refs), from))
}

fn selectors(args: &Args) -> anyhow::Result<Selectors> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let pods = args
        .pods
        .iter()
        .map(|p| {
            let uid = p.replace('_', "-").to_ascii_lowercase();
            let ok = uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
            if ok {
                Ok(uid)
            } else {
                Err(anyhow::anyhow!(
                    "--pod {}: not a pod UID (36 characters, hex and dashes)",
                    tracer_user::escape::terminal(p)
                ))
            }
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Selectors {
        pids: args.pids.clone(),
        pgids: args.pgids.clone(),
        cgroups: args
            .cgroups
            .iter()
            .map(|c| scope::cgroup_path(c, &mountinfo))
            .collect(),
        jobs: args.jobs.clone(),
        pods,
    })
}

fn unseen_note(gate: &Gate) -> String {
    let pids: Vec<String> = gate.scope().unseen.iter().map(u32::to_string).collect();
    let how = if gate.has_nvml() {
        "NVML tells whether their memory is back; children they left are known only from the \
         agent's incident log"
    } else {
        "unless the agent's incident log names their holders, every process holding GPU files \
         on these GPUs may hold theirs and keeps the gate closed"
    };
    format!(
        "pid {} was gone when the gate first looked: {how} (start the gate before the kill, or \
         scope it by cgroup, job or pod, to know)",
        pids.join(", ")
    )
}
