//! Real processes doing to a stand-in GPU device what CUDA programs and their children do:
//! open, dup, fork, exec, close, share descriptor tables, pass descriptors over sockets,
//! hold thousands of other descriptors. The integration tests trace them.
//!
//! Usage: linger-fd-scenario DEVICE SCENARIO [ARG]. Prints `ready PID...` once set up, then
//! waits to be killed.

use std::{
    env,
    fs::{File, OpenOptions},
    io::{IoSlice, IoSliceMut, Read, Write},
    os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd, RawFd},
    os::unix::{net::UnixStream, process::CommandExt},
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use nix::{
    fcntl::{fcntl, FcntlArg, FdFlag},
    sys::resource::{getrlimit, setrlimit, Resource},
    sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags},
};

fn main() -> Result<()> {
    let args: Vec<String> = env::args().collect();
    let [_, device, scenario, rest @ ..] = args.as_slice() else {
        bail!("usage: linger-fd-scenario DEVICE SCENARIO");
    };
    match scenario.as_str() {
        // open, dup, dup2 onto another descriptor, F_DUPFD_CLOEXEC, then close the plain dup.
        "dup-close" => {
            let f = open(device, true)?;
            let dup = nix::unistd::dup(&f)?;
            let mut slot = File::open("/dev/null")?.into();
            nix::unistd::dup2(&f, &mut slot)?;
            let high = fcntl(&f, FcntlArg::F_DUPFD_CLOEXEC(60))?;
            drop(dup);
            ready(&[])?;
            wait_forever((f, slot, high))
        }
        // A child made with clone(CLONE_FILES) shares the parent's descriptor table.
        "shared-table" => {
            let f = open(device, true)?;
            let child = clone_sharing_files()?;
            ready(&[child])?;
            wait_forever(f)
        }
        // The parent's descriptor is inherited by a child that outlives it (fork, then exec of a
        // holder that does nothing but keep it).
        "fork-holder" => {
            let f = open(device, false)?;
            ready(&[spawn_holder(device)?])?;
            wait_forever(f)
        }
        "many-fds" => many_fds(device, rest),
        "send-fd" => send_fd(device),
        "receive" => receive(),
        // Exec keeps the descriptor without O_CLOEXEC and drops the one with it.
        "exec" => {
            let keep = open(device, false)?;
            let dropped = open(device, true)?;
            let (k, d) = (keep.into_raw_fd(), dropped.into_raw_fd());
            let err = Command::new(env::current_exe()?)
                .args([device, "hold", &format!("{k}"), &format!("{d}")])
                .exec();
            bail!("exec failed: {err}")
        }
        // A DataLoader-style worker that escapes: forked (no exec) after the device is open,
        // it calls setsid and keeps the inherited descriptor when the parent is killed.
        // Holds the device and a file whose close never ends (linger-stuck-fuse's): killed,
        // it sleeps uninterruptibly in its exit, the device still held.
        "stuck" => {
            let [path] = rest else {
                bail!("usage: linger-fd-scenario DEVICE stuck FILE");
            };
            let held = (
                open(device, false)?,
                File::open(path).context("the stuck file")?,
            );
            ready(&[])?;
            wait_forever(held)
        }
        "setsid-worker" => {
            let f = open(device, true)?;
            let worker = fork_setsid_worker()?;
            ready(&[worker])?;
            wait_forever(f)
        }
        // A process that opened and closed the device: it holds nothing when it dies.
        "close" => {
            drop(open(device, false)?);
            ready(&[])?;
            wait_forever(())
        }
        // Open before tracing starts: the test waits for `ready`, then starts linger.
        "hold" | "held-before" => {
            let f = if scenario == "held-before" {
                Some(open(device, false)?)
            } else {
                None
            };
            ready(&[])?;
            // The exec scenario passes the kept and dropped descriptor numbers for the test.
            let _ = rest;
            wait_forever(f)
        }
        other => bail!("unknown scenario {other}"),
    }
}

