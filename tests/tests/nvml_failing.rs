//! NVML that loads but whose every reading fails, end to end: a `libnvidia-ml.so.1` built
//! here (it initialises, sees one GPU, and answers every memory query with an error; the
//! functions it lacks fail to load, as on a broken install) is put first on the library path
//! of the real agent and gate. Fault injection, not a mock of a success path: nothing it says
//! can make a reading. The agent says NVML is down on /metrics and never calls memory back from
//! it: a killed process whose forked child keeps its files (a stand-in GPU device) is not back
//! until the child dies, and then by the kernel's account. The gate, with nothing but NVML
//! keeping it closed, cannot tell (exit 3).

use std::{fs, path::Path, process::Command, time::Duration};

use linger_tests::{
    agent::{eventually, free_port, get, start},
    linger, require_root, stand_in_device, FdScenario, TempDir,
};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::Value;

const SCENARIO: &str = env!("CARGO_BIN_EXE_linger-fd-scenario");

const FAULTY_NVML: &str = r#"
/* Initialises, sees one GPU, fails every reading. */
typedef int nvmlReturn_t;
#define FAULT 999 /* NVML_ERROR_UNKNOWN */
nvmlReturn_t nvmlInit_v2(void) { return 0; }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return 0; }
nvmlReturn_t nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(nvmlReturn_t r) { (void)r; return "fault injected"; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { *count = 1; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **device) {
    (void)i; *device = (void *)0x1; return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(void *d, void *m) { (void)d; (void)m; return FAULT; }
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *d, void *m) { (void)d; (void)m; return FAULT; }
"#;

/// Builds the faulty library into `dir` (as libnvidia-ml.so.1) with the C compiler.
fn faulty_nvml(dir: &Path) {
    let source = dir.join("nvml.c");
    fs::write(&source, FAULTY_NVML).expect("writing the library's source");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libnvidia-ml.so.1"))
        .arg(&source)
        .output()
        .expect("cc (a C compiler is a prerequisite, README)");
    assert!(out.status.success(), "{out:?}");
}

fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(f64::max)
}

#[test]
fn an_nvml_that_fails_every_reading_is_down_and_never_calls_memory_back() {
    require_root();
    let dir = TempDir::private("nvml-failing");
    faulty_nvml(dir.path());
    let device = stand_in_device(dir.path());
    let state = dir.join("state");
    fs::create_dir(&state).expect("state dir");
    let port = free_port();
    let mut cmd = linger();
    cmd.arg("agent")
        .arg("--gpu-device")
        .arg(&device)
        .args(["--linger-after", "2s", "--metrics-listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--state-dir")
        .arg(&state)
        .env("LD_LIBRARY_PATH", dir.path());
    let agent = start(cmd);
    let body = eventually("NVML said down", Duration::from_secs(20), || {
        let (_, body) = get(port, "/metrics").ok()?;
        (metric(&body, "linger_nvml_errors_total")? > 0.0).then_some(body)
    });
    assert_eq!(metric(&body, "linger_nvml_up{"), Some(0.0), "{body}");

    let holder = FdScenario::start(SCENARIO, &device, "fork-holder");
    let (parent, child) = (holder.pids[0], holder.pids[1]);
    kill(Pid::from_raw(parent as i32), Signal::SIGKILL).expect("kill");
    let log = state.join("incidents.jsonl");
    let records = |pid: u32| -> Vec<Value> {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["target"]["pid"] == pid)
            .collect()
    };
    let held = eventually("the parent's incident", Duration::from_secs(20), || {
        records(parent).into_iter().next()
    });
    assert_eq!(held["verdict"]["kind"], "shared_fd", "{held}");
    assert!(held["gpu"]["t_memory_back_ns"].is_null(), "{held}");
    kill(Pid::from_raw(child as i32), Signal::SIGKILL).expect("kill");
    let back = eventually("the parent's memory back", Duration::from_secs(20), || {
        records(parent).into_iter().find(|r| r["settled"] == true)
    });
    assert_eq!(back["gpu"]["memory_back_by"], "kernel", "{back}");
    drop(agent);

    let gate = linger()
        .args(["wait", "--any-process", "--timeout", "1s", "--gpu-device"])
        .arg(&device)
        .arg("--state-dir")
        .arg(&state)
        .env("LD_LIBRARY_PATH", dir.path())
        .output()
        .expect("linger wait");
    let said = String::from_utf8_lossy(&gate.stderr);
    assert_eq!(gate.status.code(), Some(3), "{said}");
    assert!(said.contains("NVML failed to read"), "{said}");
}
