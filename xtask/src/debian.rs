//! Clean Debian 12 roots from Debian's own packages (debootstrap's minbase), made once and
//! kept in the cache: the package's test installs into an overlay of one, and the agent's
//! image is built on the other.

use std::{fs, path::PathBuf, process::Command};

use anyhow::Result;

use crate::setup;

/// With systemd, whose units `systemd-analyze verify --root` needs, and procps, whose `kill`
/// the unit reloads with: the package's test.
pub fn systemd_root() -> Result<PathBuf> {
    root("debian-12-systemd", &["systemd", "procps"], None)
}

/// Nothing beyond minbase (bash for the health probe, glibc for the binary): the image's base.
pub fn minbase_root() -> Result<PathBuf> {
    root("debian-12-minbase", &[], None)
}

/// The arm64 image's base: debootstrap's first stage only (`--foreign`), which unpacks the same
/// packages without running their scripts, since the second stage would run arm64 programs
/// and this machine has no binfmt handler to run them through. What the image runs (glibc,
/// bash, the binary) needs only the files; the packages stay unconfigured.
pub fn minbase_root_arm64() -> Result<PathBuf> {
    root("debian-12-minbase-arm64", &[], Some("arm64"))
}

fn root(name: &str, include: &[&str], foreign: Option<&str>) -> Result<PathBuf> {
    let root = setup::toolchain_dir()?.join(name);
    let done = root.join(".linger-complete");
    if done.exists() {
        return Ok(root);
    }
    if setup::which("debootstrap").is_none() {
        crate::apt::install(&["debootstrap"])?;
    }
    let partial = root.with_extension("partial");
    if partial.exists() {
        fs::remove_dir_all(&partial)?;
    }
    eprintln!("xtask: a clean Debian 12 root, {name} (debootstrap, once)");
    let mut debootstrap = Command::new("debootstrap");
    debootstrap.arg("--variant=minbase");
    if let Some(arch) = foreign {
        debootstrap.args(["--foreign", &format!("--arch={arch}")]);
    }
    if !include.is_empty() {
        debootstrap.arg(format!("--include={}", include.join(",")));
    }
    setup::status(
        debootstrap
            .arg("bookworm")
            .arg(&partial)
            .arg("http://deb.debian.org/debian"),
    )?;
    if root.exists() {
        fs::remove_dir_all(&root)?;
    }
    fs::rename(&partial, &root)?;
    fs::write(&done, "")?;
    Ok(root)
}
