//! The guest's initramfs: busybox, the release `linger` and the scenario's GPU process
//! (stripped) with the libraries `ldd` names, the stand-in driver module, and `init.sh` as
//! /init.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::setup;

/// `programs` land in the guest's root under their file names.
pub fn build(dir: &Path, programs: &[PathBuf], module: &Path) -> Result<PathBuf> {
    let root = dir.join("root");
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("clearing {}", root.display()))?;
    }
    for d in ["bin", "dev", "etc", "proc", "sys", "tmp"] {
        fs::create_dir_all(root.join(d))?;
    }
    let busybox = setup::which("busybox").context("busybox not found after installing it")?;
    fs::copy(&busybox, root.join("bin/busybox"))
        .with_context(|| format!("copying {}", busybox.display()))?;
    let mut needing_libraries = vec![busybox.clone()];
    for program in programs {
        let name = program.file_name().context("program without a name")?;
        // Debug info is most of the binary; the guest loads it into RAM.
        let stripped = root.join(name);
        let strip = Command::new("strip")
            .arg("-o")
            .arg(&stripped)
            .arg(program)
            .status();
        if !strip.is_ok_and(|s| s.success()) {
            fs::copy(program, &stripped)?;
        }
        needing_libraries.push(program.clone());
    }
    for bin in &needing_libraries {
        for lib in libraries(bin)? {
            let to = root.join(lib.strip_prefix("/").unwrap_or(&lib));
            fs::create_dir_all(to.parent().context("library path without a parent")?)?;
            fs::copy(&lib, &to).with_context(|| format!("copying {}", lib.display()))?;
        }
    }
    // doctor's uprobe check resolves libc through the loader cache.
    fs::write(root.join("etc/ld.so.conf"), "")?;
    let _ = Command::new("ldconfig").arg("-r").arg(&root).status();
    fs::copy(module, root.join("standin.ko"))?;
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

/// The shared libraries `ldd` lists for `bin` (none for a static binary).
fn libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .context("running ldd")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
        .collect())
}
