//! The GPU process of the VM's driver-hooks scenario (`cargo xtask vm`): opens the stand-in
//! driver's devices as CUDA does (close-on-exec), creates an RM client and allocates video
//! memory through RM_ALLOC ioctls, has the stand-in report a GPU error (Xid 31) naming it, forks
//! a child that keeps the descriptors, writes "held CHILD_PID" to READY_FILE, and sleeps until
//! killed (the child too).
//!
//! usage: linger-vm-gpu NVIDIA_DEVICE UVM_DEVICE BYTES READY_FILE

use std::{
    fs::{File, OpenOptions},
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    thread,
    time::Duration,
};

use anyhow::{bail, ensure, Context, Result};
use nix::{
    libc,
    unistd::{fork, ForkResult},
};
use tracer_common::driver::{
    MEMORY_ALLOCATION_SIZE_OFFSET, NV01_MEMORY_LOCAL_USER, NV01_ROOT_CLIENT, NVOS21_SIZE,
    NV_IOCTL_MAGIC, RM_ALLOC,
};

/// The stand-in driver's command that reports an MMU fault (Xid 31) naming the caller:
/// _IO('X', 31).
const STANDIN_FAULT: libc::c_ulong = (b'X' as libc::c_ulong) << 8 | 31;

/// The client and memory handles, as a CUDA process's would look.
const CLIENT: u32 = 0xc1d0_0001;
const MEMORY: u32 = 0xcaf0_0002;

/// NVOS21_PARAMETERS: hRoot, hObjectParent, hObjectNew, hClass, pAllocParms, paramsSize,
/// status.
#[repr(C)]
#[derive(Default)]
struct Nvos21 {
    root: u32,
    parent: u32,
    object: u32,
    class: u32,
    params: u64,
    params_size: u32,
    status: u32,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [nvidia, uvm, bytes, ready] = args.as_slice() else {
        bail!("usage: linger-vm-gpu NVIDIA_DEVICE UVM_DEVICE BYTES READY_FILE");
    };
    let bytes: u64 = bytes.parse().context("BYTES")?;
    let gpu = open(nvidia)?;
    let _uvm = open(uvm)?;
    rm_alloc(&gpu, CLIENT, 0, CLIENT, NV01_ROOT_CLIENT, None)?;
    // NV_MEMORY_ALLOCATION_PARAMS, zeroed but for its size.
    let mut params = [0u8; 128];
    let at = MEMORY_ALLOCATION_SIZE_OFFSET as usize;
    params[at..at + 8].copy_from_slice(&bytes.to_ne_bytes());
    rm_alloc(
        &gpu,
        CLIENT,
        CLIENT,
        MEMORY,
        NV01_MEMORY_LOCAL_USER,
        Some(&mut params),
    )?;
    // SAFETY: an ioctl without argument on a descriptor we own.
    let rc = unsafe { libc::ioctl(gpu.as_raw_fd(), STANDIN_FAULT) };
    ensure!(
        rc == 0,
        "the stand-in's fault ioctl failed: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the program is single-threaded here; the child only sleeps.
    if let ForkResult::Parent { child } = unsafe { fork() }? {
        std::fs::write(ready, format!("held {child}\n"))?;
    }
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}

fn open(path: &str) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("opening {path}"))
}

fn rm_alloc(
    gpu: &File,
    root: u32,
    parent: u32,
    object: u32,
    class: u32,
    params: Option<&mut [u8]>,
) -> Result<()> {
    let mut p = Nvos21 {
        root,
        parent,
        object,
        class,
        ..Default::default()
    };
    if let Some(params) = params {
        p.params = params.as_mut_ptr() as u64;
        p.params_size = params.len() as u32;
    }
    // _IOWR('F', NV_ESC_RM_ALLOC, NVOS21_PARAMETERS).
    let cmd = 3 << 30
        | (NVOS21_SIZE as libc::c_ulong) << 16
        | (NV_IOCTL_MAGIC << 8 | RM_ALLOC) as libc::c_ulong;
    // SAFETY: `p` (and the parameters it points to) outlive the call; the stand-in driver
    // reads nothing, the real one reads and writes only within them.
    let rc = unsafe { libc::ioctl(gpu.as_raw_fd(), cmd, &mut p as *mut Nvos21) };
    ensure!(
        rc == 0 && p.status == 0,
        "RM_ALLOC of class {class:#x}: {rc} (status {:#x}): {}",
        p.status,
        std::io::Error::last_os_error()
    );
    Ok(())
}
