//! `linger agent`'s parts beside the live pipeline: Prometheus metrics and their HTTP
//! endpoint (the incident log is in `output`).

pub mod http;
pub mod lingering;
pub mod metrics;
pub mod node;
