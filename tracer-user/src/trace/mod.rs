//! Trace files: record the event stream on one machine, replay or export it on another.
//!
//! Format (docs/trace-format.md): a file header with JSON metadata, then chunks of
//! length-prefixed records, each chunk checked by CRC32C and optionally zstd-compressed. Kernel
//! records are stored as the ring buffer delivered them and decoded on replay by the same
//! decoder as live; user-space events have record kinds of their own.

pub mod format;
mod input;
pub mod meta;
pub mod prefetch;
pub mod reader;
pub mod record;
pub mod snapshot;
pub mod writer;

pub use meta::{EndSummary, TraceMeta};
pub use reader::{TraceError, TraceReader};
pub use writer::{TraceWriter, WriterOptions};

#[cfg(test)]
mod tests;
