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

use std::{fs::File, hint::black_box, ops::ControlFlow, path::Path, time::Instant};

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

/// One ring buffer record from `seq`: header fields and a payload field that vary, as real
/// ones do.
fn record<T: c::Payload>(seq: u64, payload: T) -> Vec<u8> {
    let pid = 4000 + (seq % 64) as u32;
    let tid = 4000 + (seq % 512) as u32;
    c::Record::new(
        (seq % 2) as u32,
        1_000_000_000 + seq * 1000,
        pid,
        tid,
        payload,
    )
    .as_bytes()
    .to_vec()
}

/// The mix: 6 GPU ioctls, then a thread exit, a delivery, a fork and an exec in every 10.
fn records(n: u64) -> Vec<Vec<u8>> {
    let python = c::comm(b"python3");
    (0..n)
        .map(|i| {
            let varying = i.wrapping_mul(0x9e37_79b9) >> 16;
            match i % 10 {
                0..=5 => record(
                    i,
                    c::GpuIoctl {
                        fd: varying as i32,
                        cmd: (varying >> 32) as u32,
                        ..Default::default()
                    },
                ),
                6 => record(
                    i,
                    c::TaskExit {
                        exit_code: varying as u32,
                        comm: python,
                        ..Default::default()
                    },
                ),
                7 => record(
                    i,
                    c::SignalDeliver {
                        sig: varying as u32,
                        ..Default::default()
                    },
                ),
                8 => record(
                    i,
                    c::ProcessFork {
                        child_pid: varying as u32,
                        comm: python,
                        ..Default::default()
                    },
                ),
                _ => record(i, c::ProcessExec { comm: python }),
            }
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
