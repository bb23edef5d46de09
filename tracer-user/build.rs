//! Builds the eBPF programs (tracer-ebpf) with the pinned nightly and bpf-linker. `cargo xtask
//! setup` installs both; bpf-linker is found on PATH or where setup puts it.

use std::{env, path::PathBuf};

include!("ebpf-toolchain.rs");

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=LINGER_TOOLCHAIN_DIR");
    ensure_bpf_linker_on_path()?;
    let package = aya_build::Package {
        name: "tracer-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../tracer-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(EBPF_TOOLCHAIN))
}

fn ensure_bpf_linker_on_path() -> anyhow::Result<()> {
    let path = env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = env::split_paths(&path).collect();
    if dirs.iter().any(|d| d.join("bpf-linker").is_file()) {
        return Ok(());
    }
    let toolchain = env::var_os("LINGER_TOOLCHAIN_DIR")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/linger")));
    // One folder per pinned nightly, as xtask's setup lays it out.
    let Some(bin) = toolchain.map(|t| t.join(EBPF_TOOLCHAIN).join("bpf-linker/bin")) else {
        anyhow::bail!("bpf-linker not found: run `cargo xtask setup`");
    };
    if !bin.join("bpf-linker").is_file() {
        anyhow::bail!(
            "bpf-linker not found on PATH nor in {}: run `cargo xtask setup`",
            bin.display()
        );
    }
    dirs.insert(0, bin);
    // The nested cargo that aya-build spawns inherits this PATH.
    env::set_var("PATH", env::join_paths(dirs)?);
    Ok(())
}
