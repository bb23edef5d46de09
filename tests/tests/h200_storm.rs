//! A kill storm of processes that never touch a GPU, recorded on the H200 in the default mode
//! (the NVIDIA libraries' uprobes, so every victim is watched in case NVML lists it, and NVML
//! is read every millisecond meanwhile): `scripts/h200/kill-storm.c`, 5000 forks SIGKILLed and
//! reaped. Replayed, every kill is one incident about a process without GPU memory, however
//! many readings came while hundreds of victims waited for their reap.

use std::{collections::BTreeSet, path::Path};

use linger_tests::linger;
use serde_json::Value;

const KILLS: usize = 5000;

fn replay(extra: &[&str]) -> Vec<Value> {
    let trace =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/h200/storms/kill-storm-5000.trace");
    let out = linger()
        .arg("replay")
        .arg("--json")
        .args(extra)
        .arg(&trace)
        .output()
        .expect("running linger replay");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .expect("UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[test]
fn every_kill_is_one_incident_without_gpu_memory() {
    let lines = replay(&["--events"]);
    let kinds = |kind: &str| {
        lines
            .iter()
            .filter(|l| l["type"] == "event" && l["event"]["data"]["kind"] == kind)
            .count()
    };
    // What makes it a storm under NVML's fast readings in library mode.
    assert!(kinds("nvml") >= 100, "{} NVML readings", kinds("nvml"));
    let strategy = lines
        .iter()
        .find(|l| l["event"]["data"]["kind"] == "strategy")
        .expect("a strategy event");
    assert!(
        strategy["event"]["data"]["libraries"]
            .as_array()
            .is_some_and(|l| !l.is_empty()),
        "{strategy}"
    );

    let incidents: Vec<&Value> = lines.iter().filter(|l| l["type"] == "incident").collect();
    assert_eq!(incidents.len(), KILLS);
    let targets: BTreeSet<u64> = incidents
        .iter()
        .map(|i| i["target"]["pid"].as_u64().expect("a pid"))
        .collect();
    assert_eq!(targets.len(), KILLS, "one incident per victim");
    for i in incidents {
        assert_eq!(i["outcome"], "exited", "{i}");
        assert_eq!(i["sender"]["comm"], "kill-storm", "{i}");
        assert!(i["gpu"].is_null() && i["verdict"].is_null(), "{i}");
        assert_eq!(i["deliveries"].as_array().map(Vec::len), Some(1), "{i}");
        assert!(i["t_reaped_ns"].is_u64(), "{i}");
        assert_eq!(i["reaper"]["how"], "parent", "{i}");
    }
    assert!(
        !lines.iter().any(|l| l["type"] == "incident_update"),
        "nothing to update about processes without GPU memory"
    );
}
