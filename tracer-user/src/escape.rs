//! Untrusted text made safe to show. Any unprivileged process picks its own name (prctl), its
//! arguments and its cgroup path, and a terminal obeys the control characters and escape
//! sequences in what is printed to it: shown raw, such a name retitles or clears the
//! operator's screen, or forges report lines.
//!
//! One notation everywhere: a byte that is not UTF-8 as `\xNN` (turned into text by [`bytes`]
//! where it is read), C0 controls and DEL as `\xNN`, C1 controls and the characters that hide
//! or reorder text (bidirectional controls, zero-width characters, tag characters) as
//! `\u{NNNN}`. A backslash is left as it is: the notation shows what was there, it is not
//! meant to be decoded.

use std::{borrow::Cow, fmt::Write as _, os::unix::ffi::OsStrExt, path::Path};

/// Untrusted text as one line of human output (terminal, table, flamegraph frame, timeline
/// track name): every character a terminal would obey, or that would hide text, as an escape.
pub fn terminal(s: &str) -> Cow<'_, str> {
    escape_where(s, is_unsafe)
}

/// [`terminal`] for a report that linger laid out over several lines itself: its newlines
/// are kept. The fields in it should have gone through [`terminal`] already, or a newline in
/// one of them starts a line of its own.
pub fn terminal_lines(s: &str) -> Cow<'_, str> {
    escape_where(s, |c| c != '\n' && is_unsafe(c))
}

/// Bytes from the kernel or /proc as text: valid UTF-8 as it is, each byte of an invalid
/// sequence as `\xNN`, so no name is lost or merged with another.
pub fn bytes(raw: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(raw) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(raw.len() + 8);
    for chunk in raw.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    Cow::Owned(out)
}

/// A path for a message: file names in shared directories are chosen by other users too.
pub fn path(p: &Path) -> String {
    terminal(&bytes(p.as_os_str().as_bytes())).into_owned()
}

/// Whether `c` must not reach a reader raw: controls (C0, DEL, C1), line and paragraph
/// separators, the invisible formatting characters that reorder or hide text, and the
/// noncharacters XML refuses.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{ad}'
                | '\u{61c}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{fdd0}'..='\u{fdef}'
                | '\u{e0000}'..='\u{e007f}'
        )
        || (c as u32 & 0xfffe) == 0xfffe
}

fn escape_where(s: &str, escape: impl Fn(char) -> bool) -> Cow<'_, str> {
    let Some(first) = s.find(&escape) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len() + 16);
    out.push_str(&s[..first]);
    for c in s[first..].chars() {
        match c {
            c if !escape(c) => out.push(c),
            c if u32::from(c) <= 0x7f => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use std::{ffi::OsStr, path::PathBuf};

    use super::*;

    #[test]
    fn terminal_escapes_controls_sequences_and_invisible_characters() {
        let cases = [
            ("python3", "python3"),
            ("\x1b]0;pwn\x07\x1b[2J", "\\x1b]0;pwn\\x07\\x1b[2J"),
            ("a\nb\tc\rd\0", "a\\x0ab\\x09c\\x0dd\\x00"),
            ("del\x7f", "del\\x7f"),
            ("c1 \u{9b}2J", "c1 \\u{9b}2J"),
            ("evil\u{202e}txt.exe", "evil\\u{202e}txt.exe"),
            ("zero\u{200b}width", "zero\\u{200b}width"),
            ("tag\u{e0041}", "tag\\u{e0041}"),
            ("bom\u{feff}", "bom\\u{feff}"),
            ("non\u{fffe}char\u{1ffff}", "non\\u{fffe}char\\u{1ffff}"),
            // Printable text stays as it is, other scripts and backslashes included.
            ("Grüße · 进程 → █ \\x1b", "Grüße · 进程 → █ \\x1b"),
        ];
        for (raw, shown) in cases {
            assert_eq!(terminal(raw), shown, "{raw:?}");
        }
    }

    #[test]
    fn clean_text_is_borrowed() {
        assert!(matches!(terminal("bash"), Cow::Borrowed(_)));
        assert!(matches!(bytes(b"bash"), Cow::Borrowed(_)));
    }

    #[test]
    fn terminal_lines_keeps_only_newlines() {
        assert_eq!(
            terminal_lines("line \x1b[2J one\nline\ttwo\n"),
            "line \\x1b[2J one\nline\\x09two\n"
        );
    }

    #[test]
    fn invalid_utf8_bytes_are_escaped_one_by_one() {
        assert_eq!(bytes(b"ok\xff\xfe"), "ok\\xff\\xfe");
        // A truncated sequence, then valid multi-byte text.
        assert_eq!(bytes(b"\xe2\x82 \xe2\x82\xac"), "\\xe2\\x82 €");
        assert_eq!(
            bytes(b"\x1b[2J"),
            "\x1b[2J",
            "valid UTF-8 is left to terminal()"
        );
        assert_eq!(terminal(&bytes(b"\x1b\xff")), "\\x1b\\xff");
    }

    #[test]
    fn paths_are_escaped_bytes() {
        let p = PathBuf::from(OsStr::from_bytes(b"/tmp/\x1b[2J\xff.lgr"));
        assert_eq!(path(&p), "/tmp/\\x1b[2J\\xff.lgr");
    }
}
