//! deploy/kubernetes/examples/gpu-pod-gated.yaml: valid against the Kubernetes schema
//! (kubernetes-validate, as deploy_files.rs checks the DaemonSet), and its init container's
//! command runs as written against the linger under test, reading the GPUs from the
//! environment the device plugin gives it.

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use linger_tests::{linger, require_root, stand_in_device, FdScenario, TempDir};

const SCENARIO: &str = env!("CARGO_BIN_EXE_linger-fd-scenario");

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes/examples/gpu-pod-gated.yaml")
}

/// A part of the pod's spec, by a Python expression on `pod`.
fn spec_part(expression: &str) -> serde_json::Value {
    let out = Command::new("python3")
        .args([
            "-c",
            &format!(
                "import json, sys, yaml; pod = yaml.safe_load(open(sys.argv[1])); \
                 print(json.dumps({expression}))"
            ),
        ])
        .arg(manifest())
        .output()
        .expect("python3 with PyYAML (kubernetes-validate's dependency)");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("the part as JSON")
}

/// The init container's arguments (its image's entry point is linger).
fn gate_args() -> Vec<String> {
    serde_json::from_value(spec_part("pod['spec']['initContainers'][0]['args']")).expect("the args")
}

/// The previous pod's holders live in other pid namespaces: the gate runs in the host's,
/// where this test runs it too (tests/tests/wait_gate.rs shows it refusing from its own).
#[test]
fn the_gated_pod_sees_the_hosts_processes() {
    assert_eq!(spec_part("pod['spec'].get('hostPID')"), true);
}

/// The init container's command with `--timeout` and `--state-dir` given other values, and
/// `extra` options after it, under `env`.
fn run_gate(replace: &[(&str, &str)], extra: &[&str], env: (&str, &str)) -> Output {
    let mut args = gate_args();
    for (option, value) in replace {
        let at = args
            .iter()
            .position(|a| a == option)
            .unwrap_or_else(|| panic!("the init container passes {option}: {args:?}"));
        args[at + 1] = value.to_string();
    }
    linger()
        .args(&args)
        .args(extra)
        .env_remove("SLURM_JOB_GPUS")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env(env.0, env.1)
        .output()
        .expect("running the init container's command")
}

#[test]
fn the_gated_pod_matches_the_kubernetes_schema() {
    let out = Command::new("python3")
        .args([
            "-m",
            "kubernetes_validate",
            "--strict",
            "--quiet",
            "--no-warn",
        ])
        .arg(manifest())
        .output()
        .expect("kubernetes-validate (pip install kubernetes-validate; cargo xtask test does)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && !text.contains("ERROR"), "{text}");
}

#[test]
fn the_init_containers_gate_reads_its_gpus_from_the_device_plugins_variable() {
    require_root();
    let state = TempDir::new("gate-manifest-state");
    let state_dir = state.path().to_str().expect("UTF-8 path");
    // A GPU this machine does not have: said, and the gate cannot tell (3), not clean.
    let uuid = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6";
    let out = run_gate(
        &[("--timeout", "0s"), ("--state-dir", state_dir)],
        &[],
        ("NVIDIA_VISIBLE_DEVICES", uuid),
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(uuid),
        "{out:?}"
    );
    // The GPU stood in for by a device another process holds: not clean (1), named.
    let dir = TempDir::new("gate-manifest");
    let device = stand_in_device(dir.path());
    let holder = FdScenario::start(SCENARIO, &device, "held-before");
    let device = device.to_str().expect("UTF-8 path");
    let out = run_gate(
        &[("--timeout", "0s"), ("--state-dir", state_dir)],
        &["--gpu-device", device, "--json"],
        ("NVIDIA_VISIBLE_DEVICES", uuid),
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON answer");
    assert_eq!(answer["verdict"], "gpu_busy", "{answer:#}");
    assert_eq!(answer["holders"][0]["pid"], holder.pids[0], "{answer:#}");
    assert_eq!(answer["scope"]["gpus_from"], "NVIDIA_VISIBLE_DEVICES");
}
