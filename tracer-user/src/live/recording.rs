//! The trace file of a live run: created with its header and process snapshot, closed with
//! its summary.

use anyhow::Context;

use super::config::Config;
use crate::{
    clock::{boottime_ns, WallAnchor},
    escape,
    output::{Existing, OutputFile},
    probe::devices,
    source::{machine, nvml, procfs},
    trace::{meta::AnalysisDefaults, writer, EndSummary, TraceMeta, TraceWriter, WriterOptions},
};

/// Creates the trace file of a live run, if asked for, with its header and process snapshot.
pub fn start(
    config: &Config,
    anchor: &WallAnchor,
) -> anyhow::Result<Option<TraceWriter<OutputFile>>> {
    let Some(recording) = &config.recording else {
        return Ok(None);
    };
    let options = WriterOptions {
        zstd_level: recording.compressed.then_some(1),
        ..Default::default()
    };
    let existing = Existing::replace_if(recording.replace);
    let path = &recording.path;
    let mut w = writer::create(path, existing, &meta(config, anchor), options)
        .with_context(|| format!("creating the trace file {}", escape::path(path)))?;
    w.processes(&procfs::processes(config.describe.redact_cmdline));
    Ok(Some(w))
}

/// How a live run records: this machine, its signals and analysis options.
pub fn meta(config: &Config, anchor: &WallAnchor) -> TraceMeta {
    TraceMeta {
        signals: config
            .probes
            .fatal_signals
            .iter()
            .map(|&s| s as u32)
            .collect(),
        ring_size: config.probes.ring_size,
        analysis: AnalysisDefaults::new(&config.analysis, config.output.count),
        redacted_cmdlines: config.describe.redact_cmdline,
        ..TraceMeta::describe(
            anchor,
            &machine(config),
            &machine::proc_devices()
                .map(|d| devices::nvidia_listing(&d))
                .unwrap_or_default(),
            nvml::library_version(),
        )
    }
}

/// This machine, named as the run was told to name its node.
pub fn machine(config: &Config) -> machine::Machine {
    let mut machine = machine::read();
    if let Some(name) = &config.node_name {
        machine.host = name.clone();
    }
    machine
}

/// Writes the closing record and says what was written.
pub fn finish(
    recorder: Option<TraceWriter<OutputFile>>,
    config: &Config,
    kernel_drops: u64,
) -> anyhow::Result<()> {
    let (Some(w), Some(recording)) = (recorder, &config.recording) else {
        return Ok(());
    };
    let summary = EndSummary {
        end_boot_ns: boottime_ns(),
        kernel_drops,
        records: w.records(),
    };
    let path = &recording.path;
    let (_, stats) = w
        .finish(&summary)
        .with_context(|| format!("writing the trace file {}", escape::path(path)))?;
    eprintln!(
        "linger: wrote {} records in {} chunks, {} bytes ({:.1} bytes/record), to {}",
        stats.records,
        stats.chunks,
        stats.file_bytes,
        stats.file_bytes as f64 / stats.records.max(1) as f64,
        escape::path(path)
    );
    Ok(())
}
