//! Any bytes through the whole replay: the reader (header, chunk scan and resync, zstd,
//! framing, the kernel decoder, the event JSON), the correlator with the recording's own
//! options, and every sink: the text and JSON reports with their event lines, the Perfetto
//! timeline with the incidents, the folded stacks and their flamegraph, and the stats table
//! and chart of the JSON lines. It may return errors; it must not panic. The input is read
//! twice: as it is (the reader's damage and resync paths), and with its checksums made right
//! (the rest of the pipeline: a mutated record behind a checksum the mutation broke would
//! never get past the reader).
#![no_main]

use std::ops::ControlFlow;

use libfuzzer_sys::fuzz_target;
use tracer_user::{
    analysis::{
        stats::{self, By, Sample},
        Correlator, Output as Record,
    },
    live::report::{self, Output, Report},
    sink::{folded, perfetto::ChromeTrace, stats_svg},
    source::replay::Replay,
    trace::format::{CHUNK_HEADER_LEN, CHUNK_MAGIC, FILE_HEADER_LEN},
};

fuzz_target!(|data: &[u8]| {
    let _ = report(data, false);
    let data = &checksummed(data);
    if let Some(lines) = report(data, true) {
        stats_of(&lines);
    }
    export(data);
});

/// `data` with the file header's checksum, and each chunk's header and body checksums, made
/// right, as far as the framing's lengths hold (docs/trace-format.md).
fn checksummed(data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    let Some(meta_len) = out.get(16..20).map(|l| u32::from_le_bytes(l.try_into().unwrap())) else {
        return out;
    };
    let meta_end = FILE_HEADER_LEN + meta_len as usize;
    if let Some(meta) = out.get(FILE_HEADER_LEN..meta_end) {
        let crc = crc32c::crc32c_append(crc32c::crc32c(&out[..FILE_HEADER_LEN - 4]), meta);
        out[FILE_HEADER_LEN - 4..FILE_HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    }
    let mut at = meta_end;
    while let Some(h) = out.get(at..at + CHUNK_HEADER_LEN) {
        if h[..4] != CHUNK_MAGIC {
            break;
        }
        let stored = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
        let Some(body) = out.get(at + CHUNK_HEADER_LEN..at + CHUNK_HEADER_LEN + stored) else {
            break;
        };
        let body_crc = crc32c::crc32c(body);
        out[at + 40..at + 44].copy_from_slice(&body_crc.to_le_bytes());
        let header_crc = crc32c::crc32c(&out[at..at + 44]);
        out[at + 44..at + 48].copy_from_slice(&header_crc.to_le_bytes());
        at += CHUNK_HEADER_LEN + stored;
    }
    out
}

/// `linger replay [--json] --events`; the lines printed.
fn report(data: &[u8], json: bool) -> Option<Vec<u8>> {
    let mut replay = Replay::new(data).ok()?;
    let meta = replay.meta().clone();
    let mut out = Vec::new();
    let output = Output {
        json,
        events: true,
        count: None,
    };
    let config = meta.analysis.config.clone();
    let mut report = Report::new(&mut out, output, meta.anchor(), config, report::node_of(&meta));
    let _ = replay.run(|e| report.on_event(e), |_| {});
    let _ = report.finish();
    Some(out)
}

/// `linger stats` of the JSON lines, table and chart.
fn stats_of(lines: &[u8]) {
    let samples: Vec<Sample> = lines
        .split(|b| *b == b'\n')
        .filter_map(|l| serde_json::from_slice(l).ok())
        .filter_map(|v| Sample::from_record(&v))
        .collect();
    for by in [By::Termination, By::Verdict, By::Comm, By::Gpu, By::Size, By::Driver] {
        let groups = stats::groups(samples.iter(), by);
        let _ = stats_svg::render(&groups, "fuzz");
    }
}

/// `linger export` as a Perfetto timeline and as a flamegraph.
fn export(data: &[u8]) {
    let Ok(mut replay) = Replay::new(data) else {
        return;
    };
    let mut correlator = Correlator::new(replay.meta().analysis.config.clone());
    let Ok(mut trace) = ChromeTrace::new(Vec::new()) else {
        return;
    };
    let mut outputs = Vec::new();
    let _ = replay.run(
        |e| {
            correlator.on_event(e, &mut outputs);
            let _ = trace.on_event(e);
            ControlFlow::Continue(())
        },
        |_| {},
    );
    correlator.finish(&mut outputs);
    let mut incidents = Vec::new();
    for o in outputs {
        if let Record::Incident(inc) = o {
            let _ = trace.on_incident(&inc);
            incidents.push(*inc);
        }
    }
    let _ = trace.finish();
    let lines = folded::lines(&incidents);
    let _ = folded::svg(&lines, std::io::sink());
}
