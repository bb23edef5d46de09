//! The GPU process of the VM's driver-hooks scenario (`cargo xtask vm`): opens the stand-in
//! driver's devices as CUDA does (close-on-exec), creates an RM client, asks which device
//! instance two GPUs are (GET_ID_INFO: the stand-in leaves the answer the caller wrote, as if
//! the driver had), allocates the second GPU's device object and video memory below it
//! through RM_ALLOC ioctls, has the stand-in report a GPU error (Xid 31) naming it, forks
//! a child that keeps the descriptors, writes "held CHILD_PID" to READY_FILE, and sleeps until
//! killed (the child too). With LINGER_VM_GPU_LIB naming the stand-in libcuda, the opens and
//! ioctls go through that library, as a CUDA program's go through libcuda.
//!
//! usage: [LINGER_VM_GPU_LIB=LIBRARY] linger-vm-gpu NVIDIA_DEVICE UVM_DEVICE BYTES READY_FILE

use std::{
    ffi::{c_char, c_int, c_ulong, c_void, CString},
    fs::{File, OpenOptions},
    os::{
        fd::{AsRawFd, FromRawFd},
        unix::fs::OpenOptionsExt,
    },
    sync::OnceLock,
    thread,
    time::Duration,
};

use anyhow::{bail, ensure, Context, Result};
use nix::{
    libc,
    unistd::{fork, ForkResult},
};
use tracer_common::driver::{
    CTRL_GPU_GET_ID_INFO, MEMORY_ALLOCATION_SIZE_OFFSET, NV01_DEVICE_0, NV01_MEMORY_LOCAL_USER,
    NV01_ROOT_CLIENT, NVOS21_SIZE, NV_IOCTL_MAGIC, RM_ALLOC, RM_CONTROL,
};

/// The stand-in driver's command that reports an MMU fault (Xid 31) naming the caller:
/// _IO('X', 31).
const STANDIN_FAULT: libc::c_ulong = (b'X' as libc::c_ulong) << 8 | 31;

/// The client, device and memory handles, as a CUDA process's would look.
const CLIENT: u32 = 0xc1d0_0001;
const DEVICE: u32 = 0xcaf0_0001;
const MEMORY: u32 = 0xcaf0_0002;
/// The RM gpu ids (PCI domain 0, bus 4 and 5) of device instances 0 and 1 (xtask's check).
const GPU_IDS: [u32; 2] = [0x0400, 0x0500];

/// NVOS54_PARAMETERS (RM_CONTROL): hClient, hObject, cmd, flags, params, paramsSize, status.
#[repr(C)]
#[derive(Default)]
struct Nvos54 {
    client: u32,
    object: u32,
    cmd: u32,
    flags: u32,
    params: u64,
    params_size: u32,
    status: u32,
}

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

type OpenFn = unsafe extern "C" fn(*const c_char) -> c_int;
type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;

/// The stand-in libcuda's entry points (xtask/src/vm/standin/libcuda.c).
struct Library {
    open: OpenFn,
    ioctl: IoctlFn,
}

/// Set when the calls go through the stand-in libcuda.
static LIBRARY: OnceLock<Library> = OnceLock::new();

fn load_library(path: &str) -> Result<Library> {
    let path = CString::new(path)?;
    // SAFETY: dlopen and dlsym with valid C strings; the library is never unloaded, and its
    // two functions have the signatures declared above.
    unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
        ensure!(!handle.is_null(), "dlopen {path:?} failed");
        let open = libc::dlsym(handle, c"standin_open".as_ptr());
        let ioctl = libc::dlsym(handle, c"standin_ioctl".as_ptr());
        ensure!(
            !open.is_null() && !ioctl.is_null(),
            "{path:?} lacks standin_open or standin_ioctl"
        );
        Ok(Library {
            open: std::mem::transmute::<*mut c_void, OpenFn>(open),
            ioctl: std::mem::transmute::<*mut c_void, IoctlFn>(ioctl),
        })
    }
}

/// ioctl(2), through the stand-in libcuda when it is loaded.
///
/// # Safety
/// As ioctl(2): `arg` must be what the command expects.
unsafe fn ioctl(fd: c_int, cmd: c_ulong, arg: *mut c_void) -> c_int {
    // SAFETY: the caller vouches for the argument.
    unsafe {
        match LIBRARY.get() {
            Some(lib) => (lib.ioctl)(fd, cmd, arg),
            None => libc::ioctl(fd, cmd, arg),
        }
    }
}

