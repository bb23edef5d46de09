//! The driver hooks, chosen at load time by trying: fentry/fexit on `__fput` where the kernel
//! allows it, else kprobe/kretprobe, else none (tracepoints and stack sampling only); kprobes on
//! the NVIDIA driver's functions when its modules are loaded. What was tried and the kernel's
//! answers are kept for `linger doctor`, `live -v` and the event stream.

use std::fs;

use aya::{Btf, Ebpf};

use super::{
    attach::{attach_all, AttachError, Hook},
    devices::GpuDevices,
    library,
};
use crate::{
    error::Result,
    event::{DriverFunc, DriverHooks, HookKind, Mode, Strategy},
};

/// The driver's functions on the release path, its open and ioctl entries, hooked by kprobes.
/// fentry is not an option for them: it needs the module's BTF, which aya 0.14 cannot attach
/// to.
const DRIVER_FUNCS: [DriverFunc; 7] = [
    DriverFunc::NvidiaClose,
    DriverFunc::RmCleanupFilePrivate,
    DriverFunc::NvidiaCloseDeferred,
    DriverFunc::UvmReleaseEntry,
    DriverFunc::NvidiaUnlockedIoctl,
    DriverFunc::NvidiaOpen,
    DriverFunc::UvmOpenEntry,
];

/// The functions that answer opens and ioctls of GPU files in place of the system call
/// tracepoints; `__fput` must be hooked too, for the releases.
const ANSWERING: [DriverFunc; 3] = [
    DriverFunc::NvidiaOpen,
    DriverFunc::UvmOpenEntry,
    DriverFunc::NvidiaUnlockedIoctl,
];

/// Whether the hooks attached answer every open and ioctl of the driver's files, so that no
/// system call tracepoint is needed: `__fput` hooked, and the open and ioctl entries of every
/// driver module loaded (UVM's open only where nvidia-uvm is loaded).
fn driver_answers(s: &Strategy) -> bool {
    let uvm = fs::read_to_string("/proc/modules")
        .map(|m| m.lines().any(|l| l.starts_with("nvidia_uvm ")))
        .unwrap_or(false);
    s.fput.is_some()
        && ANSWERING
            .iter()
            .filter(|f| uvm || **f != DriverFunc::UvmOpenEntry)
            .all(|f| s.driver_functions.iter().any(|h| h == f.symbol()))
}

/// Whether the system call tracepoints would see nothing of GPUs: no NVIDIA driver registered
/// (/proc/devices) and no device declared with `--gpu-device`. Then none is attached until the
/// driver registers.
fn no_gpu_files(devices: &GpuDevices) -> bool {
    devices.majors.is_empty() && devices.devs.is_empty()
}

/// The strategy's reason for [`Mode::NoDriver`].
const NO_DRIVER_REASON: &str = "system call tracepoints: none, no NVIDIA driver is registered \
     (/proc/devices) and no --gpu-device declared; when it registers, its functions are hooked \
     where kprobes work, else the NVIDIA libraries if found then, else these tracepoints \
     attached";

/// What the mode is chosen from, besides what the driver hooks already attached.
pub struct Wanted<'a> {
    /// `--lean`.
    pub lean: bool,
    /// `--syscall-hooks`: the system call tracepoints rather than the NVIDIA libraries.
    pub syscall_hooks: bool,
    /// The GPU files: the driver's majors and the devices declared with `--gpu-device`.
    pub devices: &'a GpuDevices,
    /// Whether the library hooks follow ioctls too.
    pub ioctls: bool,
}

