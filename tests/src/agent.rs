//! Helpers of the agent's tests: `linger agent` on a stand-in device, plain HTTP requests to
//! it, and a real Prometheus (Debian's package) asked through its HTTP API.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc::channel,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{linger, Guarded};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `linger agent` on the stand-in device, once it says it traces.
pub fn agent(device: &Path, port: u16, extra: &[&str]) -> Guarded {
    let mut cmd = linger();
    cmd.args(agent_args(device, port)).args(extra);
    start(cmd)
}

/// The arguments of [`agent`]: the stand-in device, no NVML, metrics on `port`.
pub fn agent_args(device: &Path, port: u16) -> Vec<String> {
    let device = device.to_str().expect("UTF-8 device path");
    [
        "agent",
        "--no-nvml",
        "--linger-after",
        "2s",
        "--gpu-device",
        device,
        "--metrics-listen",
        &format!("127.0.0.1:{port}"),
    ]
    .map(String::from)
    .to_vec()
}

/// Starts `cmd` (an agent, or what runs one) and waits until the agent says it traces.
pub fn start(mut cmd: std::process::Command) -> Guarded {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start linger agent");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = channel();
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("agent: {line}");
            if line.contains("tracing") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the agent attached");
    Guarded(child)
}

/// One HTTP GET on 127.0.0.1, each step bounded by 10 s: (status line, body).
pub fn get(port: u16, path: &str) -> std::io::Result<(String, String)> {
    let bound = Duration::from_secs(10);
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), bound)?;
    s.set_read_timeout(Some(bound))?;
    s.set_write_timeout(Some(bound))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    Ok((
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    ))
}

/// Debian's Prometheus with `config` (YAML), its data in `dir`, and its port.
pub fn prometheus(dir: &Path, config: &str) -> (Guarded, u16) {
    let port = free_port();
    let file = dir.join("prometheus.yml");
    std::fs::write(&file, config).expect("prometheus.yml");
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus from Debian's package (apt-get install prometheus)");
    (Guarded(child), port)
}

/// The `data` of a Prometheus API answer at `path`; Null while it does not answer, or
/// answers 503 as it does between opening its port and loading its storage (seconds on a
/// busy machine).
pub fn api(port: u16, path: &str) -> Value {
    let Ok((status, body)) = get(port, path) else {
        return Value::Null;
    };
    if status.contains(" 503 ") {
        return Value::Null;
    }
    assert!(status.contains("200"), "{status}: {body}");
    let v: Value = serde_json::from_str(&body).expect("Prometheus answers JSON");
    v["data"].clone()
}

/// Prometheus's answer to an instant query: the result vector.
pub fn query(port: u16, promql: &str) -> Vec<Value> {
    let encoded: String = promql
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    api(port, &format!("/api/v1/query?query={encoded}"))["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

pub fn eventually<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(200));
    }
}

/// A sample's value.
pub fn value(sample: &Value) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}
