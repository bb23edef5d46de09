//! Cross-building for arm64 hosts (Grace): `cargo xtask build --arch aarch64`, and the programs
//! of the arm64 test VM. The eBPF object is built for the same target: aya-build reads its
//! architecture for the programs that read registers (kprobe and uprobe arguments, the system
//! call arguments at exit). Debian's gcc-aarch64-linux-gnu links it and compiles the C in its
//! dependencies.

use std::process::Command;

use anyhow::{bail, Result};

use crate::{apt, setup, workspace};

pub const TARGET: &str = "aarch64-unknown-linux-gnu";
const GCC: &str = "aarch64-linux-gnu-gcc";
/// A header of libc6-dev-arm64-cross.
const LIBC_HEADER: &str = "/usr/aarch64-linux-gnu/include/stdio.h";

/// `cargo SUBCOMMAND --target aarch64-unknown-linux-gnu` with the cross linker and compiler,
/// installed first where they are missing.
pub fn cargo(subcommand: &str) -> Result<Command> {
    // The compiler alone is not enough (the VM's tools install it without the C library's
    // headers, a mere recommendation of its package): ring's C needs both.
    if setup::which(GCC).is_none() || !std::path::Path::new(LIBC_HEADER).exists() {
        apt::install(&["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"])?;
    }
    let rustup = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status();
    if !rustup.is_ok_and(|s| s.success()) {
        bail!("rustup target add {TARGET} failed");
    }
    let mut cargo = workspace::cargo()?;
    cargo
        .args([subcommand, "--target", TARGET])
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", GCC)
        .env("CC_aarch64_unknown_linux_gnu", GCC)
        .env("AR_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-ar");
    Ok(cargo)
}
