//! Folded stacks (`frame;frame;frame weight`, the flamegraph input format) of where killed
//! processes spend their time: one stack per target command, signal and phase, weighted in
//! nanoseconds summed over incidents; the teardown of GPU processes continues into the kernel
//! stacks sampled while they died.

use std::{collections::BTreeMap, io::Write};

use super::phases::phases;
use crate::analysis::Incident;

pub fn lines(incidents: &[Incident]) -> Vec<String> {
    let mut weights: BTreeMap<String, u64> = BTreeMap::new();
    for inc in incidents {
        for phase in phases(inc) {
            let stack = format!(
                "{};{};{}",
                frame(&inc.target.comm),
                inc.signal_name,
                phase.name
            );
            *weights.entry(stack).or_default() += phase.end_ns - phase.start_ns;
        }
        for (frames, ns) in &inc.teardown_stacks {
            let kernel: Vec<String> = frames.iter().map(|f| frame(f)).collect();
            let stack = format!(
                "{};{};teardown (kernel stacks);{}",
                frame(&inc.target.comm),
                inc.signal_name,
                kernel.join(";")
            );
            *weights.entry(stack).or_default() += ns;
        }
    }
    weights
        .into_iter()
        .filter(|(_, w)| *w > 0)
        .map(|(stack, w)| format!("{stack} {w}"))
        .collect()
}

/// A comm as a frame: `;` separates frames and a newline ends the line.
fn frame(comm: &str) -> String {
    comm.replace([';', '\n'], "_")
}

/// An SVG flamegraph of `lines`.
pub fn svg(lines: &[String], out: impl Write) -> std::io::Result<()> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = "linger: where killed processes spend their time".into();
    options.count_name = "ns".into();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
        .map_err(std::io::Error::other)
}
