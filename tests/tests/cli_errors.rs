//! Mistakes on the command line and a missing root give exit code 2 and a message that names
//! the problem, before anything is loaded.

use std::{
    os::unix::process::CommandExt,
    process::{Command, Output},
};

use linger_tests::{doctor::Doctor, linger, require_root, TempDir};

fn assert_refused(out: &Output, mentions: &[&str], what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: {out:?}");
    assert!(out.stdout.is_empty(), "{what}: printed on stdout: {out:?}");
    for m in mentions {
        assert!(
            stderr.contains(m),
            "{what}: stderr does not mention {m:?}:\n{stderr}"
        );
    }
}

#[test]
fn bad_flags_name_the_problem() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["live", "--duration", "banana"],
            &["--duration", "banana", "not a duration"],
        ),
        (
            &["live", "--ring-size", "1000"],
            &["--ring-size", "power of two"],
        ),
        (
            &["live", "--signal", "SIGNOPE"],
            &["--signal", "SIGNOPE", "not a signal"],
        ),
        (&["live", "--count", "-3"], &["-3"]),
        (&["live", "--frobnicate"], &["--frobnicate"]),
        (&["frobnicate"], &["frobnicate"]),
        (
            &["record", "-o", "/nonexistent/x.trace", "--json"],
            &["linger live --json", "--record FILE"],
        ),
        (
            &["record", "-o", "/nonexistent/x.trace", "--events"],
            &["linger live --json", "--record FILE"],
        ),
    ];
    for (args, mentions) in cases {
        let out = linger().args(*args).output().expect("running linger");
        assert_refused(&out, mentions, &args.join(" "));
    }
}

/// Runs linger as `nobody` (uid and gid 65534, no supplementary groups).
fn as_nobody(args: &[&str]) -> Output {
    let mut cmd: Command = linger();
    cmd.args(args).uid(65534).gid(65534);
    cmd.output().expect("running linger as nobody")
}

#[test]
fn missing_root_is_named() {
    // Dropping to nobody needs root in the first place.
    require_root();
    for args in [
        &["live", "--duration", "1s"][..],
        &["doctor"],
        &["demo"],
        &["agent", "--duration", "1s"],
        &["wait", "--timeout", "1s"],
    ] {
        assert_refused(&as_nobody(args), &["root"], &args.join(" "));
    }
}

/// Told nothing to wait for, `wait` asks NVML about every GPU: where the doctor finds NVML it
/// answers (0 clean, 1 timed out); elsewhere it cannot tell, with its own exit code.
#[test]
fn wait_without_a_target_answers_only_where_nvml_runs() {
    require_root();
    let nvml = Doctor::run().has("nvml");
    let out = linger()
        .args(["wait", "--timeout", "1s"])
        .output()
        .expect("running linger");
    if nvml {
        assert!(matches!(out.status.code(), Some(0 | 1)), "{out:?}");
        return;
    }
    // 0 clean, 1 timed out, 2 permission: anything else that stops it is 3.
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NVML"),
        "{out:?}"
    );
}

#[test]
fn a_config_file_error_names_the_key_before_anything_is_loaded() {
    let dir = TempDir::new("cfg");
    let file = dir.join("bad.toml");
    std::fs::write(&file, "metrics_port = 9477\n").expect("config");
    let out = linger()
        .args(["agent", "--config"])
        .arg(&file)
        .output()
        .expect("running linger");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("metrics_port"),
        "{out:?}"
    );
}

#[test]
fn a_bad_web_config_stops_the_agent_at_start_with_its_reason() {
    let dir = TempDir::new("web-config");
    let file = dir.join("web.yml");
    std::fs::write(
        &file,
        "tls_server_config:\n  cert_file: none.pem\n  key_file: k.pem\n",
    )
    .expect("web config");
    let out = linger()
        .args([
            "agent",
            "--metrics-listen",
            "127.0.0.1:0",
            "--web-config-file",
        ])
        .arg(&file)
        .output()
        .expect("running linger");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let missing = dir.join("none.pem");
    assert!(
        stderr.contains(&format!("cert_file {}", missing.display()))
            && stderr.matches("No such file").count() == 1,
        "the file and its cause, once: {stderr}"
    );
    assert!(!stderr.contains("tracing"), "{stderr}");
}

/// A trace that is not there: the path and the OS's reason, once.
#[test]
fn replay_of_a_missing_file_says_why_once() {
    let out = linger()
        .args(["replay", "/nonexistent/none.trace"])
        .output()
        .expect("running linger");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/nonexistent/none.trace") && stderr.matches("No such file").count() == 1,
        "{stderr}"
    );
}
