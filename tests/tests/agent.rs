//! `linger agent` for real: a real Prometheus (Debian's package) scrapes a real agent on
//! 127.0.0.1 while real processes holding a stand-in GPU device (a node for /dev/full) are
//! SIGKILLed; the test asks Prometheus's HTTP API what it stored. Also the incident log's
//! rotation, SIGHUP reopening and a full disk.

use std::{
    fs,
    io::{BufRead, BufReader},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use linger_tests::{
    agent::{agent, agent_args, eventually, free_port, get, prometheus, query, start, value},
    linger, stand_in_device, FdScenario, TempDir,
};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::Value;

const SCENARIO: &str = env!("CARGO_BIN_EXE_linger-fd-scenario");

/// Every agent sees every kill on the machine, and every stand-in device is the same node
/// (1:7): the tests of this file run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// This machine's name, as the kernel has it in the test's (the host's) UTS namespace.
fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("the host's name")
        .trim()
        .to_string()
}

/// The value of `label` on the series of /metrics whose line starts with `series{`.
fn label_of(body: &str, series: &str, label: &str) -> Option<String> {
    let line = body
        .lines()
        .find(|l| l.starts_with(&format!("{series}{{")))?;
    let at = line
        .find(&format!("{{{label}=\""))
        .or_else(|| line.find(&format!(",{label}=\"")))?;
    let rest = &line[at + label.len() + 3..];
    Some(rest[..rest.find('"')?].to_string())
}

/// A scenario process on the stand-in device and the pids on its `ready` line.
fn scenario(device: &Path, name: &str) -> (FdScenario, Vec<u32>) {
    let s = FdScenario::start(SCENARIO, device, name);
    let pids = s.pids.clone();
    (s, pids)
}

fn sigkill(pid: u32) {
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("kill");
}

