//! Replays of traces recorded on the H200 (tests/data/h200): the analysis here must reproduce
//! what `linger live` printed there, and agree with the independent NVML poll run beside it.

use std::{path::Path, process::Command};

use serde_json::Value;

fn linger() -> String {
    std::env::var("LINGER_BIN").expect("LINGER_BIN is set by `cargo xtask test`")
}

fn data(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/h200")
        .join(rel)
}

fn replay_json(trace: &Path) -> Vec<Value> {
    let out = Command::new(linger())
        .args(["replay", "--json"])
        .arg(trace)
        .output()
        .expect("run linger replay");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

/// Every field the recorded object has is in `now`, with the same value (newer versions may
/// add fields, never change old ones).
fn assert_superset(recorded: &Value, now: &Value, path: &str) {
    match (recorded, now) {
        (Value::Object(r), Value::Object(n)) => {
            for (k, v) in r {
                let inner = format!("{path}.{k}");
                assert_superset(v, n.get(k).unwrap_or(&Value::Null), &inner);
            }
        }
        (Value::Array(r), Value::Array(n)) => {
            assert_eq!(r.len(), n.len(), "{path}: length");
            for (i, (a, b)) in r.iter().zip(n).enumerate() {
                assert_superset(a, b, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(recorded, now, "{path}"),
    }
}

/// `key=value` pairs of one poll.txt line.
fn poll_fields(line: &str) -> impl Fn(&str) -> u64 + '_ {
    move |key: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} in {line}"))
    }
}

#[test]
fn plain_kill_of_16_gib_replays_as_recorded_live() {
    let dir = data("issue3");
    let recorded: Vec<Value> = std::fs::read_to_string(dir.join("live.jsonl"))
        .expect("recorded live output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let replayed = replay_json(&dir.join("plain-kill-16g-no-stacks.trace"));
    let incidents: Vec<&Value> = replayed
        .iter()
        .filter(|v| v["type"] == "incident")
        .collect();
    assert_eq!(incidents.len(), recorded.len());
    for (r, n) in recorded.iter().zip(&incidents) {
        assert_superset(r, n, "incident");
    }
}

#[test]
fn the_ledger_and_nvml_agree_on_the_16_gib_kill() {
    let dir = data("issue3");
    let replayed = replay_json(&dir.join("plain-kill-16g-no-stacks.trace"));
    let incident = replayed
        .iter()
        .find(|v| v["type"] == "incident")
        .expect("one incident");
    let gpu = &incident["gpu"];
    // torch.empty(16 GiB) is one NV01_MEMORY_LOCAL_USER allocation of exactly 16 GiB.
    let local = gpu["classes"]
        .as_array()
        .expect("classes")
        .iter()
        .find(|c| c["class"] == "0x40")
        .expect("class 0x40");
    assert_eq!(local["largest"].as_u64(), Some(16 << 30));
    // The ledger's video memory is what NVML accounted to the process.
    assert_eq!(gpu["bytes_ledger"], gpu["bytes_nvml"]);
    // The independent poll (scripts/h200/nvml_poll.py) saw the memory back within 5 ms.
    let poll = std::fs::read_to_string(dir.join("poll.txt")).expect("poll.txt");
    let line = poll
        .lines()
        .find(|l| l.contains(&format!("pid={}", incident["target"]["pid"])))
        .expect("the poll of this pid");
    let back_poll = poll_fields(line)("back_boot_ns");
    let back = gpu["t_memory_back_ns"].as_u64().expect("memory came back");
    assert!(
        back.abs_diff(back_poll) < 5_000_000,
        "linger {back} vs poll {back_poll}"
    );
}
