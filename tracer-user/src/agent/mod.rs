//! `linger agent`'s parts beside the live pipeline: Prometheus metrics and their HTTP
//! endpoint (the incident log is in `output`).

mod basic_auth;
mod connections;
pub mod http;
pub mod lingering;
pub mod metrics;
pub mod node;
pub mod self_metrics;
pub mod web_config;
