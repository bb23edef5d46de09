//! `linger record`, and the recording half of `linger live --record`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use tracer_user::{
    analysis::CorrelatorConfig,
    clock::{boottime_ns, WallAnchor},
    escape,
    output::{Existing, OutputFile},
    probe::{devices, load::DEFAULT_FATAL_SIGNALS},
    source::{machine, nvml, procfs},
    trace::{meta::AnalysisDefaults, writer, EndSummary, TraceMeta, TraceWriter, WriterOptions},
};

use super::live;

/// Trace file options of `live` (and `record`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Options {
    /// Also write everything traced to this trace file, for `linger replay` and `export`.
    #[arg(long = "record", value_name = "FILE")]
    pub path: Option<PathBuf>,
    /// Keep only the program of each command line in the trace, not its arguments.
    #[arg(long)]
    pub redact_cmdline: bool,
    /// Store trace chunks uncompressed: larger files, faster replay.
    #[arg(long)]
    pub uncompressed: bool,
    /// Replace the trace file if it exists: only a regular file of linger's own user, and
    /// never through a symbolic link (a new file takes its name).
    #[arg(long)]
    pub force: bool,
}

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
pub fn run(mut args: Args) -> anyhow::Result<()> {
    if args.live.recording.path.is_some() {
        bail!("`linger record` writes to -o FILE; --record is for `linger live`");
    }
    if args.live.json || args.live.events {
        // A usage mistake, refused like clap's own before anything is loaded: the output
        // the flag asks for would silently not be there.
        use clap::CommandFactory;
        super::Cli::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "`linger record` prints no incidents or events, only a summary; for both, run \
                 `linger live --json [--events] --record FILE`",
            )
            .exit();
    }
    args.live.recording.path = Some(args.output);
    let probes = live::load(&args.live)?;
    let ready = || eprintln!("linger: recording (Ctrl-C to stop)");
    live::trace(probes, &args.live, ready, &mut std::io::sink(), &mut ())?;

    Ok(())
}

/// Creates the trace file of a live run, if asked for, with its header and process snapshot.
pub fn start(
    args: &live::Args,
    anchor: &WallAnchor,
    config: &CorrelatorConfig,
) -> anyhow::Result<Option<TraceWriter<OutputFile>>> {
    let Some(path) = &args.recording.path else {
        return Ok(None);
    };
    let meta = meta(args, anchor, config);
    let options = WriterOptions {
        zstd_level: (!args.recording.uncompressed).then_some(1),
        ..Default::default()
    };
    let existing = Existing::replace_if(args.recording.force);
    let mut w = writer::create(path, existing, &meta, options)
        .with_context(|| format!("creating the trace file {}", escape::path(path)))?;
    w.processes(&procfs::processes(args.recording.redact_cmdline));
    Ok(Some(w))
}

/// How a live run records: this machine, its signals and analysis options.
pub fn meta(args: &live::Args, anchor: &WallAnchor, config: &CorrelatorConfig) -> TraceMeta {
    TraceMeta {
        signals: if args.signals.is_empty() {
            DEFAULT_FATAL_SIGNALS.iter().map(|&s| s as u32).collect()
        } else {
            args.signals.clone()
        },
        ring_size: args.ring_size,
        analysis: AnalysisDefaults::new(config, args.count),
        redacted_cmdlines: args.recording.redact_cmdline,
        ..TraceMeta::describe(
            anchor,
            &machine::read(),
            &machine::proc_devices()
                .map(|d| devices::nvidia_listing(&d))
                .unwrap_or_default(),
            nvml::library_version(),
        )
    }
}

/// Writes the closing record and says what was written.
pub fn finish(
    recorder: Option<TraceWriter<OutputFile>>,
    args: &live::Args,
    kernel_drops: u64,
) -> anyhow::Result<()> {
    let (Some(w), Some(path)) = (recorder, &args.recording.path) else {
        return Ok(());
    };
    let summary = EndSummary {
        end_boot_ns: boottime_ns(),
        kernel_drops,
        records: w.records(),
    };
    let (_, stats) = w
        .finish(&summary)
        .with_context(|| format!("writing the trace file {}", escape::path(path)))?;
    eprintln!(
        "linger: wrote {} records in {} chunks, {} bytes ({:.1} bytes/record), to {}",
        stats.records,
        stats.chunks,
        stats.file_bytes,
        stats.file_bytes as f64 / stats.records.max(1) as f64,
        escape::path(path)
    );
    Ok(())
}
