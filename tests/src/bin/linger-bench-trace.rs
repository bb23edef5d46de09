//! Trace file benchmark: bytes per event, the recorder's cost per event, and the replay decode
//! rate from the page cache, for chunks stored plain and zstd-compressed.
//!
//! ```text
//! linger-bench-trace --events 2000000 --rounds 3 --nice -19
//! ```
//!
//! Needs no root (but `--nice` below 0 does). The records are built in the kernel's layout
//! (`tracer_common`) with a mix like a GPU training job's teardown, GPU ioctls first, and go
//! through the real writer, reader and decoder. Each round writes the file again and reads it
//! back three ways, all from the page cache (the file was just written): the chunks alone
//! (`TraceReader`: read, CRC, decompress), a replay on one thread (`Replay::new`: the same plus
//! decoding every record), and a replay as `linger replay` runs it (`Replay::open`: chunks read
//! on a second thread). Prints one JSON object on stdout; `cargo xtask bench` turns it into a
//! table.

use std::{
    fs::File,
    hint::black_box,
    mem::{offset_of, size_of},
    ops::ControlFlow,
    path::Path,
    time::Instant,
};

use anyhow::{ensure, Result};
use clap::Parser;
use linger_tests::bench::Nice;
use serde_json::{json, Value};
use tracer_common as c;
use tracer_user::{
    event::{Event, EventData},
    output::Existing,
    source::replay::Replay,
    trace::{writer, TraceMeta, TraceReader, WriterOptions},
};

/// One ring buffer record: header, then `payload_len` bytes with `comm` at `comm_at`.
fn record(kind: c::Kind, payload_len: usize, comm_at: Option<usize>, seq: u64) -> Vec<u8> {
    let size = size_of::<c::Header>() + payload_len;
    let mut r = Vec::with_capacity(size);
    r.extend_from_slice(&(kind as u16).to_le_bytes());
    r.extend_from_slice(&(size as u16).to_le_bytes());
    r.extend_from_slice(&((seq % 2) as u32).to_le_bytes());
    r.extend_from_slice(&(1_000_000_000 + seq * 1000).to_le_bytes());
    r.extend_from_slice(&(4000 + (seq % 64) as u32).to_le_bytes());
    r.extend_from_slice(&(4000 + (seq % 512) as u32).to_le_bytes());
    r.resize(size, 0);
    // Varying fields, as real ioctls and exits have.
    r[24..32].copy_from_slice(&(seq.wrapping_mul(0x9e37_79b9) >> 16).to_le_bytes()[..8]);
    if let Some(at) = comm_at {
        let comm = b"python3\0";
        r[24 + at..24 + at + comm.len()].copy_from_slice(comm);
    }
    r
}

/// The mix: 6 GPU ioctls, then a thread exit, a delivery, a fork and an exec in every 10.
fn records(n: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| match i % 10 {
            0..=5 => record(c::Kind::GpuIoctl, size_of::<c::GpuIoctl>(), None, i),
            6 => record(
                c::Kind::TaskExit,
                size_of::<c::TaskExit>(),
                Some(offset_of!(c::TaskExit, comm)),
                i,
            ),
            7 => record(
                c::Kind::SignalDeliver,
                size_of::<c::SignalDeliver>(),
                None,
                i,
            ),
            8 => record(
                c::Kind::ProcessFork,
                size_of::<c::ProcessFork>(),
                Some(offset_of!(c::ProcessFork, comm)),
                i,
            ),
            _ => record(
                c::Kind::ProcessExec,
                size_of::<c::ProcessExec>(),
                Some(offset_of!(c::ProcessExec, comm)),
                i,
            ),
        })
        .collect()
}

/// Trace file benchmark; prints one JSON object on stdout.
#[derive(Parser)]
#[command(args_override_self = true)]
struct Config {
    /// Kernel records in the file (at least 1000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1000..), default_value_t = 2_000_000)]
    events: u64,
    /// Rounds, each writing the file again and reading it back.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 3)]
    rounds: u32,
    #[command(flatten)]
    nice: Nice,
}

