//! The Python tools the tests use, in a virtual environment of the workspace's own.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};

/// The Python tools the tests use, in a virtual environment under `target/python` at the
/// versions `xtask/python-requirements.txt` pins (remade when that file changes), made with
/// Debian's own python3 where there is one: the system's pip is never used (Debian's refuses
/// to install, PEP 668). Returns the environment's `bin`, for the front of the tests' PATH.
pub fn env() -> Result<PathBuf> {
    let root = crate::build::workspace_root();
    let requirements = root.join("xtask/python-requirements.txt");
    let wanted = fs::read_to_string(&requirements).context("xtask/python-requirements.txt")?;
    let env = root.join("target/python");
    let stamp = env.join("requirements.txt");
    let bin = env.join("bin");
    if fs::read_to_string(&stamp).is_ok_and(|had| had == wanted) {
        return Ok(bin);
    }
    let base = ["/usr/bin/python3"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("python3"));
    let make = || {
        let _ = fs::remove_dir_all(&env);
        Command::new(&base)
            .args(["-m", "venv"])
            .arg(&env)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !make() {
        // Debian's python3 makes environments with its python3-venv package.
        crate::apt::install(&["python3-venv"])?;
        if !make() {
            bail!("{} -m venv {} failed", base.display(), env.display());
        }
    }
    eprintln!(
        "xtask: installing the tests' Python tools into {}",
        env.display()
    );
    let ok = Command::new(bin.join("python3"))
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&requirements)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!(
            "installing xtask/python-requirements.txt into {} failed",
            env.display()
        );
    }
    fs::write(&stamp, wanted)?;
    Ok(bin)
}
