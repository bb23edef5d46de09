//! ioctls on GPU files, decoded from the driver's parameter struct at their exit. There is no
//! entry hook: every system call would pay for it (their duration comes from the driver hooks
//! where the kernel allows them).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use tracer_common::{
    driver::{
        has_memory_allocation_params, id_info_size, ioc_nr, ioc_size, ioc_type,
        CTRL_GPU_GET_ID_INFO, ID_INFO_DEVICE_INSTANCE_OFFSET, IOCTL_XFER_CMD,
        MEMORY_ALLOCATION_SIZE_OFFSET, NV01_DEVICE_0, NVIDIA_MAJOR, NVOS21_SIZE, NVOS64_SIZE,
        NV_IOCTL_MAGIC, PARAMS_POINTER_OFFSET, RM_ALLOC, RM_ALLOC_MEMORY, RM_CONTROL,
        RM_DUP_OBJECT, RM_FREE, RM_MAP_MEMORY, RM_SHARE,
    },
    GpuIoctl,
};

use crate::{
    emit::{current_ids, emit},
    files::gpu_file_at,
    holders::is_holder,
    regs::{read_user, syscall_args},
};

/// sys_exit_ioctl: ret@16; the descriptor, command and argument are the call's first three
/// arguments. The driver has written its status and new handles back by now.
#[tracepoint]
pub fn ioctl_exit(ctx: TracePointContext) -> u32 {
    // Processes that never held a GPU file stop here, after one map lookup.
    if !is_holder(current_ids().0) {
        return 0;
    }
    let Some([fd, cmd, arg]) = syscall_args() else {
        return 0;
    };
    // SAFETY: offset of `ret` in the stable sys_exit format.
    let ret = unsafe { ctx.read_at::<i64>(16) }.unwrap_or(-1);
    record(fd, cmd, arg, ret);
    0
}

/// One finished ioctl of the current process, recorded when `fd` is a GPU file (whether it
/// was is returned). `ret` is the system call's return, or the C library's (-1 on failure)
/// when seen from an NVIDIA library.
pub fn record(fd: u64, cmd: u64, arg: u64, ret: i64) -> bool {
    if fd > u32::MAX as u64 {
        return false;
    }
    let Some((_, file, dev)) = gpu_file_at(fd as u32) else {
        return false;
    };
    let cmd = cmd as u32;
    emit::<GpuIoctl>(|e| {
        e.fd = fd as i32;
        e.cmd = cmd;
        e.dev = dev;
        e.ret = ret as i32;
        e.file = file;
        if dev >> 20 == NVIDIA_MAJOR && ioc_type(cmd) == NV_IOCTL_MAGIC {
            decode_rm(e, cmd, arg);
        }
    });
    true
}

/// Fills the decoded fields from the escape's fixed-size parameter struct.
pub fn decode_rm(e: &mut GpuIoctl, cmd: u32, arg: u64) {
    let (mut nr, mut size, mut params) = (ioc_nr(cmd), ioc_size(cmd), arg);
    if nr == IOCTL_XFER_CMD {
        // {u32 cmd, u32 size, u64 ptr}: the real escape and its parameters.
        nr = read_user::<u32>(arg);
        size = read_user::<u32>(arg + 4);
        params = read_user::<u64>(arg + 8);
        e.cmd = nr;
    }
    match nr {
        RM_ALLOC if size == NVOS21_SIZE || size == NVOS64_SIZE => {
            let [root, parent, object, class] = read_user::<[u32; 4]>(params);
            (e.h_root, e.h_parent, e.h_object, e.h_class) = (root, parent, object, class);
            let status_at = if size == NVOS64_SIZE { 40 } else { 28 };
            e.status = read_user::<u32>(params + status_at);
            let sized = has_memory_allocation_params(class);
            // Other classes' parameters are not read: one user read fewer per allocation.
            if sized || class == NV01_DEVICE_0 {
                let alloc_params = read_user::<u64>(params + PARAMS_POINTER_OFFSET);
                if alloc_params != 0 && sized {
                    e.size = read_user::<u64>(alloc_params + MEMORY_ALLOCATION_SIZE_OFFSET);
                } else if alloc_params != 0 {
                    // Which GPU the objects below it are on.
                    e.size = read_user::<u32>(alloc_params) as u64;
                }
            }
        }
        RM_FREE => {
            let [root, parent, object, status] = read_user::<[u32; 4]>(params);
            (e.h_root, e.h_parent, e.h_object, e.status) = (root, parent, object, status);
        }
        RM_ALLOC_MEMORY => {
            // NVOS02: hRoot, hObjectParent, hObjectNew, hClass, flags, pMemory@24, limit@32,
            // status@40.
            let [root, parent, object, class] = read_user::<[u32; 4]>(params);
            (e.h_root, e.h_parent, e.h_object, e.h_class) = (root, parent, object, class);
            e.size = read_user::<u64>(params + 32).wrapping_add(1);
            e.status = read_user::<u32>(params + 40);
        }
        RM_CONTROL => {
            // NVOS54: hClient, hObject, cmd, flags, params@16, paramsSize@24, status@28.
            let [client, object, ctrl] = read_user::<[u32; 3]>(params);
            (e.h_root, e.h_object, e.ctrl_cmd) = (client, object, ctrl);
            e.status = read_user::<u32>(params + 28);
            if e.status == 0 && (ctrl == CTRL_GPU_GET_ID_INFO[0] || ctrl == CTRL_GPU_GET_ID_INFO[1])
            {
                // The driver's word on which GPU a device instance is.
                let info = read_user::<u64>(params + PARAMS_POINTER_OFFSET);
                let gpu_id = read_user::<u32>(info);
                let instance = read_user::<u32>(info + ID_INFO_DEVICE_INSTANCE_OFFSET);
                e.size = id_info_size(gpu_id, instance);
            }
        }
        RM_MAP_MEMORY => {
            // NVOS33: hClient, hDevice, hMemory, offset@16, length@24, pLinearAddress@32,
            // status@40.
            let [client, device, memory] = read_user::<[u32; 3]>(params);
            (e.h_root, e.h_parent, e.h_object) = (client, device, memory);
            e.size = read_user::<u64>(params + 24);
            e.status = read_user::<u32>(params + 40);
        }
        RM_DUP_OBJECT => {
            // NVOS55: hClient, hParent, hObject, hClientSrc@12, hObjectSrc@16, flags, status@24.
            let [client, parent, object, src_client] = read_user::<[u32; 4]>(params);
            (e.h_root, e.h_parent, e.h_object) = (client, parent, object);
            e.ctrl_cmd = src_client;
            e.h_class = read_user::<u32>(params + 16);
            e.status = read_user::<u32>(params + 24);
        }
        RM_SHARE => {
            // NVOS57: hClient, hObject, sharePolicy{type, action, ...}, status@20.
            let [client, object] = read_user::<[u32; 2]>(params);
            (e.h_root, e.h_object) = (client, object);
            e.status = read_user::<u32>(params + 20);
        }
        _ => {}
    }
}
