//! `linger replay`: the live analysis over a recorded trace; for the same events, the same
//! lines as `linger live` printed.

use std::{fs::File, path::Path, path::PathBuf, time::Duration};

use anyhow::Context;
use tracer_user::{
    analysis::CorrelatorConfig,
    escape,
    live::report::{self, Output, Report},
    source::replay::Replay,
    trace::TraceMeta,
};

use super::{duration, progress::Progress};

#[derive(clap::Args)]
pub struct Args {
    /// The trace file (from `linger record` or `linger live --record`).
    file: PathBuf,
    /// One JSON object per incident (schema: docs/incident-json.md).
    #[arg(long)]
    json: bool,
    /// Also print every event as a JSON line.
    #[arg(long)]
    events: bool,
    /// Stop after this many incidents (default: the recording's --count).
    #[arg(long)]
    count: Option<usize>,
    #[command(flatten)]
    filters: Filters,
}

/// Analysis options; each defaults to what the recording command was given.
#[derive(clap::Args)]
pub struct Filters {
    /// Only incidents of this target pid (repeatable).
    #[arg(long = "pid")]
    pids: Vec<u32>,
    /// Only incidents of targets with this command name (repeatable).
    #[arg(long = "comm")]
    comms: Vec<String>,
    /// A process still alive this long after a catchable signal survived it.
    #[arg(long, value_parser = duration::parse)]
    survive_after: Option<Duration>,
    /// Drop the recording's --pid, --comm and --count: every incident in the file.
    #[arg(long)]
    all: bool,
}

impl Filters {
    /// The recording's analysis options with these overrides.
    pub fn apply(&self, meta: &TraceMeta) -> CorrelatorConfig {
        let mut config = meta.analysis.config.clone();
        if self.all {
            config.pids.clear();
            config.comms.clear();
        }
        if !self.pids.is_empty() {
            config.pids = self.pids.clone();
        }
        if !self.comms.is_empty() {
            config.comms = self.comms.clone();
        }
        if let Some(d) = self.survive_after {
            config.survive_after_ns = d.as_nanos() as u64;
        }
        config
    }
}

/// Opens a trace for reading; a file that is not a usable trace is an error (exit code 1).
pub fn open(path: &Path) -> anyhow::Result<(Replay<File>, Progress)> {
    let replay = Replay::open(path).with_context(|| escape::path(path))?;
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    Ok((replay, Progress::new(len, "reading")))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (mut replay, progress) = open(&args.file)?;
    let meta = replay.meta().clone();
    let config = args.filters.apply(&meta);
    let recorded_count = meta.analysis.count.filter(|_| !args.filters.all);
    let output = Output {
        json: args.json,
        events: args.events,
        count: args.count.or(recorded_count.map(|n| n as usize)),
    };
    let mut out = progress.writer(std::io::stdout().lock());
    let node = report::node_of(&meta);
    let mut report = Report::new(&mut out, output, meta.anchor(), config, node);
    let read = replay.run(|e| report.on_event(e), |at| progress.set(at));
    progress.finish();
    read.with_context(|| format!("reading {}", escape::path(&args.file)))?;
    report.finish()?;
    warn_about(&replay, &args.file);
    Ok(())
}

/// Says on stderr what could not be replayed.
pub fn warn_about(replay: &Replay<File>, path: &Path) {
    let path = escape::path(path);
    let read = replay.read_stats();
    for d in &read.damage {
        eprintln!(
            "linger: {}: skipped {} bytes at offset {}: {}",
            path,
            d.bytes,
            d.offset,
            escape::terminal(&d.reason)
        );
    }
    if read.chunks_lost > 0 {
        eprintln!(
            "linger: {}: {} chunk(s) missing between good ones; incidents around them may be incomplete",
            path,
            read.chunks_lost
        );
    }
    let stats = replay.stats();
    if stats.undecodable > 0 {
        eprintln!(
            "linger: {} kernel record(s) could not be decoded (skipped live too)",
            stats.undecodable
        );
    }
    if stats.unknown > 0 {
        eprintln!(
            "linger: skipped {} record(s) of kinds this linger does not know (written by a newer one)",
            stats.unknown
        );
    }
    if stats.damaged > 0 {
        eprintln!(
            "linger: skipped {} damaged event(s) of kinds this linger knows (a field missing or \
             of the wrong type)",
            stats.damaged
        );
    }
    if stats.malformed_chunks > 0 {
        eprintln!(
            "linger: {} chunk(s) held a record running past their end; the rest of each was skipped",
            stats.malformed_chunks
        );
    }
    if replay.read_to_end() && replay.end().is_none() && read.damage.is_empty() {
        eprintln!("linger: {path}: no end record: the recorder did not close the file (killed?)");
    }
}
