//! `linger wait`: the gate for schedulers, serving frameworks, init containers and job
//! epilogs ([`tracer_user::gate`]): its options, and the answer printed.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use tracer_user::{
    gate::{self, report, Answer, Request},
    sink::json,
};

use super::duration;

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

impl Args {
    fn request(&self) -> Request {
        Request {
            pids: self.pids.clone(),
            pgids: self.pgids.clone(),
            cgroups: self.cgroups.clone(),
            jobs: self.jobs.clone(),
            pods: self.pods.clone(),
            gpus: self.gpus.clone(),
            uuids: self.uuids.clone(),
            job_gpus: self.job_gpus,
            any_process: self.any_process,
            allowed: self.allowed.clone(),
            timeout: self.timeout,
            gpu_devices: self.gpu_devices.clone(),
            state_dir: self.state_dir.clone(),
            allow_partial_view: self.allow_partial_view,
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let report = gate::decide(&args.request())?;
    if args.json {
        json::write_line(&mut std::io::stdout().lock(), &report)?;
    } else {
        print!("{}", report::render(&report));
    }
    let answer = if report.clean {
        Answer::Clean
    } else {
        Answer::Held
    };
    Ok(ExitCode::from(answer.exit_code()))
}
