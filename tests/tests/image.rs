//! The agent's image (`cargo xtask dist`), run by podman with the DaemonSet's own settings,
//! read from the manifest Debian's kubectl builds: its capabilities (all dropped, then the
//! ones added), `privileged: false`, the host's pid namespace, the user, no privilege
//! escalation, a read-only root, its arguments and environment, the ConfigMap as its config
//! file and the volumes at their mount paths (the state directory in a temporary directory
//! of the host's). It must attach, see a kill on the host, answer its health probe and
//! /metrics, and write the incident into the host directory; and no capability the
//! manifest adds may be dropped without a loss linger names.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::{Mutex, Once},
    thread,
    time::{Duration, Instant},
};

use linger_tests::{require_root, TempDir};
use nix::sys::resource::{getrlimit, Resource};
use serde_json::Value;

/// One agent container at a time: the SYS_ADMIN case changes a host setting the others read.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .expect("podman (Debian's package; cargo xtask test installs it)")
}

/// Loads the image `cargo xtask dist` wrote, once.
fn image() -> &'static str {
    static LOAD: Once = Once::new();
    LOAD.call_once(|| {
        let archive = std::env::var("LINGER_IMAGE")
            .expect("LINGER_IMAGE: the image archive (cargo xtask test builds it)");
        let out = podman(&["load", "-i", &archive]);
        assert!(out.status.success(), "podman load: {out:?}");
    });
    "ghcr.io/linger/linger:0.1.0"
}

/// The objects of the base kustomization, as JSON (PyYAML, from the tests' environment).
fn base_objects() -> Vec<Value> {
    let kubectl = std::env::var("LINGER_DEBIAN_KUBECTL")
        .expect("LINGER_DEBIAN_KUBECTL: Debian's kubectl (cargo xtask test fetches it)");
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/base");
    let mut kubectl = Command::new(kubectl)
        .arg("kustomize")
        .arg(base)
        .stdout(Stdio::piped())
        .spawn()
        .expect("kubectl kustomize");
    let yaml = kubectl.stdout.take().expect("kubectl's output");
    let json = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(sys.stdin))))",
        ])
        .stdin(yaml)
        .output()
        .expect("python3 with PyYAML (cargo xtask test puts its environment first on PATH)");
    assert!(
        kubectl.wait().is_ok_and(|s| s.success()),
        "kubectl kustomize failed"
    );
    assert!(json.status.success(), "YAML to JSON: {json:?}");
    serde_json::from_slice(&json.stdout).expect("JSON")
}

/// What the DaemonSet asks of the container runtime for the agent.
struct AgentPod {
    security: Value,
    host_pid: bool,
    args: Vec<String>,
    env: Vec<(String, String)>,
    config: Value,
    mounts: Vec<(String, String, bool)>,
}

