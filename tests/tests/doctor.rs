//! `linger doctor` tries each hook type for real. What a kernel allows differs (this build
//! machine refuses fentry and has no kprobes; Debian's stock kernels allow both): the report
//! must give a reason for each refusal and choose the strategy the answers allow.

use std::path::Path;

use linger_tests::{doctor::Doctor, list, require_root, text};
use serde_json::Value;

#[test]
fn doctor_reports_what_this_kernel_allows() {
    require_root();
    let doctor = Doctor::run();
    let report = &doctor.0;
    assert_eq!(text(report, "/type"), "doctor");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    assert!(
        text(report, "/kernel").starts_with(release.trim()),
        "{report:#}"
    );

    // linger's own programs need these two; the other tests depend on them working.
    for name in ["tracepoint", "tp_btf"] {
        assert!(doctor.allows(name), "{report:#}");
    }
    for h in list(report, "/hooks") {
        assert!(
            h["ok"] == true || !text(h, "/detail").is_empty(),
            "a refusal without a reason: {report:#}"
        );
    }
    // Without the kprobe PMU the kernel cannot have allowed a kprobe, and the reason is its
    // config, not a permission.
    if !Path::new("/sys/bus/event_source/devices/kprobe").exists() {
        let kprobe = doctor.hook("kprobe");
        assert_eq!(kprobe["ok"], false, "{report:#}");
        assert!(
            text(kprobe, "/detail").contains("CONFIG_KPROBES"),
            "{report:#}"
        );
    }
    // The release of GPU files is timed by the first hook type the kernel allowed, and only
    // where neither is allowed does the strategy fall back to stack sampling.
    let (fput, says) = if doctor.allows("fentry") {
        (
            Value::from("fentry"),
            "GPU file release timed exactly by fentry/fexit on __fput",
        )
    } else if doctor.allows("kprobe") {
        (
            Value::from("kprobe"),
            "GPU file release timed exactly by kprobe/kretprobe on __fput",
        )
    } else {
        (
            Value::Null,
            "driver teardown seen through stack sampling only",
        )
    };
    assert_eq!(report["driver_hooks"]["fput"], fput, "{report:#}");
    assert!(doctor.strategy().contains(says), "{report:#}");
    // The NVIDIA driver's own functions are hooked only by kprobes.
    if !doctor.allows("kprobe") {
        assert!(
            list(report, "/driver_hooks/driver_functions").is_empty(),
            "{report:#}"
        );
        assert!(
            list(report, "/driver_hooks/reasons")
                .iter()
                .any(|r| r == "NVIDIA driver functions: not hooked, kprobes are unavailable"),
            "{report:#}"
        );
    }
}

/// The kernel log's check: where /dev/kmsg opens (here) and where it does not (a mount
/// namespace whose /dev lacks it, as a container's /dev may), with what that costs.
#[test]
fn doctor_says_whether_the_kernel_log_names_gpu_errors_processes() {
    require_root();
    let kmsg = |report: &Value| -> Value {
        list(report, "/gpu")
            .iter()
            .find(|c| c["name"] == "kmsg")
            .cloned()
            .unwrap_or_else(|| panic!("no kmsg check in {report:#}"))
    };
    let run = |cmd: &mut std::process::Command| -> Value {
        let out = cmd.output().expect("running linger doctor");
        assert!(out.status.success(), "doctor failed: {out:?}");
        serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON")
    };
    let here = Doctor::run().gpu("kmsg").clone();
    assert_eq!(here["ok"], true, "{here}");
    let without = kmsg(&run(std::process::Command::new("unshare")
        .args(["--mount", "--", "sh", "-c"])
        .arg("mount -t tmpfs tmpfs /dev && exec \"$0\" doctor --json")
        .arg(linger_tests::linger_bin())));
    assert_eq!(without["ok"], false, "{without}");
    let detail = text(&without, "/detail");
    assert!(
        detail.contains("not the kernel log (/dev/kmsg: No such file or directory"),
        "{detail}"
    );
}
