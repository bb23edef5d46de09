//! Command-line interface: one file per command.

mod agent;
mod config;
mod demo;
mod doctor;
mod duration;
mod export;
mod holders;
mod live;
mod progress;
mod record;
mod replay;
mod stats;
mod target;
mod wait;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use tracer_user::{error::Error, escape, gate::Answer};

#[derive(Parser)]
#[command(
    name = "linger",
    version,
    about = "Why is a killed process's GPU memory still in use, and for how long?"
)]
struct Cli {
    /// More diagnostics on stderr (-v: debug, with the eBPF programs' own log; -vv: aya's too).
    /// RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Trace fatal signals live and print one incident per killed process.
    Live(live::Args),
    /// The live pipeline as a service: Prometheus metrics, an incident log.
    // A config file's options come first: the command line's, later, override them.
    #[command(args_override_self = true)]
    Agent(agent::Args),
    /// Record everything traced to a file, for replay or export elsewhere.
    Record(record::Args),
    /// Run the analysis over a recorded trace: the report live tracing printed.
    Replay(replay::Args),
    /// Convert a trace for Perfetto / chrome://tracing, or to a flamegraph.
    Export(export::Args),
    /// Try every eBPF hook type and the GPU stack; say what this machine allows.
    Doctor(doctor::Args),
    /// Every process holding GPU files now, with what NVML accounts to each.
    Holders(holders::Args),
    /// Release times, residue and collateral across incidents: logs, JSON output, traces.
    Stats(stats::Args),
    /// Wait until the GPUs are clean for the next job (0), or time out (1) naming who holds them.
    Wait(wait::Args),
    /// Start a multi-threaded child, SIGKILL it and print the incident.
    Demo(demo::Args),
    /// A process for demo and tests to kill (not for users).
    #[command(name = "__target", hide = true)]
    Target(target::Args),
}

pub fn main() -> ExitCode {
    let cli = match config::expand(&Cli::command(), std::env::args_os().collect()) {
        Ok(argv) => Cli::parse_from(argv),
        Err(e) => {
            eprintln!("linger: {}", escape::terminal_lines(&format!("{e:#}")));
            return ExitCode::FAILURE;
        }
    };
    init_logging(cli.verbose);
    if let Command::Wait(args) = cli.command {
        // 1 is wait's timeout: its other failures have answers of their own.
        return wait::run(args).unwrap_or_else(|e| {
            let answer = if is_permission(&e) {
                Answer::NotPermitted
            } else {
                Answer::CannotTell
            };
            print_error(&e);
            ExitCode::from(answer.exit_code())
        });
    }
    let result = match cli.command {
        Command::Live(args) => live::run(args),
        Command::Agent(args) => agent::run(args),
        Command::Record(args) => record::run(args, usage_conflict),
        Command::Replay(args) => replay::run(args),
        Command::Export(args) => export::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Holders(args) => holders::run(args),
        Command::Stats(args) => stats::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Target(args) => target::run(args),
        Command::Wait(_) => unreachable!("handled above"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failed(e),
    }
}

/// A usage mistake a command finds in its options, refused like clap's own (exit 2).
fn usage_conflict(message: &str) -> ! {
    Cli::command()
        .error(clap::error::ErrorKind::ArgumentConflict, message)
        .exit()
}

fn failed(e: anyhow::Error) -> ExitCode {
    print_error(&e);
    if is_permission(&e) {
        ExitCode::from(2)
    } else {
        ExitCode::FAILURE
    }
}

fn print_error(e: &anyhow::Error) {
    // Errors quote paths and trace contents, which others may have chosen.
    eprintln!("linger: {}", escape::terminal_lines(&format!("{e:#}")));
}

fn is_permission(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| matches!(c.downcast_ref::<Error>(), Some(Error::Permission(_))))
}

fn init_logging(verbose: u8) {
    // -v: our own debug output and the eBPF programs' log; -vv adds aya's loader details.
    let default = match verbose {
        0 => "warn",
        1 => "warn,linger=debug,tracer_user=debug,linger_probes=debug",
        2 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format_timestamp_millis()
        .init();
}
