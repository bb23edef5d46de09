//! `linger agent`'s parts beside the live pipeline: Prometheus metrics and their HTTP
//! endpoint, and the flight recorder (the incident log is in `output`).

mod basic_auth;
pub mod companion;
mod connections;
mod flight;
pub mod http;
pub mod labels;
pub mod lingering;
pub mod metrics;
pub mod node;
pub mod self_metrics;
pub mod web_config;

pub use flight::{FlightOptions, FlightRecorder};
