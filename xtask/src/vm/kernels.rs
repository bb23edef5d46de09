//! The kernel matrix: Debian's stock kernels the VM boots, each with the headers the stand-in
//! module is built against. 6.1 is this machine's own Debian 12 kernel (installed from the
//! system's archive); 5.10 (Debian 11) and 6.12 are fetched with an apt sources list of the VM
//! test's own, passed with `-o Dir::Etc::sourcelist=...` so the system's lists never change,
//! and unpacked under `target/vm/kernels/`, where the downloads stay cached.
//!
//! 6.12 is the one Debian 12 ships in bookworm-backports: the same kernel series as Debian 13's,
//! built with Debian 12's compiler and C library. Debian 13's own package cannot have a module
//! built here: its build flags need gcc 14 (this machine has gcc 12) and its kbuild tools
//! (modpost, objtool) glibc 2.38 (this machine has 2.36).
//!
//! The arm64 kernels (ARM64_MATRIX) are Debian 12's 6.1 and bookworm-backports' 6.12, both
//! fetched. Their headers' kbuild tools come from the amd64 package of the same version
//! (Debian's cross-build arrangement: the headers' `scripts` link points at whichever kbuild
//! package is unpacked beside them).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use super::guest::Guest;
use crate::{apt, build::Arch};

/// Where a kernel of the matrix comes from.
pub enum Source {
    /// The newest `linux-image-*-amd64` installed in /boot, with its headers from the system.
    System,
    /// The newest package of `suite` whose name matches `image` (a prefix before the ABI
    /// number and a suffix after it).
    Debian {
        suite: &'static str,
        prefix: &'static str,
        suffix: &'static str,
    },
}

pub struct Spec {
    /// What `--kernel` names it by: the kernel series.
    pub name: &'static str,
    pub source: Source,
}

pub const MATRIX: [Spec; 3] = [
    Spec {
        name: "5.10",
        source: Source::Debian {
            suite: "bullseye",
            prefix: "linux-image-5.10.0-",
            suffix: "-amd64",
        },
    },
    Spec {
        name: "6.1",
        source: Source::System,
    },
    Spec {
        name: "6.12",
        source: Source::Debian {
            suite: "bookworm-backports",
            prefix: "linux-image-6.12.",
            suffix: "+deb12-amd64",
        },
    },
];

/// The arm64 kernels: 6.1 (Debian 12's own) and 6.12 (its backport).
pub const ARM64_MATRIX: [Spec; 2] = [
    Spec {
        name: "6.1",
        source: Source::Debian {
            suite: "bookworm",
            prefix: "linux-image-6.1.0-",
            suffix: "-arm64",
        },
    },
    Spec {
        name: "6.12",
        source: Source::Debian {
            suite: "bookworm-backports",
            prefix: "linux-image-6.12.",
            suffix: "+deb12-arm64",
        },
    },
];

const SOURCES: &str = "\
deb [arch=amd64,arm64] http://deb.debian.org/debian bullseye main
deb [arch=amd64,arm64] http://deb.debian.org/debian-security bullseye-security main
deb [arch=amd64,arm64] http://deb.debian.org/debian bookworm main
deb [arch=amd64,arm64] http://deb.debian.org/debian-security bookworm-security main
deb [arch=amd64,arm64] http://deb.debian.org/debian bookworm-backports main
";

/// The kernel of `spec` for `guest`, fetched into `dir` when it is not there yet.
pub fn resolve(dir: &Path, spec: &Spec, guest: Guest) -> Result<Kernel> {
    match &spec.source {
        Source::System => {
            let mut k = stock_kernel()?;
            k.headers = PathBuf::from(format!("/usr/src/linux-headers-{}", k.release));
            if !k.headers.join("Makefile").exists() {
                apt::install(&[&format!("linux-headers-{}", k.release)])?;
            }
            Ok(k)
        }
        Source::Debian {
            suite,
            prefix,
            suffix,
        } => fetch(&dir.join("kernels"), guest, suite, prefix, suffix),
    }
}

