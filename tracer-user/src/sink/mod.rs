//! Where incidents go.

pub mod folded;
pub mod holders;
pub mod json;
pub mod perfetto;
pub mod phases;
pub mod stats_svg;
pub mod text;
mod text_line;
mod text_records;
