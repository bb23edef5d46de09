//! What this machine allows: each eBPF hook type tried for real, plus the GPU side.

use std::fs;

use aya::{Btf, Ebpf, EbpfLoader};
use serde::Serialize;

use super::{
    attach::{attach, chain, AttachError, Hook},
    devices::GpuDevices,
    object::EBPF_OBJECT,
    offsets::{self, Layout},
    questions::{self, Question},
    strategy::{self, Wanted},
    tracefs,
};
use crate::{
    escape,
    event::{DriverHooks, Strategy},
};

#[derive(Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    /// What was seen: a version or path when ok, the kernel's answer and what it means when not.
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct Report {
    #[serde(rename = "type")]
    pub record_type: &'static str,
    pub kernel: String,
    pub hooks: Vec<Check>,
    pub gpu: Vec<Check>,
    /// How linger will watch driver teardown on this machine.
    pub strategy: String,
    /// The driver hooks `live` would choose here, and why.
    pub driver_hooks: Strategy,
    /// Each question linger asks, with the hook that answers it here and what it costs.
    pub questions: Vec<Question>,
    /// The layouts and tracepoint prototypes that differ between kernels, as BTF has them here.
    pub kernel_layout: Vec<Layout>,
}

pub fn run() -> Report {
    let mut hooks = Vec::new();
    if let Err(e) = tracefs::ensure_mounted() {
        hooks.push(Check {
            name: "tracefs",
            ok: false,
            detail: format!("{e}: tracepoints cannot be attached"),
        });
    }
    let btf = Btf::from_sys_fs();
    let mut driver_hooks = Strategy::default();
    hooks.push(Check {
        name: "btf",
        ok: btf.is_ok(),
        detail: match &btf {
            Ok(_) => "/sys/kernel/btf/vmlinux".into(),
            Err(e) => format!("{e}: tp_btf and fentry need kernel BTF (CONFIG_DEBUG_INFO_BTF)"),
        },
    });
    match load_object() {
        Ok(mut ebpf) => {
            let btf = btf.ok();
            // The real selection, as `live` makes it with its defaults (auto never fails).
            driver_hooks =
                strategy::attach(&mut ebpf, DriverHooks::Auto, btf.as_ref()).unwrap_or_default();
            let devices = GpuDevices::discover(&[] as &[&str]).unwrap_or_default();
            let wanted = Wanted {
                lean: false,
                syscall_hooks: false,
                devices: &devices,
                ioctls: true,
            };
            let mode =
                strategy::choose_mode(&mut ebpf, &mut driver_hooks, &mut Vec::new(), &wanted);
            driver_hooks.enter(mode);
            for name in [
                "tracepoint",
                "tp_btf",
                "raw_tracepoint",
                "perf_event",
                "uprobe",
                "fentry",
                "kprobe",
            ] {
                let result = try_hook(&mut ebpf, name, btf.as_ref());
                hooks.push(Check {
                    name,
                    ok: result.is_ok(),
                    detail: result.map_or_else(|e| e.reason(), |()| "loaded and attached".into()),
                });
            }
        }
        Err(e) => hooks.push(Check {
            name: "bpf",
            ok: false,
            detail: format!("loading the eBPF object failed: {e}"),
        }),
    }
    let xid = super::xid::layout();
    driver_hooks.xid_tracepoint = xid.is_ok();
    let gpu = vec![
        driver_check(),
        nvml_check(),
        Check {
            name: "xid_tracepoint",
            ok: xid.is_ok(),
            detail: xid.map_or_else(
                |why| format!("{why}: GPU errors from the kernel log"),
                |_| "nvidia/nvidia_dev_xid: GPU errors as the driver reports them".into(),
            ),
        },
        kmsg_check(driver_hooks.xid_tracepoint),
    ];
    Report {
        record_type: "doctor",
        kernel: kernel_line(),
        hooks,
        gpu,
        strategy: strategy::describe(&driver_hooks),
        questions: questions::table(&driver_hooks),
        driver_hooks,
        kernel_layout: offsets::load_vmlinux()
            .and_then(|btf| offsets::layouts(&btf))
            .unwrap_or_else(|e| {
                vec![Layout {
                    name: "btf",
                    detail: format!("{e}: linger cannot run here"),
                }]
            }),
    }
}

fn load_object() -> Result<Ebpf, String> {
    // The doctor only loads its own empty programs; a one-page ring keeps the maps small.
    EbpfLoader::new()
        .map_max_entries("EVENTS", 4096)
        .load(EBPF_OBJECT)
        .map_err(|e| e.to_string())
}

