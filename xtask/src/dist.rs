//! `cargo xtask dist`: what an operator installs without the toolchain, in `target/dist/`: for
//! x86-64 and arm64 (Grace), the stripped binary (eBPF embedded), a Debian package for
//! bare-metal and Slurm nodes and the agent's container image for Kubernetes, with their
//! SHA-256 sums. The arm64 ones are cross-built (the same build as the arm64 VM's).

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{build, build::Arch, debian, image, setup};

const PACKAGE: &str = "linger";

/// The default configuration, installed as a conffile: the agent's options are the
/// command line's (docs/agent.md); an empty file keeps every default.
const DEFAULT_CONFIG: &str = "\
# linger agent options (docs/agent.md, \"Options and the config file\"): the long options of
# `linger agent`, with `_` or `-`. Options on the unit's command line win over this file.
# metrics_listen = \"127.0.0.1:9477\"
# linger_after = \"30s\"
# lean = false
";

/// One architecture of the release: its build, its names (the binary's, uname's; Debian's
/// and OCI's, which agree) and its strip.
struct Target {
    arch: Arch,
    uname: &'static str,
    debian: &'static str,
    strip: &'static str,
}

const TARGETS: [Target; 2] = [
    Target {
        arch: Arch::Host,
        uname: "x86_64",
        debian: "amd64",
        strip: "strip",
    },
    Target {
        arch: Arch::Aarch64,
        uname: "aarch64",
        debian: "arm64",
        strip: "aarch64-linux-gnu-strip",
    },
];

/// What `cargo xtask dist` wrote: the package and image of each architecture, amd64 first.
pub struct Dist {
    pub deb: PathBuf,
    pub image: PathBuf,
    pub deb_arm64: PathBuf,
    pub image_arm64: PathBuf,
}

pub fn run() -> Result<Dist> {
    let root = workspace_root();
    let dist = root.join("target/dist");
    fs::create_dir_all(&dist)?;
    let version = version(&root)?;
    let mut written = Vec::new();
    for target in &TARGETS {
        let bin = build::linger(target.arch)?;
        let linger = dist.join(format!("{PACKAGE}-{}-linux", target.uname));
        fs::copy(&bin, &linger).with_context(|| format!("copying {}", bin.display()))?;
        setup::status(Command::new(target.strip).arg(&linger))?;
        let deb = package(&root, &linger, target.debian, &dist)?;
        let base = match target.arch {
            Arch::Host => debian::minbase_root()?,
            Arch::Aarch64 => debian::minbase_root_arm64()?,
        };
        let image = image::build(&root, &base, &linger, &version, target.debian, &dist)?;
        written.extend([linger, deb, image]);
    }
    let files: Vec<&Path> = written.iter().map(PathBuf::as_path).collect();
    sums(&dist, &files)?;
    for file in &written {
        eprintln!("xtask dist: {}", file.display());
    }
    let [_, deb, image, _, deb_arm64, image_arm64] = <[PathBuf; 6]>::try_from(written)
        .map_err(|_| anyhow::anyhow!("two architectures write three files each"))?;
    Ok(Dist {
        deb,
        image,
        deb_arm64,
        image_arm64,
    })
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
fn package(root: &Path, linger: &Path, arch: &str, dist: &Path) -> Result<PathBuf> {
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
    fs::write(control.join("control"), control_file(&version, arch))?;
    let deb = dist.join(format!("{PACKAGE}_{version}_{arch}.deb"));
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

fn control_file(version: &str, arch: &str) -> String {
    format!(
        "Package: {PACKAGE}\n\
         Version: {version}\n\
         Architecture: {arch}\n\
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
