//! `cargo xtask vm`: the driver-hooks strategies tested on stock kernels. This machine's kernel
//! refuses fentry and has no kprobes, so Debian's 5.10, 6.1 and 6.12 kernels (kernels.rs) boot
//! under qemu, as many at once as there are cores (TCG; KVM hangs here), each with a busybox initramfs holding the release
//! `linger` and a stand-in NVIDIA driver module built against that kernel's headers; `init.sh`
//! runs doctor, one kill scenario per forced strategy and one with the default strategy (the
//! driver's hooks instead of system call tracepoints), and prints the results on the serial
//! console, checked here. `--arch aarch64` boots Debian's arm64 kernels the same way, with
//! everything in the guest cross-built (guest.rs).

mod checks;
mod guest;
mod image;
mod kernels;
mod record;
mod standin;
mod suite;

use std::{
    env, fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::Stdio,
    sync::mpsc,
    thread,
    time::Instant,
};

use anyhow::{bail, Context, Result};

use crate::{
    apt::install,
    build::{self, Arch},
    setup,
};
use guest::Guest;
use kernels::{stock_kernel, Kernel};
use suite::{HOST_TESTS, MARK, STANDIN_TESTS};

/// Packages the VM needs, from Debian's archive: installed when missing.
const PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "linux-image-amd64",
    "busybox-static",
    "cpio",
    // pahole: modules of newer kernels carry BTF.
    "dwarves",
];

/// The arm64 guests' tools beyond the x86-64 ones': the emulator, the cross compiler, and
/// qemu-user for the arm64 ldconfig (image.rs); each with its Debian package.
const ARM64_TOOLS: [(&str, &str); 4] = [
    ("qemu-system-aarch64", "qemu-system-arm"),
    ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
    ("aarch64-linux-gnu-readelf", "binutils-aarch64-linux-gnu"),
    ("qemu-aarch64-static", "qemu-user-static"),
];

/// Boots each kernel of the matrix (or the one `only` names) and runs its checks: (passed,
/// failed) over all of them. A kernel that cannot be fetched, or have its module built, counts
/// as one failed check.
pub fn run(only: Option<&str>, arch: Arch) -> Result<(u64, u64)> {
    if env::consts::ARCH != "x86_64" {
        eprintln!(
            "xtask vm: SKIPPED: the test VM boots Debian's kernels with qemu on an amd64 \
             host (its kbuild tools and packages are amd64's), not on this {} host",
            env::consts::ARCH
        );
        return Ok((0, 0));
    }
    let guest = Guest { arch };
    let specs: Vec<&kernels::Spec> = kernels::matrix(guest)
        .iter()
        .filter(|k| only.is_none_or(|name| name == k.name))
        .collect();
    if specs.is_empty() {
        let names: Vec<&str> = kernels::matrix(guest).iter().map(|k| k.name).collect();
        bail!("no kernel {only:?} in the matrix ({})", names.join(", "));
    }
    ensure_packages(guest)?;
    let root = build::workspace_root().join(guest.dir());
    // The library lands in the guest's root, where no library search looks: the late-driver
    // scenario installs it with the driver.
    let mut programs = vec![
        build::linger(arch)?,
        build::test_bin("linger-vm-gpu", arch)?,
        build::test_bin("linger-group-job", arch)?,
        standin::build_library(&root.join("standin-lib"), guest)?,
    ];
    // Each lands in the guest's root as /test-NAME, which init.sh runs.
    let tests = root.join("host-tests");
    fs::create_dir_all(&tests)?;
    for (name, built) in HOST_TESTS
        .iter()
        .zip(build::integration_tests(HOST_TESTS, arch)?)
    {
        let to = tests.join(format!("test-{name}"));
        fs::copy(built, &to).with_context(|| format!("copying the {name} test"))?;
        programs.push(to);
    }
    for (name, built) in STANDIN_TESTS
        .iter()
        .zip(build::integration_tests(STANDIN_TESTS, arch)?)
    {
        let to = tests.join(format!("standin-test-{name}"));
        fs::copy(built, &to).with_context(|| format!("copying the {name} test"))?;
        programs.push(to);
    }
    let results = run_guests(&root, &specs, guest, &programs);
    let mut total = (0, 0);
    for (name, (passed, failed)) in results {
        eprintln!("xtask vm: kernel {name}: {passed} passed, {failed} failed");
        total.0 += passed;
        total.1 += failed;
    }
    Ok(total)
}

