//! The stand-in NVIDIA driver module (standin/nvidia.c), built against the guest kernel's
//! headers: it gives the driver-function kprobes real functions to attach to and a slow,
//! sometimes deferred, close to time.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use super::Kernel;

pub fn build(dir: &Path, kernel: &Kernel) -> Result<PathBuf> {
    let headers = &kernel.headers;
    let src = dir.join("standin");
    fs::create_dir_all(&src)?;
    fs::write(src.join("nvidia.c"), include_str!("standin/nvidia.c"))?;
    fs::write(src.join("Kbuild"), include_str!("standin/Kbuild"))?;
    fs::write(
        src.join("standin-xid.h"),
        include_str!("standin/standin-xid.h"),
    )?;
    let out = Command::new("make")
        .arg("-C")
        .arg(headers)
        .arg(format!("M={}", src.display()))
        // Debian's headers name the compiler the kernel was built with (gcc-10 for 5.10):
        // this machine's gcc builds modules for each of them.
        .arg("CC=gcc")
        .arg("modules")
        .output()
        .context("running make for the stand-in module (needs make and gcc)")?;
    if !out.status.success() {
        bail!(
            "building the stand-in module against {} failed:\n{}{}",
            headers.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(src.join("nvidia.ko"))
}
