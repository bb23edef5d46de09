//! Any bytes through the whole replay: the reader (header, chunk scan and resync, zstd,
//! framing, the kernel decoder, the event JSON), the correlator with the recording's own
//! options, and every sink: the text and JSON reports with their event lines, the Perfetto
//! timeline with the incidents, the folded stacks and their flamegraph, and the stats table
//! and chart of the JSON lines. It may return errors; it must not panic.
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
};

fuzz_target!(|data: &[u8]| {
    let _ = report(data, false);
    if let Some(lines) = report(data, true) {
        stats_of(&lines);
    }
    export(data);
});

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
