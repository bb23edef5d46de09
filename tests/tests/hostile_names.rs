//! A process that names itself with terminal escape sequences and bytes that are not UTF-8
//! (prctl, no privilege needed) holds a GPU file and is killed while `linger live` records:
//! no output, text or JSON, live or replayed or exported, carries those bytes raw.

use std::{
    ffi::OsStr,
    io::Read,
    os::unix::ffi::OsStrExt,
    path::Path,
    process::{Output, Stdio},
};

use linger_tests::{linger, require_root, stand_in_device, Guarded, Lines, TempDir, READY};
use nix::{
    fcntl::{open, OFlag},
    sys::{signal::Signal, stat::Mode},
};
use serde_json::Value;

/// Set the terminal title, then clear the screen; an invalid byte; a C1 CSI. 15 bytes, the
/// most a comm holds.
const HOSTILE: &[u8] = b"\x1b]0;pwn\x07\x1b[2J\xff\xc2\x9b";
/// The same name as linger shows it.
const SHOWN: &str = r"\x1b]0;pwn\x07\x1b[2J\xff\u{9b}";
/// The name as text in JSON: the controls are in the string (as JSON escapes in the
/// output), the invalid byte is the text `\xff`.
const AS_TEXT: &str = "\x1b]0;pwn\x07\x1b[2J\\xff\u{9b}";

/// Fails on any byte a terminal would obey: C0 controls but newline (and tab where a format
/// has them), DEL, C1 controls, or bytes that are not UTF-8.
fn assert_inert(what: &str, bytes: &[u8], tabs: bool) {
    let text = std::str::from_utf8(bytes).unwrap_or_else(|e| {
        panic!(
            "{what}: not UTF-8 ({e}): {:?}",
            String::from_utf8_lossy(bytes)
        )
    });
    let bad = text
        .chars()
        .find(|&c| c.is_control() && c != '\n' && !(tabs && matches!(c, '\t' | '\r')));
    assert_eq!(bad, None, "{what}: raw control character in {text:?}");
}

fn run(args: &[&OsStr]) -> Output {
    let out = linger().args(args).output().expect("running linger");
    assert!(
        out.status.success(),
        "linger {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout_text(what: &str, out: &Output) -> String {
    assert_inert(what, &out.stdout, false);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts `linger __target` named [`HOSTILE`], holding an open descriptor of `device`.
fn hostile_holder(device: &Path) -> (Guarded, u32) {
    // Not close-on-exec: the child inherits it, as a DataLoader worker inherits CUDA's files.
    let fd = open(device, OFlag::O_RDWR, Mode::empty()).expect("opening the stand-in device");
    let mut child = Guarded(
        linger()
            .args(["__target", "--threads", "2", "--name"])
            .arg(OsStr::from_bytes(HOSTILE))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting linger __target"),
    );
    drop(fd);
    let mut stdout = Lines::read(child.0.stdout.take().expect("piped stdout"));
    let pid = child.pid();
    assert_eq!(stdout.next_line(), Some(format!("ready {pid}")));
    let comm = std::fs::read(format!("/proc/{pid}/comm")).expect("its comm");
    assert_eq!(comm, [HOSTILE, b"\n"].concat(), "prctl renamed it");
    let held = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("its descriptors")
        .flatten()
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == device));
    assert!(held, "the target did not inherit {}", device.display());
    (child, pid)
}

#[test]
fn hostile_names_reach_no_output_raw() {
    require_root();
    let dir = TempDir::new("hostile");
    let device = stand_in_device(dir.path());
    let trace = dir.join("hostile.lgr");
    let (mut target, pid) = hostile_holder(&device);

    // holders: the table and its JSON.
    let gpu = [OsStr::new("--gpu-device"), device.as_os_str()];
    let holders = run(&[&[OsStr::new("holders")], &gpu[..]].concat());
    let table = stdout_text("holders", &holders);
    let row = table
        .lines()
        .find(|l| l.contains(&format!(" {pid} ")))
        .unwrap_or_else(|| panic!("no row for {pid}: {table}"));
    assert!(row.contains(SHOWN), "{row}");
    assert!(
        row.contains(&format!("--name {SHOWN}")),
        "the command line too: {row}"
    );
    let json = run(&[&[OsStr::new("holders"), OsStr::new("--json")], &gpu[..]].concat());
    assert_inert("holders --json", &json.stdout, false);
    let doc: Value = serde_json::from_slice(&json.stdout).expect("holders JSON");
    let mine = doc["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|h| h["pid"] == pid)
        .unwrap_or_else(|| panic!("no holder {pid}: {doc}"));
    assert_eq!(mine["comm"], AS_TEXT);

    // live, recording: the text report, as the operator's terminal would get it.
    let mut live = Guarded(
        linger()
            .args(["live", "--no-nvml", "--count", "1", "--duration", "20s"])
            .args(["--pid", &pid.to_string(), "--record"])
            .arg(&trace)
            .args(gpu)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting linger live"),
    );
    let mut stdout = live.0.stdout.take().expect("piped stdout");
    let mut stderr = Lines::read(live.0.stderr.take().expect("piped stderr"));
    while stderr.next_line().is_some_and(|l| l != READY) {}
    target.signal(Signal::SIGKILL);
    target.wait();
    let mut raw = Vec::new();
    stdout.read_to_end(&mut raw).expect("live's stdout");
    assert!(live.wait().success(), "linger live: {:?}", stderr.all());
    assert_inert("live", &raw, false);
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains(&format!("-> {SHOWN}[{pid}]")), "{text}");

    // replay, text and JSON.
    let replayed = run(&[OsStr::new("replay"), trace.as_os_str()]);
    assert_eq!(stdout_text("replay", &replayed), text, "replay is live");
    let replayed = run(&[
        OsStr::new("replay"),
        OsStr::new("--json"),
        trace.as_os_str(),
    ]);
    assert_inert("replay --json", &replayed.stdout, false);
    let incident: Value = String::from_utf8_lossy(&replayed.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .find(|v| v["type"] == "incident")
        .expect("the incident");
    assert_eq!(incident["target"]["comm"], AS_TEXT);

    // exports: folded stacks and SVG (XML), Perfetto (JSON).
    let export = |format: &str| {
        let out = run(&[
            OsStr::new("export"),
            trace.as_os_str(),
            OsStr::new("--format"),
            OsStr::new(format),
        ]);
        assert_inert(format, &out.stdout, true);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let folded = export("folded");
    let frame = SHOWN.replace(';', r"\x3b");
    assert!(
        folded
            .lines()
            .any(|l| l.starts_with(&format!("{frame};SIGKILL;"))),
        "{folded}"
    );
    let svg = export("svg");
    assert!(svg.contains(&format!("<title>{frame} (")), "{svg}");
    let perfetto: Value = serde_json::from_str(&export("perfetto")).expect("Perfetto JSON");
    let track = perfetto["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .find(|e| e["name"] == "process_name" && e["pid"] == pid)
        .unwrap_or_else(|| panic!("no track for {pid}"));
    assert_eq!(track["args"]["name"], SHOWN);
}

/// File names in shared directories are other users' choice too: messages show them escaped.
#[test]
fn hostile_file_names_in_messages_are_escaped() {
    let dir = std::env::temp_dir().join(format!("linger-hostile-name-{}", std::process::id()));
    let name = OsStr::from_bytes(b"\x1b]0;pwn\x07\xff.lgr");
    let out = linger()
        .arg("replay")
        .arg(dir.join(name))
        .output()
        .expect("running linger replay");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_inert("replay's error", &out.stderr, false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(r"\x1b]0;pwn\x07\xff.lgr"), "{stderr}");
}
