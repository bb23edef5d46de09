//! The agent's container image, the one the Kubernetes manifests name, built without docker,
//! a registry or a second toolchain: a Debian 12 minbase root from Debian's packages, the
//! binary the workspace built and the health probe, committed by buildah and written as an
//! OCI archive (`podman load -i`, `skopeo copy oci-archive:... docker://...`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::setup;

/// Where the manifests pull it from (deploy/kubernetes/base/linger-agent.yaml).
pub const REPOSITORY: &str = "ghcr.io/linger/linger";

/// Builds `REPOSITORY:version` for `arch` (OCI's name: amd64, arm64) from `base` and the
/// stripped `linger`, and writes it to `dist/linger-image-ARCH.tar`.
pub fn build(
    root: &Path,
    base: &Path,
    linger: &Path,
    version: &str,
    arch: &str,
    dist: &Path,
) -> Result<PathBuf> {
    if ["buildah", "podman", "runc"]
        .iter()
        .any(|p| setup::which(p).is_none())
    {
        crate::apt::install(&["buildah", "podman", "runc"])?;
    }
    let name = format!("{REPOSITORY}:{version}");
    // The base as one layer, without what debootstrap leaves that a container gets from its
    // runtime (/dev, /proc, /sys), its downloads, or what is ours (the completion mark).
    let layer = dist.join(format!("base-{arch}.tar"));
    setup::status(
        Command::new("tar")
            .arg("-C")
            .arg(base)
            .args([
                "--exclude=./dev/*",
                "--exclude=./proc/*",
                "--exclude=./sys/*",
                "--exclude=./.linger-complete",
                // The first stage's own files, on the arm64 base (debian::minbase_root_arm64).
                "--exclude=./debootstrap",
                "--exclude=./var/cache/apt/archives/*.deb",
                "-cf",
            ])
            .arg(&layer)
            .arg("."),
    )?;
    let container = buildah(&["from", "--arch", arch, "scratch"])?;
    let result = fill(root, &container, &layer, linger, version, arch, &name);
    let _ = buildah(&["rm", &container]);
    fs::remove_file(&layer)?;
    result?;
    let archive = dist.join(format!("linger-image-{arch}.tar"));
    if archive.exists() {
        fs::remove_file(&archive)?;
    }
    buildah(&[
        "push",
        &name,
        &format!("oci-archive:{}:{name}", archive.display()),
    ])?;
    Ok(archive)
}

fn fill(
    root: &Path,
    container: &str,
    layer: &Path,
    linger: &Path,
    version: &str,
    arch: &str,
    name: &str,
) -> Result<()> {
    buildah(&["add", container, &layer.display().to_string(), "/"])?;
    buildah(&[
        "copy",
        "--chmod",
        "0755",
        container,
        &linger.display().to_string(),
        "/usr/bin/linger",
    ])?;
    let probe = root.join("deploy/linger-healthz");
    buildah(&[
        "copy",
        "--chmod",
        "0755",
        container,
        &probe.display().to_string(),
        "/usr/bin/linger-healthz",
    ])?;
    buildah(&[
        "config",
        "--arch",
        arch,
        "--os",
        "linux",
        "--entrypoint",
        r#"["/usr/bin/linger"]"#,
        "--cmd",
        "agent",
        "--label",
        &format!("org.opencontainers.image.version={version}"),
        "--label",
        "org.opencontainers.image.title=linger",
        container,
    ])?;
    buildah(&["commit", container, name])?;
    Ok(())
}

/// Runs buildah; its standard output (a container's name, an image's id), trimmed.
fn buildah(args: &[&str]) -> Result<String> {
    let out = Command::new("buildah")
        .args(args)
        .output()
        .with_context(|| format!("running buildah {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "buildah {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
