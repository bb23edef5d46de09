//! `cargo xtask dist`: what an operator installs without the toolchain, in `target/dist/`: the
//! stripped binary (eBPF embedded), a Debian package for bare-metal and Slurm nodes and the
//! agent's container image for Kubernetes, with their SHA-256 sums.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{build, debian, image, setup};

/// The package's name and the Debian architecture of this machine's build.
const PACKAGE: &str = "linger";
const DEB_ARCH: &str = "amd64";

/// The default configuration, installed as a conffile: the agent's options are the
/// command line's (docs/agent.md); an empty file keeps every default.
const DEFAULT_CONFIG: &str = "\
# linger agent options (docs/agent.md, \"Options and the config file\"): the long options of
# `linger agent`, with `_` or `-`. Options on the unit's command line win over this file.
# metrics_listen = \"127.0.0.1:9477\"
# linger_after = \"30s\"
# lean = false
";

/// What `cargo xtask dist` wrote.
pub struct Dist {
    pub deb: PathBuf,
    pub image: PathBuf,
}

pub fn run() -> Result<Dist> {
    let bin = build::linger(build::Arch::Host)?;
    let root = workspace_root();
    let dist = root.join("target/dist");
    fs::create_dir_all(&dist)?;
    let linger = dist.join(format!("{PACKAGE}-x86_64-linux"));
    fs::copy(&bin, &linger).with_context(|| format!("copying {}", bin.display()))?;
    setup::status(Command::new("strip").arg(&linger))?;
    let deb = package(&root, &linger, &dist)?;
    let base = debian::minbase_root()?;
    let image = image::build(&root, &base, &linger, &version(&root)?, DEB_ARCH, &dist)?;
    sums(&dist, &[&linger, &deb, &image])?;
    for file in [&linger, &deb, &image] {
        eprintln!("xtask dist: {}", file.display());
    }
    Ok(Dist { deb, image })
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf()
}

/// The workspace's version (`[workspace.package]`, which the binary's crate takes).
fn version(root: &Path) -> Result<String> {
    let manifest = fs::read_to_string(root.join("Cargo.toml"))?;
    manifest
        .lines()
        .skip_while(|l| l.trim() != "[workspace.package]")
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .map(str::to_string)
        .context("Cargo.toml's [workspace.package] has no version")
}

/// Lays out the package's tree and builds it with dpkg-deb.
fn package(root: &Path, linger: &Path, dist: &Path) -> Result<PathBuf> {
    let version = version(root)?;
    let tree = dist.join("deb");
    if tree.exists() {
        fs::remove_dir_all(&tree)?;
    }
    let put = |to: &str, from: &Path, mode: u32| -> Result<()> {
        let path = tree.join(to);
        fs::create_dir_all(path.parent().expect("a directory"))?;
        fs::copy(from, &path).with_context(|| format!("{} -> {to}", from.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    put("usr/bin/linger", linger, 0o755)?;
    let unit = fs::read_to_string(root.join("deploy/systemd/linger-agent.service"))?;
    // The unit in the repository is for a binary installed by hand; the package's is in /usr/bin.
    let unit = unit.replace("/usr/local/bin/linger", "/usr/bin/linger");
    let unit_path = tree.join("lib/systemd/system/linger-agent.service");
    fs::create_dir_all(unit_path.parent().expect("a directory"))?;
    fs::write(&unit_path, unit)?;
    for script in [
        "linger-epilog",
        "linger-slurm.sh",
        "linger-undrain",
        "linger-unkillable",
    ] {
        let from = root.join("deploy/slurm").join(script);
        put(&format!("usr/share/linger/slurm/{script}"), &from, 0o755)?;
    }
    put(
        "usr/share/doc/linger/README.md",
        &root.join("README.md"),
        0o644,
    )?;
    for doc in fs::read_dir(root.join("docs"))? {
        let doc = doc?.path();
        if doc.extension().is_some_and(|e| e == "md") {
            let name = doc
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            put(&format!("usr/share/doc/linger/{name}"), &doc, 0o644)?;
        }
    }
    let config = tree.join("etc/linger/linger.toml");
    fs::create_dir_all(config.parent().expect("a directory"))?;
    fs::write(&config, DEFAULT_CONFIG)?;
    let control = tree.join("DEBIAN");
    fs::create_dir_all(&control)?;
    fs::write(control.join("conffiles"), "/etc/linger/linger.toml\n")?;
    fs::write(control.join("control"), control_file(&version))?;
    let deb = dist.join(format!("{PACKAGE}_{version}_{DEB_ARCH}.deb"));
    if setup::which("dpkg-deb").is_none() {
        bail!("dpkg-deb (Debian's dpkg) is needed to build the package");
    }
    setup::status(
        Command::new("dpkg-deb")
            .args(["--build", "--root-owner-group"])
            .arg(&tree)
            .arg(&deb),
    )?;
    fs::remove_dir_all(&tree)?;
    Ok(deb)
}

fn control_file(version: &str) -> String {
    format!(
        "Package: {PACKAGE}\n\
         Version: {version}\n\
         Architecture: {DEB_ARCH}\n\
         Maintainer: linger developers <linger@users.noreply.github.com>\n\
         Depends: libc6 (>= 2.34)\n\
         Section: admin\n\
         Priority: optional\n\
         Homepage: https://github.com/linger/linger\n\
         Description: why a killed process's GPU memory is still in use\n \
         An eBPF tracer that correlates each kill of a GPU process with the NVIDIA driver's\n \
         teardown and the moment the memory is back, and says why it lingers. The agent\n \
         (linger-agent.service, not enabled by installing) serves Prometheus metrics; the\n \
         Slurm kit (epilog, unkillable-step program, undrain check) is in\n \
         /usr/share/linger/slurm.\n"
    )
}

/// `SHA256SUMS` beside the files, in sha256sum's format.
fn sums(dist: &Path, files: &[&Path]) -> Result<()> {
    let out = Command::new("sha256sum")
        .args(files.iter().map(|f| f.file_name().expect("a name")))
        .current_dir(dist)
        .output()
        .context("sha256sum")?;
    if !out.status.success() {
        bail!("sha256sum failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    fs::write(dist.join("SHA256SUMS"), out.stdout)?;
    Ok(())
}
