//! The benchmarks' JSON results, as the report's sections take them.

use serde_json::Value;

/// One benchmark command and the JSON it printed.
pub struct Measured {
    /// The command line, run from the workspace root.
    pub command: String,
    pub data: Value,
}

pub struct Results {
    pub storm: Vec<Measured>,
    pub sweep: Measured,
    pub syscall: Measured,
    pub decode: Measured,
    /// `ioctl` and `ioctl-gpu` workloads.
    pub ioctl: Measured,
    pub gpu_ioctl: Measured,
    /// `spin` with the tracer idle, and kills of a 64-thread GPU holder.
    pub idle: Measured,
    pub dying: Measured,
    pub trace: Measured,
    pub replay: Measured,
    /// The `syscalls` workload beside perf, linger and linger --lean.
    pub tax: Measured,
    /// `linger agent` over many kills.
    pub soak: Measured,
    /// `linger wait`'s own cost.
    pub gate: Measured,
    /// The whole-replay fuzz campaign.
    pub fuzz: Measured,
}