fn fetch(dir: &Path, guest: Guest, suite: &str, prefix: &str, suffix: &str) -> Result<Kernel> {
    let apt = Apt::new(&dir.join("apt"))?;
    let image = apt.newest(suite, prefix, suffix)?;
    let release = image
        .strip_prefix("linux-image-")
        .context("image package name")?
        .to_string();
    let root = dir.join(&release);
    let vmlinuz = root.join(format!("boot/vmlinuz-{release}"));
    let headers = root.join(format!("usr/src/linux-headers-{release}"));
    if !vmlinuz.exists() || !headers.join("Makefile").exists() {
        // The image and headers of the guest's architecture; their common half (for all) and
        // kbuild (this machine's, which runs it) unqualified.
        let arch = guest.debian_arch();
        let headers_pkg = format!("linux-headers-{release}:{arch}");
        let mut packages = vec![format!("{image}:{arch}"), headers_pkg.clone()];
        packages.extend(apt.kernel_dependencies(&headers_pkg)?);
        unpack(&apt, &packages, &root)?;
    }
    // Each time: the path an earlier run wrote may be gone (it named the clone it ran in).
    relocate(&root, &headers)?;
    Ok(Kernel {
        vmlinuz,
        release,
        headers,
    })
}

/// The busybox and ldconfig of Debian's arm64 user space (both static), unpacked once under
/// `dir`; its root.
pub fn arm64_userland(dir: &Path) -> Result<PathBuf> {
    let root = dir.join("kernels/userland-arm64");
    if !root.join("bin/busybox").exists() || !root.join("sbin/ldconfig").exists() {
        let apt = Apt::new(&dir.join("kernels/apt"))?;
        let packages = ["busybox-static:arm64".to_string(), "libc-bin:arm64".into()];
        unpack(&apt, &packages, &root)?;
    }
    Ok(root)
}

/// `packages` downloaded beside `root` (into ROOT.debs) and unpacked into it.
fn unpack(apt: &Apt, packages: &[String], root: &Path) -> Result<()> {
    // Not with_extension: a release's dots (6.1.0-57-arm64) would give every 6.1 one folder.
    let mut debs = root.as_os_str().to_owned();
    debs.push(".debs");
    let debs = PathBuf::from(debs);
    fs::create_dir_all(&debs)?;
    apt.download(&debs, packages)?;
    fs::create_dir_all(root)?;
    for deb in fs::read_dir(&debs)? {
        let deb = deb?.path();
        let ok = Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(root)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            bail!("unpacking {}", deb.display());
        }
    }
    Ok(())
}

/// The headers' Makefile includes its common half by absolute path (`/usr/src/...` as
/// packaged): it lies under `root`, named by its real path (the cache's, not a clone's link to
/// it, which goes with the clone).
fn relocate(root: &Path, headers: &Path) -> Result<()> {
    let root = root
        .canonicalize()
        .with_context(|| format!("resolving {}", root.display()))?;
    let makefile = headers.join("Makefile");
    let text = fs::read_to_string(&makefile)?;
    let moved: String = text
        .lines()
        .map(
            |line| match (line.strip_prefix("include "), line.find("/usr/src/")) {
                (Some(_), Some(at)) => format!("include {}{}\n", root.display(), &line[at..]),
                _ => format!("{line}\n"),
            },
        )
        .collect();
    if moved != text {
        fs::write(&makefile, moved)?;
    }
    Ok(())
}

/// apt-get and apt-cache on the VM test's own sources list and state.
struct Apt {
    options: Vec<String>,
}

