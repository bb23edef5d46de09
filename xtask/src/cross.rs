//! `cargo xtask build --arch aarch64`: linger cross-built for arm64 hosts (Grace). The eBPF
//! object is built for the same target: aya-build reads its architecture for the programs that
//! read registers (kprobe and uprobe arguments, the system call arguments at exit). Debian's
//! gcc-aarch64-linux-gnu links it and compiles the C in its dependencies.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::{build, setup, vm};

const TARGET: &str = "aarch64-unknown-linux-gnu";
const GCC: &str = "aarch64-linux-gnu-gcc";

/// Builds target/aarch64-unknown-linux-gnu/release/linger and returns its path.
pub fn linger() -> Result<PathBuf> {
    if setup::which(GCC).is_none() {
        vm::install(&["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"])?;
    }
    let rustup = std::process::Command::new("rustup")
        .args(["target", "add", TARGET])
        .status();
    if !rustup.is_ok_and(|s| s.success()) {
        bail!("rustup target add {TARGET} failed");
    }
    setup::status(
        build::cargo()?
            .args(["build", "--locked", "--release", "--target", TARGET])
            .args(["--package", "tracer-user", "--bin", "linger"])
            .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", GCC)
            .env("CC_aarch64_unknown_linux_gnu", GCC)
            .env("AR_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-ar"),
    )?;
    Ok(build::workspace_root()
        .join("target")
        .join(TARGET)
        .join("release/linger"))
}
