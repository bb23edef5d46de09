//! `linger __target`: a multi-threaded process that waits to be signalled.

use std::{
    ffi::{CString, OsString},
    io::Write,
    os::unix::ffi::OsStrExt,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum OnTerm {
    /// Leave SIGTERM's default action (the process dies).
    Default,
    /// Handle SIGTERM and carry on.
    Survive,
    /// Handle SIGTERM and exit(0) from the main thread.
    Exit,
}

#[derive(clap::Args)]
pub struct Args {
    /// Threads in total, the main one included.
    #[arg(long, default_value_t = 4)]
    threads: u32,
    #[arg(long, value_enum, default_value_t = OnTerm::Default)]
    on_term: OnTerm,
    /// Rename the process (prctl PR_SET_NAME, any bytes but NUL, cut to 15), as a hostile
    /// user's process can: tests show that such names reach no output raw.
    #[arg(long)]
    name: Option<OsString>,
    /// Start a child that exits at once and is never reaped (printed as `child PID` after
    /// `ready`): dying, the process hands that zombie to a subreaper, which a SIGCHLD tells.
    #[arg(long)]
    zombie_child: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(name) = &args.name {
        // Before the other threads start, so that they inherit it.
        nix::sys::prctl::set_name(&CString::new(name.as_bytes())?)?;
    }
    let term = Arc::new(AtomicBool::new(false));
    if !matches!(args.on_term, OnTerm::Default) {
        signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&term))?;
    }
    for _ in 1..args.threads.max(1) {
        thread::spawn(|| loop {
            thread::park();
        });
    }
    // Never waited for: it stays a zombie child of this process.
    let child = args
        .zombie_child
        .then(|| std::process::Command::new("/bin/true").spawn())
        .transpose()?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {}", std::process::id())?;
    if let Some(child) = &child {
        writeln!(out, "child {}", child.id())?;
    }
    out.flush()?;
    drop(out);
    loop {
        thread::sleep(Duration::from_millis(5));
        if term.swap(false, Ordering::Relaxed) {
            match args.on_term {
                OnTerm::Exit => return Ok(()),
                OnTerm::Survive => println!("survived SIGTERM"),
                OnTerm::Default => {}
            }
        }
    }
}
