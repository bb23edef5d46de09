//! GPU errors from the kernel log where the driver's tracepoint is missing: the driver logs
//! every Xid as `NVRM: Xid (PCI:0000:3b:00): 31, pid=..., ...`. Only records written after
//! the start are read. Their times are the log's clock (monotonic, microseconds), moved to the
//! stream's boot-time clock.

use std::{
    fs::File,
    io::{ErrorKind, Read, Seek, SeekFrom},
    os::{fd::AsFd, unix::fs::OpenOptionsExt},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use tokio::sync::mpsc::UnboundedSender;

use crate::{
    clock::{boottime_ns, monotonic_ns},
    event::{Event, EventData, XidSource},
};

const KMSG: &str = "/dev/kmsg";

/// Opens the kernel log at its end. Reading it may take CAP_SYSLOG, checked at open: open it
/// before privileges are dropped.
pub fn open() -> std::io::Result<File> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(KMSG)?;
    f.seek(SeekFrom::End(0))?;
    Ok(f)
}

/// The reader thread; dropping it stops the thread.
pub struct KmsgReader {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl KmsgReader {
    pub fn start(log: File, out: UnboundedSender<Event>) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = thread::Builder::new()
            .name("linger-kmsg".into())
            .spawn(move || read_loop(log, &s, &out))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for KmsgReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_loop(mut log: File, stop: &AtomicBool, out: &UnboundedSender<Event>) {
    // The end the open seeked to is the kernel's best guess and may lag: records logged
    // before the start can still come first.
    let since_ns = monotonic_ns();
    // One record per read; the kernel's records are at most about 1 KiB of text.
    let mut buf = vec![0u8; 8192];
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(log.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::from(200u16)).is_err() {
            continue;
        }
        loop {
            match log.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let record = String::from_utf8_lossy(&buf[..n]);
                    if let Some(e) = parse(&record, since_ns) {
                        if out.send(e).is_err() {
                            return;
                        }
                    }
                }
                // Records overwritten before we read them: go on with the next.
                Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted =>
                {
                    break
                }
                Err(_) => return,
            }
        }
    }
}

/// A log record ("6,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=..., ...") as a GPU
/// error event, if it is one logged at `since_ns` (monotonic) or later.
fn parse(record: &str, since_ns: u64) -> Option<Event> {
    let (prefix, text) = record.split_once(';')?;
    let ts_us: u64 = prefix.split(',').nth(2)?.parse().ok()?;
    if ts_us.saturating_mul(1_000) < since_ns {
        return None;
    }
    let text = text.lines().next()?;
    let rest = &text[text.find("Xid (PCI:")? + "Xid (PCI:".len()..];
    let (pci, rest) = rest.split_once("): ")?;
    let (xid, message) = rest.split_once(", ").unwrap_or((rest, ""));
    let xid: u32 = xid.trim().parse().ok()?;
    // The log's clock is monotonic; the stream's counts suspended time too.
    let ts_ns = (ts_us * 1_000).saturating_add(boottime_ns().saturating_sub(monotonic_ns()));
    Some(Event::collector(
        ts_ns,
        EventData::GpuXid {
            xid,
            pci: pci.to_string(),
            message: message.to_string(),
            truncated: false,
            source: XidSource::Kmsg,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_xid_line() {
        let e = parse(
            "4,2817,93845219003,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=5121, name=python3, \
             channel 0x00000002, intr 00000000. MMU Fault\n SUBSYSTEM=pci\n",
            0,
        )
        .expect("an Xid line");
        let EventData::GpuXid {
            xid, pci, message, ..
        } = e.data
        else {
            panic!("not an Xid: {e:?}");
        };
        assert_eq!((xid, pci.as_str()), (31, "0000:3b:00"));
        assert_eq!(
            message,
            "pid=5121, name=python3, channel 0x00000002, intr 00000000. MMU Fault"
        );
        assert!(e.ts_ns >= 93_845_219_003_000);
    }

    #[test]
    fn other_lines_are_not_errors() {
        assert!(parse("6,1,2,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module", 0).is_none());
        assert!(parse("6,1,2,-;NVRM: Xid (PCI:0000:3b:00): x, junk", 0).is_none());
        assert!(parse("garbage", 0).is_none());
        // Logged before linger started.
        assert!(parse(
            "4,9,5000,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=1",
            5_000_001
        )
        .is_none());
    }
}
