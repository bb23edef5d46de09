//! Debian's kubectl (package kubernetes-client) for the Kubernetes manifests' test: unpacked
//! under `target/kubernetes-client` rather than installed, so that it stands beside any other
//! kubectl the machine has (a Google Cloud SDK's owns /usr/bin/kubectl, and dpkg would refuse
//! the second).

use std::{fs, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};

use crate::build::workspace_root;

const PACKAGE: &str = "kubernetes-client";

/// The unpacked kubectl, downloaded with `apt-get download` the first time.
pub fn debian() -> Result<PathBuf> {
    let dir = workspace_root().join("target").join(PACKAGE);
    let kubectl = dir.join("root/usr/bin/kubectl");
    if kubectl.is_file() {
        return Ok(kubectl);
    }
    fs::create_dir_all(&dir)?;
    eprintln!("xtask: fetching Debian's {PACKAGE} into {}", dir.display());
    let download = || {
        Command::new("apt-get")
            .args(["download", "-q", PACKAGE])
            .current_dir(&dir)
            .status()
            .is_ok_and(|s| s.success())
    };
    let update = || {
        Command::new("apt-get")
            .args(["update", "-qq"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !(download() || (update() && download())) {
        bail!("apt-get download {PACKAGE} failed");
    }
    let deb = fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("the downloaded package")?;
    let ok = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(dir.join("root"))
        .status()
        .is_ok_and(|s| s.success());
    if !ok || !kubectl.is_file() {
        bail!("unpacking {}", deb.display());
    }
    Ok(kubectl)
}
