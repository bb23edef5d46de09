//! Errors of the library; the binary wraps them with anyhow. Each keeps its cause as its source,
//! so a message names the cause once (`attach::chain`, anyhow's `{:#}`).

use std::{error::Error as StdError, io, path::PathBuf};

use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A cause from a library that reports errors untyped (btf-rs returns anyhow's).
pub type BoxedError = Box<dyn StdError + Send + Sync>;

#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Permission(#[from] crate::privileges::Missing),
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error("mounting {fs} at {path} failed{hint}")]
    Mount {
        fs: &'static str,
        path: &'static str,
        /// What to do about it, when the errno says.
        hint: &'static str,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("loading eBPF programs")]
    Load(#[source] Box<aya::EbpfError>),
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error("listing the online CPUs ({path})")]
    OnlineCpus {
        path: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("--gpu-device {}: not a character device", .0.display())]
    NotCharDevice(PathBuf),
    #[error(transparent)]
    Attach(#[from] crate::probe::attach::AttachError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl From<aya::EbpfError> for Error {
    fn from(e: aya::EbpfError) -> Self {
        Self::Load(Box::new(e))
    }
}

/// Why the kernel's BTF did not give what linger needs.
#[derive(Debug, Error)]
pub enum BtfError {
    #[error("reading kernel BTF {path}")]
    Read {
        path: &'static str,
        #[source]
        source: BoxedError,
    },
    #[error("reading kernel BTF for the loader")]
    Loader(#[source] aya::BtfError),
    #[error("kernel BTF: looking up {what}")]
    Lookup {
        what: String,
        #[source]
        source: BoxedError,
    },
    /// The type is there but not as expected.
    #[error("kernel BTF: {0}")]
    Shape(String),
}

/// A map or program of the eBPF object that could not be used.
#[derive(Debug, Error)]
pub enum ObjectError {
    #[error("map {0} missing from the eBPF object")]
    MissingMap(String),
    #[error("map {name}")]
    Map {
        name: String,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("program {0} missing from the eBPF object")]
    MissingProgram(String),
    #[error("program {name}")]
    Program {
        name: String,
        #[source]
        source: aya::programs::ProgramError,
    },
}

impl ObjectError {
    /// `source`, from the map `name`.
    pub fn map(name: &str) -> impl FnOnce(aya::maps::MapError) -> Self + '_ {
        move |source| Self::Map {
            name: name.into(),
            source,
        }
    }
}
