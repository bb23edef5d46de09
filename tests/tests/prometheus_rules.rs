//! The alert rules shipped in deploy/prometheus, checked and unit-tested by Debian's promtool;
//! their PrometheusRule twin, their runbooks, their threshold parameter and the PromQL joins
//! docs/agent.md shows.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use linger_tests::TempDir;

fn rules_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path),
    )
    .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn promtool(args: &[&str]) -> String {
    promtool_in(&rules_dir(), args)
}

fn promtool_in(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool from Debian's prometheus package (cargo xtask test installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_rules_are_valid() {
    let out = promtool(&["check", "rules", "linger-rules.yaml"]);
    assert!(out.contains("SUCCESS: 9 rules found"), "{out}");
}

#[test]
fn every_alert_fires_and_clears_as_its_unit_tests_say() {
    let out = promtool(&["test", "rules", "linger-rules.test.yaml"]);
    assert!(out.contains("SUCCESS"), "{out}");
    // Every alert of the rules file has a test.
    let rules = std::fs::read_to_string(rules_dir().join("linger-rules.yaml")).expect("rules");
    let tests = std::fs::read_to_string(rules_dir().join("linger-rules.test.yaml")).expect("tests");
    for alert in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        assert!(
            tests.contains(&format!("alertname: {alert}")),
            "{alert} has no unit test"
        );
    }
}

fn alerts(rules: &str) -> Vec<&str> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect()
}

/// GitHub's anchor for a Markdown heading: lower case, spaces to dashes, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_has_a_runbook_in_the_docs() {
    let rules = repo_file("deploy/prometheus/linger-rules.yaml");
    let runbooks = repo_file("docs/runbooks.md");
    let anchors: Vec<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(anchor)
        .collect();
    const BASE: &str = "https://github.com/linger/linger/blob/main/docs/runbooks.md#";
    let urls: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: "))
        .collect();
    let alerts = alerts(&rules);
    assert_eq!(urls.len(), alerts.len(), "one runbook_url per alert");
    for (alert, url) in alerts.iter().zip(&urls) {
        let to = url.strip_prefix(BASE).unwrap_or_else(|| panic!("{url}"));
        assert_eq!(to, alert.to_lowercase(), "{alert}'s runbook");
        assert!(
            anchors.iter().any(|a| a == to),
            "docs/runbooks.md has no `## {alert}`"
        );
    }
}

#[test]
fn the_prometheus_rule_object_holds_the_same_groups() {
    let rules = repo_file("deploy/prometheus/linger-rules.yaml");
    let object = repo_file("deploy/kubernetes/monitoring/prometheusrule.yaml");
    let groups = &rules[rules.find("\ngroups:").expect("groups") + 1..];
    let expected: String = groups
        .lines()
        .map(|l| {
            if l.is_empty() {
                "\n".into()
            } else {
                format!("  {l}\n")
            }
        })
        .collect();
    let spec = &object[object.find("\nspec:\n").expect("spec") + "\nspec:\n".len()..];
    assert!(
        spec == expected,
        "prometheusrule.yaml's spec is not linger-rules.yaml's groups: after `spec:` it should read\n{expected}"
    );
}

/// The unattributed alert's threshold, changed as its comment says: below it, no alert.
#[test]
fn the_unattributed_threshold_is_one_expression_to_change() {
    let rules = repo_file("deploy/prometheus/linger-rules.yaml");
    let default = "expr: vector(0)";
    assert_eq!(rules.matches(default).count(), 1, "one threshold");
    let dir = TempDir::new("rules-threshold");
    std::fs::write(
        dir.join("rules.yaml"),
        rules.replace(default, "expr: vector(268435456)"),
    )
    .expect("rules copy");
    std::fs::write(
        dir.join("test.yaml"),
        "rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'linger_gpu_memory_unattributed_bytes{gpu=\"0\",UUID=\"GPU-a\"}'
        values: '134217728x10'
      - series: 'linger_gpu_memory_unattributed_bytes{gpu=\"1\",UUID=\"GPU-b\"}'
        values: '536870912x10'
    promql_expr_test:
      - expr: ALERTS{alertname=\"LingerGpuMemoryUnattributed\",alertstate=\"firing\"}
        eval_time: 8m
        exp_samples:
          - labels: 'ALERTS{alertname=\"LingerGpuMemoryUnattributed\",alertstate=\"firing\",severity=\"critical\",gpu=\"1\",UUID=\"GPU-b\"}'
            value: 1
",
    )
    .expect("test file");
    let out = promtool_in(dir.path(), &["test", "rules", "test.yaml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The PromQL of docs/agent.md's joins with dcgm-exporter is what the rules' unit tests run.
#[test]
fn the_documented_joins_are_the_tested_ones() {
    let docs = repo_file("docs/agent.md");
    let tests = repo_file("deploy/prometheus/linger-rules.test.yaml");
    let tested: Vec<&str> = tests
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- expr: "))
        .collect();
    let documented: Vec<&str> = docs
        .split("```promql\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .map(str::trim)
        .collect();
    assert!(documented.len() >= 2, "docs/agent.md shows the joins");
    for expr in documented {
        assert!(
            tested.contains(&expr),
            "untested in linger-rules.test.yaml: {expr}"
        );
    }
}
