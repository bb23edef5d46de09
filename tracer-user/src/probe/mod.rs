//! Loading and attaching the eBPF programs, and probing what the kernel allows.

pub mod attach;
mod compat;
pub mod config;
pub mod devices;
pub mod doctor;
pub mod hooks;
mod late_driver;
pub mod library;
pub mod load;
mod maps;
mod object;
pub mod offsets;
mod plt;
pub mod questions;
pub mod sampling;
mod search;
pub mod strategy;
pub mod tracefs;
pub mod xid;

pub use config::{ProbeConfig, DEFAULT_FATAL_SIGNALS};
pub use load::Probes;
