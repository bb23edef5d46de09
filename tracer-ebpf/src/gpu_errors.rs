//! GPU errors the NVIDIA driver reports (Xids), from its one tracepoint. It fires only when a
//! GPU has an error: no cost to anything else.

use aya_ebpf::{
    helpers::{bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes},
    macros::tracepoint,
    programs::TracePointContext,
    EbpfContext,
};
use tracer_common::{GpuXid, XidLayout};

use crate::emit::emit;

/// Field offsets from the event's format file, set by user space before load.
#[unsafe(no_mangle)]
static XID_LAYOUT: XidLayout = XidLayout {
    dev: 0,
    msg: 0,
    error_code: 0,
    _pad: 0,
};

/// Tracepoint nvidia/nvidia_dev_xid(pdev, error_code, msg): `dev` and `msg` are
/// `__data_loc` strings (offset in the low 16 bits of the word, length in the high 16).
#[tracepoint(category = "nvidia", name = "nvidia_dev_xid")]
pub fn gpu_xid(ctx: TracePointContext) -> u32 {
    // SAFETY: read-only global filled before load.
    let layout = unsafe { core::ptr::read_volatile(&XID_LAYOUT) };
    let base = ctx.as_ptr() as *const u8;
    // SAFETY: offsets inside the tracepoint record, from its format; reads are checked.
    let field = |off: u32| unsafe {
        bpf_probe_read_kernel(base.add(off as usize) as *const u32).unwrap_or(0)
    };
    let xid = field(layout.error_code);
    let dev = field(layout.dev);
    let msg = field(layout.msg);
    emit::<GpuXid>(|e| {
        e.xid = xid;
        e.msg_len = msg >> 16;
        // SAFETY: the string lies inside the record; a failed read leaves the field empty.
        unsafe {
            let _ = bpf_probe_read_kernel_str_bytes(base.add((dev & 0xffff) as usize), &mut e.pci);
            let _ =
                bpf_probe_read_kernel_str_bytes(base.add((msg & 0xffff) as usize), &mut e.msg.0);
        }
    });
    0
}