impl AgentPod {
    fn from_manifest() -> Self {
        let objects = base_objects();
        let kind = |k: &str| {
            objects
                .iter()
                .find(|o| o["kind"] == k)
                .unwrap_or_else(|| panic!("no {k} in the base"))
        };
        let spec = &kind("DaemonSet")["spec"]["template"]["spec"];
        let agent = spec["containers"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "agent"))
            .expect("the agent's container");
        let volumes = spec["volumes"].as_array().expect("volumes");
        let source = |name: &Value| -> Option<String> {
            let v = volumes.iter().find(|v| &v["name"] == name)?;
            v["hostPath"]["path"].as_str().map(str::to_string)
        };
        let mounts = agent["volumeMounts"]
            .as_array()
            .expect("volume mounts")
            .iter()
            .map(|m| {
                let from = source(&m["name"]).unwrap_or_else(|| "configMap".into());
                let at = m["mountPath"].as_str().expect("a mount path").to_string();
                (from, at, m["readOnly"] == true)
            })
            .collect();
        let env = agent["env"]
            .as_array()
            .expect("env")
            .iter()
            .map(|e| {
                let name = e["name"].as_str().expect("a name").to_string();
                // The node's name comes from the API server: this machine's.
                let value = e["value"].as_str().map_or_else(hostname, str::to_string);
                (name, value)
            })
            .collect();
        Self {
            security: agent["securityContext"].clone(),
            host_pid: spec["hostPID"] == true,
            args: strings(&agent["args"]),
            env,
            config: kind("ConfigMap")["data"].clone(),
            mounts,
        }
    }

    fn caps_added(&self) -> Vec<String> {
        strings(&self.security["capabilities"]["add"])
    }

    /// `podman run` for it, without `leave_out` among the capabilities added, its config in
    /// `dir/config` and its state directory in `dir/state`.
    fn run_args(&self, dir: &Path, leave_out: Option<&str>) -> Vec<String> {
        let s = &self.security;
        assert_eq!(s["privileged"], false, "the agent is not privileged");
        let mut args: Vec<String> = ["run", "--runtime", "runc", "--cgroup-manager=cgroupfs"]
            .map(String::from)
            .to_vec();
        // podman's default limits (a million open files) exceed what this host allows; the
        // agent needs far less, and a limit under the host's is always allowed.
        for (flag, resource, most) in [
            ("nofile", Resource::RLIMIT_NOFILE, 65536),
            ("nproc", Resource::RLIMIT_NPROC, 4096),
        ] {
            let (_, hard) = getrlimit(resource).expect("getrlimit");
            let limit = hard.min(most);
            args.push(format!("--ulimit={flag}={limit}:{limit}"));
        }
        if self.host_pid {
            args.push("--pid=host".into());
        }
        if let Some(uid) = s["runAsUser"].as_u64() {
            args.push(format!("--user={uid}"));
        }
        if s["allowPrivilegeEscalation"] == false {
            args.push("--security-opt=no-new-privileges".into());
        }
        if s["readOnlyRootFilesystem"] == true {
            args.push("--read-only".into());
        }
        for cap in strings(&s["capabilities"]["drop"]) {
            args.push(format!("--cap-drop={cap}"));
        }
        for cap in self.caps_added() {
            if Some(cap.as_str()) != leave_out {
                args.push(format!("--cap-add={cap}"));
            }
        }
        for (name, value) in &self.env {
            args.push(format!("--env={name}={value}"));
        }
        let config = dir.join("config");
        std::fs::create_dir_all(&config).expect("the config directory");
        for (file, text) in self.config.as_object().expect("the ConfigMap's data") {
            std::fs::write(config.join(file), text.as_str().expect("text")).expect("config");
        }
        let state = dir.join("state");
        std::fs::create_dir_all(&state).expect("the state directory");
        for (from, at, read_only) in &self.mounts {
            let from = match from.as_str() {
                "configMap" => config.display().to_string(),
                "/var/lib/linger" => state.display().to_string(),
                host => host.to_string(),
            };
            let ro = if *read_only { ":ro" } else { "" };
            args.push(format!("--volume={from}:{at}{ro}"));
        }
        args
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// A running agent container, removed when dropped.
struct Agent {
    name: String,
}

impl Agent {
    fn start(pod: &AgentPod, dir: &Path, leave_out: Option<&str>) -> Self {
        let name = format!(
            "linger-image-test-{}-{}",
            std::process::id(),
            leave_out.unwrap_or("all")
        );
        let _ = podman(&["rm", "-f", &name]);
        let mut args = pod.run_args(dir, leave_out);
        args.extend(["-d".into(), "--name".into(), name.clone(), image().into()]);
        args.extend(pod.args.iter().cloned());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = podman(&argv);
        if !out.status.success() {
            let _ = podman(&["rm", "-f", &name]);
            panic!("podman run: {out:?}");
        }
        Self { name }
    }

    fn exec(&self, command: &[&str]) -> Output {
        let mut args = vec!["exec", self.name.as_str()];
        args.extend(command);
        podman(&args)
    }

    fn logs(&self) -> String {
        let out = podman(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    fn inspect(&self, format: &str) -> String {
        let out = podman(&["inspect", "-f", format, &self.name]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Waits until its health probe answers (true), or it exited (false).
    fn healthy(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.inspect("{{.State.Status}}") == "exited" {
                return false;
            }
            if self.exec(&["/usr/bin/linger-healthz"]).status.success() {
                return true;
            }
            thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "the agent neither answered its probe nor exited: {}",
            self.logs()
        );
    }

    /// The capabilities its process holds now, by name.
    fn effective_caps(&self) -> Vec<String> {
        let pid = self.inspect("{{.State.Pid}}");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .expect("CapEff")
            .trim();
        let mask = u64::from_str_radix(hex, 16).expect("a mask");
        caps_of(mask)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "5", &self.name]);
    }
}

fn caps_of(mask: u64) -> Vec<String> {
    [
        (2, "DAC_READ_SEARCH"),
        (19, "SYS_PTRACE"),
        (21, "SYS_ADMIN"),
        (34, "SYSLOG"),
        (38, "PERFMON"),
        (39, "BPF"),
    ]
    .iter()
    .filter(|(bit, _)| mask & (1 << bit) != 0)
    .map(|(_, name)| name.to_string())
    .collect()
}

/// The host's kernel.perf_event_paranoid, set for a while and put back when dropped.
struct Paranoid(String);

impl Paranoid {
    const PATH: &str = "/proc/sys/kernel/perf_event_paranoid";

    fn set(value: &str) -> Self {
        let was = std::fs::read_to_string(Self::PATH).expect("perf_event_paranoid");
        std::fs::write(Self::PATH, value).expect("setting perf_event_paranoid");
        Self(was)
    }
}

impl Drop for Paranoid {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, self.0.trim());
    }
}

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The incident the agent wrote into the host directory about `pid`.
fn incident_in(log: &Path, pid: u32, agent: &Agent) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|r| r["target"]["pid"] == pid);
        if let Some(incident) = found {
            return incident;
        }
        thread::sleep(Duration::from_millis(200));
    }
    panic!(
        "no incident about {pid} in {}: {}",
        log.display(),
        agent.logs()
    );
}

