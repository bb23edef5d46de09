//! Where events come from.

mod asleep;
mod asleep_at_start;
pub mod collect;
pub mod cost;
pub mod decode;
pub mod gpu;
pub mod kallsyms;
pub mod kcmp;
pub mod kernel;
pub mod kmsg;
pub mod kmsg_clock;
pub mod machine;
pub mod nvml;
mod nvml_budget;
pub mod pace;
pub mod procfs;
pub mod replay;
pub mod stacks;
pub mod workload;