#[test]
fn prometheus_scrapes_the_lingering_incident_and_sees_it_go() {
    let _serial = serial();
    let dir = TempDir::private("agent-prometheus");
    let device = stand_in_device(dir.path());
    let agent_port = free_port();
    let state = dir.join("state");
    fs::create_dir(&state).expect("state dir");
    let mut agent = agent(
        &device,
        agent_port,
        &["--state-dir", state.to_str().expect("UTF-8")],
    );
    let (_prometheus, prom_port) = prometheus(
        dir.path(),
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
             - job_name: linger\n    static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n"
        ),
    );
    eventually(
        "Prometheus to scrape the agent",
        Duration::from_secs(30),
        || {
            let up = query(prom_port, "up{job=\"linger\"}");
            (up.len() == 1 && value(&up[0]) == 1.0).then_some(())
        },
    );
    let build = query(prom_port, "linger_build_info");
    assert_eq!(build.len(), 1, "{build:?}");
    // A declared --gpu-device has no driver behind it, so only the system call tracepoints see
    // its opens: on every kernel, whatever hooks on the driver or its libraries it allows.
    assert_eq!(build[0]["metric"]["strategy"], "syscalls");

    // A parent and its forked child share the device file; the parent is killed.
    let (_scenario, pids) = scenario(&device, "fork-holder");
    let (parent, child) = (pids[0], pids[1]);
    sigkill(parent);
    let lingering = eventually(
        "the lingering incident in Prometheus",
        Duration::from_secs(20),
        || {
            let r = query(prom_port, "linger_lingering_incidents");
            (!r.is_empty()).then_some(r)
        },
    );
    assert_eq!(lingering.len(), 1, "{lingering:?}");
    assert_eq!(value(&lingering[0]), 1.0);
    assert_eq!(lingering[0]["metric"]["verdict"], "shared_fd");
    // No NODE_NAME: the host's own name, under dcgm-exporter's label.
    assert_eq!(lingering[0]["metric"]["hostname"], host_name().as_str());
    let counted = query(prom_port, "linger_incidents_total{termination=\"kill\"}");
    assert_eq!(counted.len(), 1, "{counted:?}");
    assert_eq!(counted[0]["metric"]["verdict"], "shared_fd");
    assert_eq!(value(&counted[0]), 1.0);

    // The holder goes: the series goes with it, and the release time is observed.
    sigkill(child);
    eventually(
        "the lingering series to go",
        Duration::from_secs(20),
        || {
            query(prom_port, "linger_lingering_incidents")
                .is_empty()
                .then_some(())
        },
    );
    // Into the histogram where the moment is known to 2 ms, else counted as a bound.
    let released = eventually("the release observed", Duration::from_secs(10), || {
        let r = query(
            prom_port,
            "(sum(linger_release_duration_seconds_count{termination=\"kill\"}) or vector(0)) \
             + (sum(linger_release_bounded_total{termination=\"kill\"}) or vector(0))",
        );
        (r.len() == 1 && value(&r[0]) >= 1.0).then_some(r)
    });
    assert!(value(&released[0]) >= 1.0);

    // SIGTERM detaches and flushes: every record is in the log, the last one settled.
    kill(Pid::from_raw(agent.0.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let status = agent.0.wait().expect("agent exit");
    assert!(status.success(), "agent exited with {status}");
    let log = fs::read_to_string(state.join("incidents.jsonl")).expect("incident log");
    let records: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let of_parent: Vec<&Value> = records
        .iter()
        .filter(|r| r["target"]["pid"] == parent)
        .collect();
    assert_eq!(of_parent[0]["type"], "incident");
    assert_eq!(of_parent[0]["settled"], false);
    let last = of_parent.last().expect("records of the parent");
    assert_eq!(last["settled"], true, "{last}");
}

#[test]
fn the_node_is_named_from_node_name_else_the_hosts_own_name() {
    let _serial = serial();
    let dir = TempDir::private("agent-node");
    let device = stand_in_device(dir.path());

    // A DaemonSet's agent: NODE_NAME from the downward API names every series.
    let port = free_port();
    let mut cmd = linger();
    cmd.args(agent_args(&device, port)).env("NODE_NAME", "n1");
    let agent = start(cmd);
    let (_scenario, pids) = scenario(&device, "fork-holder");
    sigkill(pids[0]);
    let body = eventually("the lingering series", Duration::from_secs(20), || {
        let (_, body) = get(port, "/metrics").ok()?;
        body.contains("linger_lingering_incidents{").then_some(body)
    });
    assert_eq!(
        label_of(&body, "linger_lingering_incidents", "hostname").as_deref(),
        Some("n1"),
        "{body}"
    );
    assert_eq!(
        label_of(&body, "linger_build_info", "hostname").as_deref(),
        Some("n1")
    );
    sigkill(pids[1]);
    drop(agent);

    // dcgm-exporter's label before its PR #655, for dashboards that join on it.
    let port = free_port();
    let mut cmd = linger();
    cmd.args(agent_args(&device, port))
        .args(["--hostname-label", "Hostname"])
        .env("NODE_NAME", "n1");
    let agent = start(cmd);
    let (_, body) = get(port, "/metrics").expect("metrics");
    assert_eq!(
        label_of(&body, "linger_build_info", "Hostname").as_deref(),
        Some("n1"),
        "{body}"
    );
    assert_eq!(label_of(&body, "linger_build_info", "hostname"), None);
    drop(agent);

    // As in a container with the host's pids and a host name of its own, without NODE_NAME:
    // the agent's UTS namespace says `linger-pod`, PID 1's (the host's here) the host's name.
    // A pid namespace of its own makes PID 1 a shell of the host's UTS namespace, which this
    // test may read (the machine's own PID 1 may not be readable in a sandbox).
    let port = free_port();
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--kill-child", "--mount-proc", "--"])
        .args([
            "sh",
            "-c",
            "unshare --uts -- sh -c 'hostname linger-pod && exec \"$0\" \"$@\"' \"$@\"; exit $?",
        ])
        .arg("agent-in-a-pod")
        .arg(linger_tests::linger_bin())
        .args(agent_args(&device, port))
        .env_remove("NODE_NAME");
    let agent = start(cmd);
    let (_, body) = get(port, "/metrics").expect("metrics");
    assert_eq!(
        label_of(&body, "linger_build_info", "hostname"),
        Some(host_name()),
        "{body}"
    );
    drop(agent);
}

/// The sum of `linger_lingering_incidents` on the agent's /metrics.
fn lingering_total(port: u16) -> Option<f64> {
    let (_, body) = get(port, "/metrics").ok()?;
    Some(
        body.lines()
            .filter(|l| l.starts_with("linger_lingering_incidents{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}

/// A rollout as the DaemonSet's does it (maxSurge 1, maxUnavailable 0): the new agent starts
/// beside the old on the same state directory, then the old one stops. What docs/kubernetes.md
/// says a restart does: the old agent's open incidents stay in the log as it last wrote them
/// (not settled), the new one follows the deaths it saw itself and not the old one's.
#[test]
fn a_rollout_keeps_watching_and_leaves_the_old_agents_incidents_open_in_the_log() {
    let _serial = serial();
    let dir = TempDir::private("agent-rollout");
    let device = stand_in_device(dir.path());
    let state = dir.join("state");
    let state_arg = ["--state-dir", state.to_str().expect("UTF-8")];
    let (old_port, new_port) = (free_port(), free_port());
    let mut old = agent(&device, old_port, &state_arg);
    let (_before, before) = scenario(&device, "fork-holder");
    sigkill(before[0]);
    eventually("the old agent's incident", Duration::from_secs(20), || {
        (lingering_total(old_port)? == 1.0).then_some(())
    });

    let new = agent(&device, new_port, &state_arg);
    let (_during, during) = scenario(&device, "fork-holder");
    sigkill(during[0]);
    eventually("both agents' incidents", Duration::from_secs(20), || {
        (lingering_total(old_port)? == 2.0 && lingering_total(new_port)? == 1.0).then_some(())
    });

    kill(Pid::from_raw(old.0.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    assert!(old.0.wait().expect("old agent exit").success());
    let log = fs::read_to_string(state.join("incidents.jsonl")).expect("incident log");
    let of = |pid: u32| -> Vec<Value> {
        log.lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("JSON line"))
            .filter(|r| r["target"]["pid"] == pid)
            .collect()
    };
    // The old agent's incident stays as it last wrote it: open, never settled by anyone.
    let earlier = of(before[0]);
    assert!(!earlier.is_empty(), "{log}");
    assert_eq!(earlier.last().expect("record")["settled"], false, "{log}");
    // The death during the overlap: reported by both agents, each with its own id.
    assert!(of(during[0]).len() >= 2, "by both agents:\n{log}");
    // The new agent still follows the death it saw, and never learnt of the earlier one.
    thread::sleep(Duration::from_secs(1));
    assert_eq!(lingering_total(new_port), Some(1.0));
    sigkill(during[1]);
    eventually(
        "the new agent's incident to end",
        Duration::from_secs(20),
        || (lingering_total(new_port)? == 0.0).then_some(()),
    );
    sigkill(before[1]);
    drop(new);
}

#[test]
fn metrics_endpoint_answers_only_what_it_serves() {
    let _serial = serial();
    let dir = TempDir::private("agent-http");
    let device = stand_in_device(dir.path());
    let port = free_port();
    let _agent = agent(&device, port, &[]);
    let (status, body) = get(port, "/healthz").expect("healthz");
    assert!(status.contains("200"), "{status}");
    assert_eq!(body, "ok\n");
    // The collector's own cost is counted from its first tick on.
    let (status, body) = eventually("the collector's CPU time", Duration::from_secs(5), || {
        get(port, "/metrics")
            .ok()
            .filter(|(_, b)| b.contains("linger_collector_cpu_seconds_total{"))
    });
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("# TYPE linger_build info"), "{body}");
    assert!(body.contains("linger_nvml_errors_total 0"), "{body}");
    assert!(
        body.ends_with("# EOF\n"),
        "OpenMetrics ends with EOF: {body}"
    );
    // Every metric served is in docs/agent.md (families without a series yet are not served).
    let docs = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/agent.md"))
        .expect("docs/agent.md");
    let listed: Vec<&str> = docs
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .collect();
    let served: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect();
    assert!(served.contains(&"process_cpu_seconds"), "{body}");
    for m in &served {
        let suffixed = |s: &str| listed.iter().any(|l| *l == format!("{m}{s}"));
        assert!(
            suffixed("") || suffixed("_total") || suffixed("_info"),
            "{m} is served but not in docs/agent.md"
        );
    }
    let (status, _) = get(port, "/other").expect("404");
    assert!(status.contains("404"), "{status}");
    // A client that sends nothing is dropped without holding the endpoint up.
    let _silent = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let (status, _) = get(port, "/healthz").expect("healthz while another waits");
    assert!(status.contains("200"), "{status}");
}

/// Waits until `path` holds `n` lines.
fn lines_in(path: &Path, n: usize) -> Vec<String> {
    eventually(
        &format!("{n} lines in {}", path.display()),
        Duration::from_secs(15),
        || {
            let text = fs::read_to_string(path).ok()?;
            let lines: Vec<String> = text.lines().map(String::from).collect();
            (lines.len() >= n).then_some(lines)
        },
    )
}

fn kill_one(device: &Path) -> u32 {
    let (_s, pids) = scenario(device, "hold");
    sigkill(pids[0]);
    pids[0]
}

#[test]
fn the_incident_log_rotates_and_reopens_on_sighup() {
    let _serial = serial();
    let dir = TempDir::private("agent-log");
    let device = stand_in_device(dir.path());
    let state = dir.join("state");
    fs::create_dir(&state).expect("state dir");
    let agent = agent(
        &device,
        free_port(),
        &[
            "--state-dir",
            state.to_str().expect("UTF-8"),
            "--log-max-bytes",
            "1",
            "--log-keep",
            "2",
        ],
    );
    let log = state.join("incidents.jsonl");
    // Each record is bigger than the limit: every one after the first rotates.
    for _ in 0..3 {
        let pid = kill_one(&device);
        eventually("the incident in the log", Duration::from_secs(15), || {
            fs::read_to_string(&log)
                .ok()?
                .contains(&format!("\"pid\":{pid},"))
                .then_some(())
        });
    }
    assert!(state.join("incidents.jsonl.1").exists());
    assert!(state.join("incidents.jsonl.2").exists());
    assert!(
        !state.join("incidents.jsonl.3").exists(),
        "only --log-keep 2 kept"
    );

    // logrotate's way: move the file, then SIGHUP; the next incident goes to a new file.
    let moved = state.join("moved.jsonl");
    fs::rename(&log, &moved).expect("move the log");
    kill(Pid::from_raw(agent.0.id() as i32), Signal::SIGHUP).expect("SIGHUP");
    thread::sleep(Duration::from_millis(200));
    let pid = kill_one(&device);
    let lines = lines_in(&log, 1);
    assert!(lines[0].contains(&format!("\"pid\":{pid},")), "{lines:?}");
    assert!(!fs::read_to_string(&moved)
        .expect("moved log")
        .contains(&format!("\"pid\":{pid},")));
    drop(agent);
}

#[test]
fn a_full_disk_is_counted_and_the_agent_carries_on() {
    let _serial = serial();
    let dir = TempDir::private("agent-full");
    let device = stand_in_device(dir.path());
    let state = dir.join("state");
    fs::create_dir(&state).expect("state dir");
    // A 64 KiB tmpfs: the log fills it.
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs"])
        .arg(&state)
        .status()
        .expect("mount");
    assert!(mounted.success(), "mounting a tmpfs needs root");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(state.clone());
    fs::write(state.join("filler"), vec![0u8; 60 * 1024]).expect("fill most of it");
    let port = free_port();
    let _agent = agent(
        &device,
        port,
        &["--state-dir", state.to_str().expect("UTF-8")],
    );
    for _ in 0..4 {
        kill_one(&device);
    }
    let errors = eventually("failed writes counted", Duration::from_secs(15), || {
        let (_, body) = get(port, "/metrics").ok()?;
        let n: f64 = body
            .lines()
            .find_map(|l| l.strip_prefix("linger_log_write_errors_total "))?
            .parse()
            .ok()?;
        (n >= 1.0).then_some(n)
    });
    assert!(errors >= 1.0);
    // Still serving, and every incident counted: the first failed write can come before
    // the later incidents are reported, so their count is awaited too.
    let counted = |body: &str| -> f64 {
        body.lines()
            .filter(|l| l.starts_with("linger_incidents_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    eventually(
        "the four incidents counted",
        Duration::from_secs(15),
        || {
            let (_, body) = get(port, "/metrics").ok()?;
            (counted(&body) >= 4.0).then_some(())
        },
    );
    let (_, body) = get(port, "/metrics").expect("metrics");
    assert_eq!(counted(&body), 4.0, "{body}");
}

#[test]
fn a_held_incident_gets_a_flight_file_that_replays_to_it() {
    let _serial = serial();
    let dir = TempDir::private("agent-flight");
    let device = stand_in_device(dir.path());
    let state = dir.join("state");
    fs::create_dir(&state).expect("state dir");
    fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod");
    let port = free_port();
    let _agent = agent(
        &device,
        port,
        &[
            "--state-dir",
            state.to_str().expect("UTF-8"),
            "--keep",
            "1m",
        ],
    );
    // A holder whose forked child keeps the file; the kill comes in a later segment than
    // the fork (segments last 10 s at the least).
    let mut parent = Command::new("sh")
        .args(["-c", "exec 3<>\"$0\"; sleep 600 & echo $!; exec sleep 600"])
        .arg(&device)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the holder");
    let mut line = String::new();
    BufReader::new(parent.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the child's pid");
    let child: u32 = line.trim().parse().expect("pid");
    thread::sleep(Duration::from_secs(11));
    sigkill(parent.id());
    let _ = parent.wait();
    thread::sleep(Duration::from_secs(1));
    sigkill(child);
    let flight = state.join("flight");
    let suffix = format!("-{}.trace", parent.id());
    let file = eventually("the flight file", Duration::from_secs(15), || {
        fs::read_dir(&flight)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("incident-") && n.ends_with(&suffix))
            })
    });
    let segments = fs::read_dir(&flight)
        .expect("flight dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("segment-"))
        .count();
    assert!(segments >= 2, "the window spans segments: {segments}");
    let out = linger()
        .args(["replay", "--json"])
        .arg(&file)
        .output()
        .expect("linger replay");
    assert!(out.status.success(), "{out:?}");
    let of = |text: &str| -> Vec<Value> {
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("JSON"))
            .filter(|r| r["target"]["pid"] == parent.id())
            .map(|mut r| {
                // Numbered per run, and stamped by the process that printed it.
                for k in ["id", "node", "wall_time"] {
                    r[k].take();
                }
                r
            })
            .collect()
    };
    let replayed = of(&String::from_utf8_lossy(&out.stdout));
    let logged = of(&fs::read_to_string(state.join("incidents.jsonl")).expect("log"));
    assert!(!logged.is_empty());
    assert_eq!(
        replayed, logged,
        "the flight file replays to the logged incident"
    );
    let verdict = &logged.last().expect("incident")["verdict"]["kind"];
    assert_eq!(verdict, "shared_fd");
    assert_eq!(
        logged.last().expect("incident")["holders"][0]["how"],
        "fork"
    );
}
