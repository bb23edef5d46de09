//! The deployment files: Kubernetes manifests validated against the API schema offline
//! (kubernetes-validate, from PyPI, with its bundled schemas), and every Grafana panel's query
//! parsed by promtool, and the systemd unit checked by `systemd-analyze verify`.

use std::{path::PathBuf, process::Command};

use linger_tests::{linger_bin, TempDir};

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

#[test]
fn the_daemonset_and_its_companions_match_the_kubernetes_schema() {
    let out = Command::new("python3")
        .args([
            "-m",
            "kubernetes_validate",
            "--strict",
            "--quiet",
            "--no-warn",
        ])
        .arg(deploy().join("kubernetes/daemonset.yaml"))
        .output()
        .expect("kubernetes-validate (pip install kubernetes-validate; cargo xtask test does)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("ERROR"), "{text}");
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
}
