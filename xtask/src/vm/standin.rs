//! The stand-in NVIDIA driver module (standin/nvidia.c), built against the guest kernel's
//! headers: it gives the driver-function kprobes real functions to attach to and a slow,
//! sometimes deferred, close to time. And a stand-in libcuda (standin/libcuda.c), whose PLT
//! entries the library uprobes hook.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use super::{guest::Guest, kernels::Kernel};

/// The module with a slow release beside the stand-in (`standin/linger_slow.c`), built with
/// it: the same directory, file name.
pub const SLOW_MODULE: &str = "linger_slow.ko";

/// The modules' sources, by file name.
const MODULE_SOURCES: [(&str, &str); 4] = [
    ("nvidia.c", include_str!("standin/nvidia.c")),
    ("linger_slow.c", include_str!("standin/linger_slow.c")),
    ("Kbuild", include_str!("standin/Kbuild")),
    ("standin-xid.h", include_str!("standin/standin-xid.h")),
];

/// The stand-in module for `kernel`, built in `dir` unless the module already there was
/// built from the same sources for the same kernel release with the same compiler (a kernel's
/// headers of one release do not change): a cache for reruns on this machine, which a fresh
/// clone fills anew.
pub fn build(dir: &Path, kernel: &Kernel, guest: Guest) -> Result<PathBuf> {
    let src = dir.join("standin");
    let module = src.join("nvidia.ko");
    let key_file = src.join("built-from");
    let key = build_key(kernel, guest);
    if module.exists()
        && src.join(SLOW_MODULE).exists()
        && fs::read_to_string(&key_file).is_ok_and(|k| k == key)
    {
        eprintln!(
            "xtask vm: the stand-in module for {} is cached",
            kernel.release
        );
        return Ok(module);
    }
    let _ = fs::remove_file(&key_file);
    fs::create_dir_all(&src)?;
    for (name, text) in MODULE_SOURCES {
        fs::write(src.join(name), text)?;
    }
    make_module(&src, kernel, guest)?;
    fs::write(&key_file, key)?;
    Ok(module)
}

/// What the built module depends on: the kernel release, the compiler, the sources' hash.
fn build_key(kernel: &Kernel, guest: Guest) -> String {
    use std::hash::{Hash, Hasher};
    let mut hash = std::collections::hash_map::DefaultHasher::new();
    MODULE_SOURCES.hash(&mut hash);
    format!(
        "{} {} {:016x}\n",
        kernel.release,
        guest.gcc(),
        hash.finish()
    )
}

fn make_module(src: &Path, kernel: &Kernel, guest: Guest) -> Result<()> {
    let headers = &kernel.headers;
    let out = Command::new("make")
        .arg("-C")
        .arg(headers)
        .arg(format!("M={}", src.display()))
        // Debian's headers name the compiler the kernel was built with (gcc-10 for 5.10):
        // this machine's gcc (or cross gcc) builds modules for each of them.
        .arg(format!("CC={}", guest.gcc()))
        .args(guest.kbuild_args())
        .arg("modules")
        .output()
        .context("running make for the stand-in module (needs make and gcc)")?;
    if !out.status.success() {
        bail!(
            "building the stand-in module against {} failed:\n{}{}",
            headers.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The stand-in libcuda.so.1, built once for every guest of an architecture (it runs on their
/// common user space).
pub fn build_library(dir: &Path, guest: Guest) -> Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let src = dir.join("libcuda.c");
    fs::write(&src, include_str!("standin/libcuda.c"))?;
    let lib = dir.join("libcuda.so.1");
    // gcc's default for a shared library: its calls to open and ioctl go through PLT entries,
    // as the real library's do.
    let out = Command::new(guest.gcc())
        .args(["-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .context("running gcc for the stand-in libcuda")?;
    if !out.status.success() {
        bail!(
            "building the stand-in libcuda failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(lib)
}
