//! The eBPF toolchain: the pinned nightly (tracer-user/ebpf-toolchain.rs) with rust-src, and
//! bpf-linker 0.13 linked against that nightly's own libLLVM (no LLVM package of the right version
//! exists here), in a folder of its own per pinned nightly. Idempotent: a stamp file records what
//! was built, so a second run only checks.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

// EBPF_TOOLCHAIN, the pinned nightly, shared with tracer-user's build.rs.
include!("../../tracer-user/ebpf-toolchain.rs");

/// The pinned nightly the eBPF crate is built (and linted) with.
pub const EBPF_NIGHTLY: &str = EBPF_TOOLCHAIN;

const BPF_LINKER_VERSION: &str = "0.13.0";
/// The LLVM major bpf-linker is built for; the pinned nightly's must match.
const LLVM_MAJOR: &str = "22";

/// Where the toolchain pieces live: `$LINGER_TOOLCHAIN_DIR`, else `~/.cache/linger`.
pub fn toolchain_dir() -> Result<PathBuf> {
    if let Some(dir) = env::var_os("LINGER_TOOLCHAIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let home = env::var_os("HOME").context("HOME is not set")?;
    Ok(Path::new(&home).join(".cache/linger"))
}

/// What is built for the pinned nightly: `bpf-linker/` and `rust-llvm/` (tracer-user's build.rs
/// looks there too). A folder per nightly: checkouts pinned to different ones do not rebuild
/// each other's bpf-linker.
fn pinned_dir() -> Result<PathBuf> {
    Ok(toolchain_dir()?.join(EBPF_TOOLCHAIN))
}

/// The folder holding `bpf-linker`, to put first on PATH.
pub fn bpf_linker_bin() -> Result<PathBuf> {
    Ok(pinned_dir()?.join("bpf-linker/bin"))
}

/// Ensures everything is in place; returns the bpf-linker folder.
pub fn run() -> Result<PathBuf> {
    if which("rustup").is_none() {
        bail!(
            "rustup not found on PATH: linger builds its eBPF programs with rustup's \
             {EBPF_TOOLCHAIN} toolchain; install rustup (https://rustup.rs) and run \
             `cargo xtask setup` again"
        );
    }
    ensure_nightly()?;
    let llvm = nightly_libllvm()?;
    let bin = bpf_linker_bin()?;
    let stamp_path = pinned_dir()?.join("bpf-linker/STAMP");
    let want = format!(
        "bpf-linker {BPF_LINKER_VERSION} against {}\n",
        llvm.display()
    );
    if fs::read_to_string(&stamp_path).ok().as_deref() == Some(want.as_str())
        && bin.join("bpf-linker").exists()
    {
        return Ok(bin);
    }
    build_bpf_linker(&llvm)?;
    fs::write(&stamp_path, want)?;
    Ok(bin)
}

/// The pinned nightly with rust-src, that date exactly (never whatever `nightly` is today).
fn ensure_nightly() -> Result<()> {
    let installed = output("rustup", &["toolchain", "list"])?;
    // Listed with the host's triple: nightly-2026-05-20-x86_64-unknown-linux-gnu.
    let listed = format!("{EBPF_TOOLCHAIN}-");
    if !installed.lines().any(|l| l.starts_with(&listed)) {
        eprintln!("xtask: installing the {EBPF_TOOLCHAIN} toolchain with rust-src");
        status(Command::new("rustup").args([
            "toolchain",
            "install",
            EBPF_TOOLCHAIN,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))
        .with_context(|| format!("installing {EBPF_TOOLCHAIN} with rustup failed"))?;
    }
    let components = output(
        "rustup",
        &[
            "component",
            "list",
            "--toolchain",
            EBPF_TOOLCHAIN,
            "--installed",
        ],
    )?;
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        eprintln!("xtask: adding rust-src to {EBPF_TOOLCHAIN}");
        status(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            EBPF_TOOLCHAIN,
        ]))
        .with_context(|| format!("adding rust-src to {EBPF_TOOLCHAIN} failed"))?;
    }
    Ok(())
}

/// The pinned nightly's own libLLVM, after checking its major version.
fn nightly_libllvm() -> Result<PathBuf> {
    let toolchain = format!("+{EBPF_TOOLCHAIN}");
    let verbose = output("rustc", &[&toolchain, "--version", "--verbose"])?;
    let llvm_version = verbose
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .with_context(|| format!("rustc {toolchain} does not report its LLVM version"))?;
    let major = llvm_version.split('.').next().unwrap_or_default();
    if major != LLVM_MAJOR {
        bail!(
            "{EBPF_TOOLCHAIN} uses LLVM {llvm_version}, but bpf-linker {BPF_LINKER_VERSION} is \
             built here with its llvm-{LLVM_MAJOR} feature: pin a nightly with LLVM \
             {LLVM_MAJOR} (tracer-user/ebpf-toolchain.rs) or change LLVM_MAJOR with it"
        );
    }
    let sysroot = output("rustc", &[&toolchain, "--print", "sysroot"])?;
    let lib = Path::new(sysroot.trim()).join("lib");
    fs::read_dir(&lib)
        .with_context(|| format!("reading {}", lib.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("libLLVM.so.") && name.ends_with("-nightly")
        })
        .with_context(|| format!("no libLLVM.so.*-nightly in {}", lib.display()))
}

/// bpf-linker's llvm-sys build looks for `lib/libLLVM.so` under LLVM_PREFIX; a prefix of
/// symlinks to nightly's library satisfies it, and the binary keeps an rpath into it.
fn build_bpf_linker(llvm: &Path) -> Result<()> {
    let dir = pinned_dir()?;
    let prefix = dir.join("rust-llvm");
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib)?;
    let name = llvm.file_name().context("libLLVM has no file name")?;
    for link in [lib.join("libLLVM.so"), lib.join(name)] {
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(llvm, &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against {} (about a minute)",
        llvm.display()
    );
    status(
        Command::new("cargo")
            .args([
                "install",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                "--locked",
                "--force",
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{LLVM_MAJOR}"),
            ])
            .arg("--root")
            .arg(dir.join("bpf-linker"))
            .env("LLVM_PREFIX", &prefix),
    )
    .context("building bpf-linker failed")
}

pub fn which(program: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn output(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn status(cmd: &mut Command) -> Result<()> {
    let s = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !s.success() {
        bail!("{cmd:?} exited with {s}");
    }
    Ok(())
}