/// The one choice of the mode, for `Probes::load`, a driver registered late and `doctor`: the
/// cheapest way that sees GPU files. The driver's own functions where they answer (after
/// [`attach`]), else the NVIDIA libraries' calls (hooked here when found), else nothing where no
/// GPU file can exist yet, else the system call tracepoints. A declared `--gpu-device` has no
/// driver or library behind it: only the system calls see it.
pub fn choose_mode(
    ebpf: &mut Ebpf,
    s: &mut Strategy,
    attached: &mut Vec<String>,
    wanted: &Wanted,
) -> Mode {
    let declared = !wanted.devices.devs.is_empty();
    if wanted.lean {
        Mode::Lean
    } else if !declared && driver_answers(s) {
        Mode::Driver
    } else if !declared && !wanted.syscall_hooks && library::hook(ebpf, s, attached, wanted.ioctls)
    {
        Mode::Libraries
    } else if !wanted.syscall_hooks && no_gpu_files(wanted.devices) {
        s.reasons.push(NO_DRIVER_REASON.into());
        Mode::NoDriver
    } else {
        Mode::Syscalls
    }
}

/// Attaches the hooks `requested` asks for. `auto` never fails: it records why each step did
/// not work. A forced `fentry` or `kprobe` that the kernel refuses is an error.
pub fn attach(ebpf: &mut Ebpf, requested: DriverHooks, btf: Option<&Btf>) -> Result<Strategy> {
    let mut s = Strategy {
        requested,
        ..Default::default()
    };
    if requested == DriverHooks::Off {
        s.reasons
            .push("driver hooks turned off (--driver-hooks off)".into());
        return Ok(s);
    }
    if matches!(requested, DriverHooks::Auto | DriverHooks::Fentry) {
        match attach_fput_fentry(ebpf, btf) {
            Ok(()) => {
                s.fput = Some(HookKind::Fentry);
                s.reasons.push("fentry/fexit on __fput: attached".into());
            }
            Err(e) if requested == DriverHooks::Fentry => return Err(e.into()),
            Err(e) => s
                .reasons
                .push(format!("fentry/fexit on __fput: {}", e.reason())),
        }
    }
    let mut kprobes = true;
    if s.fput.is_none() {
        match attach_kprobes(ebpf, DriverFunc::Fput) {
            Ok(()) => {
                s.fput = Some(HookKind::Kprobe);
                s.reasons
                    .push("kprobe/kretprobe on __fput: attached".into());
            }
            Err(e) if requested == DriverHooks::Kprobe => return Err(e.into()),
            Err(e) => {
                kprobes = false;
                s.reasons
                    .push(format!("kprobe/kretprobe on __fput: {}", e.reason()));
            }
        }
    }
    if kprobes {
        attach_driver(ebpf, &mut s);
    } else {
        s.reasons
            .push("NVIDIA driver functions: not hooked, kprobes are unavailable".into());
    }
    Ok(s)
}

/// One line for `doctor`'s strategy and `live -v`.
pub fn describe(s: &Strategy) -> String {
    let hooks = hooks_of(s);
    match s.mode() {
        Mode::Lean => format!("lean (no system call tracepoint): {hooks}"),
        Mode::Libraries => format!(
            "no system call tracepoint, opens, closes and ioctls of GPU files from uprobes on \
             the PLT entries of {}: {hooks}",
            s.libraries.join(", ")
        ),
        Mode::NoDriver => format!(
            "no system call tracepoint: no NVIDIA driver is registered, so no GPU file can be \
             opened (when it comes: its functions, its libraries or these tracepoints): {hooks}"
        ),
        Mode::Driver => format!(
            "no system call tracepoint, opens and ioctls of GPU files from the driver's own \
             functions: {hooks}"
        ),
        Mode::Syscalls => hooks,
    }
}

fn hooks_of(s: &Strategy) -> String {
    let Some(fput) = s.fput else {
        let why = if s.requested == DriverHooks::Off {
            "driver hooks turned off"
        } else {
            "this kernel allows neither fentry nor kprobes on __fput"
        };
        return format!(
            "tracepoints + tp_btf; driver teardown seen through stack sampling only ({why})"
        );
    };
    let how = match fput {
        HookKind::Fentry => "fentry/fexit",
        HookKind::Kprobe => "kprobe/kretprobe",
    };
    let driver = if s.driver_functions.is_empty() {
        "no NVIDIA driver functions hooked".to_string()
    } else {
        format!("kprobes on {}", s.driver_functions.join(", "))
    };
    format!("tracepoints + tp_btf; GPU file release timed exactly by {how} on __fput; {driver}")
}

