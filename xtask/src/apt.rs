//! Debian's packages that the tasks need (the VM's tools, the cross compiler, bpftrace),
//! installed with apt-get where missing.

use std::process::Command;

use anyhow::{bail, Result};

use crate::setup;

/// `apt-get install`, refreshing the package lists once if the first attempt fails.
pub fn install(packages: &[&str]) -> Result<()> {
    if setup::which("apt-get").is_none() {
        bail!(
            "the test VM needs {} from Debian's archive, and apt-get is not available here",
            packages.join(" ")
        );
    }
    eprintln!("xtask vm: installing {}", packages.join(" "));
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend(packages);
    if apt(&args) || (apt(&["update"]) && apt(&args)) {
        Ok(())
    } else {
        bail!("apt-get install {} failed", packages.join(" "))
    }
}
