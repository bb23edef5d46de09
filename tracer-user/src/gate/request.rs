//! What to wait for, and how: `linger wait`'s options as the gate takes them.

use std::{path::PathBuf, time::Duration};

/// What to wait for, and how (`linger wait`'s options, docs/gate.md).
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub pids: Vec<u32>,
    pub pgids: Vec<u32>,
    pub cgroups: Vec<String>,
    pub jobs: Vec<u64>,
    pub pods: Vec<String>,
    pub gpus: Vec<u32>,
    pub uuids: Vec<String>,
    /// The GPUs the job's environment names (SLURM_JOB_GPUS and the like).
    pub job_gpus: bool,
    pub any_process: bool,
    /// Processes `any_process` lets hold GPU files.
    pub allowed: Vec<u32>,
    pub timeout: Option<Duration>,
    pub gpu_devices: Vec<PathBuf>,
    /// Where the agent keeps its incident log.
    pub state_dir: PathBuf,
    /// Decide from this pid namespace's processes alone.
    pub allow_partial_view: bool,
}
