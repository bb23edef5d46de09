//! Copies a trace for committing as a test fixture: every chunk recompressed at a high zstd
//! level, and with `--drop-unread-controls` without the successful RM controls that no rule
//! of the analysis reads (`ledger::is_unread_control`: most of a CUDA program's driver calls).
//! The file header, the metadata and every other record stay byte for byte, in their chunks.
//!
//! With `--until S`, only the chunks that begin within the first S seconds of the recording
//! are kept: a long run's opening as a fixture, read like the trace of a recorder stopped there
//! (no closing summary).
//!
//! ```text
//! linger-trace-trim IN OUT [--drop-unread-controls] [--until S]
//! ```
//!
//! A damaged input is refused. Check what a trim kept with `linger replay --json` of both
//! files: the output must be identical (scripts/h200/suite/README.md).

use std::{
    fs::File,
    io::{Read, Write},
    path::PathBuf,
};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use tracer_user::{
    analysis::ledger::is_unread_control,
    event::UNRECORDED_LOSS_PERIOD_NS,
    source::decode::decode,
    trace::{
        format::{kind, FILE_HEADER_LEN},
        reader::Chunk,
        record::{self, Record},
        writer::encode_chunk,
        TraceReader,
    },
};

/// zstd's strongest level without its long-window mode, which a reader would need to allow.
const LEVEL: i32 = 19;

#[derive(Parser)]
struct Args {
    input: PathBuf,
    output: PathBuf,
    /// Leave out successful RM controls that no rule of the analysis reads.
    #[arg(long)]
    drop_unread_controls: bool,
    /// Keep only the chunks that begin within this many seconds of the recording's start.
    #[arg(long, value_name = "S")]
    until: Option<f64>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut head = vec![0u8; FILE_HEADER_LEN];
    File::open(&args.input)?.read_exact(&mut head)?;
    let meta_len = u32::from_le_bytes(head[16..20].try_into()?) as usize;
    head.resize(FILE_HEADER_LEN + meta_len, 0);
    File::open(&args.input)?.read_exact(&mut head)?;

    let mut reader = TraceReader::new(File::open(&args.input)?)?;
    let until = args
        .until
        .map(|s| reader.meta().start_boot_ns + (s * 1e9) as u64);
    let mut out = File::create_new(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    out.write_all(&head)?;
    let mut compressor = zstd::bulk::Compressor::new(LEVEL)?;
    let (mut body, mut stored) = (Vec::new(), Vec::new());
    let (mut kept, mut dropped) = (0u64, 0u64);
    while let Some(chunk) = reader.next_chunk()? {
        if until.is_some_and(|u| chunk.t_first_ns > u) {
            break;
        }
        body.clear();
        let mut records = 0;
        for r in chunk.records() {
            let Ok(r) = r else {
                bail!("chunk {}: a record runs past its end", chunk.seq);
            };
            match r {
                Record::Kernel(p) => {
                    let unread = decode(p).is_ok_and(|e| is_unread_control(&e.data));
                    if args.drop_unread_controls && unread {
                        dropped += 1;
                        continue;
                    }
                    record::put(&mut body, kind::KERNEL, p);
                }
                Record::Event(p) => record::put(&mut body, kind::EVENT, p),
                Record::Processes(p) => record::put(&mut body, kind::PROCESSES, p),
                Record::End(p) => record::put(&mut body, kind::END, p),
                Record::Tick { ts_ns } => record::put_tick(&mut body, ts_ns),
                Record::Loss {
                    ts_ns,
                    count,
                    period_ns,
                } => {
                    let period_ns = period_ns.unwrap_or(UNRECORDED_LOSS_PERIOD_NS);
                    record::put_loss(&mut body, ts_ns, count, period_ns)
                }
                Record::Unknown { kind, .. } => bail!("record kind {kind:#x}: not copied"),
            }
            records += 1;
        }
        kept += records;
        let copy = Chunk {
            records: records as u32,
            body: &body,
            ..chunk
        };
        encode_chunk(&copy, Some(&mut compressor), &mut stored)?;
        out.write_all(&stored)?;
    }
    let stats = reader.stats();
    ensure!(
        stats.damage.is_empty() && stats.chunks_lost == 0,
        "{}: damaged ({:?}); nothing to trim",
        args.input.display(),
        stats.damage
    );
    out.sync_all()?;
    eprintln!(
        "{}: {kept} records kept, {dropped} unread controls left out",
        args.output.display()
    );
    Ok(())
}
