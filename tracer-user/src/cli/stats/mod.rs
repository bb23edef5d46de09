//! `linger stats FILE|DIR...`: the article's table from real incidents. Incident logs and
//! live or replay JSON output (`*.jsonl`, `*.json`) are read as they are; trace files
//! (`*.trace`) are replayed through the analysis first. The same incident met in several
//! inputs counts once.

use std::{
    fs,
    io::Write,
    ops::ControlFlow,
    path::{Path, PathBuf},
};

mod table;

use super::report;
use anyhow::Context;
use serde_json::{json, Value};
use tracer_user::{
    analysis::{
        stats::{groups, By, Incidents, Sample},
        Correlator,
    },
    escape,
    output::{Existing, OutputFile},
    sink::{json as json_sink, stats_svg},
    source::replay::Replay,
};

#[derive(clap::Args)]
pub struct Args {
    /// Incident logs, JSON output of `live`/`replay`, trace files, or directories of them.
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

/// What could not be read, said on stderr and in the JSON.
#[derive(Default)]
struct Skipped {
    notes: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for input in &args.inputs {
        collect(input, &mut files)?;
    }
    let mut incidents = Incidents::default();
    let mut skipped = Skipped::default();
    let mut read = 0;
    for file in &files {
        let records = match file.extension().and_then(|e| e.to_str()) {
            Some("trace") => replayed(file, &mut skipped),
            _ => lines(file, &mut skipped),
        };
        read += 1;
        for r in &records {
            if let Some(s) = Sample::from_record(r).filter(|s| wanted(&args, s)) {
                incidents.add(s);
            }
        }
    }
    for note in &skipped.notes {
        eprintln!("linger stats: {}", escape::terminal(note));
    }
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
            "files": read,
            "groups": rows,
            "skipped": skipped.notes,
        });
        json_sink::write_line(&mut out, &report)?;
    } else if args.csv {
        out.write_all(table::csv(&rows).as_bytes())?;
    } else {
        out.write_all(escape::terminal_lines(&table::text(&rows, args.by, read)).as_bytes())?;
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

/// Files under `input`, in name order (a directory recursively).
fn collect(input: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let meta = fs::metadata(input).map_err(|e| anyhow::anyhow!("{}: {e}", escape::path(input)))?;
    if !meta.is_dir() {
        files.push(input.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = fs::read_dir(input)?.flatten().map(|e| e.path()).collect();
    entries.sort();
    for e in entries {
        let ext = e.extension().and_then(|x| x.to_str());
        if e.is_dir() {
            collect(&e, files)?;
        } else if matches!(ext, Some("jsonl" | "json" | "trace")) {
            files.push(e);
        }
    }
    Ok(())
}

/// The JSON lines of a file; lines that are not JSON are counted and skipped.
fn lines(file: &Path, skipped: &mut Skipped) -> Vec<Value> {
    let text = match fs::read(file) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => {
            skipped.notes.push(format!("{}: {e}", escape::path(file)));
            return Vec::new();
        }
    };
    let mut bad = 0;
    let values = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let v = serde_json::from_str(l).ok();
            bad += usize::from(v.is_none());
            v
        })
        .collect();
    if bad > 0 {
        skipped.notes.push(format!(
            "{}: {bad} line(s) that are not JSON skipped (a truncated or damaged log)",
            escape::path(file)
        ));
    }
    values
}

/// The incident records the analysis makes of a trace file, as JSON.
fn replayed(file: &Path, skipped: &mut Skipped) -> Vec<Value> {
    let mut replay = match Replay::open(file) {
        Ok(r) => r,
        Err(e) => {
            skipped.notes.push(format!("{}: {e}", escape::path(file)));
            return Vec::new();
        }
    };
    let mut correlator = Correlator::new(replay.meta().analysis.config.clone());
    let mut out = Vec::new();
    let result = replay.run(
        |e| {
            correlator.on_event(e, &mut out);
            ControlFlow::Continue(())
        },
        |_| {},
    );
    if let Err(e) = result {
        // What was read before the damage still counts.
        skipped.notes.push(format!(
            "{}: {e}; the incidents before it are counted",
            escape::path(file)
        ));
    }
    let read = replay.read_stats();
    for d in &read.damage {
        skipped.notes.push(format!(
            "{}: skipped {} damaged bytes at offset {} ({}); the incidents around them may be \
             incomplete",
            escape::path(file),
            d.bytes,
            d.offset,
            d.reason
        ));
    }
    if read.chunks_lost > 0 {
        skipped.notes.push(format!(
            "{}: {} chunk(s) missing",
            escape::path(file),
            read.chunks_lost
        ));
    }
    correlator.finish(&mut out);
    // As `linger replay` prints them: the same node and boot as the live output's records.
    let (node, anchor) = (report::node_of(replay.meta()), replay.meta().anchor());
    out.iter_mut()
        .map(|r| {
            report::stamp(r, &node, &anchor);
            &*r
        })
        .filter_map(|r| serde_json::to_value(r).ok())
        .collect()
}