#[test]
fn the_image_traces_a_host_kill_with_the_daemonsets_settings() {
    require_root();
    let _one = one_at_a_time();
    let pod = AgentPod::from_manifest();
    assert!(pod.host_pid, "the agent sees the host's processes");
    let dir = TempDir::new("image");
    let agent = Agent::start(&pod, dir.path(), None);
    assert!(agent.healthy(), "{}", agent.logs());

    let mut sleeper = Command::new("sleep").arg("600").spawn().expect("sleep");
    sleeper.kill().expect("SIGKILL");
    sleeper.wait().expect("reaping sleep");
    let incident = incident_in(
        &dir.path().join("state/incidents.jsonl"),
        sleeper.id(),
        &agent,
    );
    assert_eq!(incident["signal_name"], "SIGKILL", "{incident:#}");
    assert_eq!(
        incident["node"]["host"],
        hostname(),
        "NODE_NAME names the node: {incident:#}"
    );

    let metrics = agent.exec(&[
        "bash",
        "-c",
        "exec 3<>/dev/tcp/127.0.0.1/9477; printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3",
    ]);
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        metrics.contains("linger_incidents_total{termination=\"kill\""),
        "{metrics}"
    );

    // Once attached, the agent keeps only what its collector uses: no CAP_SYS_ADMIN where
    // the kernel lets CAP_BPF and CAP_PERFMON do.
    let mut kept = agent.effective_caps();
    kept.sort();
    let paranoid = std::fs::read_to_string(Paranoid::PATH).expect("perf_event_paranoid");
    let mut want = vec!["BPF", "DAC_READ_SEARCH", "PERFMON", "SYS_PTRACE", "SYSLOG"];
    if paranoid.trim().parse::<i32>().unwrap_or(2) > 2 {
        want.push("SYS_ADMIN");
    }
    want.sort();
    assert_eq!(kept, want, "{}", agent.logs());
}

/// Each capability the manifest adds, left out in turn: the agent refuses to start naming it
/// (exit 2), or starts and names what it loses. CAP_SYS_ADMIN is for perf events where
/// perf_event_paranoid is above 2 (Debian's and Ubuntu's kernels): that case runs with the
/// host's setting at 3, where linger's own check asks for it (this kernel, not Debian's,
/// would still let CAP_PERFMON open them).
#[test]
fn no_capability_the_daemonset_adds_can_be_left_out_unsaid() {
    require_root();
    let _one = one_at_a_time();
    let pod = AgentPod::from_manifest();
    let added = pod.caps_added();
    assert!(!added.is_empty(), "the manifest adds capabilities");
    for cap in &added {
        let _debian = (cap == "SYS_ADMIN").then(|| Paranoid::set("3"));
        let dir = TempDir::new("image-cap");
        let agent = Agent::start(&pod, dir.path(), Some(cap));
        let started = agent.healthy();
        let logs = agent.logs();
        let named = logs.contains(&format!("CAP_{cap}"));
        if started {
            assert!(
                named,
                "started without CAP_{cap}, saying nothing of it: {logs}"
            );
        } else {
            assert_eq!(agent.inspect("{{.State.ExitCode}}"), "2", "{logs}");
            assert!(named, "refused without naming CAP_{cap}: {logs}");
        }
        eprintln!(
            "without CAP_{cap}: {}",
            if started { "starts, says so" } else { "exit 2" }
        );
    }
}
