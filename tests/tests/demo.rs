//! `linger demo` kills its own child and reports it: a smoke test of the whole pipeline through
//! the command users try first.

use linger_tests::{exit_tids, linger, num, require_root, text, Guarded, Lines};

#[test]
fn demo_reports_its_child() {
    require_root();
    let mut demo = Guarded(
        linger()
            .args(["demo", "--json", "--threads", "3"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starting linger demo"),
    );
    let mut stdout = Lines::read(demo.0.stdout.take().expect("piped stdout"));
    let mut stderr = Lines::read(demo.0.stderr.take().expect("piped stderr"));
    let status = demo.wait();
    let lines = stdout.all();
    let stderr = stderr.all().join("\n");
    assert!(status.success(), "demo failed: {status:?}\n{stderr}");
    let [line] = lines.as_slice() else {
        panic!("expected one incident line, got {lines:?}");
    };
    let inc: serde_json::Value = serde_json::from_str(line).expect("incident JSON");

    // The demo names its child on stderr: "started child PID with N threads".
    let child: u64 = stderr
        .split("started child ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("demo did not name its child: {stderr}"));
    assert_eq!(num(&inc, "/target/pid"), child, "{inc:#}");
    assert_eq!(num(&inc, "/target/threads"), 3, "{inc:#}");
    assert_eq!(exit_tids(&inc).len(), 3, "{inc:#}");
    assert_eq!(num(&inc, "/signal"), 9, "{inc:#}");
    assert_eq!(num(&inc, "/exit/signal"), 9, "{inc:#}");
    assert_eq!(text(&inc, "/outcome"), "exited");
    // The demo process itself sent the kill and reaped the child.
    assert_eq!(num(&inc, "/sender/pid"), u64::from(demo.pid()), "{inc:#}");
    assert_eq!(num(&inc, "/reaper/pid"), u64::from(demo.pid()), "{inc:#}");
}