// linger decodes RM_ALLOC only when the command's size is NVOS21's (or NVOS64's).
const _: () = assert!(std::mem::size_of::<Nvos21>() == NVOS21_SIZE as usize);

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [nvidia, uvm, bytes, ready] = args.as_slice() else {
        bail!("usage: linger-vm-gpu NVIDIA_DEVICE UVM_DEVICE BYTES READY_FILE");
    };
    let bytes: u64 = bytes.parse().context("BYTES")?;
    if let Some(path) = std::env::var("LINGER_VM_GPU_LIB")
        .ok()
        .filter(|p| !p.is_empty())
    {
        let _ = LIBRARY.set(load_library(&path)?);
    }
    let gpu = open(nvidia)?;
    let _uvm = open(uvm)?;
    rm_alloc(&gpu, CLIENT, 0, CLIENT, NV01_ROOT_CLIENT, None)?;
    for (instance, gpu_id) in GPU_IDS.into_iter().enumerate() {
        get_id_info(&gpu, gpu_id, instance as u32)?;
    }
    // NV0080_ALLOC_PARAMETERS begins with the device instance: the second GPU.
    let mut device = [0u8; 64];
    device[..4].copy_from_slice(&1u32.to_ne_bytes());
    rm_alloc(
        &gpu,
        CLIENT,
        CLIENT,
        DEVICE,
        NV01_DEVICE_0,
        Some(&mut device),
    )?;
    // NV_MEMORY_ALLOCATION_PARAMS, zeroed but for its size.
    let mut params = [0u8; 128];
    let at = MEMORY_ALLOCATION_SIZE_OFFSET as usize;
    params[at..at + 8].copy_from_slice(&bytes.to_ne_bytes());
    rm_alloc(
        &gpu,
        CLIENT,
        DEVICE,
        MEMORY,
        NV01_MEMORY_LOCAL_USER,
        Some(&mut params),
    )?;
    // SAFETY: an ioctl without argument on a descriptor we own.
    let rc = unsafe { ioctl(gpu.as_raw_fd(), STANDIN_FAULT, std::ptr::null_mut()) };
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
    if let Some(lib) = LIBRARY.get() {
        let c_path = CString::new(path)?;
        // SAFETY: a valid C string; the descriptor returned is ours alone.
        let fd = unsafe { (lib.open)(c_path.as_ptr()) };
        ensure!(
            fd >= 0,
            "opening {path} through the library: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a fresh descriptor nobody else owns.
        return Ok(unsafe { File::from_raw_fd(fd) });
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("opening {path}"))
}

/// NV0000_CTRL_CMD_GPU_GET_ID_INFO for `gpu_id`, with the answer already in place:
/// `{gpuId, gpuFlags, deviceInstance, ...}`.
fn get_id_info(gpu: &File, gpu_id: u32, instance: u32) -> Result<()> {
    let mut info = [0u32; 12];
    (info[0], info[2]) = (gpu_id, instance);
    let mut p = Nvos54 {
        client: CLIENT,
        object: CLIENT,
        cmd: CTRL_GPU_GET_ID_INFO[0],
        params: info.as_mut_ptr() as u64,
        params_size: std::mem::size_of_val(&info) as u32,
        ..Default::default()
    };
    // SAFETY: `info` outlives the call; the stand-in reads nothing.
    let rc = unsafe { escape(gpu, RM_CONTROL, &mut p) };
    ensure!(
        rc == 0 && p.status == 0,
        "GET_ID_INFO: {rc} (status {:#x}): {}",
        p.status,
        std::io::Error::last_os_error()
    );
    Ok(())
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
    // SAFETY: the parameters `p` points to outlive the call; the stand-in driver reads nothing,
    // the real one reads and writes only within them.
    let rc = unsafe { escape(gpu, RM_ALLOC, &mut p) };
    ensure!(
        rc == 0 && p.status == 0,
        "RM_ALLOC of class {class:#x}: {rc} (status {:#x}): {}",
        p.status,
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// Issues the RM escape `nr` with its parameter struct: `_IOWR('F', nr, T)`.
///
/// # Safety
/// Every pointer inside `params` must be valid for the driver to read and write.
unsafe fn escape<T>(gpu: &File, nr: u32, params: &mut T) -> i32 {
    let cmd = 3 << 30
        | (std::mem::size_of::<T>() as libc::c_ulong) << 16
        | (NV_IOCTL_MAGIC << 8 | nr) as libc::c_ulong;
    // SAFETY: `params` is a live, writable struct of the size the command declares; the
    // caller vouches for the pointers in it.
    unsafe { ioctl(gpu.as_raw_fd(), cmd, params as *mut T as *mut c_void) }
}
