//! One GPU error (an Xid), as an incident or a `gpu_error` record shows it (tied to its
//! process by `analysis/gpu_errors.rs`). Plain data.

use serde::Serialize;

use crate::event::XidSource;

/// One GPU error, as an incident or a `gpu_error` record shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuError {
    pub xid: u32,
    /// What the number means (NVIDIA's Xid catalog, shortened).
    pub meaning: &'static str,
    /// NVIDIA's catalog's immediate action for it (`RESTART_APP`, `RESET_GPU`, `RESTART_BM`,
    /// ...; analysis/xid-catalog.tsv), and that in plain words; null where it gives none.
    pub action: Option<&'static str>,
    pub recommended: Option<&'static str>,
    pub t_ns: u64,
    /// For incidents: milliseconds from the incident's `t_signal_ns` (negative: before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<f64>,
    /// The device's PCI address as the driver named it.
    pub pci: String,
    /// NVML's index and UUID of that device, when NVML runs.
    pub gpu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The process the driver's message names (`pid=`), and its name there.
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_name: Option<String>,
    /// The driver's text after the number.
    pub message: String,
    /// The message was cut to fit the record.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    pub source: XidSource,
}

impl GpuError {
    /// "Xid 31 (MMU fault) on GPU0".
    pub fn describe(&self) -> String {
        let on = match self.gpu {
            Some(i) => format!("GPU{i}"),
            None => format!("PCI {}", self.pci),
        };
        format!("Xid {} ({}) on {on}", self.xid, self.meaning)
    }

    /// "NVIDIA's catalog: reset the GPU (RESET_GPU)", where it says.
    pub fn advice(&self) -> Option<String> {
        let words = self.recommended?;
        let bucket = self.action?;
        Some(format!(
            "NVIDIA's catalog for Xid {}: {words} ({bucket})",
            self.xid
        ))
    }
}
