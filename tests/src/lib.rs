//! Helpers shared by the integration tests and benchmarks.
