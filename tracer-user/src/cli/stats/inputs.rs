//! The files `linger stats` reads, told apart by their contents, not their names: a trace by
//! its magic (`\x89LINGER\n`), an incident log or JSON output by a JSON object first. Anything
//! else is said and skipped.

use std::{
    collections::BTreeSet,
    fs::{self, File},
    io::{self, Cursor, Read},
    ops::ControlFlow,
    path::{Path, PathBuf},
};

use serde_json::Value;
use tracer_user::{
    analysis::{merge::Source, Correlator},
    escape,
    live::report,
    source::replay::Replay,
    trace::format::MAGIC,
};

/// Read at a time past blank space at the start of a file, until something else.
const BLANK_STEP: u64 = 4096;

/// The files of `input` not met yet: a file as named (a pipe too), or a directory's regular
/// files, recursively, in name order. Other directory entries (sockets, FIFOs: opening a FIFO
/// would wait for a writer) are noted and skipped.
pub fn collect(
    input: &Path,
    seen: &mut BTreeSet<PathBuf>,
    files: &mut Vec<PathBuf>,
    notes: &mut Vec<String>,
) -> anyhow::Result<()> {
    let meta = fs::metadata(input).map_err(|e| anyhow::anyhow!("{}: {e}", escape::path(input)))?;
    if !meta.is_dir() {
        // A file named twice, or also found in a directory named, is read once.
        if seen.insert(fs::canonicalize(input).unwrap_or_else(|_| input.to_path_buf())) {
            files.push(input.to_path_buf());
        }
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = fs::read_dir(input)?.flatten().map(|e| e.path()).collect();
    entries.sort();
    for e in entries {
        match fs::metadata(&e) {
            Ok(m) if m.is_dir() || m.is_file() => collect(&e, seen, files, notes)?,
            Ok(_) => notes.push(format!("{}: not a regular file: skipped", escape::path(&e))),
            Err(err) => notes.push(format!("{}: {err}", escape::path(&e))),
        }
    }
    Ok(())
}

/// What a file holds, by its first bytes.
#[derive(Debug, PartialEq)]
enum Contents {
    Trace,
    Log,
    /// Nothing, or only blank space.
    Empty,
    Other,
}

/// Reads as little of `input` as tells what it holds; returns that and the bytes read.
fn sniff(input: &mut impl Read) -> io::Result<(Contents, Vec<u8>)> {
    let mut head = Vec::new();
    input
        .by_ref()
        .take(MAGIC.len() as u64)
        .read_to_end(&mut head)?;
    if head.starts_with(&MAGIC) {
        return Ok((Contents::Trace, head));
    }
    loop {
        let first = head.iter().copied().find(|b| !b.is_ascii_whitespace());
        let contents = match first {
            Some(b'{') => Contents::Log,
            Some(_) => Contents::Other,
            None if input.by_ref().take(BLANK_STEP).read_to_end(&mut head)? == 0 => Contents::Empty,
            None => continue,
        };
        return Ok((contents, head));
    }
}

/// The incident records of a file as JSON, and whether they were replayed from a trace or
/// read from a log; None, with a note, for a file that is neither or cannot be read.
pub fn read(file: &Path, notes: &mut Vec<String>) -> Option<(Source, Vec<Value>)> {
    let name = escape::path(file);
    let opened = File::open(file).and_then(|mut f| sniff(&mut f).map(|(c, head)| (c, head, f)));
    let (contents, head, mut rest) = match opened {
        Ok(o) => o,
        Err(e) => {
            notes.push(format!("{name}: {e}"));
            return None;
        }
    };
    match contents {
        Contents::Trace => Some((
            Source::Trace,
            replayed(file, Cursor::new(head).chain(rest), notes),
        )),
        Contents::Log => {
            let mut text = head;
            if let Err(e) = rest.read_to_end(&mut text) {
                notes.push(format!("{name}: {e}"));
                return None;
            }
            Some((Source::Log, lines(file, &text, notes)))
        }
        Contents::Empty => {
            notes.push(format!(
                "{name}: empty, not a trace or an incident log: skipped"
            ));
            None
        }
        Contents::Other => {
            notes.push(format!("{name}: not a trace or an incident log: skipped"));
            None
        }
    }
}

/// The JSON lines of a log; lines that are not JSON are counted and skipped.
fn lines(file: &Path, text: &[u8], notes: &mut Vec<String>) -> Vec<Value> {
    let mut bad = 0;
    let values = String::from_utf8_lossy(text)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let v = serde_json::from_str(l).ok();
            bad += usize::from(v.is_none());
            v
        })
        .collect();
    if bad > 0 {
        notes.push(format!(
            "{}: {bad} line(s) that are not JSON skipped (a truncated or damaged log)",
            escape::path(file)
        ));
    }
    values
}

/// The incident records the analysis makes of a trace, as JSON.
fn replayed(file: &Path, input: impl Read + Send + 'static, notes: &mut Vec<String>) -> Vec<Value> {
    let mut replay = match Replay::prefetched(input) {
        Ok(r) => r,
        Err(e) => {
            notes.push(format!("{}: {e}", escape::path(file)));
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
        notes.push(format!(
            "{}: {e}; the incidents before it are counted",
            escape::path(file)
        ));
    }
    let read = replay.read_stats();
    for d in &read.damage {
        notes.push(format!(
            "{}: skipped {} damaged bytes at offset {} ({}); the incidents around them may be \
             incomplete",
            escape::path(file),
            d.bytes,
            d.offset,
            d.reason
        ));
    }
    if read.chunks_lost > 0 {
        notes.push(format!(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn contents(bytes: &[u8]) -> Contents {
        let (c, head) = sniff(&mut Cursor::new(bytes)).expect("in memory");
        assert!(
            bytes.starts_with(&head),
            "what was read is the file's start"
        );
        c
    }

    #[test]
    fn contents_tell_a_file_whatever_its_name() {
        assert_eq!(contents(b"\x89LINGER\n\x01\x00\x00\x00"), Contents::Trace);
        assert_eq!(contents(b"{\"type\":\"incident\"}\n"), Contents::Log);
        let blank_first = [vec![b'\n'; 10_000], b"  {}".to_vec()].concat();
        assert_eq!(contents(&blank_first), Contents::Log);
        assert_eq!(contents(b""), Contents::Empty);
        assert_eq!(contents(b" \n\t\n"), Contents::Empty);
        assert_eq!(contents(b"linger: tracing fatal signals"), Contents::Other);
        assert_eq!(contents(b"\x89LIN"), Contents::Other, "a cut magic");
        assert_eq!(contents(b"\x7fELF\x02\x01\x01"), Contents::Other);
    }
}
