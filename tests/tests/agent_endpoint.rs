//! The agent's metrics endpoint for real: a real Prometheus (Debian's package) scrapes it over
//! TLS with basic auth from a web-config file, a wrong password gets 401; 10,000 idle and
//! slow connections and a 1 MB header never keep a scraper out; and the agent's own cost is
//! served, its eBPF programs' runs only while the kernel counts them.

use std::{
    fs,
    io::{Read, Write},
    net::TcpStream,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use linger_tests::{
    agent::{agent, api, eventually, free_port, get, prometheus, query, value},
    stand_in_device, TempDir,
};
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use serde_json::Value;
use tokio::{io::AsyncWriteExt, task::JoinSet, time::sleep};

/// The agents of this file are loaded one at a time: the flood of one test would slow another.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

const PASSWORD: &str = "scrape-with-me";

#[test]
fn prometheus_scrapes_over_tls_with_basic_auth_and_a_wrong_password_gets_401() {
    let _serial = serial();
    let dir = TempDir::private("agent-tls");
    let device = stand_in_device(dir.path());
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
        .expect("a self-signed certificate");
    fs::write(dir.join("cert.pem"), cert.cert.pem()).expect("cert.pem");
    fs::write(dir.join("key.pem"), cert.signing_key.serialize_pem()).expect("key.pem");
    // As `htpasswd -nBC 10` writes it.
    let hash = bcrypt::hash_with_result(PASSWORD, 10)
        .expect("bcrypt")
        .format_for_version(bcrypt::Version::TwoY);
    assert!(hash.starts_with("$2y$10$"), "{hash}");
    let web = dir.join("web.yml");
    // Relative file names: beside the web config.
    fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n\
             basic_auth_users:\n  prometheus: '{hash}'\n"
        ),
    )
    .expect("web.yml");
    let port = free_port();
    let _agent = agent(
        &device,
        port,
        &["--web-config-file", web.to_str().expect("UTF-8")],
    );
    let ca = dir.join("cert.pem");
    let job = |name: &str, scheme: &str, password: &str| {
        format!(
            "  - job_name: {name}\n    scheme: {scheme}\n    tls_config:\n      ca_file: {}\n    \
             basic_auth:\n      username: prometheus\n      password: {password}\n    \
             static_configs:\n      - targets: ['127.0.0.1:{port}']\n",
            ca.display()
        )
    };
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n{}{}{}",
        job("linger", "https", PASSWORD),
        job("wrong_password", "https", "guess"),
        job("plain_http", "http", PASSWORD),
    );
    let (_prometheus, prom) = prometheus(dir.path(), &config);
    eventually(
        "Prometheus to scrape the agent over TLS",
        Duration::from_secs(30),
        || {
            let up = query(prom, "up{job=\"linger\"}");
            (up.len() == 1 && value(&up[0]) == 1.0).then_some(())
        },
    );
    let build = query(prom, "linger_build_info{job=\"linger\"}");
    assert_eq!(build.len(), 1, "{build:?}");
    let cpu = query(prom, "process_cpu_seconds_total{job=\"linger\"}");
    assert!(cpu.len() == 1 && value(&cpu[0]) > 0.0, "{cpu:?}");

    // Each other job is down, for its own reason.
    let down = |job: &str| -> Value {
        eventually(&format!("{job} scraped"), Duration::from_secs(30), || {
            api(prom, "/api/v1/targets")["activeTargets"]
                .as_array()?
                .iter()
                .find(|t| t["labels"]["job"] == job && t["health"] != "unknown")
                .cloned()
        })
    };
    let wrong = down("wrong_password");
    assert_eq!(wrong["health"], "down", "{wrong}");
    assert!(
        wrong["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("401")),
        "{wrong}"
    );
    let plain = down("plain_http");
    assert_eq!(
        plain["health"], "down",
        "plain HTTP on the TLS port: {plain}"
    );
}

/// Whether a read or write gave up waiting (the peer neither answered nor closed).
fn timed_out<T>(r: &std::io::Result<T>) -> bool {
    r.as_ref().is_err_and(|e| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    })
}

fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))?
        .parse()
        .ok()
}

const HOSTILE: u64 = 10_000;

