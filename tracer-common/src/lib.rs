//! Records shared by the eBPF programs and the collector.
//!
//! Every record in the ring buffer starts with a [`Header`] whose `kind` says which payload
//! follows. Kind ids are stable: a trace file written today must decode tomorrow, so ids are
//! never reused and payload structs only grow at their end.
#![no_std]

#[macro_use]
mod wire;

pub mod asleep;
pub mod driver;
pub mod driver_text;
pub mod offsets;
pub mod records;

pub use offsets::KernelOffsets;
pub use records::*;
