//! linger: why is a killed process's GPU memory still in use, and for how long.
//!
//! Sources (kernel ring buffer, trace files, later NVML) produce one [`event::Event`]
//! stream; [`analysis`] turns it into incidents; [`sink`] renders them. Text that other users
//! control (process names, command lines, paths) is shown through [`escape`].

pub mod agent;
pub mod analysis;
pub mod clock;
pub mod error;
pub mod escape;
pub mod event;
pub mod gate;
pub mod live;
pub mod output;
pub mod privileges;
pub mod probe;
pub mod sink;
pub mod source;
pub mod stream;
pub mod trace;