/// Entry and exit together (an entry without its exit would time nothing).
fn attach_fput_fentry(ebpf: &mut Ebpf, btf: Option<&Btf>) -> Result<(), AttachError> {
    let pairs = [
        ("fput_fentry", Hook::Fentry("__fput")),
        ("fput_fexit", Hook::Fexit("__fput")),
    ];
    attach_all(ebpf, &pairs, btf).map(|_| ())
}

/// Entry and return probes of `func`: programs `<name>_kprobe` and `<name>_kretprobe`.
fn attach_kprobes(ebpf: &mut Ebpf, func: DriverFunc) -> Result<(), AttachError> {
    let name = match func {
        DriverFunc::Fput => "fput",
        other => other.symbol(),
    };
    let (entry, exit) = (format!("{name}_kprobe"), format!("{name}_kretprobe"));
    let pairs = [
        (entry.as_str(), Hook::Kprobe(func.symbol())),
        (exit.as_str(), Hook::Kretprobe(func.symbol())),
    ];
    attach_all(ebpf, &pairs, None).map(|_| ())
}

/// Kprobes on the driver functions present in the running kernel.
pub(super) fn attach_driver(ebpf: &mut Ebpf, s: &mut Strategy) {
    if !nvidia_modules_loaded() {
        s.reasons.push(
            "NVIDIA driver functions: not hooked, no nvidia module is loaded (/proc/modules)"
                .into(),
        );
        return;
    }
    let present = kallsyms_present(&DRIVER_FUNCS.map(|f| f.symbol()));
    for func in DRIVER_FUNCS {
        let symbol = func.symbol();
        if !present.contains(&symbol) {
            s.reasons
                .push(format!("kprobe on {symbol}: not in /proc/kallsyms"));
            continue;
        }
        match attach_kprobes(ebpf, func) {
            Ok(()) => s.driver_functions.push(symbol.into()),
            Err(e) => s
                .reasons
                .push(format!("kprobe on {symbol}: {}", e.reason())),
        }
    }
    if !s.driver_functions.is_empty() {
        s.reasons.push(format!(
            "kprobe/kretprobe on {}: attached",
            s.driver_functions.join(", ")
        ));
    }
}

fn nvidia_modules_loaded() -> bool {
    fs::read_to_string("/proc/modules")
        .map(|m| m.lines().any(|l| l.starts_with("nvidia")))
        .unwrap_or(false)
}

/// Which of `names` /proc/kallsyms lists as functions (of the kernel or any module).
fn kallsyms_present(names: &[&'static str]) -> Vec<&'static str> {
    functions_listed(
        &fs::read_to_string("/proc/kallsyms").unwrap_or_default(),
        names,
    )
}

fn functions_listed(kallsyms: &str, names: &[&'static str]) -> Vec<&'static str> {
    let mut found = Vec::new();
    for line in kallsyms.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_), Some(kind), Some(sym)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if matches!(kind, "t" | "T") {
            if let Some(n) = names.iter().find(|n| **n == sym) {
                if !found.contains(n) {
                    found.push(*n);
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_functions_count() {
        // Lines as /proc/kallsyms prints them, module functions with their module.
        let kallsyms = "ffffffff8a369b80 t __fput\n\
                        ffffffffc0a010c0 T nvidia_close\t[nvidia]\n\
                        ffffffffc0a01120 t nvidia_close_deferred\t[nvidia]\n\
                        ffffffffc0a03000 d rm_cleanup_file_private\t[nvidia]\n";
        let names = DRIVER_FUNCS.map(|f| f.symbol());
        assert_eq!(
            functions_listed(kallsyms, &names),
            vec!["nvidia_close", "nvidia_close_deferred"]
        );
    }
}