/// A large program's GPU file: FILLERS descriptors (/dev/null) opened before the device, as
/// sockets and files are before CUDA starts. Once told to go (a line on stdin), a child it
/// forks and execs keeps the file.
fn many_fds(device: &str, rest: &[String]) -> Result<()> {
    let fillers: u64 = rest.first().context("many-fds FILLERS")?.parse()?;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let limit = fillers + 64;
    setrlimit(Resource::RLIMIT_NOFILE, soft.max(limit), hard.max(limit))?;
    let fillers = (0..fillers)
        .map(|_| File::open("/dev/null"))
        .collect::<std::io::Result<Vec<File>>>()?;
    let f = open(device, false)?;
    ready(&[])?;
    std::io::stdin().read_line(&mut String::new())?;
    ready(&[spawn_holder(device)?])?;
    wait_forever((fillers, f))
}

/// The descriptor goes to a process that never inherited or opened it, over a unix socket
/// (SCM_RIGHTS): no system call a tracepoint sees gives it the file.
fn send_fd(device: &str) -> Result<()> {
    let (mine, theirs) = UnixStream::pair()?;
    // The receiver's stdin is its end of the socket.
    let receiver = Command::new(env::current_exe()?)
        .args([device, "receive"])
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::null())
        .spawn()
        .context("spawning the receiver")?;
    // Opened after the receiver started: it cannot have inherited it.
    let f = open(device, true)?;
    let fds = [f.as_raw_fd()];
    sendmsg::<()>(
        mine.as_raw_fd(),
        &[IoSlice::new(b"f")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )?;
    // Its answer: it has the file.
    let mut ack = [0u8; 1];
    (&mine).read_exact(&mut ack)?;
    ready(&[receiver.id()])?;
    wait_forever(f)
}

/// The other end of send-fd: keeps what it got, awake now and then like a live process.
fn receive() -> Result<()> {
    let socket = std::io::stdin();
    let mut buf = [0u8; 1];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )?;
    let mut got = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            got.extend(fds);
        }
    }
    nix::unistd::write(socket.as_fd(), b"k")?;
    loop {
        thread::sleep(Duration::from_millis(100));
        let _ = &got;
    }
}

fn clone_sharing_files() -> Result<u32> {
    let mut stack = vec![0u8; 256 * 1024];
    let flags = nix::sched::CloneFlags::CLONE_FILES;
    // SAFETY: without CLONE_VM the child runs on a copy of our memory, so the callback and
    // stack stay valid in it; it only sleeps.
    let pid = unsafe {
        nix::sched::clone(
            Box::new(|| wait_forever(())),
            &mut stack,
            flags,
            Some(nix::sys::signal::Signal::SIGCHLD as i32),
        )
    }?;
    std::mem::forget(stack);
    Ok(pid.as_raw() as u32)
}

/// Forks a copy of this process that leaves the session and sleeps with everything it
/// inherited; returns its pid.
fn fork_setsid_worker() -> Result<u32> {
    // SAFETY: the scenario is single-threaded until here (no lock can be held by another
    // thread across the fork), and the child only calls setsid and sleeps.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Parent { child } => Ok(child.as_raw() as u32),
        nix::unistd::ForkResult::Child => {
            let _ = nix::unistd::setsid();
            wait_forever(())
        }
    }
}

fn open(device: &str, cloexec: bool) -> Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
        .with_context(|| format!("opening {device}"))?;
    if !cloexec {
        // Rust opens with O_CLOEXEC; clear it so children keep the descriptor.
        fcntl(&f, FcntlArg::F_SETFD(FdFlag::empty()))?;
    }
    Ok(f)
}

/// Forks and execs this program as a holder that only keeps the inherited descriptors;
/// returns its pid.
fn spawn_holder(device: &str) -> Result<u32> {
    let child = Command::new(env::current_exe()?)
        .args([device, "hold"])
        // Only the parent's `ready` line goes to the test.
        .stdout(Stdio::null())
        .spawn()
        .context("spawning the holder")?;
    Ok(child.id())
}

fn ready(children: &[u32]) -> Result<()> {
    let mut line = format!("ready {}", std::process::id());
    for c in children {
        line.push_str(&format!(" {c}"));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

fn wait_forever<T>(_keep: T) -> ! {
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}
