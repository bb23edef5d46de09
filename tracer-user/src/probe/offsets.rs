//! Field offsets the programs need, read from the running kernel's BTF.

use btf_rs::{Btf, Type};
use serde::Serialize;
use tracer_common::KernelOffsets;

use crate::error::{BtfError, Result};

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

pub fn load_vmlinux() -> Result<Btf> {
    Btf::from_file(VMLINUX_BTF).map_err(|e| {
        BtfError::Read {
            path: VMLINUX_BTF,
            source: e.into(),
        }
        .into()
    })
}

/// The lookup of `what` failed in btf-rs, whose errors are untyped.
fn lookup(what: &str) -> impl FnOnce(anyhow::Error) -> BtfError + '_ {
    move |e| BtfError::Lookup {
        what: what.into(),
        source: e.into(),
    }
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
        fdtable_open_fds: member_offset(btf, "fdtable", "open_fds")?,
        file_inode: member_offset(btf, "file", "f_inode")?,
        file_refcount,
        file_refcount_bias,
        inode_rdev: member_offset(btf, "inode", "i_rdev")?,
        file_private_data: member_offset(btf, "file", "private_data")?,
        task_stack: member_offset(btf, "task_struct", "stack")?,
        stack_regs: stack_regs(btf)?,
        // 5.14 renamed `state` to `__state`.
        task_state: member_offset(btf, "task_struct", "__state")
            .or_else(|_| member_offset(btf, "task_struct", "state"))?,
        // 5.18 added `prev_state` after (preempt, prev, next).
        switch_prev_state: u32::from(tracepoint_params(btf, "sched_switch")? >= 4),
        task_nvcsw: member_offset(btf, "task_struct", "nvcsw")?,
    })
}

/// Where the saved user registers sit above a task's kernel stack on kernels without
/// `bpf_task_pt_regs` (before 5.15): x86_64's task_pt_regs() is the stack's top (THREAD_SIZE,
/// 16 KiB, twice that with KASAN) minus one `struct pt_regs`. 0 where the helper exists.
fn stack_regs(btf: &Btf) -> Result<u32> {
    if has_helper(btf, "BPF_FUNC_task_pt_regs") {
        return Ok(0);
    }
    regs_above_stack(btf)
}

fn regs_above_stack(btf: &Btf) -> Result<u32> {
    let thread_size: u32 = if named(btf, "kasan_check_range") || named(btf, "check_memory_region") {
        32 << 10
    } else {
        16 << 10
    };
    let pt_regs = match first_type(btf, "pt_regs")? {
        Type::Struct(s) => s.size() as u32,
        other => {
            return Err(
                BtfError::Shape(format!("pt_regs is {}, not a struct", other.name())).into(),
            )
        }
    };
    Ok(thread_size - pt_regs)
}

/// Whether the kernel knows the BPF helper `name` (a value of its `enum bpf_func_id`).
fn has_helper(btf: &Btf, name: &str) -> bool {
    let Ok(types) = btf.resolve_types_by_name("bpf_func_id") else {
        return false;
    };
    types.iter().any(|ty| match ty {
        Type::Enum(e) => e
            .members
            .iter()
            .any(|m| btf.resolve_name(m).is_ok_and(|n| n == name)),
        _ => false,
    })
}

fn named(btf: &Btf, name: &str) -> bool {
    btf.resolve_types_by_name(name)
        .is_ok_and(|types| !types.is_empty())
}

/// Whether `sched_process_exit` passes `group_dead` (kernels since 6.16 do).
pub fn exit_has_group_dead(btf: &Btf) -> Result<bool> {
    Ok(tracepoint_params(btf, "sched_process_exit")? >= 2)
}

/// How many arguments the tracepoint `name` passes to a tp_btf program: its BTF typedef
/// `btf_trace_NAME` points to a prototype whose first parameter is the context.
fn tracepoint_params(btf: &Btf, name: &str) -> Result<usize> {
    let typedef_name = format!("btf_trace_{name}");
    let typedef = first_type(btf, &typedef_name)?;
    let mut ty = btf
        .resolve_chained_type(
            typedef
                .as_btf_type()
                .ok_or_else(|| BtfError::Shape(format!("{typedef_name} is not a type")))?,
        )
        .map_err(lookup(&typedef_name))?;
    if let Type::Ptr(ptr) = &ty {
        ty = btf
            .resolve_chained_type(ptr)
            .map_err(lookup(&typedef_name))?;
    }
    match ty {
        Type::FuncProto(proto) => Ok(proto.parameters.len().saturating_sub(1)),
        other => Err(BtfError::Shape(format!(
            "{typedef_name} resolves to {}, expected a prototype",
            other.name()
        ))
        .into()),
    }
}

