//! A growable read window over any `Read`, so the reader can look ahead, scan for the next
//! chunk after damage, and work on pipes as well as files.

use std::io::{self, Read};

pub struct Input<R> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// File offset of `buf[start]`.
    offset: u64,
    eof: bool,
}

const READ_SIZE: usize = 1 << 20;

impl<R: Read> Input<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            start: 0,
            end: 0,
            offset: 0,
            eof: false,
        }
    }

    /// Makes at least `n` bytes available unless the input ends first; returns what is.
    pub fn fill(&mut self, n: usize) -> io::Result<&[u8]> {
        while self.end - self.start < n && !self.eof {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let want = (n - self.end).max(READ_SIZE);
            if self.buf.len() < self.end + want {
                self.buf.resize(self.end + want, 0);
            }
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.available())
    }

    pub fn available(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.end - self.start);
        self.start += n;
        self.offset += n as u64;
    }

    /// File offset of the next unread byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Skips to the next occurrence of `pattern` (or to the end); returns the bytes skipped.
    pub fn seek_to(&mut self, pattern: &[u8]) -> io::Result<u64> {
        let mut skipped = 0;
        loop {
            let window = self.fill(pattern.len())?;
            if window.len() < pattern.len() {
                let rest = window.len();
                self.consume(rest);
                return Ok(skipped + rest as u64);
            }
            match window.windows(pattern.len()).position(|w| w == pattern) {
                Some(at) => {
                    self.consume(at);
                    return Ok(skipped + at as u64);
                }
                None => {
                    // Keep a tail that could be the start of the pattern.
                    let drop = window.len() + 1 - pattern.len();
                    self.consume(drop);
                    skipped += drop as u64;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seek_finds_a_pattern_across_reads() {
        // A reader that hands out 3 bytes at a time.
        struct Slow<'a>(&'a [u8]);
        impl Read for Slow<'_> {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                let n = self.0.len().min(3).min(out.len());
                out[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut input = Input::new(Slow(b"xxxxxxxLGCKrest"));
        assert_eq!(input.seek_to(b"LGCK").expect("in memory"), 7);
        assert_eq!(input.fill(8).expect("in memory"), b"LGCKrest");
        assert_eq!(input.offset(), 7);
        input.consume(5);
        assert_eq!(input.seek_to(b"LGCK").expect("in memory"), 3);
        assert!(input.fill(1).expect("in memory").is_empty());
    }
}