#[test]
fn hostile_clients_never_keep_a_scraper_out() {
    let _serial = serial();
    // The test's own descriptors: 10,000 connections and some room.
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
    let hostile = HOSTILE.min(hard.saturating_sub(1000));
    let dir = TempDir::private("agent-hostile");
    let device = stand_in_device(dir.path());
    let port = free_port();
    // The agent inherits this test's descriptor limit: nothing but its own limit on
    // connections stops it from holding all 10,000.
    let _agent = agent(&device, port, &[]);
    let (status, body) = get(port, "/metrics").expect("a scrape before");
    assert!(status.contains("200"), "{status}");
    let fds_before = metric(&body, "process_open_fds").expect("process_open_fds");

    let tried = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let (tried, stop) = (Arc::clone(&tried), Arc::clone(&stop));
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(flood(port, hostile, &tried, &stop));
        })
    };
    eventually(
        "every hostile connection tried",
        Duration::from_secs(60),
        || (tried.load(Ordering::Relaxed) == hostile).then_some(()),
    );

    // A 1 MB header: answered 431 or cut off, never read to its end.
    let mut big = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    big.set_write_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    big.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut head = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
    head.resize(head.len() + (1 << 20), b'a');
    head.extend_from_slice(b"\r\n\r\n");
    let wrote = big.write_all(&head);
    let mut answer = Vec::new();
    let read = big.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        !timed_out(&wrote) && !timed_out(&read),
        "a 1 MB header held the connection: {answer}"
    );
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "a 1 MB header was answered: {answer}"
    );

    // The scraper gets its answer, every time, while the flood is held.
    for _ in 0..3 {
        let (status, body) = get(port, "/metrics").expect("a scrape during the flood");
        assert!(status.contains("200"), "{status}");
        assert!(body.ends_with("# EOF\n"), "a whole answer");
        // At most --metrics-max-connections (256) of them are open in the agent.
        let fds = metric(&body, "process_open_fds").expect("process_open_fds");
        assert!(
            fds <= fds_before + 256.0 + 16.0,
            "{fds} descriptors open during the flood, {fds_before} before"
        );
    }
    stop.store(true, Ordering::Relaxed);
    flood.join().expect("the flood ends");
}

/// `n` connections to `port`: nine in ten send nothing, one in ten sends its headers a line a
/// second; held until `stop` (dropped with the runtime), each counted in `tried` once its
/// connect is answered or timed out.
async fn flood(port: u16, n: u64, tried: &Arc<AtomicU64>, stop: &AtomicBool) {
    let mut held = JoinSet::new();
    for i in 0..n {
        let tried = Arc::clone(tried);
        held.spawn(async move {
            let connect = tokio::net::TcpStream::connect(("127.0.0.1", port));
            let connected = tokio::time::timeout(Duration::from_secs(10), connect).await;
            tried.fetch_add(1, Ordering::Relaxed);
            let Ok(Ok(mut s)) = connected else {
                return;
            };
            if i % 10 == 0 {
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n").await;
                for line in 0.. {
                    sleep(Duration::from_secs(1)).await;
                    if s.write_all(format!("X-{line}: y\r\n").as_bytes())
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
            std::future::pending::<()>().await;
        });
    }
    // Bounded by the test's own limits: `stop` comes, or a panic ends the test.
    while !stop.load(Ordering::Relaxed) {
        sleep(Duration::from_millis(100)).await;
    }
    held.abort_all();
}

/// Sets `kernel.bpf_stats_enabled` for the test and puts the old value back after it.
struct BpfStats(String);

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    fn set(on: bool) -> Self {
        let old = fs::read_to_string(BPF_STATS).expect("kernel.bpf_stats_enabled");
        Self::write(on);
        Self(old)
    }

    fn write(on: bool) {
        fs::write(BPF_STATS, if on { "1" } else { "0" }).expect("setting bpf_stats_enabled");
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write(BPF_STATS, self.0.trim());
    }
}

/// The programs' runs as served, by program.
fn runs(body: &str) -> Vec<(String, f64)> {
    body.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("linger_bpf_program_runs_total{program=\"")?;
            let (name, value) = rest.split_once("\"} ")?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn the_programs_runs_are_served_only_while_the_kernel_counts_them() {
    let _serial = serial();
    let _stats = BpfStats::set(false);
    let dir = TempDir::private("agent-bpf-stats");
    let device = stand_in_device(dir.path());
    let port = free_port();
    let _agent = agent(&device, port, &[]);
    let (_, body) = get(port, "/metrics").expect("metrics");
    assert_eq!(
        metric(&body, "linger_bpf_stats_enabled"),
        Some(0.0),
        "{body}"
    );
    assert!(
        runs(&body).is_empty(),
        "no count while the kernel keeps none"
    );
    assert!(!body.contains("linger_bpf_program_run_seconds"), "{body}");

    BpfStats::write(true);
    // The scheduler's hook runs at every context switch.
    let first = eventually("runs counted", Duration::from_secs(10), || {
        let (_, body) = get(port, "/metrics").ok()?;
        let r = runs(&body);
        r.iter()
            .find(|(p, n)| p == "teardown_switch" && *n > 0.0)
            .map(|(_, n)| (*n, body.clone()))
    });
    assert_eq!(metric(&first.1, "linger_bpf_stats_enabled"), Some(1.0));
    assert!(
        first
            .1
            .contains("linger_bpf_program_run_seconds_total{program=\"teardown_switch\"}"),
        "{}",
        first.1
    );
    let later = eventually("more runs", Duration::from_secs(10), || {
        let (_, body) = get(port, "/metrics").ok()?;
        runs(&body)
            .into_iter()
            .find(|(p, n)| p == "teardown_switch" && *n > first.0)
    });
    assert!(later.1 > first.0);
    let names: Vec<String> = runs(&first.1).into_iter().map(|(p, _)| p).collect();
    assert!(names.iter().any(|n| n == "signal_generate"), "{names:?}");
}