fn main() -> Result<()> {
    let config = Config::parse();
    config.nice.apply()?;
    let n = config.events;
    let records = records(n);
    let raw_bytes: usize = records.iter().map(Vec::len).sum();
    let dir = std::env::temp_dir().join(format!("linger-bench-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut formats = Vec::new();
    for (name, zstd_level) in [("plain", None), ("zstd-1", Some(1))] {
        let path = dir.join(format!("{name}.lgr"));
        let mut rounds = Vec::new();
        for _ in 0..config.rounds {
            let round = Round::measure(&path, &records, zstd_level)?;
            eprintln!(
                "{name:>7}: {:.2} bytes/event, record {:.0} ns/event, chunks {:.1} M events/s, \
                 replay on one thread {:.1} M/s, replay {:.1} M/s",
                round.file_bytes as f64 / round.events as f64,
                round.write_s * 1e9 / round.events as f64,
                round.events as f64 / round.chunks_s / 1e6,
                round.events as f64 / round.direct_s / 1e6,
                round.events as f64 / round.replay_s / 1e6,
            );
            rounds.push(round.to_json());
        }
        formats.push(json!({ "name": name, "zstd_level": zstd_level, "rounds": rounds }));
    }
    std::fs::remove_dir_all(&dir)?;
    let out = json!({
        "records": n,
        "ring_bytes_per_record": raw_bytes as f64 / n as f64,
        "tick_every": TICK_EVERY,
        "formats": formats,
    });
    println!("{out}");
    Ok(())
}

/// A collector tick (written as an event) after this many kernel records.
const TICK_EVERY: usize = 1000;

struct Round {
    events: u64,
    file_bytes: u64,
    write_s: f64,
    chunks_s: f64,
    direct_s: f64,
    replay_s: f64,
}

impl Round {
    fn measure(path: &Path, records: &[Vec<u8>], zstd_level: Option<i32>) -> Result<Self> {
        let options = WriterOptions {
            zstd_level,
            ..Default::default()
        };
        let start = Instant::now();
        // Each round rewrites the same file.
        let mut w = writer::create(path, Existing::Replace, &TraceMeta::default(), options)?;
        for (i, r) in records.iter().enumerate() {
            w.kernel(r);
            if i % TICK_EVERY == TICK_EVERY - 1 {
                w.event(&Event {
                    ts_ns: 1_000_000_000 + i as u64 * 1000,
                    cpu: 0,
                    pid: 0,
                    tid: 0,
                    data: EventData::Tick,
                });
            }
        }
        let (_, stats) = w.finish(&"bench")?;
        let write_s = start.elapsed().as_secs_f64();
        let events = records.len() as u64 + (records.len() / TICK_EVERY) as u64;

        let start = Instant::now();
        let mut reader = TraceReader::new(File::open(path)?)?;
        let mut in_chunks = 0u64;
        while let Some(chunk) = reader.next_chunk()? {
            in_chunks += u64::from(black_box(chunk.records));
        }
        let chunks_s = start.elapsed().as_secs_f64();
        // The chunks also hold the process list and the end summary.
        ensure!(in_chunks >= events, "{in_chunks} records read of {events}");

        let start = Instant::now();
        replay(Replay::new(File::open(path)?)?, events)?;
        let direct_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        replay(Replay::open(path)?, events)?;
        let replay_s = start.elapsed().as_secs_f64();
        Ok(Self {
            events,
            file_bytes: stats.file_bytes,
            write_s,
            chunks_s,
            direct_s,
            replay_s,
        })
    }

    fn to_json(&self) -> Value {
        json!({
            "events": self.events,
            "file_bytes": self.file_bytes,
            "write_s": self.write_s,
            "chunks_s": self.chunks_s,
            "replay_one_thread_s": self.direct_s,
            "replay_s": self.replay_s,
        })
    }
}

/// Replays every event into nothing; checks that all `want` came out.
fn replay<R: std::io::Read>(mut replay: Replay<R>, want: u64) -> Result<()> {
    let mut events = 0u64;
    replay.run(
        |e| {
            black_box(e);
            events += 1;
            ControlFlow::Continue(())
        },
        |_| {},
    )?;
    ensure!(events == want, "replayed {events} events of {want}");
    Ok(())
}
