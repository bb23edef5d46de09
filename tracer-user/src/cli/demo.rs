//! `linger demo`: a self-contained kill, traced, on any machine.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context};
use nix::{sys::signal::Signal, unistd::Pid};
use tracer_user::live::Live;

use super::live;

#[derive(clap::Args)]
pub struct Args {
    /// Threads of the child to kill.
    #[arg(long, default_value_t = 4)]
    threads: u32,
    /// Print the incident as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let live_args = live::Args {
        duration: Some(Duration::from_secs(10)),
        json: args.json,
        pids: Vec::new(),
        comms: Vec::new(),
        signals: vec![9],
        events: false,
        count: Some(1),
        survive_after: Duration::from_secs(1),
        ring_size: 1 << 20,
        gpu_devices: Vec::new(),
        linger_after: Duration::from_secs(30),
        // The demo child holds no GPU memory.
        no_nvml: true,
        sample_hz: 4999,
        stuck_after: Duration::from_nanos(tracer_user::probe::config::STUCK_AFTER_NS),
        no_ioctls: false,
        lean: false,
        syscall_hooks: false,
        driver_hooks: Default::default(),
        kubelet_logs: tracer_user::source::workload::KUBELET_LOGS.into(),
        recording: Default::default(),
    };
    // Attach first, so the child's whole life is seen.
    let mut live = Live::load(live::config(&live_args)?)?;
    let exe = std::env::current_exe().context("finding linger's own executable")?;
    let mut child = Command::new(exe)
        .args(["__target", "--threads", &args.threads.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the demo child")?;
    let pid = child.id();
    let mut ready = String::new();
    BufReader::new(child.stdout.take().context("child stdout")?).read_line(&mut ready)?;
    if !ready.starts_with("ready") {
        bail!("the demo child did not start: {ready:?}");
    }
    eprintln!(
        "linger demo: started child {pid} with {} threads; sending SIGKILL",
        args.threads
    );
    live.analysis_mut().pids = vec![pid];
    // Kill once the collector reads the ring, so a busy machine cannot overflow it first.
    let kill_and_reap = move || {
        std::thread::spawn(move || {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            let _ = child.wait();
        });
    };
    let incidents = live.run(kill_and_reap, &mut std::io::stdout().lock(), &mut ())?;
    if incidents == 0 {
        bail!("no incident seen for the demo child {pid}");
    }
    Ok(())
}
