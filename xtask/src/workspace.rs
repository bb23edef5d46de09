//! The workspace and the cargo that builds it: its root, and cargo with the eBPF toolchain
//! (bpf-linker) first on PATH. Below the host's and the cross builds alike.

use std::{env, path::PathBuf, process::Command};

use anyhow::Result;

use crate::setup;

/// A `cargo` command with bpf-linker first on PATH. xtask's builds and tests through it pass
/// `--locked`: a stale Cargo.lock fails them instead of being rewritten.
pub fn cargo() -> Result<Command> {
    let bin = setup::run()?;
    let mut paths = vec![bin];
    paths.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.env("PATH", env::join_paths(paths)?);
    Ok(cmd)
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}
