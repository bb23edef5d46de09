//! The guest's initramfs: busybox, the release `linger` and the scenario's GPU process
//! (stripped) with the libraries they load, the stand-in driver module, and `init.sh` as
//! /init. An arm64 guest gets Debian's arm64 busybox, the cross toolchain's C library, and a
//! loader cache written by Debian's arm64 ldconfig under qemu-user (this machine's ldconfig
//! skips libraries of another architecture).

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{build::Arch, setup};

use super::{guest::Guest, kernels};

/// Where the cross toolchain's arm64 C library lies (Debian's libc6-arm64-cross).
const ARM64_LIBS: &str = "/usr/aarch64-linux-gnu/lib";

/// `programs` land in the guest's root under their file names; `vm` is the directory of the
/// guest architecture's downloads.
pub fn build(
    dir: &Path,
    programs: &[PathBuf],
    module: &Path,
    guest: Guest,
    vm: &Path,
) -> Result<PathBuf> {
    let root = dir.join("root");
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("clearing {}", root.display()))?;
    }
    for d in ["bin", "dev", "etc", "proc", "sys", "tmp"] {
        fs::create_dir_all(root.join(d))?;
    }
    let userland = match guest.arch {
        Arch::Host => None,
        Arch::Aarch64 => Some(kernels::arm64_userland(vm)?),
    };
    let busybox = match &userland {
        None => setup::which("busybox").context("busybox not found after installing it")?,
        Some(root) => root.join("bin/busybox"),
    };
    fs::copy(&busybox, root.join("bin/busybox"))
        .with_context(|| format!("copying {}", busybox.display()))?;
    let mut needing_libraries = vec![busybox.clone()];
    for program in programs {
        let name = program.file_name().context("program without a name")?;
        // Debug info is most of the binary; the guest loads it into RAM.
        let stripped = root.join(name);
        let strip = Command::new(guest.strip())
            .arg("-o")
            .arg(&stripped)
            .arg(program)
            .status();
        if !strip.is_ok_and(|s| s.success()) {
            fs::copy(program, &stripped)?;
        }
        needing_libraries.push(program.clone());
    }
    let libraries = match userland {
        None => host_libraries(&needing_libraries)?,
        Some(_) => arm64_libraries(&needing_libraries)?,
    };
    for (lib, at) in libraries {
        let to = root.join(at.strip_prefix("/").unwrap_or(&at));
        fs::create_dir_all(to.parent().context("library path without a parent")?)?;
        fs::copy(&lib, &to).with_context(|| format!("copying {}", lib.display()))?;
    }
    // doctor's uprobe check resolves libc through the loader cache.
    fs::write(root.join("etc/ld.so.conf"), "")?;
    let mut ldconfig = match &userland {
        None => Command::new("ldconfig"),
        Some(userland) => {
            let mut qemu = Command::new("qemu-aarch64-static");
            qemu.arg(userland.join("sbin/ldconfig"));
            qemu
        }
    };
    let _ = ldconfig.arg("-r").arg(&root).status();
    fs::copy(module, root.join("standin.ko"))?;
    let slow = module.with_file_name(super::standin::SLOW_MODULE);
    fs::copy(slow, root.join(super::standin::SLOW_MODULE))?;
    let init = root.join("init");
    fs::write(&init, include_str!("init.sh"))?;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;
    let out = dir.join("initramfs.cpio");
    let archive = Command::new("sh")
        .arg("-c")
        .arg("cd \"$1\" && find . -print0 | cpio --null -o -H newc --quiet > \"$2\"")
        .arg("sh")
        .arg(&root)
        .arg(&out)
        .status()
        .context("running cpio")?;
    if !archive.success() {
        bail!("cpio failed to pack {}", root.display());
    }
    Ok(out)
}

/// The shared libraries `ldd` lists for `bins` (none for a static binary), each where it is
/// here and where it goes in the guest: the same path.
fn host_libraries(bins: &[PathBuf]) -> Result<Vec<(PathBuf, PathBuf)>> {
    let mut found = Vec::new();
    for bin in bins {
        let out = Command::new("ldd")
            .arg(bin)
            .output()
            .context("running ldd")?;
        found.extend(
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter(|w| w.starts_with('/'))
                .map(|w| (PathBuf::from(w), PathBuf::from(w))),
        );
    }
    Ok(found)
}

/// The arm64 libraries `bins` need, and theirs in turn, from the cross toolchain's C library:
/// into the guest's multiarch directory, and the loader where arm64 programs name it.
fn arm64_libraries(bins: &[PathBuf]) -> Result<Vec<(PathBuf, PathBuf)>> {
    const LOADER: &str = "ld-linux-aarch64.so.1";
    let mut found = vec![(
        Path::new(ARM64_LIBS).join(LOADER),
        Path::new("/lib").join(LOADER),
    )];
    let mut todo: Vec<PathBuf> = bins.to_vec();
    let mut seen = std::collections::BTreeSet::new();
    while let Some(bin) = todo.pop() {
        let out = Command::new("aarch64-linux-gnu-readelf")
            .arg("-d")
            .arg(&bin)
            .output()
            .context("running aarch64-linux-gnu-readelf")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let needed = text
            .lines()
            .filter(|l| l.contains("(NEEDED)"))
            .filter_map(|l| l.split('[').nth(1)?.split(']').next());
        for name in needed {
            if seen.insert(name.to_string()) {
                let lib = Path::new(ARM64_LIBS).join(name);
                if !lib.exists() {
                    bail!("{} needs {name}, not in {ARM64_LIBS}", bin.display());
                }
                found.push((lib.clone(), Path::new("/lib/aarch64-linux-gnu").join(name)));
                todo.push(lib);
            }
        }
    }
    Ok(found)
}
