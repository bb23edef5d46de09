//! GPU errors from the kernel log where the driver's tracepoint is missing: the driver logs
//! every Xid as `NVRM: Xid (PCI:0000:3b:00): 31, pid=..., ...`. Only records written after
//! the start are read. Their times are the log's clock (the kernel's local clock,
//! microseconds), moved to CLOCK_MONOTONIC by a measured offset (`kmsg_clock.rs`) and then to
//! the stream's boot-time clock.

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

use log::info;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use tokio::sync::mpsc::UnboundedSender;

use super::kmsg_clock::{LogClock, Marker, STALE_AFTER_NS};
use crate::{
    clock::{boottime_ns, monotonic_ns},
    event::{Event, EventData, XidSource},
};

const KMSG: &str = "/dev/kmsg";
const XID: &str = "Xid (PCI:";

/// The kernel log, read from its end, and the same log opened for writing the clock's markers
/// (or why it did not open).
pub struct KernelLog {
    records: File,
    markers: std::io::Result<File>,
}

/// Opens the kernel log at its end. Reading it may take CAP_SYSLOG and writing the markers
/// write access to /dev/kmsg, both checked at open: open it before privileges are dropped.
pub fn open() -> std::io::Result<KernelLog> {
    let mut records = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(KMSG)?;
    records.seek(SeekFrom::End(0))?;
    let markers = std::fs::OpenOptions::new().write(true).open(KMSG);
    Ok(KernelLog { records, markers })
}

