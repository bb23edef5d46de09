//! `linger doctor` tries each hook type for real. This machine's kernel allows tracepoints and
//! tp_btf but refuses fentry and kprobes; the report must say so and why.

use std::path::Path;

use linger_tests::{linger, list, require_root, text};
use serde_json::Value;

fn hook<'a>(report: &'a Value, name: &str) -> &'a Value {
    list(report, "/hooks")
        .iter()
        .find(|h| h["name"] == name)
        .unwrap_or_else(|| panic!("no {name} hook in {report:#}"))
}

#[test]
fn doctor_reports_what_this_kernel_allows() {
    require_root();
    let out = linger()
        .args(["doctor", "--json"])
        .output()
        .expect("running linger doctor");
    assert!(out.status.success(), "doctor failed: {out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON");
    assert_eq!(text(&report, "/type"), "doctor");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    assert!(
        text(&report, "/kernel").starts_with(release.trim()),
        "{report:#}"
    );

    // linger's own programs need these two; the other tests depend on them working.
    for name in ["tracepoint", "tp_btf"] {
        assert_eq!(hook(&report, name)["ok"], true, "{report:#}");
    }
    for name in ["fentry", "kprobe"] {
        let h = hook(&report, name);
        assert_eq!(h["ok"], false, "{name} works on this kernel? {report:#}");
        assert!(
            !text(h, "/detail").is_empty(),
            "{name} without a reason: {report:#}"
        );
    }
    // Without the kprobe PMU the reason is the kernel config, not a permission.
    if !Path::new("/sys/bus/event_source/devices/kprobe").exists() {
        assert!(
            text(hook(&report, "kprobe"), "/detail").contains("CONFIG_KPROBES"),
            "{report:#}"
        );
    }
    // With neither driver hook, the strategy falls back to stack sampling.
    assert!(
        text(&report, "/strategy").contains("stack sampling"),
        "{report:#}"
    );
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
    let here = kmsg(&run(linger().args(["doctor", "--json"])));
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
