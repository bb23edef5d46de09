//! Trace file benchmark: bytes per event, the recorder's cost per event, and the replay
//! decode rate from the page cache, for chunks stored plain and zstd-compressed.
//!
//! `linger-bench-trace [EVENTS]` (default 5,000,000). Needs no root: the records are built in
//! the kernel's layout (`tracer_common`) with a mix like a GPU training job's teardown, GPU
//! ioctls first, and go through the real writer, reader and decoder.

use std::{
    hint::black_box,
    mem::{offset_of, size_of},
    ops::ControlFlow,
    time::Instant,
};

use tracer_common as c;
use tracer_user::{
    event::{Event, EventData},
    source::replay::Replay,
    trace::{writer, TraceMeta, WriterOptions},
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

fn main() -> anyhow::Result<()> {
    let n: u64 = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 5_000_000,
    };
    let records = records(n);
    let raw_bytes: usize = records.iter().map(Vec::len).sum();
    println!(
        "{n} kernel records, {:.1} bytes each in the ring buffer, a tick every 1000",
        raw_bytes as f64 / n as f64
    );
    let dir = std::env::temp_dir().join(format!("linger-bench-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    for (name, zstd_level) in [("plain", None), ("zstd-1", Some(1))] {
        let path = dir.join(format!("{name}.lgr"));
        let options = WriterOptions {
            zstd_level,
            ..Default::default()
        };
        let start = Instant::now();
        let mut w = writer::create(&path, &TraceMeta::default(), options)?;
        for (i, r) in records.iter().enumerate() {
            w.kernel(r);
            if i % 1000 == 999 {
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

        // Replay twice; the second read is from the page cache.
        let mut best = f64::MAX;
        let mut events = 0u64;
        for _ in 0..2 {
            let start = Instant::now();
            let mut replay = Replay::open(&path)?;
            events = 0;
            replay.run(
                |e| {
                    black_box(e);
                    events += 1;
                    ControlFlow::Continue(())
                },
                |_| {},
            )?;
            best = best.min(start.elapsed().as_secs_f64());
        }
        anyhow::ensure!(
            events == n + n / 1000,
            "replayed {events} events of {}",
            n + n / 1000
        );
        println!(
            "{name:>7}: {:.2} bytes/event in the file ({} MB), record {:.0} ns/event, \
             replay {:.1} M events/s ({:.0} ns/event)",
            stats.file_bytes as f64 / events as f64,
            stats.file_bytes / 1_000_000,
            write_s * 1e9 / events as f64,
            events as f64 / best / 1e6,
            best * 1e9 / events as f64,
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
