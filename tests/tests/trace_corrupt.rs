//! Damaged traces: truncated anywhere, bytes flipped, not a trace, a newer version. Never a
//! panic; unusable files exit 1 with a reason; damage costs only the chunks it hits.

mod trace_support;

use std::{collections::HashSet, path::Path, process::Output};

use linger_tests::TempDir;
use trace_support::{incidents, record, run, Recording};

/// A small deterministic generator, so a failure can be replayed.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

fn replay(file: &Path) -> Output {
    run(&["replay", "--json"], file)
}

/// Exit 0 with JSON lines whose incidents all were in the live report, or exit 1; no panic.
fn check_sane(out: &Output, live: &HashSet<String>, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    match out.status.code() {
        Some(0) => {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let v: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {line}"));
                // Incidents cut short by damage may differ (pending, fewer exits); the ones
                // that closed the same way must be the live ones exactly.
                if v["type"] == "incident" && v["outcome"] == "exited" && !v["reaper"].is_null() {
                    let key = (v["target"]["pid"].clone(), v["t_signal_ns"].clone());
                    let same = live.iter().any(|l| {
                        let lv: serde_json::Value = serde_json::from_str(l).expect("live JSON");
                        (lv["target"]["pid"].clone(), lv["t_signal_ns"].clone()) == key
                    });
                    assert!(same, "{what}: an incident live never saw: {line}");
                }
            }
        }
        Some(1) => assert!(stderr.starts_with("linger: "), "{what}: {stderr}"),
        other => panic!("{what}: exit {other:?}: {stderr}"),
    }
}

fn live_lines(rec: &Recording) -> HashSet<String> {
    rec.live_json.lines().map(str::to_string).collect()
}

/// Offsets of the chunk magics, in order.
fn chunks(bytes: &[u8]) -> Vec<usize> {
    bytes
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == b"LGCK")
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn truncated_and_flipped_traces_recover() {
    let rec = record("corrupt", &[]);
    let live = live_lines(&rec);
    let bytes = std::fs::read(&rec.trace).expect("the trace");
    let dir = TempDir::new("corrupt-cases");
    let file = dir.join("case.lgr");
    let mut rng = Lcg(0x5eed);
    assert!(chunks(&bytes).len() >= 3, "a 3.5 s recording spans chunks");

    for i in 0..40 {
        let cut = if i == 0 {
            bytes.len() - 1
        } else {
            rng.below(bytes.len())
        };
        std::fs::write(&file, &bytes[..cut]).expect("writing the case");
        let out = replay(&file);
        check_sane(&out, &live, &format!("cut at {cut} of {}", bytes.len()));
        if i == 0 {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("ends inside a chunk"), "{stderr}");
        }
    }
    for i in 0..40 {
        let mut damaged = bytes.clone();
        let at = rng.below(bytes.len());
        damaged[at] ^= 1 << (i % 8);
        std::fs::write(&file, &damaged).expect("writing the case");
        let out = replay(&file);
        let what = format!("bit {} flipped at {at}", i % 8);
        check_sane(&out, &live, &what);
        if at >= chunks(&bytes)[0] {
            assert_eq!(out.status.code(), Some(0), "{what}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("skipped"), "{what}: damage goes unreported");
        }
    }
}

/// Damage to the first chunk loses its events; the late kill in a later chunk replays to the
/// line live printed.
#[test]
fn reading_resumes_at_the_next_good_chunk() {
    let rec = record("resume", &[]);
    let mut bytes = std::fs::read(&rec.trace).expect("the trace");
    let first = chunks(&bytes)[0];
    bytes[first + 48 + 5] ^= 0xff;
    let dir = TempDir::new("resume-case");
    let file = dir.join("case.lgr");
    std::fs::write(&file, &bytes).expect("writing the case");
    let out = replay(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("checksum mismatch"), "{stderr}");
    let late = *rec.killed.last().expect("four kills");
    // Ids count incidents from the start of the stream, so the lost ones shift them.
    let late_ones = |lines: &str| -> Vec<serde_json::Value> {
        incidents(lines)
            .into_iter()
            .filter(|v| v["target"]["pid"] == u64::from(late))
            .map(|mut v| {
                v["id"] = serde_json::Value::Null;
                v
            })
            .collect()
    };
    let live_late = late_ones(&rec.live_json);
    let replay_late = late_ones(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(live_late.len(), 1);
    assert_eq!(replay_late, live_late);
}

#[test]
fn unusable_files_exit_1_with_a_reason() {
    let rec = record("unusable", &[]);
    let bytes = std::fs::read(&rec.trace).expect("the trace");
    let dir = TempDir::new("unusable-cases");
    let mut newer = bytes.clone();
    newer[8] = 2;
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("empty", Vec::new(), "empty"),
        (
            "json",
            br#"{"traceEvents": []}"#.to_vec(),
            "not a linger trace",
        ),
        ("newer", newer, "newer than this linger"),
        ("header", bytes[..20].to_vec(), "inside its header"),
    ];
    for (name, content, reason) in cases {
        let file = dir.join(name);
        std::fs::write(&file, content).expect("writing the case");
        for cmd in [
            &["replay", "--json"][..],
            &["export", "--format", "perfetto"][..],
        ] {
            let out = run(cmd, &file);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
            assert!(stderr.contains(reason), "{name}: {stderr}");
            assert!(out.stdout.is_empty(), "{name}");
        }
    }
    let missing = run(&["replay"], &dir.join("no-such-file"));
    assert_eq!(missing.status.code(), Some(1));
}
