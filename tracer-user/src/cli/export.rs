//! `linger export`: a trace as a timeline (Perfetto / Chrome JSON) or a flamegraph of where
//! killed processes spend their time (folded stacks, SVG).

use std::{
    fs::File,
    io::{BufWriter, Write},
    ops::ControlFlow,
    path::PathBuf,
};

use anyhow::Context;
use tracer_user::{
    analysis::{Correlator, Incident},
    escape,
    sink::{folded, perfetto::ChromeTrace},
};

use super::replay::{self, Filters};

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
    /// Write here instead of to stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    filters: Filters,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (mut replay, progress) = replay::open(&args.file)?;
    let mut correlator = Correlator::new(args.filters.apply(replay.meta()));
    let out: Box<dyn Write> = match &args.output {
        Some(path) => {
            Box::new(File::create(path).with_context(|| format!("creating {}", path.display()))?)
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = BufWriter::new(out);
    let mut closed = Vec::new();
    let reading = format!("reading {}", escape::path(&args.file));
    match args.format {
        Format::Perfetto | Format::Chrome => {
            let mut trace = ChromeTrace::new(&mut out)?;
            let mut failure = None;
            let draw = |trace: &mut ChromeTrace<_>, incidents: &mut Vec<Incident>| {
                incidents
                    .drain(..)
                    .try_for_each(|inc| trace.on_incident(&inc))
            };
            let read = replay.run(
                |e| {
                    correlator.on_event(e, &mut closed);
                    match trace
                        .on_event(e)
                        .and_then(|()| draw(&mut trace, &mut closed))
                    {
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
            correlator.finish(&mut closed);
            draw(&mut trace, &mut closed)?;
            trace.name_processes(replay.processes());
            trace.finish()?;
        }
        Format::Folded | Format::Svg => {
            let mut incidents = Vec::new();
            let read = replay.run(
                |e| {
                    correlator.on_event(e, &mut closed);
                    incidents.append(&mut closed);
                    ControlFlow::Continue(())
                },
                |at| progress.set(at),
            );
            progress.finish();
            read.context(reading)?;
            correlator.finish(&mut incidents);
            let lines = folded::lines(&incidents);
            if matches!(args.format, Format::Svg) {
                folded::svg(&lines, &mut out)?;
            } else {
                for line in &lines {
                    writeln!(out, "{line}")?;
                }
            }
        }
    }
    out.flush()?;
    replay::warn_about(&replay, &args.file);
    Ok(())
}