/// Boots each kernel's guest, as many at once as this machine has cores: under TCG a guest is one
/// host thread (`thread=single`), so two guests on two cores take the time of one. What they
/// share is fetched first, one at a time (apt's state is one per architecture).
fn run_guests(
    root: &Path,
    specs: &[&kernels::Spec],
    guest: Guest,
    programs: &[PathBuf],
) -> Vec<(&'static str, (u64, u64))> {
    let failed = |name: &str, e: anyhow::Error| {
        eprintln!("xtask vm: {name}: FAILED: {e:#}");
        (0, 1)
    };
    if guest.arch == Arch::Aarch64 {
        if let Err(e) = kernels::arm64_userland(root) {
            let why = format!("the arm64 user space: {e:#}");
            return specs
                .iter()
                .map(|s| (s.name, failed(s.name, anyhow::anyhow!("{why}"))))
                .collect();
        }
    }
    let mut ready = Vec::new();
    let mut results: Vec<(&'static str, Result<String>)> = Vec::new();
    let mut used = Vec::new();
    for spec in specs {
        match kernels::resolve(root, spec, guest) {
            Ok(kernel) => {
                used.extend(record::line(guest, spec.name, &kernel).ok());
                ready.push((spec.name, kernel));
            }
            Err(e) => results.push((spec.name, Err(e))),
        }
    }
    record::compare(&build::workspace_root(), root, guest, &used);
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    let next = std::sync::Mutex::new(ready.into_iter());
    let done = std::sync::Mutex::new(results);
    thread::scope(|scope| {
        for _ in 0..cores.min(specs.len()) {
            scope.spawn(|| {
                // The queue's lock is let go as soon as the next kernel is taken.
                while let Some((name, kernel)) = next.lock().map(|mut n| n.next()).ok().flatten() {
                    let console = one_kernel(root, name, &kernel, guest, programs);
                    if let Ok(mut done) = done.lock() {
                        done.push((name, console));
                    }
                }
            });
        }
    });
    let mut consoles = done.into_inner().unwrap_or_default();
    consoles.sort_by_key(|(name, _)| specs.iter().position(|s| s.name == *name));
    // Checked one kernel after the other, so that each one's report reads in one piece.
    consoles
        .into_iter()
        .map(|(name, console)| {
            let result = console
                .and_then(|c| checks::run(&c))
                .unwrap_or_else(|e| failed(name, e));
            (name, result)
        })
        .collect()
}

fn one_kernel(
    root: &Path,
    name: &str,
    kernel: &Kernel,
    guest: Guest,
    programs: &[PathBuf],
) -> Result<String> {
    let dir = root.join(name);
    fs::create_dir_all(&dir)?;
    let module = standin::build(&dir, kernel, guest)?;
    let initramfs = image::build(&dir, programs, &module, guest, root)?;
    let started = Instant::now();
    eprintln!(
        "xtask vm: {name}: booting {} under qemu (TCG)",
        kernel.release
    );
    let log = dir.join("console.log");
    let console = boot(guest, name, &kernel.vmlinuz, &initramfs, &log)?;
    eprintln!(
        "xtask vm: {name}: guest ran {:.0} s (console: {})",
        started.elapsed().as_secs_f64(),
        log.display()
    );
    Ok(console)
}

/// Runs the checks over a console log saved by an earlier run.
pub fn check_saved(path: &Path) -> Result<(u64, u64)> {
    let console =
        fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    checks::run(&console)
}

fn ensure_packages(guest: Guest) -> Result<()> {
    let have = |tools: &[&str]| tools.iter().all(|t| setup::which(t).is_some());
    if stock_kernel().is_err() || !have(&["qemu-system-x86_64", "busybox", "cpio", "pahole"]) {
        install(PACKAGES)?;
    }
    if guest.arch == Arch::Aarch64 && !have(&ARM64_TOOLS.map(|(tool, _)| tool)) {
        install(&ARM64_TOOLS.map(|(_, package)| package))?;
    }
    Ok(())
}

/// Boots the guest and returns its console output; the whole of it is also saved to `log`.
fn boot(guest: Guest, name: &str, vmlinuz: &Path, initramfs: &Path, log: &Path) -> Result<String> {
    let (mut qemu, console) = guest.qemu();
    let mut qemu = qemu
        // One host thread runs both vCPUs: with a thread each (MTTCG), a vCPU can run a stale
        // translation of kernel text that another has just patched (a tracepoint's jump label
        // flipped as a probe detaches) and trap on an int3 no longer there: a guest Oops in
        // bprm_execve, seen once on 6.12. No real CPU does that after the kernel's sync.
        .args([
            "-accel",
            "tcg,thread=single",
            "-cpu",
            "max",
            "-m",
            "1024",
            "-smp",
            "2",
        ])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .arg("-append")
        .arg(format!("console={console} quiet panic=-1"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {:?}", guest.qemu().0.get_program()))?;
    let stdout = qemu.stdout.take().context("qemu stdout")?;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n').map_while(|l| l.ok()) {
            if tx
                .send(String::from_utf8_lossy(&line).trim_end().to_string())
                .is_err()
            {
                break;
            }
        }
    });
    let limit = guest.limit();
    let deadline = Instant::now() + limit;
    let mut console = String::new();
    let mut finished = false;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                // Progress, without the bulky JSON.
                if let Some(at) = line.find(MARK) {
                    let tag = line[at + MARK.len()..]
                        .split(' ')
                        .next()
                        .unwrap_or_default();
                    if !tag.ends_with("-out") && tag != "doctor" {
                        eprintln!("  {name}: {}", &line[at..]);
                    }
                }
                finished |= line.contains("LINGER-VM done");
                console.push_str(&line);
                console.push('\n');
            }
            // qemu exited (the guest powered off) or the deadline passed.
            Err(_) => break,
        }
    }
    let _ = qemu.kill();
    let status = qemu.wait().context("waiting for qemu")?;
    fs::write(log, &console).with_context(|| format!("writing {}", log.display()))?;
    if !finished {
        let mut stderr = String::new();
        if let Some(mut e) = qemu.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
        }
        bail!(
            "the guest did not finish within {limit:?} (qemu: {status}; {}); console in {}",
            stderr.trim(),
            log.display()
        );
    }
    Ok(console)
}
