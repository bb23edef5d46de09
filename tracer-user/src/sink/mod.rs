//! Where incidents go.

pub mod json;
pub mod text;
