//! What a live run is asked for, as plain values: the commands build it from their options.

use std::{path::PathBuf, time::Duration};

use super::report::Output;
use crate::{analysis::CorrelatorConfig, probe::ProbeConfig, source::procfs};

#[derive(Clone, Debug)]
pub struct Config {
    /// The kernel side; its GPU devices, discovered once, serve the whole run.
    pub probes: ProbeConfig,
    /// Which deaths make incidents, and when memory is lingering.
    pub analysis: CorrelatorConfig,
    /// How incidents are written, and how many.
    pub output: Output,
    /// Stop after this long; `None`: at SIGINT or SIGTERM.
    pub duration: Option<Duration>,
    /// Read GPU memory through NVML.
    pub nvml: bool,
    /// How processes are described (command lines redacted, pods named).
    pub describe: procfs::Describe,
    /// Also write everything traced to a trace file.
    pub recording: Option<Recording>,
    /// The node's name where it is not this UTS namespace's (the agent in a pod: `NODE_NAME`,
    /// or the host's): incidents and the trace file's header carry it.
    pub node_name: Option<String>,
}

/// The trace file of a live run.
#[derive(Clone, Debug)]
pub struct Recording {
    pub path: PathBuf,
    /// zstd-compressed chunks.
    pub compressed: bool,
    /// Replace an existing file of linger's own user.
    pub replace: bool,
}
