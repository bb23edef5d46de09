//! `linger export`: a recorded kill as Perfetto / Chrome JSON and as a flamegraph.

mod trace_support;

use serde_json::Value;
use trace_support::{record, run};

#[test]
fn a_recorded_kill_exports_to_valid_perfetto_json() {
    let rec = record("export", &[]);
    let out = run(&["export", "--format", "perfetto"], &rec.trace);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let events = doc["traceEvents"].as_array().expect("a traceEvents array");
    let on = |pid: u32| move |e: &&Value| e["pid"].as_u64() == Some(u64::from(pid));
    for &pid in &rec.killed {
        let mine: Vec<&Value> = events.iter().filter(on(pid)).collect();
        let has = |ph: &str, cat: &str, name: &str| {
            mine.iter()
                .any(|e| e["ph"] == ph && e["cat"] == cat && (name.is_empty() || e["name"] == name))
        };
        assert!(has("X", "incident", ""), "no incident slice for {pid}");
        assert!(has("X", "phase", "exiting"), "no exiting phase for {pid}");
        assert!(has("i", "event", "SIGKILL"), "no SIGKILL instant for {pid}");
        assert!(has("i", "event", "exit"), "no thread exit for {pid}");
        assert!(has("M", "__metadata", "process_name"), "unnamed {pid}");
        let slice = mine
            .iter()
            .find(|e| e["cat"] == "incident")
            .expect("checked above");
        assert!(slice["dur"].as_f64().is_some_and(|d| d > 0.0));
        assert_eq!(slice["args"]["target"]["pid"], u64::from(pid));
    }
    // Chrome's flavour is the same document.
    let chrome = run(&["export", "--format", "chrome"], &rec.trace);
    assert_eq!(chrome.stdout, out.stdout);
}

#[test]
fn a_recorded_kill_exports_to_a_flamegraph() {
    let rec = record("flame", &[]);
    let folded = run(&["export", "--format", "folded"], &rec.trace);
    assert!(folded.status.success());
    let folded = String::from_utf8_lossy(&folded.stdout);
    let line = folded
        .lines()
        .find(|l| l.starts_with("linger;SIGKILL;exiting "))
        .unwrap_or_else(|| panic!("no exiting phase of the killed targets: {folded}"));
    let ns: u64 = line
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a weight");
    assert!(ns > 0);
    let svg = run(&["export", "--format", "svg"], &rec.trace);
    assert!(svg.status.success());
    let svg = String::from_utf8_lossy(&svg.stdout);
    assert!(svg.contains("<svg") && svg.contains("exiting"), "{svg}");
    // No incident of the pid asked for: nothing to draw, an error, and no file left behind.
    let out = rec.trace.with_extension("svg");
    let none = run(
        &[
            "export",
            "--format",
            "svg",
            "--pid",
            "4000000",
            "-o",
            out.to_str().expect("UTF-8"),
        ],
        &rec.trace,
    );
    assert_eq!(none.status.code(), Some(1), "{none:?}");
    assert!(!out.exists(), "a failed export left {}", out.display());
}
