//! The alert rules shipped in deploy/prometheus, checked and unit-tested by Debian's promtool.

use std::{path::PathBuf, process::Command};

fn rules_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(rules_dir())
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
    assert!(out.contains("SUCCESS: 5 rules found"), "{out}");
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
