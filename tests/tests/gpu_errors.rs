//! GPU errors from the kernel log, for real: linger reads the driver's Xid lines from /dev/kmsg
//! wherever it opens (with or without the driver's Xid tracepoint, which names no process); the
//! test writes such lines there (as root), naming a real process that holds a stand-in GPU file
//! and is then SIGKILLed, and one that survives. No tracepoint fires for a written line, so each
//! is reported from the log on any machine.

use std::{
    io::Write,
    process::{Child, Command},
    thread,
    time::Duration,
};

use linger_tests::{doctor::Doctor, linger, require_root, text, Live, TempDir};
use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

/// A process holding /dev/full (the stand-in GPU file) on fd 3.
fn holder() -> Child {
    Command::new("sh")
        .args(["-c", "exec 3<>/dev/full; exec sleep 60"])
        .spawn()
        .expect("start the holder")
}

fn log_xid(line: &str) {
    let mut kmsg = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .expect("open /dev/kmsg");
    // The newline ends the record: without it the kernel keeps it open for more text, and
    // readers do not see it yet.
    kmsg.write_all(format!("{line}\n").as_bytes())
        .expect("write /dev/kmsg");
}

#[test]
fn an_xid_in_the_kernel_log_goes_to_the_incident_of_the_process_it_names() {
    require_root();
    let doctor = Doctor::run();
    assert!(
        doctor.has("kmsg"),
        "the test writes the kernel log: {:#}",
        doctor.0
    );
    let dir = TempDir::new("xid");
    let trace = dir.join("run.trace");
    let live = Live::start([
        "--json",
        "--no-nvml",
        "--gpu-device",
        "/dev/full",
        "--duration",
        "9s",
        "--record",
        trace.to_str().expect("UTF-8"),
    ]);
    let mut gpu = holder();
    let mut bystander = Command::new("sleep").arg("60").spawn().expect("sleep");
    thread::sleep(Duration::from_millis(300));
    log_xid(&format!(
        "NVRM: Xid (PCI:0000:3b:00): 31, pid={}, name=sh, channel 0x0000000a, intr 00000000. \
         MMU Fault: ENGINE GRAPHICS GPC1 faulted @ 0x0_00000000",
        gpu.id()
    ));
    log_xid(&format!(
        "NVRM: Xid (PCI:0000:3b:00): 13, pid={}, name=sleep, Graphics Exception: ESR 0x1",
        bystander.id()
    ));
    thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(Pid::from_raw(gpu.id() as i32), Signal::SIGKILL).expect("kill");
    gpu.wait().expect("reap the holder");
    let out = live.finish();
    let _ = bystander.kill();
    let _ = bystander.wait();

    let inc = out.incident_of(gpu.id());
    let errors = inc["gpu_errors"].as_array().expect("gpu_errors");
    assert_eq!(errors.len(), 1, "only the Xid naming it: {inc}");
    let x = &errors[0];
    assert_eq!(
        (x["xid"].as_u64(), x["pid"].as_u64()),
        (Some(31), Some(u64::from(gpu.id())))
    );
    assert_eq!(text(x, "/source"), "kmsg");
    assert_eq!(text(x, "/meaning"), "MMU fault");
    let at = x["at_ms"].as_f64().expect("at_ms");
    assert!(
        at < 0.0 && at > -2000.0,
        "logged about 300 ms before the kill: {x}"
    );
    let evidence = text(inc, "/verdict/evidence/0");
    assert!(
        evidence.starts_with("Xid 31 (MMU fault) on PCI 0000:3b:00 at -")
            && evidence.contains("then the process died of SIGKILL"),
        "{evidence}"
    );
    // The one naming a process that lives on is a record of its own, after its wait.
    let own: Vec<&Value> = out.of_type("gpu_error");
    assert_eq!(own.len(), 1, "{:#?}", out.records);
    assert_eq!(own[0]["xid"], 13);
    assert_eq!(own[0]["pid"], bystander.id(), "{own:#?}");
    assert!(own[0]["node"]["host"].is_string() && own[0]["wall_time"].is_string());

    // The recording replays to the same records.
    let replay = linger()
        .args(["replay", "--json"])
        .arg(&trace)
        .output()
        .expect("linger replay");
    assert!(replay.status.success(), "{replay:?}");
    let replayed: Vec<Value> = String::from_utf8_lossy(&replay.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let of = |records: &[Value], kind: &str| -> Vec<Value> {
        records
            .iter()
            .filter(|r| r["type"] == kind)
            .map(|r| {
                let mut r = r.clone();
                r["node"].take();
                r
            })
            .collect()
    };
    assert_eq!(of(&replayed, "gpu_error"), of(&out.records, "gpu_error"));
    let live_errors: Vec<Value> = of(&out.records, "incident")
        .iter()
        .map(|r| r["gpu_errors"].clone())
        .collect();
    let replay_errors: Vec<Value> = of(&replayed, "incident")
        .iter()
        .map(|r| r["gpu_errors"].clone())
        .collect();
    assert_eq!(replay_errors, live_errors);

    // The recording says where its Xids came from, as the doctor found it here.
    let events = linger()
        .args(["replay", "--events"])
        .arg(&trace)
        .output()
        .expect("linger replay --events");
    assert!(events.status.success(), "{events:?}");
    let strategy: Value = String::from_utf8_lossy(&events.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON"))
        .find(|v| v["event"]["data"]["kind"] == "strategy")
        .map(|v| v["event"]["data"].clone())
        .expect("the strategy record");
    assert_eq!(
        strategy["xid_tracepoint"],
        doctor.has("xid_tracepoint"),
        "{strategy:#}"
    );
}