fn first_type(btf: &Btf, name: &str) -> Result<Type> {
    btf.resolve_types_by_name(name)
        .map_err(lookup(name))?
        .into_iter()
        .next()
        .ok_or_else(|| BtfError::Shape(format!("{name} not found")).into())
}

/// Byte offset of `field` in `struct name`, looking through anonymous struct and union members
/// (randomized layouts and unions put fields there).
pub fn member_offset(btf: &Btf, name: &str, field: &str) -> Result<u32> {
    let structs = btf
        .resolve_types_by_name(name)
        .map_err(lookup(&format!("struct {name}")))?;
    for ty in structs {
        if let Type::Struct(s) = ty {
            if let Some(bits) = find_member(btf, &s, field) {
                return Ok(bits / 8);
            }
        }
    }
    Err(BtfError::Shape(format!("no field {field} in struct {name}")).into())
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

/// One layout or prototype that moves between kernels, and what this kernel's BTF chose.
#[derive(Debug, Serialize)]
pub struct Layout {
    pub name: &'static str,
    pub detail: String,
}

/// What `resolve` and `exit_has_group_dead` found on this kernel, said for `linger doctor`.
pub fn layouts(btf: &Btf) -> Result<Vec<Layout>> {
    let o = resolve(btf)?;
    let state = if member_offset(btf, "task_struct", "__state").is_ok() {
        "task_struct.__state"
    } else {
        "task_struct.state"
    };
    let layout = |name, detail: String| Layout { name, detail };
    Ok(vec![
        layout(
            "file_refcount",
            if o.file_refcount_bias == 1 {
                "file.f_ref (count - 1; 6.13+)".into()
            } else {
                "file.f_count".into()
            },
        ),
        layout(
            "sched_process_exit",
            if exit_has_group_dead(btf)? {
                "(task, group_dead) (6.16+)".into()
            } else {
                "(task): group death from signal_struct.live".into()
            },
        ),
        layout(
            "sched_switch",
            if o.switch_prev_state == 1 {
                "(preempt, prev, next, prev_state) (5.18+)".into()
            } else {
                format!("(preempt, prev, next): prev_state from {state}")
            },
        ),
        layout(
            "syscall_arguments",
            if o.stack_regs == 0 {
                "bpf_task_pt_regs (5.15+)".into()
            } else {
                format!(
                    "pt_regs at task_struct.stack + {} (no bpf_task_pt_regs before 5.15)",
                    o.stack_regs
                )
            },
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's kernel (6.18) has every newer layout.
    #[test]
    fn the_running_kernel_gets_the_new_layouts() {
        let Ok(btf) = load_vmlinux() else {
            eprintln!("skipped: no {VMLINUX_BTF}");
            return;
        };
        let o = resolve(&btf).expect("offsets");
        assert_eq!(o.stack_regs, 0, "6.18 has bpf_task_pt_regs");
        assert_eq!(o.switch_prev_state, 1);
        assert!(o.task_stack != 0 && o.task_state != o.task_pid);
        let layouts = layouts(&btf).expect("layouts");
        let names: Vec<_> = layouts.iter().map(|l| l.name).collect();
        assert_eq!(
            names,
            [
                "file_refcount",
                "sched_process_exit",
                "sched_switch",
                "syscall_arguments"
            ]
        );
        assert!(layouts[3].detail.starts_with("bpf_task_pt_regs"));
    }

    /// The fallback's arithmetic on this kernel (no KASAN): a 16 KiB stack, 21 saved words.
    #[test]
    fn pt_regs_sit_one_struct_below_the_stack_top() {
        let Ok(btf) = load_vmlinux() else {
            eprintln!("skipped: no {VMLINUX_BTF}");
            return;
        };
        assert!(has_helper(&btf, "BPF_FUNC_task_pt_regs"));
        assert!(!has_helper(&btf, "BPF_FUNC_no_such_helper"));
        assert_eq!(regs_above_stack(&btf).expect("pt_regs"), 16384 - 168);
    }
}
