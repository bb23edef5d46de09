//! Folded stacks (`frame;frame;frame weight`, the flamegraph input format) of where killed
//! processes spend their time: one stack per target command, signal and phase, weighted in
//! nanoseconds summed over incidents; the teardown of GPU processes continues into the kernel
//! stacks sampled while they died.

use std::{collections::BTreeMap, io::Write};

use super::phases::phases;
use crate::{analysis::Incident, escape};

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
            // Outermost frame first.
            let kernel: Vec<String> = frames.iter().rev().map(|f| frame(f)).collect();
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

/// A comm or kernel symbol as a frame, escaped as in every human output (the SVG's XML
/// takes no control characters at all), and `;`, which separates frames, as `\x3b`.
fn frame(name: &str) -> String {
    escape::terminal(name).replace(';', "\\x3b")
}

/// An SVG flamegraph of `lines`.
pub fn svg(lines: &[String], out: impl Write) -> std::io::Result<()> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = "linger: where killed processes spend their time".into();
    options.count_name = "ns".into();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_stay_one_escaped_frame() {
        assert_eq!(frame("a;b\nc \x1b[2J\\xff"), "a\\x3bb\\x0ac \\x1b[2J\\xff");
    }

    #[test]
    fn the_svg_of_hostile_frames_is_well_formed_text() {
        let lines = [format!(
            "{};SIGKILL;exiting 5",
            frame("<x>&\"\x1b]0;pwn\x07\u{9b}")
        )];
        let mut svg = Vec::new();
        super::svg(&lines, &mut svg).expect("inferno");
        let svg = String::from_utf8(svg).expect("UTF-8");
        assert!(!svg.contains(['\x1b', '\x07', '\u{9b}']), "{svg}");
        assert!(
            svg.contains("&lt;x&gt;&amp;&quot;\\x1b]0\\x3bpwn\\x07\\u{9b}"),
            "{svg}"
        );
    }
}
