//! `linger record`: the live pipeline writing a trace file, printing only a summary.

use std::path::PathBuf;

use anyhow::bail;
use tracer_user::live::Live;

use super::live;

#[derive(clap::Args)]
pub struct Args {
    /// The trace file to write (created new with mode 0600: it holds command lines; an
    /// existing one is replaced only with --force).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
    #[command(flatten)]
    live: live::Args,
}

/// Records until `--duration`, `--count` incidents or Ctrl-C; prints only a summary.
/// `usage_conflict` refuses a usage mistake as clap refuses its own.
pub fn run(mut args: Args, usage_conflict: fn(&str) -> !) -> anyhow::Result<()> {
    if args.live.recording.path.is_some() {
        bail!("`linger record` writes to -o FILE; --record is for `linger live`");
    }
    if args.live.json || args.live.events {
        // Refused before anything is loaded: the output the flag asks for would silently
        // not be there.
        usage_conflict(
            "`linger record` prints no incidents or events, only a summary; for both, run \
             `linger live --json [--events] --record FILE`",
        );
    }
    args.live.recording.path = Some(args.output);
    let live = Live::load(live::config(&args.live)?)?;
    let ready = || eprintln!("linger: recording (Ctrl-C to stop)");
    live.run(ready, &mut std::io::sink(), &mut ())?;
    Ok(())
}
