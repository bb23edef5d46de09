//! Where events come from.

pub mod collect;
pub mod decode;
pub mod kernel;
pub mod replay;
