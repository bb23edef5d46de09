//! The stand-in NVIDIA driver module (standin/nvidia.c), built against the guest kernel's
//! headers: it gives the driver-function kprobes real functions to attach to and a slow,
//! sometimes deferred, close to time. And a stand-in libcuda (standin/libcuda.c), whose PLT
//! entries the library uprobes hook.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use super::{guest::Guest, Kernel};

pub fn build(dir: &Path, kernel: &Kernel, guest: Guest) -> Result<PathBuf> {
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
        // this machine's gcc (or cross gcc) builds modules for each of them.
        .arg(format!("CC={}", guest.gcc()))
        .args(guest.kbuild_args())
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

/// The stand-in libcuda.so.1, built once for every guest of an architecture (it runs on their
/// common user space).
pub fn build_library(dir: &Path, guest: Guest) -> Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let src = dir.join("libcuda.c");
    fs::write(&src, include_str!("standin/libcuda.c"))?;
    let lib = dir.join("libcuda.so.1");
    // gcc's default for a shared library: its calls to open and ioctl go through PLT entries,
    // as the real library's do.
    let out = Command::new(guest.gcc())
        .args(["-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .context("running gcc for the stand-in libcuda")?;
    if !out.status.success() {
        bail!(
            "building the stand-in libcuda failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(lib)
}
