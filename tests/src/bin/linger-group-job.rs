//! A job that dies as a group, as the field kills them: a process group (killpg), a cgroup
//! (`cgroup.kill`), or a pid namespace whose init is killed from outside (a container's main
//! process). The job opens the stand-in GPU device and forks children that keep it.
//!
//! Usage: linger-group-job DEVICE KIND CHILDREN [CGROUP] [--racer]
//! KIND: `pgroup` (its own process group), `cgroup` (joins the cgroup directory CGROUP
//! first), `pidns` (pid 1 of a new pid namespace; this process stays outside as its parent).
//! `--racer`: the first child exits on its own when a line comes on stdin, as the job is
//! killed. Prints `ready JOB CHILD...` (host pids) once set up, and again after the line.
//! `LINGER_TEST_SLOW_EXIT=PATH`: also holds PATH, opened before and after the device.

use std::{
    env,
    fs::{self, File, OpenOptions},
    io::{BufRead, Read, Write},
    os::fd::OwnedFd,
    thread,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use nix::{
    fcntl::{fcntl, FcntlArg, FdFlag},
    sched::{unshare, CloneFlags},
    sys::wait::waitpid,
    unistd::{fork, pipe, setpgid, ForkResult, Pid},
};

fn main() -> Result<()> {
    let args: Vec<String> = env::args().collect();
    let racer = args.iter().any(|a| a == "--racer");
    let args: Vec<&String> = args.iter().filter(|a| *a != "--racer").collect();
    let [_, device, kind, children, rest @ ..] = args.as_slice() else {
        bail!("usage: linger-group-job DEVICE KIND CHILDREN [CGROUP] [--racer]");
    };
    let children: usize = children.parse().context("CHILDREN")?;
    match kind.as_str() {
        "pgroup" => {
            setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
            job(device, children, racer)
        }
        "cgroup" => {
            let [cgroup, ..] = rest else {
                bail!("cgroup needs the cgroup's directory");
            };
            fs::write(format!("{cgroup}/cgroup.procs"), "0").context("joining the cgroup")?;
            job(device, children, racer)
        }
        "pidns" => {
            unshare(CloneFlags::CLONE_NEWPID).context("unshare(CLONE_NEWPID)")?;
            // SAFETY: single-threaded here; the child runs plain code and never returns.
            match unsafe { fork() }? {
                ForkResult::Child => job(device, children, racer),
                ForkResult::Parent { child } => {
                    // Outside the namespace: its init's parent, until the init dies.
                    let _ = waitpid(child, None);
                    Ok(())
                }
            }
        }
        other => bail!("unknown kind {other}"),
    }
}

/// Opens the device, forks `children` that keep it, says who they are, and waits to be
/// killed; with `racer`, the first child exits when a line comes on stdin.
fn job(device: &str, children: usize, racer: bool) -> Result<()> {
    let slow_before = slow_exit()?;
    let gpu = OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
        .with_context(|| format!("opening {device}"))?;
    // Rust opens with O_CLOEXEC; children keep it across fork either way.
    fcntl(&gpu, FcntlArg::F_SETFD(FdFlag::empty()))?;
    let slow_after = slow_exit()?;
    let (pids_r, pids_w) = pipe()?;
    let (go_r, go_w) = pipe()?;
    for i in 0..children {
        // SAFETY: single-threaded; the child only reads, writes and sleeps.
        if let ForkResult::Child = unsafe { fork() }? {
            drop(pids_r);
            drop(go_w);
            child(pids_w, (racer && i == 0).then_some(go_r));
        }
    }
    drop(pids_w);
    drop(go_r);
    let mut pids = vec![host_pid()?];
    let mut from = File::from(pids_r);
    let mut text = String::new();
    from.read_to_string(&mut text)?;
    pids.extend(
        text.split_whitespace()
            .map(|p| p.parse::<u32>().unwrap_or(0)),
    );
    ready(&pids)?;
    if racer {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        File::from(go_w).write_all(b"x")?;
        ready(&pids)?;
    }
    let _held = (slow_before, gpu, slow_after);
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}

/// The file `LINGER_TEST_SLOW_EXIT` names (the VM's stand-in whose release sleeps), opened:
/// held on each side of the GPU device, one of them is released after it whichever order
/// the kernel runs the exit's releases in, and the exit goes on after the driver's free.
fn slow_exit() -> Result<Option<File>> {
    let Some(path) = env::var_os("LINGER_TEST_SLOW_EXIT") else {
        return Ok(None);
    };
    let file = File::open(&path).with_context(|| format!("opening {path:?}"))?;
    Ok(Some(file))
}

/// A child: tells its host pid, then sleeps holding the device (or exits at the go).
fn child(pids: OwnedFd, go: Option<OwnedFd>) -> ! {
    let pid = host_pid().unwrap_or(0);
    // Closed after the write: the job reads until every child's copy is gone.
    let _ = File::from(pids).write_all(format!("{pid} ").as_bytes());
    if let Some(go) = go {
        let mut byte = [0u8; 1];
        let _ = File::from(go).read(&mut byte);
        // SAFETY: exits this child at once, as a worker that finished would.
        unsafe { nix::libc::_exit(0) };
    }
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}

/// This process's pid in the host's namespace: /proc is the host's mount.
fn host_pid() -> Result<u32> {
    let link = fs::read_link("/proc/self")?;
    link.to_string_lossy()
        .parse()
        .context("/proc/self names no pid")
}

fn ready(pids: &[u32]) -> Result<()> {
    let line: Vec<String> = pids.iter().map(u32::to_string).collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {}", line.join(" "))?;
    out.flush()?;
    Ok(())
}
