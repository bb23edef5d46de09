//! The Debian package `cargo xtask dist` writes, installed the way operators of bare-metal and
//! Slurm nodes install software: `dpkg -i` into a clean Debian 12 root (debootstrap's minbase
//! with systemd, made once by `cargo xtask test`, used through an overlay so that it stays
//! clean), then `linger doctor` and `systemd-analyze verify` from it, then purged.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use linger_tests::{require_root, TempDir};
use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// A writable view of the clean root, and the host's /proc, /sys and /dev inside it, undone
/// when dropped.
struct Root {
    _dir: TempDir,
    merged: PathBuf,
    mounts: Vec<PathBuf>,
}

impl Root {
    fn new(clean: &Path) -> Self {
        let dir = TempDir::new("package-root");
        let [upper, work, merged] = ["upper", "work", "merged"].map(|d| dir.join(d));
        for d in [&upper, &work, &merged] {
            std::fs::create_dir_all(d).expect("overlay directories");
        }
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            clean.display(),
            upper.display(),
            work.display()
        );
        mount(
            Some("overlay"),
            &merged,
            Some("overlay"),
            MsFlags::empty(),
            Some(options.as_str()),
        )
        .expect("an overlay of the clean root");
        let mut root = Self {
            _dir: dir,
            merged: merged.clone(),
            mounts: vec![merged],
        };
        for (what, kind) in [("/proc", Some("proc")), ("/sys", None), ("/dev", None)] {
            let at = root.merged.join(&what[1..]);
            let flags = if kind.is_some() {
                MsFlags::empty()
            } else {
                MsFlags::MS_BIND | MsFlags::MS_REC
            };
            mount(Some(what), &at, kind, flags, None::<&str>).expect("a mount into the root");
            root.mounts.push(at);
        }
        root
    }

    fn chroot(&self, args: &[&str]) -> Output {
        Command::new("chroot")
            .arg(&self.merged)
            .args(args)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .expect("chroot")
    }

    fn has(&self, path: &str) -> bool {
        self.merged.join(path.trim_start_matches('/')).exists()
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        for at in self.mounts.iter().rev() {
            let _ = umount2(at, MntFlags::MNT_DETACH);
        }
    }
}

fn env_path(name: &str) -> PathBuf {
    std::env::var_os(name)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{name} is set by `cargo xtask test`"))
}

fn ok(what: &str, out: &Output) -> String {
    assert!(out.status.success(), "{what}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_package_installs_on_a_clean_debian_12_runs_and_purges_cleanly() {
    require_root();
    let deb = env_path("LINGER_DEB");
    let root = Root::new(&env_path("LINGER_DEBIAN_ROOT"));
    std::fs::copy(&deb, root.merged.join("tmp/linger.deb")).expect("the package into the root");

    ok("dpkg -i", &root.chroot(&["dpkg", "-i", "/tmp/linger.deb"]));
    let status = ok("dpkg -s", &root.chroot(&["dpkg", "-s", "linger"]));
    assert!(status.contains("Status: install ok installed"), "{status}");
    for path in [
        "/usr/bin/linger",
        "/lib/systemd/system/linger-agent.service",
        "/usr/share/linger/slurm/linger-epilog",
        "/usr/share/linger/slurm/linger-unkillable",
        "/usr/share/doc/linger/README.md",
        "/etc/linger/linger.toml",
    ] {
        assert!(root.has(path), "{path} installed");
    }
    let unit = std::fs::read_to_string(root.merged.join("lib/systemd/system/linger-agent.service"))
        .expect("the unit");
    assert!(unit.contains("ExecStart=/usr/bin/linger agent --config /etc/linger/linger.toml"));

    let doctor = ok("linger doctor", &root.chroot(&["linger", "doctor"]));
    assert!(doctor.contains("kernel"), "{doctor}");
    // The shipped configuration is one the agent reads: its own check of the file.
    let agent = root.chroot(&[
        "linger",
        "agent",
        "--config",
        "/etc/linger/linger.toml",
        "--help",
    ]);
    ok("linger agent --config", &agent);
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.merged.display()))
        .arg("/lib/systemd/system/linger-agent.service")
        .output()
        .expect("systemd-analyze");
    assert!(
        verify.status.success() && verify.stderr.is_empty(),
        "{verify:?}"
    );

    ok("dpkg -P", &root.chroot(&["dpkg", "-P", "linger"]));
    for path in [
        "/usr/bin/linger",
        "/lib/systemd/system/linger-agent.service",
        "/usr/share/linger",
        "/usr/share/doc/linger",
        "/etc/linger",
    ] {
        assert!(!root.has(path), "{path} left behind by the purge");
    }
}
