//! `linger export`: a trace as a timeline (Perfetto / Chrome JSON) or a flamegraph of where
//! killed processes spend their time (folded stacks, SVG).

use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufWriter, Write},
    ops::ControlFlow,
    path::PathBuf,
};

use anyhow::Context;
use tracer_user::{
    analysis::{Correlator, Incident, Output},
    escape,
    output::{Existing, OutputFile},
    sink::{folded, perfetto::ChromeTrace},
    source::replay::Replay,
};

use super::{
    progress::Progress,
    replay::{self, Filters},
};

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    /// Chrome trace event JSON, as the Perfetto UI (ui.perfetto.dev) opens it.
    Perfetto,
    /// The same JSON, for chrome://tracing.
    Chrome,
    /// Folded stacks: `command;signal;phase nanoseconds` per line.
    Folded,
    /// The folded stacks as an SVG flamegraph.
    Svg,
}

#[derive(clap::Args)]
pub struct Args {
    /// The trace file.
    file: PathBuf,
    #[arg(long, value_enum)]
    format: Format,
    /// Write here instead of to stdout (created new with mode 0600; an existing file is
    /// replaced only with --force).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Replace FILE if it exists: only a regular file of linger's own user, and only once the
    /// export is complete (a new file is renamed over it).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    filters: Filters,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (mut replay, progress) = replay::open(&args.file)?;
    match &args.output {
        Some(path) => {
            let file = OutputFile::create(path, Existing::replace_if(args.force))
                .with_context(|| format!("creating {}", escape::path(path)))?;
            let mut out = BufWriter::new(file);
            let exported = export(&args, &mut replay, &progress, &mut out);
            let mut file = out.into_inner().map_err(|e| e.into_error())?;
            if let Err(e) = exported {
                // An export that failed leaves no file behind.
                file.discard();
                return Err(e);
            }
            // A file replaced gives way to a complete export only.
            file.commit()?;
        }
        None => export(
            &args,
            &mut replay,
            &progress,
            &mut BufWriter::new(std::io::stdout().lock()),
        )?,
    }
    replay::warn_about(&replay, &args.file);
    Ok(())
}

fn export(
    args: &Args,
    replay: &mut Replay<File>,
    progress: &Progress,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut correlator = Correlator::new(args.filters.apply(replay.meta()));
    let mut outputs = Vec::new();
    // Each incident as last reported (updates replace the first record).
    let mut incidents: BTreeMap<u64, Incident> = BTreeMap::new();
    let mut keep = |outputs: &mut Vec<Output>| {
        for o in outputs.drain(..) {
            if let Output::Incident(inc) = o {
                incidents.insert(inc.id, *inc);
            }
        }
    };
    let reading = format!("reading {}", escape::path(&args.file));
    match args.format {
        Format::Perfetto | Format::Chrome => {
            let mut trace = ChromeTrace::new(&mut *out)?;
            let mut failure = None;
            let read = replay.run(
                |e| {
                    correlator.on_event(e, &mut outputs);
                    keep(&mut outputs);
                    match trace.on_event(e) {
                        Ok(()) => ControlFlow::Continue(()),
                        Err(err) => {
                            failure = Some(err);
                            ControlFlow::Break(())
                        }
                    }
                },
                |at| progress.set(at),
            );
            progress.finish();
            read.context(reading)?;
            if let Some(e) = failure {
                return Err(e.into());
            }
            correlator.finish(&mut outputs);
            keep(&mut outputs);
            for inc in incidents.values() {
                trace.on_incident(inc)?;
            }
            trace.name_processes(replay.processes());
            trace.finish()?;
        }
        Format::Folded | Format::Svg => {
            let read = replay.run(
                |e| {
                    correlator.on_event(e, &mut outputs);
                    keep(&mut outputs);
                    ControlFlow::Continue(())
                },
                |at| progress.set(at),
            );
            progress.finish();
            read.context(reading)?;
            correlator.finish(&mut outputs);
            keep(&mut outputs);
            let incidents: Vec<Incident> = incidents.into_values().collect();
            let lines = folded::lines(&incidents);
            if matches!(args.format, Format::Svg) {
                folded::svg(&lines, &mut *out)?;
            } else {
                for line in &lines {
                    writeln!(out, "{line}")?;
                }
            }
        }
    }
    out.flush()?;
    Ok(())
}
