//! `linger replay` gives the report `linger live` gave for the same events; traces are private
//! and can leave command-line arguments out.

mod trace_support;

use std::{io::BufReader, os::unix::fs::PermissionsExt, process::Stdio};

use linger_tests::{linger, linger_bin, Target, TempDir};
use nix::sys::signal::Signal;
use trace_support::{incident_pids, record, run, wait_for_line};

fn replays_identically(extra: &[&str]) {
    let rec = record(&format!("replay{}", extra.join("")), extra);
    let reported = incident_pids(&rec.live_json);
    for pid in &rec.killed {
        assert!(
            reported.contains(pid),
            "live missed the kill of {pid}: {}\n{}",
            rec.live_json,
            rec.live_stderr
        );
    }
    let out = run(&["replay", "--json"], &rec.trace);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "replay failed: {stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), rec.live_json);
    assert!(
        stderr.is_empty(),
        "a clean trace replays without warnings: {stderr}"
    );

    let text = run(&["replay"], &rec.trace);
    let text = String::from_utf8_lossy(&text.stdout);
    for pid in &rec.killed {
        assert!(text.contains(&format!("-> linger[{pid}]")), "{text}");
    }
    let mode = std::fs::metadata(&rec.trace)
        .expect("trace")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn replay_json_is_live_json() {
    replays_identically(&[]);
}

#[test]
fn replay_json_is_live_json_uncompressed() {
    replays_identically(&["--uncompressed"]);
}

/// The process snapshot holds the arguments of processes alive at the start, unless redacted.
#[test]
fn redact_cmdline_drops_arguments() {
    let dir = TempDir::new("redact");
    let mut bystander = Target::start(3, "default");
    let marker = "--threads";
    for redact in [false, true] {
        let file = dir.join(format!("redact-{redact}.lgr"));
        let mut cmd = linger();
        cmd.args(["record", "--duration", "300ms", "--uncompressed", "-o"])
            .arg(&file);
        if redact {
            cmd.arg("--redact-cmdline");
        }
        let mut child = cmd.stderr(Stdio::piped()).spawn().expect("linger record");
        let said = wait_for_line(
            &mut BufReader::new(child.stderr.take().expect("piped")),
            "wrote",
        );
        assert!(child.wait().expect("linger record").success(), "{said}");
        let bytes = std::fs::read(&file).expect("the trace");
        let found = bytes.windows(marker.len()).any(|w| w == marker.as_bytes());
        assert_eq!(found, !redact, "redact={redact}");
        let program = linger_bin().to_string_lossy().into_owned();
        assert!(bytes
            .windows(program.len())
            .any(|w| w == program.as_bytes()));
    }
    bystander.child.signal(Signal::SIGKILL);
    bystander.child.wait();
}
