//! The agent on the H200 (scripts/h200/agent.py): a 4 GiB PyTorch process SIGKILLed while a
//! child it forked keeps its GPU files. Its incident log must be what `linger replay` makes of
//! the agent's recording, and say what the metrics said (tests/data/h200/agent/agent.json).

use std::{path::PathBuf, process::Command};

use serde_json::Value;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/h200/agent")
}

fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

/// The agent that wrote the logs predates `node.driver` (the replay takes it from the
/// recording's header) and the per-GPU parts `gpu.gpus`: the replay's are left out where the
/// logged record has none.
fn without_newer_fields(replayed: &mut [Value], logged: &[Value]) {
    for (r, l) in replayed.iter_mut().zip(logged) {
        linger_tests::without_newer_window(r, l);
        linger_tests::without_older_hint(r, l);
        if l["node"].get("driver").is_none() {
            if let Some(node) = r.get_mut("node").and_then(Value::as_object_mut) {
                node.remove("driver");
            }
        }
        if l["gpu"].get("gpus").is_none() {
            if let Some(gpu) = r.get_mut("gpu").and_then(Value::as_object_mut) {
                gpu.remove("gpus");
            }
        }
    }
}

#[test]
fn the_agents_incident_log_is_what_its_recording_replays_to() {
    let linger = std::env::var("LINGER_BIN").expect("LINGER_BIN is set by `cargo xtask test`");
    let out = Command::new(linger)
        .args(["replay", "--json"])
        .arg(data().join("agent.trace"))
        .output()
        .expect("linger replay");
    assert!(out.status.success(), "{out:?}");
    let mut replayed = lines(&String::from_utf8_lossy(&out.stdout));
    let logged = lines(&std::fs::read_to_string(data().join("incidents.jsonl")).expect("log"));
    without_newer_fields(&mut replayed, &logged);
    assert_eq!(replayed, logged);

    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(data().join("agent.json")).expect("run"))
            .expect("agent.json");
    let victim = run["victim"].as_u64().expect("victim pid");
    let child = run["child"].as_u64().expect("child pid");
    let of_victim: Vec<&Value> = logged
        .iter()
        .filter(|r| r["target"]["pid"] == victim)
        .collect();
    let first = of_victim[0];
    assert_eq!(first["verdict"]["kind"], "shared_fd");
    assert_eq!(first["holders"][0]["pid"], child);
    assert_eq!(first["gpu"]["index"], 0);
    let share = first["gpu"]["share_bytes"].as_u64().expect("share");
    assert!(share > 4 << 30, "{share}");
    // What /metrics showed while the child held the memory: the same bytes and verdict.
    let held = run["held"].as_str().expect("metrics text");
    let gauge = held
        .lines()
        .find(|l| l.starts_with("linger_gpu_memory_lingering_bytes{"))
        .expect("the lingering series");
    assert!(gauge.contains("verdict=\"shared_fd\""), "{gauge}");
    assert!(gauge.ends_with(&format!(" {share}")), "{gauge}");
    // Seen within a second of the kill; gone within a second of the memory's return.
    let ns = |k: &str| run[k].as_u64().expect(k);
    assert!(ns("t_lingering_seen_ns") - ns("t_kill_ns") < 1_000_000_000);
    assert!(ns("t_series_gone_ns") - ns("t_back_ns") < 1_000_000_000);
    let last = of_victim.last().expect("records");
    assert_eq!(last["settled"], true);
    let back = last["gpu"]["t_memory_back_ns"].as_u64().expect("back");
    let truth = ns("t_back_ns");
    assert!(
        back.abs_diff(truth) < 2_000_000,
        "linger {back} vs poll {truth}"
    );
    // `linger wait` while held: timed out, with the agent's verdict and the holder.
    let waited: Value =
        serde_json::from_str(run["wait_while_held"]["out"].as_str().expect("wait output"))
            .expect("wait JSON");
    assert_eq!(run["wait_while_held"]["rc"], 1);
    assert_eq!(waited["verdict"], "shared_fd");
    assert_eq!(waited["dead"][0]["incident"]["holders"][0]["pid"], child);
    assert_eq!(run["wait_after"]["rc"], 0);
}

/// The same run with the flight recorder (tests/data/h200/agent-flight): the trace file it
/// wrote when the held incident settled replays to that incident as the agent logged it.
#[test]
fn the_flight_recorders_file_replays_to_the_held_incident() {
    let linger = std::env::var("LINGER_BIN").expect("LINGER_BIN is set by `cargo xtask test`");
    let dir = data().with_file_name("agent-flight");
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("agent.json")).expect("run"))
            .expect("agent.json");
    let victim = run["victim"].as_u64().expect("victim pid");
    let out = Command::new(linger)
        .args(["replay", "--json"])
        .arg(dir.join(format!("incident-1-{victim}.trace")))
        .output()
        .expect("linger replay");
    assert!(out.status.success(), "{out:?}");
    // Numbered per run, and stamped by the process that printed it.
    let of_victim = |records: Vec<Value>| -> Vec<Value> {
        records
            .into_iter()
            .filter(|r| r["target"]["pid"] == victim)
            .map(|mut r| {
                for k in ["id", "node", "wall_time"] {
                    r[k].take();
                }
                r
            })
            .collect()
    };
    let mut replayed = of_victim(lines(&String::from_utf8_lossy(&out.stdout)));
    let logged = of_victim(lines(
        &std::fs::read_to_string(dir.join("incidents.jsonl")).expect("log"),
    ));
    without_newer_fields(&mut replayed, &logged);
    assert_eq!(replayed.len(), 2, "the incident and its update");
    assert_eq!(replayed, logged);
    assert_eq!(logged[1]["verdict"]["kind"], "shared_fd");
    assert_eq!(logged[1]["settled"], true);
}