/// The reader thread; dropping it stops the thread.
pub struct KmsgReader {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl KmsgReader {
    pub fn start(log: KernelLog, out: UnboundedSender<Event>) -> std::io::Result<Self> {
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

/// The log's clock as last measured, and the marker that measures it again.
struct Calibration {
    writer: Option<File>,
    clock: LogClock,
    /// When `clock` was measured (monotonic), if ever.
    measured_ns: Option<u64>,
    in_flight: Option<Marker>,
    written: u64,
    /// Why it is not measured, said once.
    said_unmeasured: bool,
}

impl Calibration {
    fn new(writer: std::io::Result<File>) -> Self {
        let mut c = Self {
            writer: None,
            clock: LogClock::ASSUMED_EQUAL,
            measured_ns: None,
            in_flight: None,
            written: 0,
            said_unmeasured: false,
        };
        match writer {
            Ok(w) => c.writer = Some(w),
            Err(e) => c.unmeasured(&format!("/dev/kmsg not writable: {e}")),
        }
        c
    }

    /// Writes a marker unless one is in flight or the offset is fresh.
    fn refresh(&mut self, now_ns: u64) {
        let fresh = self
            .measured_ns
            .is_some_and(|t| now_ns.saturating_sub(t) < STALE_AFTER_NS);
        if fresh || self.in_flight.is_some() {
            return;
        }
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        self.written += 1;
        match Marker::write(w, self.written) {
            Ok(m) => self.in_flight = Some(m),
            Err(e) => {
                self.writer = None;
                self.unmeasured(&format!("writing a marker to /dev/kmsg: {e}"));
            }
        }
    }

    /// Whether a record is the marker in flight, which then sets the clock.
    fn take(&mut self, logged_us: u64, text: &str) -> bool {
        let marker = match self.in_flight.take() {
            Some(m) if m.is(text) => m,
            other => {
                self.in_flight = other;
                return false;
            }
        };
        if let Some(clock) = marker.clock(logged_us) {
            if self.measured_ns.is_none() {
                info!(
                    "the kernel log's clock is CLOCK_MONOTONIC {:+.3} ms (± {:.3} ms)",
                    clock.offset_ms(),
                    clock.uncertainty_ns as f64 / 1e6
                );
            }
            self.clock = clock;
            self.measured_ns = Some(monotonic_ns());
        }
        true
    }

    /// Whether held records must wait for the marker in flight; a marker past its time is
    /// given up.
    fn waiting(&mut self, now_ns: u64) -> bool {
        match &self.in_flight {
            Some(m) if m.timed_out(now_ns) => {
                self.in_flight = None;
                if self.measured_ns.is_none() {
                    self.unmeasured(
                        "the marker written to /dev/kmsg did not come back \
                         (user writes to the log off or rate-limited)",
                    );
                }
                false
            }
            Some(_) => true,
            None => false,
        }
    }

    fn unmeasured(&mut self, why: &str) {
        if !std::mem::replace(&mut self.said_unmeasured, true) {
            info!(
                "the kernel log's clock is taken as CLOCK_MONOTONIC, unmeasured ({why}); \
                 x86-64 kernels keep them equal, arm64 ones may not"
            );
        }
    }
}

fn read_loop(log: KernelLog, stop: &AtomicBool, out: &UnboundedSender<Event>) {
    let KernelLog {
        records: mut log,
        markers,
    } = log;
    // The end the open seeked to is the kernel's best guess and may lag: records logged
    // before the start can still come first.
    let since_ns = monotonic_ns();
    let mut calibration = Calibration::new(markers);
    calibration.refresh(since_ns);
    // GPU errors read while a marker is in flight, placed once it is back.
    let mut held: Vec<(u64, String)> = Vec::new();
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
                    let Some((logged_us, text)) = split(&record) else {
                        continue;
                    };
                    if !calibration.take(logged_us, text) && text.contains(XID) {
                        calibration.refresh(monotonic_ns());
                        held.push((logged_us, text.to_string()));
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
        if calibration.waiting(monotonic_ns()) {
            continue;
        }
        for (logged_us, text) in held.drain(..) {
            let logged_ns = calibration.clock.monotonic_ns(logged_us);
            let Some(e) = parse(logged_ns, &text).filter(|_| logged_ns >= since_ns) else {
                continue;
            };
            if out.send(e).is_err() {
                return;
            }
        }
    }
}

/// A log record ("6,1234,5678901,-;text") as its stamp (microseconds) and text.
fn split(record: &str) -> Option<(u64, &str)> {
    let (prefix, text) = record.split_once(';')?;
    Some((prefix.split(',').nth(2)?.parse().ok()?, text))
}

/// A record's text ("NVRM: Xid (PCI:0000:3b:00): 31, pid=..., ...") logged at `logged_ns`
/// (monotonic) as a GPU error event, if it is one.
fn parse(logged_ns: u64, text: &str) -> Option<Event> {
    let text = text.lines().next()?;
    let rest = &text[text.find(XID)? + XID.len()..];
    let (pci, rest) = rest.split_once("): ")?;
    let (xid, message) = rest.split_once(", ").unwrap_or((rest, ""));
    let xid: u32 = xid.trim().parse().ok()?;
    // The stream's clock counts suspended time too.
    let ts_ns = logged_ns.saturating_add(boottime_ns().saturating_sub(monotonic_ns()));
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
        let (logged_us, text) = split(
            "4,2817,93845219003,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=5121, name=python3, \
             channel 0x00000002, intr 00000000. MMU Fault\n SUBSYSTEM=pci\n",
        )
        .expect("a record");
        assert_eq!(logged_us, 93_845_219_003);
        let e = parse(logged_us * 1_000, text).expect("an Xid line");
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
        assert!(parse(0, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module").is_none());
        assert!(parse(0, "NVRM: Xid (PCI:0000:3b:00): x, junk").is_none());
        assert!(split("garbage").is_none());
        assert!(split("6,1,notanumber,-;text").is_none());
    }

    /// Against this machine's own log: two markers give offsets that agree within their
    /// windows and the clocks' drift over the test (microseconds).
    #[test]
    fn markers_measure_the_log_clock() {
        let Ok(mut log) = open() else {
            eprintln!("skipped: /dev/kmsg does not open for reading here");
            return;
        };
        let Ok(writer) = log.markers else {
            eprintln!("skipped: /dev/kmsg does not open for writing here");
            return;
        };
        let mut calibration = Calibration::new(Ok(writer));
        let mut measure = || {
            calibration.measured_ns = None;
            calibration.refresh(monotonic_ns());
            let mut buf = vec![0u8; 8192];
            while calibration.waiting(monotonic_ns()) {
                let Ok(n) = log.records.read(&mut buf) else {
                    thread::sleep(std::time::Duration::from_millis(5));
                    continue;
                };
                let record = String::from_utf8_lossy(&buf[..n]);
                if let Some((logged_us, text)) = split(&record) {
                    calibration.take(logged_us, text);
                }
            }
            assert!(calibration.measured_ns.is_some(), "the marker came back");
            calibration.clock
        };
        let (first, second) = (measure(), measure());
        let apart = (first.offset_ms() - second.offset_ms()).abs() * 1e6;
        let allowed = (first.uncertainty_ns + second.uncertainty_ns + 100_000) as f64;
        assert!(apart <= allowed, "{first:?} and {second:?}");
    }
}
