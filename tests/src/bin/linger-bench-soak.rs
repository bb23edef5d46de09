//! The agent's soak benchmark: `linger agent` runs while this process SIGKILLs KILLS plain
//! processes (`/bin/sleep` spawned, killed, reaped), sampling the agent's RSS as it goes; at the
//! end the agent's own metrics say how many kill incidents it counted and what it lost. Prints
//! one JSON object.

use std::{
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Command, Stdio},
    sync::mpsc::channel,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Parser;
use linger_tests::bench::Nice;
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::json;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "target/release/linger")]
    linger: PathBuf,
    #[arg(long, default_value_t = 100_000)]
    kills: u32,
    /// RSS samples over the run.
    #[arg(long, default_value_t = 10)]
    samples: u32,
    #[command(flatten)]
    nice: Nice,
    /// The agent's state directory (its incident log, rotated at 16 MiB, 2 kept).
    #[arg(long, default_value = "target/bench/soak-state")]
    state_dir: PathBuf,
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")
}

fn metrics(port: u16) -> Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    Ok(reply)
}

/// The sum of every sample of `name` whose labels contain `with`.
fn sum(text: &str, name: &str, with: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn main() -> Result<()> {
    let args = Args::parse();
    args.nice.apply()?;
    let _ = fs::remove_dir_all(&args.state_dir);
    fs::create_dir_all(&args.state_dir)?;
    fs::set_permissions(
        &args.state_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut agent = Command::new(&args.linger)
        .args([
            "agent",
            "--no-nvml",
            "--log-max-bytes",
            "16777216",
            "--log-keep",
            "2",
        ])
        .arg("--state-dir")
        .arg(&args.state_dir)
        .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting linger agent")?;
    let (tx, rx) = channel();
    let stderr = agent.stderr.take().context("stderr")?;
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("tracing") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .context("the agent did not start")?;
    let pid = agent.id();
    let every = (args.kills / args.samples.max(1)).max(1);
    let mut samples = vec![json!({"kills": 0, "rss_kib": rss_kib(pid)?})];
    let start = Instant::now();
    for i in 1..=args.kills {
        let mut child = Command::new("/bin/sleep")
            .arg("60")
            .stdin(Stdio::null())
            .spawn()
            .context("spawning sleep")?;
        kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL)?;
        child.wait()?;
        if i % every == 0 {
            samples.push(json!({"kills": i, "rss_kib": rss_kib(pid)?}));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    // The last incidents are written on the agent's next ticks.
    thread::sleep(Duration::from_secs(2));
    let text = metrics(port)?;
    let counted = sum(&text, "linger_incidents_total{", "termination=\"kill\"") as u64;
    let lost = sum(&text, "linger_lost_records_total", "") as u64;
    let log_errors = sum(&text, "linger_log_write_errors_total", "") as u64;
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM)?;
    let status = agent.wait()?;
    if !status.success() {
        bail!("the agent exited with {status}");
    }
    println!(
        "{}",
        json!({
            "kills": args.kills,
            "seconds": seconds,
            "samples": samples,
            "incidents_counted": counted,
            "lost_records": lost,
            "log_write_errors": log_errors,
        })
    );
    Ok(())
}
