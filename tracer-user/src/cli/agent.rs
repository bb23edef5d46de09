//! `linger agent`: the live pipeline for systemd and DaemonSets, with Prometheus metrics on
//! `--metrics-listen` and the incidents as JSON lines in `--state-dir`.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{atomic::AtomicBool, Arc},
    time::Duration,
};

use anyhow::Context;
use tracer_user::{
    agent::{
        companion::{Agent, FlightPlan},
        http,
        metrics::WriteErrors,
        node::{self, Host, HostLabel},
        self_metrics::SelfMetrics,
        web_config::{self, WebConfig},
        FlightOptions,
    },
    live::Live,
    output::IncidentLog,
};

use super::{duration, live};

/// Its own group id: the derive names a struct's group after it, and `live::Args`, flattened
/// below, is an `Args` too (clap's debug build refuses the duplicate).
#[derive(clap::Args, Clone)]
#[group(id = "agent_args")]
pub struct Args {
    /// Options from a TOML file: each key a long option of this command (`metrics_listen =
    /// "0.0.0.0:9477"`, `lean = true`, `gpu_device = ["/dev/x"]`); options given on the
    /// command line win.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where Prometheus scrapes `/metrics` (and `/healthz`). Keep it on localhost unless
    /// `--web-config-file` (or a proxy in front of it) authenticates scrapers (docs/agent.md).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9477")]
    pub metrics_listen: SocketAddr,
    /// TLS and basic auth for the metrics endpoint, in the Prometheus exporter-toolkit's
    /// web-config format (`tls_server_config`, `basic_auth_users` with bcrypt hashes).
    #[arg(long, value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
    /// Connections the metrics endpoint keeps open at most; past it, a new one takes the
    /// place of the one that has waited longest for a request.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub metrics_max_connections: usize,
    /// Directory for the incident log (`incidents.jsonl`, rotated by size); without it
    /// incidents go to stdout as JSON lines.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Rotate the incident log when it would grow past this many bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub log_max_bytes: u64,
    /// Rotated incident logs kept.
    #[arg(long, default_value_t = 4)]
    pub log_keep: usize,
    /// How much of the past the flight recorder keeps in `DIR/flight` (with --state-dir);
    /// an incident that ends with any verdict but `released`, or lingers, gets a trace file
    /// of its window there.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration::parse)]
    pub keep: Duration,
    /// The flight recorder's segments take at most this many bytes (the oldest go first).
    #[arg(long, default_value_t = 256 << 20)]
    pub flight_max_bytes: u64,
    /// No flight recorder.
    #[arg(long)]
    pub no_flight: bool,
    /// The label naming the node (from `NODE_NAME`, else the host's name): dcgm-exporter's
    /// `hostname`, or `Hostname` as its releases before PR #655 named it.
    #[arg(long, value_enum, default_value_t = HostLabelArg::Hostname)]
    pub hostname_label: HostLabelArg,
    #[command(flatten)]
    pub live: live::Args,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum HostLabelArg {
    #[value(name = "hostname")]
    Hostname,
    #[value(name = "Hostname")]
    LegacyHostname,
}

pub fn run(mut args: Args) -> anyhow::Result<()> {
    args.live.json = true;
    let web = match &args.web_config_file {
        Some(path) => web_config::load(path).context("--web-config-file")?,
        None => WebConfig::default(),
    };
    let scheme = if web.tls.is_some() { "https" } else { "http" };
    let listener = std::net::TcpListener::bind(args.metrics_listen)
        .with_context(|| format!("listening on {} for metrics", args.metrics_listen))?;
    listener
        .set_nonblocking(true)
        .context("making the metrics listener non-blocking")?;
    let addr = listener.local_addr().unwrap_or(args.metrics_listen);
    // Before the capabilities go: reading the host's name may join PID 1's UTS namespace.
    let node = node::resolve(std::env::var("NODE_NAME").ok().as_deref());
    eprintln!("linger agent: node {:?} ({})", node.name, node.from);
    let host = Host {
        label: match args.hostname_label {
            HostLabelArg::Hostname => HostLabel::Hostname,
            HostLabelArg::LegacyHostname => HostLabel::LegacyHostname,
        },
        name: node.name,
    };
    let writes = WriteErrors::default();
    let reopen = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&reopen))
        .context("handling SIGHUP")?;
    let mut config = live::config(&args.live)?;
    // Incidents and recordings name the node as the series do, not the pod.
    config.node_name = Some(host.name.clone());
    let live = Live::load(config)?;
    let flight = match (&args.state_dir, args.no_flight) {
        (Some(dir), false) => Some(FlightPlan {
            dir: dir.clone(),
            options: FlightOptions {
                keep: args.keep,
                max_bytes: args.flight_max_bytes,
                redact_cmdline: args.live.recording.redact_cmdline,
            },
        }),
        _ => None,
    };
    let mut agent = Agent::new(
        host,
        (
            listener,
            http::Options {
                max_connections: args.metrics_max_connections,
                web,
            },
        ),
        SelfMetrics::new(live.probes().program_fds()),
        writes.clone(),
        flight,
    );
    let ready = || eprintln!("linger agent: tracing; metrics on {scheme}://{addr}/metrics");
    match &args.state_dir {
        Some(dir) => {
            let mut log =
                IncidentLog::open(dir, args.log_max_bytes, args.log_keep, reopen, writes.log)?;
            eprintln!("linger agent: incidents to {}", log.path().display());
            live.run(ready, &mut log, &mut agent)?;
        }
        None => {
            live.run(ready, &mut std::io::stdout().lock(), &mut agent)?;
        }
    }
    Ok(())
}
