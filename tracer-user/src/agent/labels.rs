//! The label sets of the agent's series. Names are dcgm-exporter's, so PromQL joins a linger
//! series with dcgm-exporter's on `UUID`.

use prometheus_client::encoding::EncodeLabelSet;

use super::node::Host;
use crate::event::Workload;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IncidentLabels {
    pub termination: String,
    pub verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TerminationLabels {
    pub termination: String,
}

/// Which GPU of which node, as dcgm-exporter labels it: the labels every GPU-scoped series
/// carries. Empty where NVML does not list the GPU (or without NVML), but the host.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
#[expect(
    non_snake_case,
    reason = "dcgm-exporter's label names, so PromQL joins with its series"
)]
pub struct GpuLabels {
    /// NVML's index.
    pub gpu: String,
    pub UUID: String,
    pub modelName: String,
    /// NVML's form, `00000000:3B:00.0`.
    pub pci_bus_id: String,
    /// The device file's name, `nvidia3`.
    pub device: String,
    #[prometheus(flatten)]
    pub host: Host,
}

/// Whom a dead process ran for: the Kubernetes pod (`pod_uid` even where the kubelet's logs
/// do not name it) or the Slurm job (`hpc_job`, dcgm-exporter's name for it).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct WorkloadLabels {
    pub pod: String,
    pub namespace: String,
    pub container: String,
    pub pod_uid: String,
    pub hpc_job: String,
}

impl WorkloadLabels {
    pub(super) fn of(w: Option<&Workload>) -> Self {
        let text = |f: fn(&Workload) -> Option<&String>| w.and_then(f).cloned().unwrap_or_default();
        Self {
            pod: text(|w| w.pod.as_ref()),
            namespace: text(|w| w.namespace.as_ref()),
            container: text(|w| w.container.as_ref()),
            pod_uid: text(|w| w.pod_uid.as_ref()),
            hpc_job: w
                .and_then(|w| w.slurm_job)
                .map(|j| j.to_string())
                .unwrap_or_default(),
        }
    }
}

/// Where lingering memory is and whose it was.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct MemoryLabels {
    #[prometheus(flatten)]
    pub gpu: GpuLabels,
    #[prometheus(flatten)]
    pub workload: WorkloadLabels,
    pub verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct XidLabels {
    #[prometheus(flatten)]
    pub gpu: GpuLabels,
    pub xid: String,
    /// NVIDIA's catalog's immediate action (`RESET_GPU`, ...); empty where it gives none.
    pub action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WhatLabel {
    pub what: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartLabel {
    pub part: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    #[prometheus(flatten)]
    pub host: Host,
    pub version: String,
    pub driver: String,
    pub kernel: String,
    pub strategy: String,
}
