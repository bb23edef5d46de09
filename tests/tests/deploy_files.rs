//! The deployment files: every Kubernetes kustomization (the base, the Prometheus Operator's
//! objects, each overlay) built by Debian's kubectl (and by the kubectl on PATH, where there is
//! one) and every object it gives validated against the API schema offline (kubernetes-validate,
//! from PyPI, with its bundled schemas); every Grafana panel's query parsed by promtool; the
//! systemd unit checked by `systemd-analyze verify`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use linger_tests::{linger_bin, TempDir};

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

const KUSTOMIZATIONS: [&str; 5] = [
    "base",
    "monitoring",
    "overlays/privileged",
    "overlays/gpu-operator",
    "overlays/gke",
];

/// The Prometheus Operator's kinds: kubernetes-validate has no schema for them.
const OPERATOR_KINDS: [&str; 2] = ["ServiceMonitor", "PrometheusRule"];

/// Debian's kubectl (cargo xtask test unpacks it), and the one on PATH where there is one.
fn kubectls() -> Vec<PathBuf> {
    let debian = std::env::var_os("LINGER_DEBIAN_KUBECTL")
        .map(PathBuf::from)
        .expect("LINGER_DEBIAN_KUBECTL: Debian's kubectl (cargo xtask test fetches it)");
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("kubectl"))
            .find(|k| k.is_file())
    });
    std::iter::once(debian).chain(on_path).collect()
}

fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn build(kubectl: &Path, kustomization: &str) -> String {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(deploy().join("kubernetes").join(kustomization))
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{} kustomize {kustomization}: {}",
        kubectl.display(),
        output_text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kubernetes-validate --strict on `objects`: nothing but the operator's kinds unknown.
fn validate(objects: &str, what: &str) {
    let dir = TempDir::new("kubernetes-validate");
    let file = dir.join("objects.yaml");
    std::fs::write(&file, objects).expect("objects file");
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict", "--quiet"])
        .arg(&file)
        .output()
        .expect("kubernetes-validate (pip install kubernetes-validate; cargo xtask test does)");
    let text = output_text(&out);
    assert!(out.status.success(), "{what}: {text}");
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            OPERATOR_KINDS
                .iter()
                .any(|k| line.contains(&format!("Couldn't find schema for kind {k} "))),
            "{what}: {line}"
        );
    }
}

#[test]
fn every_kustomization_builds_and_every_object_matches_the_kubernetes_schema() {
    let kubectls = kubectls();
    for k in KUSTOMIZATIONS {
        for kubectl in &kubectls {
            let objects = build(kubectl, k);
            assert!(objects.contains("kind: "), "{k}: {objects}");
            validate(&objects, &format!("{k} by {}", kubectl.display()));
        }
    }
}

#[test]
fn the_manifests_hold_what_docs_kubernetes_md_says() {
    let kubectl = &kubectls()[0];
    let base = build(kubectl, "base");
    for needed in [
        "fieldPath: spec.nodeName",
        "value: compute,utility",
        "readinessProbe:",
        "maxUnavailable: 0",
        "SYS_ADMIN",
    ] {
        assert!(base.contains(needed), "base lacks {needed}");
    }
    assert!(!base.contains("pod-resources"), "a mount nothing uses");
    let monitoring = build(kubectl, "monitoring");
    assert!(monitoring.contains("authorization:"));
    assert!(!monitoring.contains("bearerTokenFile"), "deprecated");
    assert!(build(kubectl, "overlays/privileged").contains("privileged: true"));
    assert!(build(kubectl, "overlays/gpu-operator").contains("path: /run/nvidia/driver"));
    let gke = build(kubectl, "overlays/gke");
    assert!(gke.contains("kind: ResourceQuota") && gke.contains("scopeName: PriorityClass"));
}

#[test]
fn every_dashboard_query_parses() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy().join("grafana/linger.json")).expect("dashboard"),
    )
    .expect("dashboard JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect();
    assert!(exprs.len() >= 8, "{exprs:?}");
    // promtool parses PromQL when it checks recording rules: one rule per query.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = e.replace("$node", ".*");
        rules.push_str(&format!(
            "      - record: dashboard:panel_{i}\n        expr: {}\n",
            serde_json::to_string(&e).expect("a JSON string is a YAML string")
        ));
    }
    let dir = TempDir::new("dashboard");
    let file = dir.join("rules.yaml");
    std::fs::write(&file, rules).expect("rules file");
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_systemd_unit_verifies() {
    let unit =
        std::fs::read_to_string(deploy().join("systemd/linger-agent.service")).expect("unit file");
    // Pointed at the linger built for the tests, since none is installed here.
    let bin = linger_bin();
    let bin = bin.to_str().expect("LINGER_BIN is UTF-8");
    let dir = TempDir::new("unit");
    let path = dir.join("linger-agent.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/linger", bin)).expect("unit copy");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && text.trim().is_empty(), "{text}");
    // The agent's own sources: the kernel log (Xids naming their process), the host's name.
    for hides in [
        "ProtectKernelLogs=yes",
        "ProtectHostname=yes",
        "PrivateDevices=yes",
    ] {
        assert!(!unit.contains(hides), "{hides}");
    }
}
