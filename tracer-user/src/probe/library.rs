//! The NVIDIA user-space libraries' calls into the C library, hooked where they leave the
//! library: the entries of its procedure linkage table (PLT) for ioctl, syscall, open, dup and
//! close. A uprobe there traps only in processes that load the library, where a system call
//! tracepoint taxes every system call of every process. The libraries are found through the
//! dynamic linker's cache as a process would find them; every distinct file (a container's
//! bind mount is the same file) is hooked.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::{self, File},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use aya::Ebpf;
use object::{
    read::elf::ElfFile64, Endianness, Object, ObjectSection, ObjectSymbol, ObjectSymbolTable,
    ReadCache, RelocationFlags, RelocationTarget,
};

use super::{
    attach::{self, AttachError, Hook},
    compat,
    plt::Plt,
};
use crate::event::Strategy;

/// The libraries through which CUDA programs and NVML users talk to the driver.
pub const LIBRARIES: [&str; 2] = ["libcuda.so.1", "libnvidia-ml.so.1"];

/// Where they are when the linker's cache does not say: Debian's and Ubuntu's directories for
/// this machine's architecture (multiarch), then the driver's and containers' usual places.
const FALLBACK_DIRS: [&str; 5] = [
    MULTIARCH[0],
    MULTIARCH[1],
    "/usr/lib64",
    "/usr/local/nvidia/lib64",
    "/usr/lib",
];

/// The multiarch directories of the architecture linger is built for: a library of another
/// architecture is one no process here loads.
const MULTIARCH: [&str; 2] = if cfg!(target_arch = "aarch64") {
    ["/usr/lib/aarch64-linux-gnu", "/lib/aarch64-linux-gnu"]
} else {
    ["/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"]
};

/// The C library functions whose PLT entries are hooked, and by which programs: an entry
/// program sees the arguments, a return program the result.
const IMPORTS: [(&str, &[&str]); 9] = [
    ("ioctl", &["lib_ioctl", "lib_ioctl_ret"]),
    ("syscall", &["lib_syscall", "lib_ioctl_ret"]),
    ("open", &["lib_open_ret"]),
    ("open64", &["lib_open_ret"]),
    ("openat", &["lib_open_ret"]),
    ("openat64", &["lib_open_ret"]),
    ("dup", &["lib_dup_ret"]),
    ("dup2", &["lib_dup_ret"]),
    ("dup3", &["lib_dup_ret"]),
];

/// close: its own entry program.
const CLOSE: (&str, &[&str]) = ("close", &["lib_close"]);

/// Imports whose programs serve the ledger (left out with `--no-ioctls`).
const IOCTL_IMPORTS: [&str; 2] = ["ioctl", "syscall"];

/// One library and the file offsets of its PLT entries, by imported function.
#[derive(Debug, PartialEq)]
pub struct Library {
    pub path: PathBuf,
    pub entries: BTreeMap<String, u64>,
}

/// Where a driver's user-space libraries may be: the machine's own root, and the driver root
/// of the NVIDIA GPU operator's driver container (mounted on the host at /run/nvidia/driver),
/// whose libraries are the ones its workloads' containers get.
pub const DRIVER_ROOTS: [&str; 2] = ["/", "/run/nvidia/driver"];

/// The NVIDIA libraries installed here, one per distinct file.
pub fn find() -> Vec<PathBuf> {
    find_in(&DRIVER_ROOTS.map(Path::new), &LIBRARIES)
}

/// The first copy of library `name` (e.g. libnvidia-ml.so.1) under the driver roots.
pub fn find_one(name: &str) -> Option<PathBuf> {
    find_in(&DRIVER_ROOTS.map(Path::new), &[name])
        .into_iter()
        .next()
}

/// The library cuda-compat ships a newer copy of (compat.rs).
const COMPAT_LIBRARY: &str = "libcuda.so.1";

