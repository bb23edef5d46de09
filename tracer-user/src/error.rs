//! Errors of the library; the binary wraps them with anyhow.

use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Permission(#[from] crate::privileges::Missing),
    #[error("reading kernel BTF: {0}")]
    Btf(String),
    #[error("{0}")]
    Mount(String),
    #[error("loading eBPF programs: {0}")]
    Load(String),
    #[error(transparent)]
    Attach(#[from] crate::probe::attach::AttachError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
