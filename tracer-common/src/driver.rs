//! The NVIDIA driver's ioctl ABI (open kernel modules, x86_64): escape codes, parameter struct
//! offsets and memory classes. Source: kernel-open/common/inc/nv-ioctl-numbers.h and the RM SDK's
//! nvos.h; see docs/driver-abi.md.

/// `_IOC` type of the driver's escapes ('F').
pub const NV_IOCTL_MAGIC: u32 = b'F' as u32;

pub const RM_ALLOC_MEMORY: u32 = 0x27;
pub const RM_FREE: u32 = 0x29;
pub const RM_CONTROL: u32 = 0x2A;
pub const RM_ALLOC: u32 = 0x2B;
pub const RM_DUP_OBJECT: u32 = 0x34;
pub const RM_SHARE: u32 = 0x35;
pub const RM_VID_HEAP_CONTROL: u32 = 0x4A;
pub const RM_MAP_MEMORY: u32 = 0x4E;
pub const RM_UNMAP_MEMORY: u32 = 0x4F;
pub const CARD_INFO: u32 = 200;
pub const REGISTER_FD: u32 = 201;
pub const ALLOC_OS_EVENT: u32 = 206;
pub const FREE_OS_EVENT: u32 = 207;
pub const CHECK_VERSION_STR: u32 = 210;
/// Indirect escape: params are `{u32 cmd, u32 size, u64 ptr}` naming the real one.
pub const IOCTL_XFER_CMD: u32 = 211;
pub const ATTACH_GPUS_TO_FD: u32 = 212;
pub const EXPORT_TO_DMABUF_FD: u32 = 217;
pub const WAIT_OPEN_COMPLETE: u32 = 218;

/// Sizes of the parameter structs the decoder reads.
pub const NVOS21_SIZE: u32 = 32;
pub const NVOS64_SIZE: u32 = 48;

/// NV_MEMORY_ALLOCATION_PARAMS.size.
pub const MEMORY_ALLOCATION_SIZE_OFFSET: u64 = 64;

/// Where NVOS21 and NVOS64 keep `pAllocParms`, and NVOS54 (RM_CONTROL) its `params`.
pub const PARAMS_POINTER_OFFSET: u64 = 16;

/// NV0000_CTRL_CMD_GPU_GET_ID_INFO and its V2: `{gpuId, gpuFlags, deviceInstance, ...}` in
/// both, the driver filling in the device instance of the GPU the caller named.
pub const CTRL_GPU_GET_ID_INFO: [u32; 2] = [0x202, 0x205];
pub const ID_INFO_DEVICE_INSTANCE_OFFSET: u64 = 8;

/// `size` of a GET_ID_INFO control: the gpu id above the device instance.
pub const fn id_info_size(gpu_id: u32, device_instance: u32) -> u64 {
    (gpu_id as u64) << 32 | device_instance as u64
}

/// The (gpu id, device instance) a GET_ID_INFO control's `size` carries.
pub const fn id_info_of(size: u64) -> (u32, u32) {
    ((size >> 32) as u32, size as u32)
}

/// The PCI (domain, bus, device) an RM gpu id encodes: `(domain & 0xffff) << 16 | bus << 8 |
/// device` (the RM's gpuGenerate32BitId).
pub const fn gpu_id_pci(gpu_id: u32) -> (u32, u32, u32) {
    (gpu_id >> 16, (gpu_id >> 8) & 0xff, gpu_id & 0xff)
}

pub const NV01_ROOT: u32 = 0x0;
pub const NV01_ROOT_NON_PRIV: u32 = 0x1;
pub const NV01_ROOT_CLIENT: u32 = 0x41;
/// A GPU (NV0080_ALLOC_PARAMETERS begins with its device instance), and a GPU of it
/// (NV20_SUBDEVICE_0): the objects below them are that GPU's.
pub const NV01_DEVICE_0: u32 = 0x80;
pub const NV20_SUBDEVICE_0: u32 = 0x2080;
pub const NV01_MEMORY_SYSTEM: u32 = 0x3E;
/// System memory described by the caller (RM_ALLOC_MEMORY of a user buffer).
pub const NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: u32 = 0x71;
pub const NV01_MEMORY_LOCAL_PRIVILEGED: u32 = 0x3F;
pub const NV01_MEMORY_LOCAL_USER: u32 = 0x40;
pub const NV01_MEMORY_LOCAL_PHYSICAL: u32 = 0xC2;
pub const NV_MEMORY_FABRIC: u32 = 0xF8;
pub const NV50_MEMORY_VIRTUAL: u32 = 0x50A0;
pub const NV01_MEMORY_DEVICELESS: u32 = 0x90CE;

/// Classes whose RM_ALLOC parameters are NV_MEMORY_ALLOCATION_PARAMS (with a size).
pub fn has_memory_allocation_params(class: u32) -> bool {
    matches!(
        class,
        NV01_MEMORY_LOCAL_USER | NV01_MEMORY_SYSTEM | NV50_MEMORY_VIRTUAL | NV01_MEMORY_DEVICELESS
    )
}

/// NV_ERR_NO_MEMORY.
pub const NV_ERR_NO_MEMORY: u32 = 0x51;

/// `_IOC_NR`, `_IOC_TYPE` and `_IOC_SIZE` of an ioctl command.
pub fn ioc_nr(cmd: u32) -> u32 {
    cmd & 0xff
}
pub fn ioc_type(cmd: u32) -> u32 {
    (cmd >> 8) & 0xff
}
pub fn ioc_size(cmd: u32) -> u32 {
    (cmd >> 16) & 0x3fff
}

/// UVM's commands are plain integers, not `_IOC` encodings.
pub const UVM_INITIALIZE: u32 = 0x3000_0001;
pub const UVM_DEINITIALIZE: u32 = 0x3000_0002;
pub const UVM_MAP_EXTERNAL_ALLOCATION: u32 = 33;
pub const UVM_FREE: u32 = 34;
pub const UVM_REGISTER_GPU: u32 = 37;
pub const UVM_MM_INITIALIZE: u32 = 75;

/// Char major of /dev/nvidiaN, nvidiactl and nvidia-modeset.
pub const NVIDIA_MAJOR: u32 = 195;

/// Kernel `dev_t` encoding (MKDEV).
pub const fn mkdev(major: u32, minor: u32) -> u32 {
    (major << 20) | minor
}
pub const fn dev_major(dev: u32) -> u32 {
    dev >> 20
}
pub const fn dev_minor(dev: u32) -> u32 {
    dev & 0xfffff
}
