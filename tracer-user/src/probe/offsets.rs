//! Field offsets the programs need, read from the running kernel's BTF.

use btf_rs::{Btf, Type};
use tracer_common::KernelOffsets;

use crate::error::{Error, Result};

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

pub fn load_vmlinux() -> Result<Btf> {
    Btf::from_file(VMLINUX_BTF).map_err(|e| Error::Btf(format!("{VMLINUX_BTF}: {e}")))
}

pub fn resolve(btf: &Btf) -> Result<KernelOffsets> {
    // 6.13 replaced `atomic_long_t f_count` with `file_ref_t f_ref`, which stores count - 1.
    let (file_refcount, file_refcount_bias) = match member_offset(btf, "file", "f_ref") {
        Ok(off) => (off, 1),
        Err(_) => (member_offset(btf, "file", "f_count")?, 0),
    };
    Ok(KernelOffsets {
        task_pid: member_offset(btf, "task_struct", "pid")?,
        task_tgid: member_offset(btf, "task_struct", "tgid")?,
        task_comm: member_offset(btf, "task_struct", "comm")?,
        task_group_leader: member_offset(btf, "task_struct", "group_leader")?,
        task_signal: member_offset(btf, "task_struct", "signal")?,
        task_exit_code: member_offset(btf, "task_struct", "exit_code")?,
        signal_nr_threads: member_offset(btf, "signal_struct", "nr_threads")?,
        signal_live: member_offset(btf, "signal_struct", "live")?,
        task_files: member_offset(btf, "task_struct", "files")?,
        files_fdt: member_offset(btf, "files_struct", "fdt")?,
        fdtable_max_fds: member_offset(btf, "fdtable", "max_fds")?,
        fdtable_fd: member_offset(btf, "fdtable", "fd")?,
        fdtable_close_on_exec: member_offset(btf, "fdtable", "close_on_exec")?,
        file_inode: member_offset(btf, "file", "f_inode")?,
        file_refcount,
        file_refcount_bias,
        inode_rdev: member_offset(btf, "inode", "i_rdev")?,
        file_private_data: member_offset(btf, "file", "private_data")?,
    })
}

/// Whether `sched_process_exit` passes `group_dead` (kernels since 6.16 do): its BTF typedef
/// `btf_trace_sched_process_exit` points to a prototype with a third parameter.
pub fn exit_has_group_dead(btf: &Btf) -> Result<bool> {
    let typedef = first_type(btf, "btf_trace_sched_process_exit")?;
    let mut ty = btf
        .resolve_chained_type(
            typedef
                .as_btf_type()
                .ok_or_else(|| Error::Btf("btf_trace_sched_process_exit is not a type".into()))?,
        )
        .map_err(|e| Error::Btf(e.to_string()))?;
    if let Type::Ptr(ptr) = &ty {
        ty = btf
            .resolve_chained_type(ptr)
            .map_err(|e| Error::Btf(e.to_string()))?;
    }
    match ty {
        Type::FuncProto(proto) => Ok(proto.parameters.len() >= 3),
        other => Err(Error::Btf(format!(
            "btf_trace_sched_process_exit resolves to {}, expected a prototype",
            other.name()
        ))),
    }
}

fn first_type(btf: &Btf, name: &str) -> Result<Type> {
    btf.resolve_types_by_name(name)
        .map_err(|e| Error::Btf(format!("{name}: {e}")))?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Btf(format!("{name} not found")))
}

/// Byte offset of `field` in `struct name`, looking through anonymous struct and union members
/// (randomized layouts and unions put fields there).
pub fn member_offset(btf: &Btf, name: &str, field: &str) -> Result<u32> {
    let structs = btf
        .resolve_types_by_name(name)
        .map_err(|e| Error::Btf(format!("struct {name}: {e}")))?;
    for ty in structs {
        if let Type::Struct(s) = ty {
            if let Some(bits) = find_member(btf, &s, field) {
                return Ok(bits / 8);
            }
        }
    }
    Err(Error::Btf(format!("no field {field} in struct {name}")))
}

fn find_member(btf: &Btf, s: &btf_rs::Struct, field: &str) -> Option<u32> {
    for member in &s.members {
        let name = btf.resolve_name(member).unwrap_or_default();
        if name == field {
            return Some(member.bit_offset());
        }
        if name.is_empty() {
            if let Ok(Type::Struct(inner) | Type::Union(inner)) = btf.resolve_chained_type(member) {
                if let Some(bits) = find_member(btf, &inner, field) {
                    return Some(member.bit_offset() + bits);
                }
            }
        }
    }
    None
}
