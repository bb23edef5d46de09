//! `linger stats FILE|DIR...`: the article's table from real incidents. Each file, named or
//! found in a directory (recursively, in name order), is told by its contents, whatever its
//! name (`*.lgr`, `*.trace`, `*.jsonl`, none): a trace (the magic `\x89LINGER\n` first) is
//! replayed through the analysis; an incident log or live/replay JSON output (a JSON object
//! first) is read as it is; any other file (text, binary, empty) is said and skipped, as is
//! what cannot be read, and the rest is counted.
//!
//! The same incident (boot id, incident id, signal time, pid) met in several files counts once.
//! Its record is taken from a replayed trace over a saved log (a live output recorded beside
//! its trace holds the same incidents: the trace's replay is what this linger's analysis says
//! of them), then a settled record over an unsettled one, then the file whose path sorts
//! first: the same whatever the order of the files. Which file gave what is said: on stderr
//! ("incidents.jsonl: 60 incident(s) also in campaign.trace; that trace's replay was used")
//! and in the JSON's `inputs`.

use std::{
    collections::BTreeSet,
    io::Write,
    path::{Path, PathBuf},
};

mod inputs;
mod table;

use anyhow::Context;
use serde_json::{json, Value};
use tracer_user::{
    analysis::{
        merge::{Contribution, Incidents, Source},
        stats::{groups, By, Sample},
    },
    escape,
    output::{Existing, OutputFile},
    sink::{json as json_sink, stats_svg},
};

#[derive(clap::Args)]
pub struct Args {
    /// Incident logs, JSON output of `live`/`replay`, traces, or directories of them (each
    /// file told by its contents).
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// What a row is.
    #[arg(long, value_enum, default_value_t = By::Termination)]
    by: By,
    /// Only incidents at or after this wall-clock time (RFC 3339, e.g. 2026-12-01T00:00:00Z;
    /// incidents without one, from older recordings, are left out).
    #[arg(long)]
    since: Option<jiff::Timestamp>,
    /// Only incidents on this GPU (NVML index; repeatable).
    #[arg(long = "gpu")]
    gpus: Vec<u64>,
    /// Only incidents of this command name (repeatable).
    #[arg(long = "comm")]
    comms: Vec<String>,
    /// Only incidents of this pod (repeatable).
    #[arg(long = "pod")]
    pods: Vec<String>,
    /// One JSON object.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Comma-separated values, one row per group.
    #[arg(long)]
    csv: bool,
    /// Also draw each group's release times on a logarithmic time axis into this SVG file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Replace the SVG file if it exists (only a regular file of linger's own user).
    #[arg(long)]
    force: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // What could not be read, said on stderr and in the JSON.
    let mut skipped = Vec::new();
    let (mut seen, mut files) = (BTreeSet::new(), Vec::new());
    for input in &args.inputs {
        inputs::collect(input, &mut seen, &mut files, &mut skipped)?;
    }
    let mut incidents = Incidents::default();
    let mut read = Vec::new();
    for file in &files {
        let Some((source, records)) = inputs::read(file, &mut skipped) else {
            continue;
        };
        let f = incidents.file(file, source);
        read.push((file.as_path(), source));
        for r in &records {
            if let Some(s) = Sample::from_record(r).filter(|s| wanted(&args, s)) {
                incidents.add(f, s);
            }
        }
    }
    let given = incidents.contributions();
    for note in skipped.iter().chain(&overlaps(&read, &given)) {
        eprintln!("linger stats: {}", escape::terminal(note));
    }
    // A script must tell "no incidents" from "nothing could be read".
    anyhow::ensure!(
        !read.is_empty(),
        "no trace or incident log could be read among the inputs ({} skipped)",
        skipped.len()
    );
    let rows = groups(incidents.samples(), args.by);
    if let Some(path) = &args.svg {
        let by = format!("{:?}", args.by).to_lowercase();
        let mut file = OutputFile::create(path, Existing::replace_if(args.force))
            .with_context(|| format!("creating {}", escape::path(path)))?;
        file.write_all(stats_svg::render(&rows, &by).as_bytes())?;
        file.commit()?;
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = json!({
            "type": "stats",
            "by": format!("{:?}", args.by).to_lowercase(),
            "files": read.len(),
            "inputs": inputs_json(&read, &given),
            "groups": rows,
            "skipped": skipped,
        });
        json_sink::write_line(&mut out, &report)?;
    } else if args.csv {
        out.write_all(table::csv(&rows).as_bytes())?;
    } else {
        out.write_all(escape::terminal_lines(&table::text(&rows, args.by, read.len())).as_bytes())?;
    }
    Ok(())
}

fn wanted(args: &Args, s: &Sample) -> bool {
    let since = args.since.is_none_or(|t| {
        s.wall_time
            .as_deref()
            .and_then(|w| w.parse::<jiff::Timestamp>().ok())
            .is_some_and(|w| w >= t)
    });
    since
        && (args.gpus.is_empty() || s.gpu.is_some_and(|g| args.gpus.contains(&g)))
        && (args.comms.is_empty() || args.comms.contains(&s.comm))
        && (args.pods.is_empty() || s.pod.as_ref().is_some_and(|p| args.pods.contains(p)))
}

/// Per file read: its kind, the incidents counted from it, and those taken from another file.
fn inputs_json(read: &[(&Path, Source)], given: &[Contribution]) -> Vec<Value> {
    read.iter()
        .zip(given)
        .map(|(&(path, source), c)| {
            let taken: serde_json::Map<String, Value> = c
                .taken_from
                .iter()
                .map(|(&from, &n)| (escape::path(read[from].0), n.into()))
                .collect();
            json!({
                "file": escape::path(path),
                "kind": source,
                "counted": c.counted,
                "duplicates": c.duplicates,
                "taken_from": taken,
            })
        })
        .collect()
}

/// A line per file and other file it shares incidents with, saying whose record was used.
fn overlaps(read: &[(&Path, Source)], given: &[Contribution]) -> Vec<String> {
    let mut notes = Vec::new();
    for (&(path, _), c) in read.iter().zip(given) {
        for (&from, n) in &c.taken_from {
            let (other, source) = read[from];
            let used = match source {
                Source::Trace => "that trace's replay was used",
                Source::Log => "that log's record was used",
            };
            notes.push(format!(
                "{}: {n} incident(s) also in {}; {used}",
                escape::path(path),
                escape::path(other)
            ));
        }
    }
    notes
}
