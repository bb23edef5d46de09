//! The gate behind `linger wait`: for schedulers, serving frameworks, init containers and job
//! epilogs. Blocks until the GPUs are clean for the next job, or until the timeout; then says
//! who still holds what, how it got it, and what to do.
//!
//! What clean means depends on the scope: with processes named (`--pid`, `--pgid`,
//! `--cgroup`, `--slurm-job`, `--pod`), the named ones dead and no process of the scope (their
//! children, every process that ran in the cgroup, job or pod) nor any process that got their
//! open GPU files still holding GPU files or memory; with `--any-process`, no process at all
//! holding any on the GPUs but those allowed; always, no GPU memory NVML accounts to a dead
//! process. Without NVML the GPU files alone decide (descriptors and memory mappings).
//!
//! Where each part lives: [`request`] (what to wait for), [`scope`] (what belongs to the
//! scope: a new scope is one selector there), [`decision`] (each look at the processes and
//! GPUs), [`rules`] (who blocks, and the answer with its exit code, from plain data: a new
//! rule goes there), [`gpus`] (which GPUs: a new GPU selector goes there), [`report`] (the
//! answer: a new answer field goes there), [`log`] (the agent's incident log), [`scoping`] (a
//! request turned into what to look at).

mod decision;
mod estimate;
mod findings;
mod gpus;
mod holdings;
mod log;
mod released;
pub mod report;
mod request;
mod rules;
mod scope;
mod scoping;

use std::{
    path::PathBuf,
    thread,
    time::{Duration, Instant},
};

pub use self::{request::Request, rules::Answer};

use crate::{
    error::Error,
    privileges,
    probe::devices::GpuDevices,
    source::{machine, nvml, procfs},
};

use self::{
    decision::{Config, Gate, NvmlScope},
    report::Report,
    scoping::{gpu_scope, known_gpus, scope_gpus, scope_report, selectors, unseen_note},
};

/// How often the gate looks while waiting.
const POLL: Duration = Duration::from_millis(40);

/// Waits until the GPUs are clean for the next job or the timeout passes, and says why not;
/// an error when it cannot tell.
pub fn decide(args: &Request) -> anyhow::Result<Report> {
    privileges::require("naming the holders of GPU files", privileges::PROC)
        .map_err(Error::from)?;
    let mut notes = Vec::new();
    if let Some(ns) = procfs::partial_pid_view() {
        notes.push(rules::partial_view(ns, args.allow_partial_view).map_err(anyhow::Error::msg)?);
    }
    let reader = nvml::Reader::open();
    let known = known_gpus(&reader, &mut notes);
    let discovered = GpuDevices::discover(&args.gpu_devices)?;
    let (gpu_scope, gpus_from) = gpu_scope(args)?;
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
    let selectors = selectors(args)?;
    let devices = &scoped.devices;
    let nvml = match reader {
        Ok(reader) => Some(NvmlScope {
            reader,
            indices: scoped.indices.clone(),
        }),
        Err(e) => {
            let has_gpu_files = !devices.majors.is_empty() || !devices.devs.is_empty();
            let names_processes = !selectors.is_empty() || args.any_process;
            rules::without_nvml(&e, has_gpu_files, names_processes).map_err(anyhow::Error::msg)?;
            None
        }
    };
    let scope_report = scope_report(args, &selectors, &scoped, gpus_from, &discovered);
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
    if gate.answer() == Answer::CannotTell {
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
    Ok(report)
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