impl Apt {
    fn new(dir: &Path) -> Result<Self> {
        let lists = dir.join("lists");
        let cache = dir.join("cache");
        fs::create_dir_all(lists.join("partial"))?;
        fs::create_dir_all(cache.join("archives/partial"))?;
        let sources = dir.join("sources.list");
        fs::write(&sources, SOURCES)?;
        let options = [
            format!("Dir::Etc::sourcelist={}", sources.display()),
            "Dir::Etc::sourceparts=/dev/null".into(),
            // The VM runs on amd64 hosts only (vm.rs), for amd64 and arm64 guests.
            "APT::Architectures::=amd64".into(),
            "APT::Architectures::=arm64".into(),
            format!("Dir::State::Lists={}", lists.display()),
            format!("Dir::Cache={}", cache.display()),
        ]
        .into_iter()
        .flat_map(|o| ["-o".to_string(), o])
        .collect();
        let apt = Self { options };
        // Fresh lists once per run: the archive drops superseded kernels.
        apt.run("apt-get", &["update", "-qq"])?;
        Ok(apt)
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<String> {
        let out = Command::new(tool)
            .args(&self.options)
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .with_context(|| format!("running {tool}"))?;
        if !out.status.success() {
            bail!(
                "{tool} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The highest-versioned package of `suite` named `prefix<version>suffix`, the version
    /// digits and dots only.
    fn newest(&self, suite: &str, prefix: &str, suffix: &str) -> Result<String> {
        let pattern = format!("^{}.*{}$", regex_escape(prefix), regex_escape(suffix));
        let found = self.run("apt-cache", &["search", "--names-only", &pattern])?;
        let mut names: Vec<(Vec<u64>, String)> = found
            .lines()
            .filter_map(|l| l.split(' ').next())
            .filter_map(|n| {
                let middle = n.strip_prefix(prefix)?.strip_suffix(suffix)?;
                // Only the version between them: not the -rt- or -cloud- flavours.
                if middle.is_empty() || !middle.chars().all(|c| c.is_ascii_digit() || c == '.') {
                    return None;
                }
                let version = middle.split('.').filter_map(|p| p.parse().ok()).collect();
                Some((version, n.to_string()))
            })
            .collect();
        names.sort();
        names
            .pop()
            .map(|(_, n)| n)
            .with_context(|| format!("no {prefix}*{suffix} in Debian's {suite}"))
    }

    /// The headers package's own kernel packages: its common half and kbuild.
    fn kernel_dependencies(&self, headers: &str) -> Result<Vec<String>> {
        let show = self.run("apt-cache", &["show", headers])?;
        let depends = show
            .lines()
            .find_map(|l| l.strip_prefix("Depends: "))
            .with_context(|| format!("{headers} without dependencies"))?;
        Ok(depends
            .split(',')
            .filter_map(|d| d.split_whitespace().next())
            .filter(|d| d.starts_with("linux-headers-") || d.starts_with("linux-kbuild-"))
            .map(String::from)
            .collect())
    }

    fn download(&self, into: &Path, packages: &[String]) -> Result<()> {
        let mut args = vec!["download"];
        args.extend(packages.iter().map(String::as_str));
        let out = Command::new("apt-get")
            .args(&self.options)
            .args(&args)
            .current_dir(into)
            .output()
            .context("running apt-get download")?;
        if !out.status.success() {
            bail!(
                "apt-get download {}: {}",
                packages.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = ".+*?()[]{}|^$\\".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// A kernel the guest boots, with the headers its stand-in module is built against.
pub struct Kernel {
    pub vmlinuz: PathBuf,
    /// `uname -r` of it, e.g. 6.1.0-57-amd64.
    pub release: String,
    /// Its headers' directory, for building modules.
    pub headers: PathBuf,
}

/// The newest Debian stock kernel in /boot.
pub fn stock_kernel() -> Result<Kernel> {
    let mut found: Vec<(Vec<u64>, Kernel)> = fs::read_dir("/boot")
        .context("reading /boot")?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let release = name.strip_prefix("vmlinuz-")?.to_string();
            release.ends_with("-amd64").then(|| {
                let version = release
                    .split(|c: char| !c.is_ascii_digit())
                    .filter_map(|n| n.parse().ok())
                    .collect();
                let vmlinuz = e.path();
                let headers = PathBuf::new();
                (
                    version,
                    Kernel {
                        vmlinuz,
                        release,
                        headers,
                    },
                )
            })
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
        .pop()
        .map(|(_, k)| k)
        .context("no /boot/vmlinuz-*-amd64 although linux-image-amd64 is installed")
}

/// The kernels `guest` boots.
pub fn matrix(guest: Guest) -> &'static [Spec] {
    match guest.arch {
        Arch::Host => &MATRIX,
        Arch::Aarch64 => &ARM64_MATRIX,
    }
}