/// `names` under each of `roots`: where its linker cache says, else in the usual directories;
/// libcuda also in the cuda-compat directories.
fn find_in(roots: &[&Path], names: &[&str]) -> Vec<PathBuf> {
    let mut seen = BTreeSet::new();
    let mut found = Vec::new();
    for root in roots {
        let cache = fs::read(root.join("etc/ld.so.cache")).unwrap_or_default();
        let under = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
        for name in names {
            let cached = ld_cache_paths(&cache, name).into_iter().map(|p| under(&p));
            let fallback = FALLBACK_DIRS.iter().map(|d| under(Path::new(d)).join(name));
            let compat_dirs = if *name == COMPAT_LIBRARY {
                compat::dirs(root)
            } else {
                Vec::new()
            };
            let compat = compat_dirs.into_iter().map(|d| d.join(name));
            for path in cached.chain(fallback).chain(compat) {
                let Ok(real) = fs::canonicalize(&path) else {
                    continue;
                };
                let Ok(meta) = fs::metadata(&real) else {
                    continue;
                };
                if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
                    found.push(real);
                }
            }
        }
    }
    found
}

/// The paths the dynamic linker's cache (glibc's "glibc-ld.so.cache1.1" format) gives for
/// `name`. A cache it cannot read gives none.
pub fn ld_cache_paths(cache: &[u8], name: &str) -> Vec<PathBuf> {
    const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    const HEADER: usize = 48;
    const ENTRY: usize = 24;
    let Some(start) = cache.windows(MAGIC.len()).position(|w| w == MAGIC) else {
        return Vec::new();
    };
    let u32_at = |at: usize| -> Option<usize> {
        let b = cache.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    // String offsets are from the start of this header.
    let string = |at: usize| -> Option<&[u8]> {
        let s = cache.get(start.checked_add(at)?..)?;
        Some(&s[..s.iter().position(|b| *b == 0)?])
    };
    let Some(count) = u32_at(start + MAGIC.len()) else {
        return Vec::new();
    };
    let mut paths = Vec::new();
    for i in 0..count {
        let at = start + HEADER + i * ENTRY;
        let (Some(key), Some(value)) = (u32_at(at + 4), u32_at(at + 8)) else {
            break;
        };
        if string(key) == Some(name.as_bytes()) {
            if let Some(v) = string(value).and_then(|v| std::str::from_utf8(v).ok()) {
                paths.push(PathBuf::from(v));
            }
        }
    }
    paths
}

/// The PLT entries of `path` for the imports hooked. Its file is read only where the ELF
/// structures are, not whole (libcuda is about 100 MB).
pub fn entries(path: &Path) -> Result<Library, String> {
    let file = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let cache = ReadCache::new(file);
    let elf = ElfFile64::<Endianness, _>::parse(&cache)
        .map_err(|e| format!("{}: not a 64-bit ELF file ({e})", path.display()))?;
    let plt = Plt::of(elf.architecture()).ok_or_else(|| {
        format!(
            "{}: built for {:?}; only x86-64 and aarch64 libraries are read",
            path.display(),
            elf.architecture()
        )
    })?;
    let wanted: BTreeSet<&str> = IMPORTS.iter().chain([&CLOSE]).map(|(n, _)| *n).collect();
    let symbols = elf
        .dynamic_symbol_table()
        .ok_or_else(|| format!("{}: no dynamic symbols", path.display()))?;
    // GOT slot address -> the function the dynamic linker puts there.
    let mut slots = BTreeMap::new();
    for (offset, reloc) in elf.dynamic_relocations().into_iter().flatten() {
        let RelocationFlags::Elf { r_type } = reloc.flags() else {
            continue;
        };
        if !plt.slot_relocations().contains(&r_type) {
            continue;
        }
        let RelocationTarget::Symbol(index) = reloc.target() else {
            continue;
        };
        let name = symbols.symbol_by_index(index).and_then(|s| s.name());
        if let Ok(name) = name.map(|n| n.split('@').next().unwrap_or(n)) {
            if wanted.contains(name) {
                slots.insert(offset, name.to_string());
            }
        }
    }
    let mut entries = BTreeMap::new();
    for section in plt.sections() {
        let Some(s) = elf.section_by_name(section) else {
            continue;
        };
        let (Ok(data), Some((file_offset, _))) = (s.data(), s.file_range()) else {
            continue;
        };
        for (at, name) in plt.jumps(section, data, s.address(), &slots) {
            entries.entry(name).or_insert(file_offset + at);
        }
    }
    Ok(Library {
        path: path.to_path_buf(),
        entries,
    })
}

/// The imports of `lib` hooked, with their programs and PLT entries' offsets.
fn hooked(lib: &Library, ioctls: bool) -> Vec<(&'static str, &'static [&'static str], u64)> {
    IMPORTS
        .iter()
        .chain([&CLOSE])
        .filter(|(import, _)| ioctls || !IOCTL_IMPORTS.contains(import))
        .filter_map(|&(import, programs)| Some((import, programs, *lib.entries.get(import)?)))
        .collect()
}

/// Hooks every library's entries: all or, on any refusal, none.
pub fn attach(ebpf: &mut Ebpf, libraries: &[Library], ioctls: bool) -> Result<(), AttachError> {
    let targets: Vec<String> = libraries
        .iter()
        .map(|l| l.path.to_string_lossy().into_owned())
        .collect();
    let mut pairs = Vec::new();
    for (lib, library) in libraries.iter().zip(&targets) {
        for (import, programs, offset) in hooked(lib, ioctls) {
            let hook = Hook::PltUprobe {
                library,
                import,
                offset,
            };
            pairs.extend(programs.iter().map(|p| (*p, hook)));
        }
    }
    attach::attach_all(ebpf, &pairs, None).map(|_| ())
}

/// Hooks the NVIDIA libraries found here; whether it did (why not is in the strategy's
/// reasons).
pub fn hook(
    ebpf: &mut Ebpf,
    strategy: &mut Strategy,
    attached: &mut Vec<String>,
    ioctls: bool,
) -> bool {
    let mut libs = Vec::new();
    for path in find() {
        match entries(&path) {
            Ok(lib) if lib.entries.contains_key("ioctl") || lib.entries.contains_key("syscall") => {
                libs.push(lib)
            }
            Ok(_) => strategy.reasons.push(format!(
                "{}: no PLT entry for ioctl or syscall, not hooked",
                path.display()
            )),
            Err(e) => strategy.reasons.push(format!("{e}: not hooked")),
        }
    }
    if libs.is_empty() {
        strategy.reasons.push(format!(
            "NVIDIA libraries: none of {} found (ld.so.cache and the usual directories), \
             none hooked",
            LIBRARIES.join(", ")
        ));
        return false;
    }
    if let Err(e) = attach(ebpf, &libs, ioctls) {
        strategy
            .reasons
            .push(format!("NVIDIA libraries: {e}; none hooked"));
        return false;
    }
    for lib in &libs {
        let mut imports: Vec<&str> = hooked(lib, ioctls).iter().map(|h| h.0).collect();
        imports.sort_unstable();
        strategy.reasons.push(format!(
            "uprobes on the PLT entries of {}: {}",
            lib.path.display(),
            imports.join(", ")
        ));
        attached.push(format!(
            "uprobe/{}:{{{}}}@plt",
            lib.path.display(),
            imports.join(",")
        ));
        strategy.libraries.push(lib.path.display().to_string());
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_root_is_searched_like_the_machines_own() {
        let root = std::env::temp_dir().join(format!("linger-driver-root-{}", std::process::id()));
        let lib_dir = root.join(MULTIARCH[0].trim_start_matches('/'));
        fs::create_dir_all(&lib_dir).expect("driver root");
        let real = lib_dir.join("libcuda.so.580.159.04");
        fs::write(&real, b"not ELF; found all the same").expect("library");
        std::os::unix::fs::symlink("libcuda.so.580.159.04", lib_dir.join("libcuda.so.1"))
            .expect("soname link");
        let found = find_in(&[Path::new("/nonexistent"), &root], &["libcuda.so.1"]);
        let _ = fs::remove_dir_all(&root);
        assert_eq!(found, vec![real]);
    }

    #[test]
    fn a_cuda_compat_libcuda_is_found_beside_the_drivers() {
        let root = std::env::temp_dir().join(format!("linger-compat-root-{}", std::process::id()));
        let driver = root.join(MULTIARCH[0].trim_start_matches('/'));
        let compat = root.join("usr/local/cuda-12.8/compat");
        for dir in [&driver, &compat] {
            fs::create_dir_all(dir).expect("library directory");
            fs::write(dir.join("libcuda.so.1"), b"a copy of its own").expect("library");
            // The compat package ships no NVML: none is looked for there.
            fs::write(dir.join("libnvidia-ml.so.1"), b"nvml").expect("library");
        }
        let found = find_in(&[&root], &LIBRARIES);
        let _ = fs::remove_dir_all(&root);
        assert_eq!(
            found,
            vec![
                driver.join("libcuda.so.1"),
                compat.join("libcuda.so.1"),
                driver.join("libnvidia-ml.so.1")
            ]
        );
    }

    #[test]
    fn the_linker_cache_gives_the_c_library_and_nothing_for_an_unknown_name() {
        let cache = fs::read("/etc/ld.so.cache").expect("this machine's linker cache");
        let libc = ld_cache_paths(&cache, "libc.so.6");
        assert!(libc.iter().any(|p| p.exists()), "{libc:?}");
        assert!(ld_cache_paths(&cache, "libnot-a-library.so.9").is_empty());
        assert!(ld_cache_paths(&cache[..100], "libc.so.6").is_empty());
    }

    #[test]
    fn a_system_librarys_ioctl_and_close_entries_are_found() {
        // libdrm talks to GPU drivers through ioctl like libcuda does.
        let cache = fs::read("/etc/ld.so.cache").expect("this machine's linker cache");
        let path = ld_cache_paths(&cache, "libdrm.so.2")
            .into_iter()
            .next()
            .expect("libdrm.so.2 in the linker cache");
        let lib = entries(&path).expect("parse libdrm");
        for import in ["ioctl", "close", "open64"] {
            assert!(lib.entries.contains_key(import), "{import}: {lib:?}");
        }
        let plt = lib.entries["ioctl"];
        let bytes = fs::read(&path).expect("read libdrm");
        assert!(bytes[plt as usize..plt as usize + 16]
            .windows(2)
            .any(|w| w == [0xff, 0x25]));
    }

    #[test]
    fn an_aarch64_librarys_entries_are_found_in_every_plt_layout() {
        // Built by tests/data/aarch64-plt/build.sh; the offsets are where
        // `aarch64-linux-gnu-objdump -d -j .plt` puts dup@plt, open@plt, close@plt and
        // ioctl@plt (.plt's file offset is its address in these files).
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/aarch64-plt");
        for (file, [dup, open, close, ioctl]) in [
            ("libtalk-plain.so", [0x570, 0x590, 0x5a0, 0x5c0]),
            ("libtalk-bti.so", [0x600, 0x620, 0x630, 0x650]),
            ("libtalk-pac.so", [0x570, 0x5a0, 0x5b8, 0x5e8]),
            ("libtalk-bti-pac.so", [0x600, 0x630, 0x648, 0x678]),
        ] {
            let lib = entries(&dir.join(file)).expect("parse an aarch64 library");
            let expected = [
                ("close", close),
                ("dup", dup),
                ("ioctl", ioctl),
                ("open", open),
            ];
            let expected = expected.map(|(name, at)| (name.to_string(), at));
            assert_eq!(lib.entries, BTreeMap::from(expected), "{file}");
        }
    }

    #[test]
    fn a_file_that_is_not_elf_is_an_error_not_a_panic() {
        let path = std::env::temp_dir().join(format!("linger-not-elf-{}", std::process::id()));
        fs::write(&path, b"\x7fELF\x02\x01\x01 truncated").expect("write a test file");
        assert!(entries(&path).is_err());
        assert!(entries(Path::new("/nonexistent/libcuda.so.1")).is_err());
        let _ = fs::remove_file(path);
    }
}
