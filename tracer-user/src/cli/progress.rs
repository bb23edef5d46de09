//! A progress bar on stderr while a large trace is read, only where a person watches it:
//! stderr is a terminal and stdout is not a pipe.

use std::{
    io::{IsTerminal, Write},
    time::Duration,
};

use indicatif::{ProgressBar, ProgressStyle};
use nix::sys::stat::{fstat, SFlag};

/// Smaller files read in about a second: no bar.
const MIN_BYTES: u64 = 32 << 20;

pub struct Progress {
    bar: Option<ProgressBar>,
    /// Output lines go to the same terminal: the bar steps aside while they are written.
    share_terminal: bool,
}

impl Progress {
    pub fn new(len: u64, what: &'static str) -> Self {
        let stdout = std::io::stdout();
        let show = len >= MIN_BYTES && std::io::stderr().is_terminal() && !is_pipe(&stdout);
        let bar = show.then(|| {
            let style = ProgressStyle::with_template(
                "{msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            let bar = ProgressBar::new(len).with_style(style).with_message(what);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Self {
            bar,
            share_terminal: stdout.is_terminal(),
        }
    }

    pub fn set(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(bytes);
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    /// `out`, hiding the bar while something is written to the terminal it is on.
    pub fn writer<W: Write>(&self, out: W) -> Paused<'_, W> {
        Paused {
            bar: self.bar.as_ref().filter(|_| self.share_terminal),
            out,
        }
    }
}

pub struct Paused<'a, W> {
    bar: Option<&'a ProgressBar>,
    out: W,
}

impl<W: Write> Write for Paused<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let out = &mut self.out;
        match self.bar {
            Some(bar) => bar.suspend(|| out.write(buf)),
            None => out.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

fn is_pipe(fd: &impl std::os::fd::AsFd) -> bool {
    fstat(fd).is_ok_and(|st| {
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        kind == SFlag::S_IFIFO || kind == SFlag::S_IFSOCK
    })
}
