//! ioctls on GPU files: remembered at entry, decoded from the driver's parameter struct at exit
//! (when the driver has written its status and the new handles back).

use aya_ebpf::{
    helpers::bpf_probe_read_user,
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use tracer_common::{
    driver::{
        has_memory_allocation_params, ioc_nr, ioc_size, ioc_type, IOCTL_XFER_CMD,
        MEMORY_ALLOCATION_SIZE_OFFSET, NVIDIA_MAJOR, NVOS21_SIZE, NVOS64_SIZE, NV_IOCTL_MAGIC,
        RM_ALLOC, RM_ALLOC_MEMORY, RM_CONTROL, RM_DUP_OBJECT, RM_FREE, RM_MAP_MEMORY, RM_SHARE,
    },
    GpuIoctl, Loss,
};

use crate::{
    emit::{count_loss, current_ids, emit, now_ns},
    files::{gpu_file_at, is_holder},
};

#[derive(Clone, Copy)]
struct InFlight {
    ts: u64,
    file: u64,
    arg: u64,
    fd: u32,
    cmd: u32,
    dev: u32,
}

/// ioctls on GPU files under way, by thread.
#[map]
static IN_FLIGHT: HashMap<u32, InFlight> = HashMap::with_max_entries(8192, 0);

/// sys_enter_ioctl: fd@16, cmd@24, arg@32.
#[tracepoint]
pub fn ioctl_enter(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    // Processes that never held a GPU file stop here, after one map lookup.
    if !is_holder(tgid) {
        return 0;
    }
    // SAFETY: offsets of the stable sys_enter_ioctl format.
    let (fd, cmd, arg) = unsafe {
        (
            ctx.read_at::<u64>(16).unwrap_or(u64::MAX),
            ctx.read_at::<u64>(24).unwrap_or(0),
            ctx.read_at::<u64>(32).unwrap_or(0),
        )
    };
    if fd > u32::MAX as u64 {
        return 0;
    }
    let Some((_, file, dev)) = gpu_file_at(fd as u32) else {
        return 0;
    };
    let call = InFlight {
        ts: now_ns(),
        file,
        arg,
        fd: fd as u32,
        cmd: cmd as u32,
        dev,
    };
    if IN_FLIGHT.insert(tid, call, 0).is_err() {
        count_loss(Loss::Ioctls);
    }
    0
}

/// sys_exit_ioctl: ret@16.
#[tracepoint]
pub fn ioctl_exit(ctx: TracePointContext) -> u32 {
    let (_, tid) = current_ids();
    // SAFETY: the value is copied out before the entry is removed.
    let Some(call) = (unsafe { IN_FLIGHT.get(tid) }).copied() else {
        return 0;
    };
    let _ = IN_FLIGHT.remove(tid);
    // SAFETY: offset of `ret` in the stable sys_exit format.
    let ret = unsafe { ctx.read_at::<i64>(16) }.unwrap_or(-1);
    let now = now_ns();
    emit::<GpuIoctl>(|e| {
        e.fd = call.fd as i32;
        e.cmd = call.cmd;
        e.dev = call.dev;
        e.ret = ret as i32;
        e.duration_ns = now.wrapping_sub(call.ts);
        e.file = call.file;
        if call.dev >> 20 == NVIDIA_MAJOR && ioc_type(call.cmd) == NV_IOCTL_MAGIC {
            decode_rm(e, call.cmd, call.arg);
        }
    });
    0
}

fn user<T: Copy + Default>(addr: u64) -> T {
    // SAFETY: bpf_probe_read_user checks the address; unreadable memory yields the default.
    unsafe { bpf_probe_read_user(addr as *const T) }.unwrap_or_default()
}

/// Fills the decoded fields from the escape's fixed-size parameter struct.
fn decode_rm(e: &mut GpuIoctl, cmd: u32, arg: u64) {
    let (mut nr, mut size, mut params) = (ioc_nr(cmd), ioc_size(cmd), arg);
    if nr == IOCTL_XFER_CMD {
        // {u32 cmd, u32 size, u64 ptr}: the real escape and its parameters.
        nr = user::<u32>(arg);
        size = user::<u32>(arg + 4);
        params = user::<u64>(arg + 8);
        e.cmd = nr;
    }
    match nr {
        RM_ALLOC if size == NVOS21_SIZE || size == NVOS64_SIZE => {
            let [root, parent, object, class] = user::<[u32; 4]>(params);
            (e.h_root, e.h_parent, e.h_object, e.h_class) = (root, parent, object, class);
            let status_at = if size == NVOS64_SIZE { 40 } else { 28 };
            e.status = user::<u32>(params + status_at);
            if has_memory_allocation_params(class) {
                let alloc_params = user::<u64>(params + 16);
                if alloc_params != 0 {
                    e.size = user::<u64>(alloc_params + MEMORY_ALLOCATION_SIZE_OFFSET);
                }
            }
        }
        RM_FREE => {
            let [root, parent, object, status] = user::<[u32; 4]>(params);
            (e.h_root, e.h_parent, e.h_object, e.status) = (root, parent, object, status);
        }
        RM_ALLOC_MEMORY => {
            // NVOS02: hRoot, hObjectParent, hObjectNew, hClass, flags, pMemory@24, limit@32,
            // status@40.
            let [root, parent, object, class] = user::<[u32; 4]>(params);
            (e.h_root, e.h_parent, e.h_object, e.h_class) = (root, parent, object, class);
            e.size = user::<u64>(params + 32).wrapping_add(1);
            e.status = user::<u32>(params + 40);
        }
        RM_CONTROL => {
            // NVOS54: hClient, hObject, cmd, flags, params@16, paramsSize@24, status@28.
            let [client, object, ctrl] = user::<[u32; 3]>(params);
            (e.h_root, e.h_object, e.ctrl_cmd) = (client, object, ctrl);
            e.status = user::<u32>(params + 28);
        }
        RM_MAP_MEMORY => {
            // NVOS33: hClient, hDevice, hMemory, offset@16, length@24, pLinearAddress@32,
            // status@40.
            let [client, device, memory] = user::<[u32; 3]>(params);
            (e.h_root, e.h_parent, e.h_object) = (client, device, memory);
            e.size = user::<u64>(params + 24);
            e.status = user::<u32>(params + 40);
        }
        RM_DUP_OBJECT => {
            // NVOS55: hClient, hParent, hObject, hClientSrc@12, hObjectSrc@16, flags, status@24.
            let [client, parent, object, src_client] = user::<[u32; 4]>(params);
            (e.h_root, e.h_parent, e.h_object) = (client, parent, object);
            e.ctrl_cmd = src_client;
            e.h_class = user::<u32>(params + 16);
            e.status = user::<u32>(params + 24);
        }
        RM_SHARE => {
            // NVOS57: hClient, hObject, sharePolicy{type, action, ...}, status@20.
            let [client, object] = user::<[u32; 2]>(params);
            (e.h_root, e.h_object) = (client, object);
            e.status = user::<u32>(params + 20);
        }
        _ => {}
    }
}
