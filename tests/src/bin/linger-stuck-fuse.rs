//! A FUSE file system of one file, `stuck`, that never answers FLUSH: a process killed with
//! the file open sleeps uninterruptibly in its exit (the kernel waits for a forced request
//! without a timeout), as a process stuck in a driver does, until this daemon dies and the
//! connection with it. For the tests of what Slurm does with a step SIGKILL cannot end.
//!
//! Usage: linger-stuck-fuse MOUNTPOINT. Prints `ready` once mounted, serves until killed.

use std::{
    env,
    fs::OpenOptions,
    io::{Read, Write},
    os::fd::AsRawFd,
};

use anyhow::{bail, Context, Result};
use nix::mount::{mount, MsFlags};

const LOOKUP: u32 = 1;
const GETATTR: u32 = 3;
const OPEN: u32 = 14;
const RELEASE: u32 = 18;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const INTERRUPT: u32 = 36;
const ENOENT: i32 = 2;
const ENOSYS: i32 = 38;
/// The file's node id (the root is 1).
const FILE: u64 = 2;
const HEADER: usize = 40;

fn main() -> Result<()> {
    let args: Vec<String> = env::args().collect();
    let [_, mountpoint] = args.as_slice() else {
        bail!("usage: linger-stuck-fuse MOUNTPOINT");
    };
    let mut dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .context("/dev/fuse")?;
    let options = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other",
        dev.as_raw_fd()
    );
    mount(
        Some("linger-stuck"),
        mountpoint.as_str(),
        Some("fuse"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .with_context(|| format!("mounting FUSE on {mountpoint}"))?;
    println!("ready");
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = dev.read(&mut buf).context("reading /dev/fuse")?;
        if n < HEADER {
            bail!("a request of {n} bytes");
        }
        let word = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        let opcode = word(4);
        let unique = u64::from_ne_bytes(buf[8..16].try_into().expect("8 bytes"));
        let node = u64::from_ne_bytes(buf[16..24].try_into().expect("8 bytes"));
        let reply = match opcode {
            INIT => Ok(init_out(word(HEADER + 4))),
            GETATTR => Ok(attr_out(node)),
            LOOKUP if &buf[HEADER..n] == b"stuck\0" => Ok(entry_out()),
            LOOKUP => Err(ENOENT),
            OPEN => Ok(vec![0; 16]),
            RELEASE => Ok(Vec::new()),
            // Never answered: the closing process waits, uninterruptibly once killed.
            FLUSH | INTERRUPT => continue,
            _ => Err(ENOSYS),
        };
        let (error, body) = match reply {
            Ok(body) => (0, body),
            Err(e) => (-e, Vec::new()),
        };
        let mut out = Vec::with_capacity(16 + body.len());
        out.extend(((16 + body.len()) as u32).to_ne_bytes());
        out.extend(error.to_ne_bytes());
        out.extend(unique.to_ne_bytes());
        out.extend(body);
        // A reply to a request the kernel gave up on fails with ENOENT: nothing to do.
        let _ = dev.write(&out);
    }
}

/// fuse_init_out: protocol 7, the kernel's minor or 31, no capabilities.
fn init_out(kernel_minor: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend(7u32.to_ne_bytes());
    out.extend(kernel_minor.min(31).to_ne_bytes());
    out.extend(0u32.to_ne_bytes()); // max_readahead
    out.extend(0u32.to_ne_bytes()); // flags
    out.extend(1u16.to_ne_bytes()); // max_background
    out.extend(1u16.to_ne_bytes()); // congestion_threshold
    out.extend(4096u32.to_ne_bytes()); // max_write
    out.extend(1u32.to_ne_bytes()); // time_gran
    out.resize(64, 0);
    out
}

/// fuse_attr: the root directory or the file, owned by root, readable by all.
fn attr(node: u64) -> Vec<u8> {
    let mode: u32 = if node == FILE { 0o100644 } else { 0o40755 };
    let mut a = Vec::with_capacity(88);
    a.extend(node.to_ne_bytes()); // ino
    a.resize(60, 0); // size, blocks, times
    a.extend(mode.to_ne_bytes());
    a.extend(1u32.to_ne_bytes()); // nlink
    a.resize(88, 0); // uid, gid, rdev, blksize, flags
    a
}

/// fuse_attr_out.
fn attr_out(node: u64) -> Vec<u8> {
    let mut out = vec![0; 16];
    out.extend(attr(node));
    out
}

/// fuse_entry_out for `stuck`.
fn entry_out() -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.extend(FILE.to_ne_bytes());
    out.resize(40, 0); // generation, validities
    out.extend(attr(FILE));
    out
}
