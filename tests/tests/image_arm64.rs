//! The arm64 release (`cargo xtask dist`), for Grace nodes, run where this amd64 machine can:
//! the image archive is opened as a registry would (OCI index, manifest, config, layers), its
//! configuration must say arm64, and its own root runs its own `linger` under qemu's user-mode
//! emulator: the version, and a replay of a committed H200 recording that must print exactly
//! what the amd64 binary prints. The arm64 package must carry the same binary. Attaching the
//! eBPF programs on arm64 kernels is the arm64 VM's test (`cargo xtask vm --arch aarch64`):
//! qemu's user mode runs programs, not a kernel's.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use linger_tests::{linger, TempDir};
use serde_json::Value;

const RECORDING: &str = "tests/data/h200/suite/pass15/crash.trace";
/// ELF's e_machine for AArch64.
const EM_AARCH64: u16 = 183;

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(path: &Path) -> Value {
    let text = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The blob a descriptor (`{"digest": "sha256:..."}`) names, in an unpacked OCI layout.
fn blob(layout: &Path, descriptor: &Value) -> PathBuf {
    let digest = descriptor["digest"].as_str().expect("a digest");
    let (algorithm, hex) = digest.split_once(':').expect("ALGORITHM:HEX");
    layout.join("blobs").join(algorithm).join(hex)
}

/// Unpacks the archive's image into `dir/root`, layer by layer, checking its configuration's
/// platform on the way.
fn unpack_image(archive: &str, dir: &TempDir) -> PathBuf {
    let layout = dir.join("layout");
    fs::create_dir_all(&layout).expect("a folder");
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&layout));
    let index = json(&layout.join("index.json"));
    let manifests = index["manifests"].as_array().expect("an OCI index");
    assert_eq!(manifests.len(), 1, "one image in the archive: {index}");
    let manifest = json(&blob(&layout, &manifests[0]));
    let config = json(&blob(&layout, &manifest["config"]));
    assert_eq!(config["architecture"], "arm64", "{config}");
    assert_eq!(config["os"], "linux", "{config}");
    assert_eq!(config["config"]["Entrypoint"][0], "/usr/bin/linger");
    let root = dir.join("root");
    fs::create_dir_all(&root).expect("a folder");
    for layer in manifest["layers"].as_array().expect("layers") {
        // GNU tar finds the layer's compression (gzip, zstd or none) itself.
        run(Command::new("tar")
            .arg("-xf")
            .arg(blob(&layout, layer))
            .arg("-C")
            .arg(&root));
    }
    root
}

fn elf_machine(path: &Path) -> u16 {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..4], b"\x7fELF", "{} is not ELF", path.display());
    u16::from_le_bytes([bytes[18], bytes[19]])
}

/// A program of the image's root, run by qemu-aarch64 with that root as its library prefix.
fn in_image(root: &Path, program: &str) -> Command {
    let mut cmd = Command::new("qemu-aarch64-static");
    cmd.arg("-L").arg(root).arg(root.join(program));
    cmd
}

#[test]
fn arm64_image_and_package_run_their_linger_and_replay_as_amd64_does() {
    let archive = std::env::var("LINGER_IMAGE_ARM64")
        .expect("LINGER_IMAGE_ARM64: the arm64 image archive (cargo xtask test builds it)");
    let dir = TempDir::new("image-arm64");
    let root = unpack_image(&archive, &dir);
    let binary = root.join("usr/bin/linger");
    assert_eq!(elf_machine(&binary), EM_AARCH64, "the image's linger");
    assert!(
        package_binary(&dir) == fs::read(&binary).expect("the image's linger"),
        "the arm64 package's linger is not the image's"
    );

    let version = run(in_image(&root, "usr/bin/linger").arg("--version"));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("linger {}", env!("CARGO_PKG_VERSION"))
    );
    // The health probe's interpreter, from the image (the probe itself calls curl-less bash).
    let bash = run(in_image(&root, "bin/bash").args(["-c", "echo $HOSTTYPE"]));
    assert_eq!(String::from_utf8_lossy(&bash.stdout).trim(), "aarch64");

    let recording = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(RECORDING);
    let report = |cmd: &mut Command| {
        let out = run(cmd.arg("replay").arg(&recording).arg("--json"));
        String::from_utf8(out.stdout).expect("UTF-8 JSON")
    };
    let arm64 = report(&mut in_image(&root, "usr/bin/linger"));
    let amd64 = report(&mut linger());
    assert!(arm64.contains("\"type\":\"incident\""), "{arm64}");
    assert_eq!(arm64, amd64, "the arm64 replay differs from the amd64 one");
}

/// The arm64 package's binary, for the image's root to run it: the same bytes as the image's.
fn package_binary(dir: &TempDir) -> Vec<u8> {
    let deb = std::env::var("LINGER_DEB_ARM64")
        .expect("LINGER_DEB_ARM64: the arm64 package (cargo xtask test builds it)");
    let field = run(Command::new("dpkg-deb").args(["--field", &deb, "Architecture"]));
    assert_eq!(String::from_utf8_lossy(&field.stdout).trim(), "arm64");
    let unpacked = dir.join("deb");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked));
    fs::read(unpacked.join("usr/bin/linger")).expect("the package's /usr/bin/linger")
}
