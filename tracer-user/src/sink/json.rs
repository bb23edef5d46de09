//! One JSON object per line (schema: docs/incident-json.md).

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{Formatter, Serializer};

use crate::escape;

pub fn write_line(out: &mut impl Write, value: &impl Serialize) -> io::Result<()> {
    append_line(out, value)?;
    out.flush()
}

/// One line, not flushed: a writer of many lines flushes once after them.
pub fn append_line(out: &mut impl Write, value: &impl Serialize) -> io::Result<()> {
    // One write per line: the serializer's many small writes go to memory, not through `out`
    // (stdout's line buffering scans each of them for a newline; the incident log takes
    // whole lines).
    let mut line = Vec::with_capacity(2048);
    to_writer(&mut line, value)?;
    line.push(b'\n');
    out.write_all(&line)
}

/// `serde_json::to_writer` that also writes DEL, C1 controls and invisible characters as
/// `\uNNNN` (serde_json escapes only C0): the same strings to a JSON reader, and nothing a
/// terminal obeys when the output is read there.
pub fn to_writer(out: impl Write, value: &impl Serialize) -> io::Result<()> {
    value
        .serialize(&mut Serializer::with_formatter(out, Visible))
        .map_err(io::Error::from)
}

struct Visible;

impl Formatter for Visible {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        // Keys, numbers' neighbours and most values are printable ASCII: one pass over the
        // bytes instead of a char-by-char search (the live output's hottest loop).
        if fragment.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return writer.write_all(fragment.as_bytes());
        }
        let mut start = 0;
        for (at, c) in fragment
            .char_indices()
            .filter(|&(_, c)| escape::is_unsafe(c))
        {
            writer.write_all(&fragment.as_bytes()[start..at])?;
            for unit in c.encode_utf16(&mut [0; 2]) {
                write!(writer, "\\u{unit:04x}")?;
            }
            start = at + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_characters_are_json_escapes_of_the_same_string() {
        let name = "x\u{1b}]0;pwn\u{7}\u{9b}2J\u{202e}\u{e0041}\u{7f}é";
        let mut out = Vec::new();
        write_line(&mut out, &serde_json::json!({ "comm": name })).expect("in memory");
        let text = String::from_utf8(out).expect("UTF-8");
        assert_eq!(
            text,
            "{\"comm\":\"x\\u001b]0;pwn\\u0007\\u009b2J\\u202e\\udb40\\udc41\\u007fé\"}\n"
        );
        let back: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(back["comm"], name);
    }
}