/// Each hook type tried with the doctor's own empty program for it.
fn try_hook(ebpf: &mut Ebpf, name: &str, btf: Option<&Btf>) -> Result<(), AttachError> {
    let hook = match name {
        "tracepoint" => Hook::Tracepoint {
            category: "sched",
            name: "sched_process_exit",
        },
        "tp_btf" => Hook::TpBtf("sched_process_exit"),
        "raw_tracepoint" => Hook::RawTp("sched_process_exit"),
        "perf_event" => Hook::PerfEvent { cpu: 0, hz: 1 },
        "uprobe" => Hook::Uprobe {
            target: "libc",
            function: "getpid",
        },
        "fentry" => Hook::Fentry("do_exit"),
        _ => Hook::Kprobe("do_exit"),
    };
    attach(ebpf, &format!("doctor_{name}"), &hook, btf).map(|_| ())
}

fn kernel_line() -> String {
    // Lockdown decides which helpers work; it is read from securityfs.
    let _ = tracefs::ensure_securityfs();
    let release = crate::source::machine::read().kernel_release;
    let lockdown = fs::read_to_string("/sys/kernel/security/lockdown")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .find(|w| w.starts_with('['))
                .map(|w| w.trim_matches(['[', ']']).to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    format!("{} (lockdown: {lockdown})", release.trim())
}

/// Whether the kernel log opens as the tracing commands open it: it names each GPU error's
/// process (a container's device list may refuse it).
fn kmsg_check(tracepoint: bool) -> Check {
    let kmsg = crate::source::kmsg::open();
    Check {
        name: "kmsg",
        ok: kmsg.is_ok(),
        detail: super::xid::kmsg_reason(kmsg.as_ref().map(|_| ()), tracepoint),
    }
}

fn driver_check() -> Check {
    match crate::source::machine::driver() {
        Some(v) => Check {
            name: "nvidia_driver",
            ok: true,
            detail: v,
        },
        None => Check {
            name: "nvidia_driver",
            ok: false,
            detail: "no NVIDIA kernel driver loaded (/proc/driver/nvidia/version missing)".into(),
        },
    }
}

fn nvml_check() -> Check {
    match crate::source::nvml::open_nvml() {
        Ok(nvml) => {
            let version = nvml
                .sys_driver_version()
                .unwrap_or_else(|e| format!("? ({e})"));
            let count = nvml
                .device_count()
                .map_or_else(|e| format!("? ({e})"), |n| n.to_string());
            Check {
                name: "nvml",
                ok: true,
                detail: format!("driver {version}, {count} device(s)"),
            }
        }
        Err(e) => Check {
            name: "nvml",
            ok: false,
            detail: format!("{}: GPU memory will come from kernel data only", chain(&e)),
        },
    }
}

/// Plain-text form of the report. Details quote the kernel, the driver and NVML, and a
/// replayed strategy comes from a file: all shown escaped.
pub fn render(report: &Report) -> String {
    let mut s = format!("{:<16}{}\n", "kernel", escape::terminal(&report.kernel));
    for c in report.hooks.iter().chain(&report.gpu) {
        s.push_str(&format!(
            "{:<16}{:<5}{}\n",
            c.name,
            if c.ok { "yes" } else { "no" },
            escape::terminal(&c.detail)
        ));
    }
    s.push_str(&format!(
        "{:<16}{}\n",
        "strategy",
        escape::terminal(&report.strategy)
    ));
    for reason in &report.driver_hooks.reasons {
        s.push_str(&format!("{:<16}- {}\n", "", escape::terminal(reason)));
    }
    for l in &report.kernel_layout {
        s.push_str(&format!(
            "{:<16}{:<5}{}\n",
            "layout",
            "",
            escape::terminal(&format!("{}: {}", l.name, l.detail))
        ));
    }
    if !report.questions.is_empty() {
        s.push_str("\nwhat linger asks, and which hook answers it here:\n");
    }
    for q in &report.questions {
        s.push_str(&format!(
            "  {}\n    default: {}\n    --lean:  {}\n    cost:    {}\n",
            q.question, q.default, q.lean, q.cost
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_escapes_what_it_quotes() {
        let report = Report {
            record_type: "doctor",
            kernel: "6.1\x1b[2J".into(),
            hooks: vec![Check {
                name: "fentry",
                ok: false,
                detail: "refused\n\x1b]0;pwn\x07".into(),
            }],
            gpu: Vec::new(),
            strategy: "tracepoints\u{9b}".into(),
            driver_hooks: Strategy {
                reasons: vec!["kprobe: \u{202e}no".into()],
                ..Default::default()
            },
            questions: Vec::new(),
            kernel_layout: Vec::new(),
        };
        let text = render(&report);
        assert!(
            !text.contains(['\x1b', '\x07', '\u{9b}', '\u{202e}']),
            "{text:?}"
        );
        assert_eq!(
            text,
            "kernel          6.1\\x1b[2J\n\
             fentry          no   refused\\x0a\\x1b]0;pwn\\x07\n\
             strategy        tracepoints\\u{9b}\n\
             \x20               - kprobe: \\u{202e}no\n"
        );
    }
}
