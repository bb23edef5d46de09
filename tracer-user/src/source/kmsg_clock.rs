//! The kernel log's clock against CLOCK_MONOTONIC. The log stamps each record with the kernel's
//! local clock (sched_clock, microseconds), which x86-64 kernels keep within a millisecond of
//! CLOCK_MONOTONIC but arm64 ones need not: Debian's arm64 guests had them 0.6 and 1.2 s apart
//! (docs/kernels.md). So the offset is measured: a marker record is written to the log between
//! two monotonic readings and its stamp read back. The clocks drift apart slowly (a few
//! microseconds a minute here, docs/gpu-errors.md), so a stale offset is measured again before
//! a GPU error is placed, rather than on a timer that would fill the log with markers.

use std::{fs::File, io::Write};

use crate::clock::monotonic_ns;

/// How old an offset may be when a GPU error is placed with it.
pub const STALE_AFTER_NS: u64 = 60_000_000_000;
/// How long a marker may take to come back; one that does not (user writes to the log turned
/// off or rate-limited) leaves the offset as it was.
pub const MARKER_TIMEOUT_NS: u64 = 1_000_000_000;

/// `log stamp - CLOCK_MONOTONIC`, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogClock {
    offset_ns: i64,
    /// How far the true offset may be from `offset_ns` either way.
    pub uncertainty_ns: u64,
}

impl LogClock {
    /// Uncalibrated: the two clocks taken as equal, as x86-64 kernels keep them.
    pub const ASSUMED_EQUAL: Self = Self {
        offset_ns: 0,
        uncertainty_ns: u64::MAX,
    };

    /// From a marker written between the monotonic readings `before_ns` and `after_ns` and
    /// stamped `logged_us` by the log. The stamp was taken at some instant of that window and
    /// cut to the microsecond, so the offset lies in
    /// `[logged - after, logged + 1 µs - before]`: its middle, with half its width.
    pub fn from_marker(before_ns: u64, logged_us: u64, after_ns: u64) -> Option<Self> {
        let logged_ns = i128::from(logged_us) * 1_000;
        let low = logged_ns - i128::from(after_ns);
        let high = logged_ns + 1_000 - i128::from(before_ns);
        if high < low {
            return None;
        }
        Some(Self {
            offset_ns: i64::try_from((low + high) / 2).ok()?,
            uncertainty_ns: u64::try_from((high - low + 1) / 2).ok()?,
        })
    }

    /// A log stamp (microseconds) on CLOCK_MONOTONIC (nanoseconds), 0 for a stamp before boot.
    pub fn monotonic_ns(&self, logged_us: u64) -> u64 {
        let ns = i128::from(logged_us) * 1_000 - i128::from(self.offset_ns);
        u64::try_from(ns.max(0)).unwrap_or(u64::MAX)
    }

    /// The offset in milliseconds, for the log line that reports it.
    pub fn offset_ms(&self) -> f64 {
        self.offset_ns as f64 / 1e6
    }
}

/// A marker written and not yet read back.
#[derive(Debug)]
pub struct Marker {
    text: String,
    before_ns: u64,
    after_ns: u64,
}

impl Marker {
    /// Writes the `n`th marker of this process to the log (`writer`: /dev/kmsg opened for
    /// writing), at level info of the user facility. The newline ends the record: without it
    /// the kernel holds the record open for a continuation and no reader sees it.
    pub fn write(writer: &mut File, n: u64) -> std::io::Result<Self> {
        let text = format!(
            "linger[{}]: kernel log clock marker {n}",
            std::process::id()
        );
        let before_ns = monotonic_ns();
        writer.write_all(format!("<14>{text}\n").as_bytes())?;
        let after_ns = monotonic_ns();
        Ok(Self {
            text,
            before_ns,
            after_ns,
        })
    }

    /// Whether a record's text is this marker.
    pub fn is(&self, text: &str) -> bool {
        text.lines().next() == Some(self.text.as_str())
    }

    /// The clock this marker's stamp gives.
    pub fn clock(&self, logged_us: u64) -> Option<LogClock> {
        LogClock::from_marker(self.before_ns, logged_us, self.after_ns)
    }

    /// Whether it has had its time to come back.
    pub fn timed_out(&self, now_ns: u64) -> bool {
        now_ns.saturating_sub(self.after_ns) > MARKER_TIMEOUT_NS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_the_middle_of_the_window() {
        // Written between 10.000 s and 10.002 s of CLOCK_MONOTONIC, stamped 11.2 s by the log.
        let clock =
            LogClock::from_marker(10_000_000_000, 11_200_000, 10_002_000_000).expect("a window");
        // Offset in [1.198 s, 1.200001 s].
        assert_eq!(clock.offset_ns, 1_199_000_500);
        assert_eq!(clock.uncertainty_ns, 1_000_500);
        // A record the log stamped 20 s was logged at about 18.8 s monotonic.
        assert_eq!(clock.monotonic_ns(20_000_000), 18_800_999_500);
        assert!((clock.offset_ms() - 1199.0005).abs() < 1e-6);
        // Before the monotonic clock's start: 0, not a wrap.
        assert_eq!(clock.monotonic_ns(1_000), 0);
    }

    #[test]
    fn a_log_clock_behind_gives_a_negative_offset() {
        let clock =
            LogClock::from_marker(5_000_000_000, 4_500_000, 5_000_001_000).expect("a window");
        assert_eq!(clock.offset_ns, -500_000_000);
        assert_eq!(clock.uncertainty_ns, 1_000);
        assert_eq!(clock.monotonic_ns(4_500_000), 5_000_000_000);
    }

    #[test]
    fn a_window_backwards_gives_no_clock() {
        assert!(LogClock::from_marker(u64::MAX, 0, 0).is_none());
    }

    #[test]
    fn uncalibrated_stamps_are_taken_as_monotonic() {
        assert_eq!(LogClock::ASSUMED_EQUAL.monotonic_ns(1_234), 1_234_000);
    }

    #[test]
    fn a_marker_is_known_by_its_text_and_times_out() {
        let m = Marker {
            text: "linger[7]: kernel log clock marker 3".into(),
            before_ns: 100,
            after_ns: 200,
        };
        assert!(m.is("linger[7]: kernel log clock marker 3\n SUBSYSTEM=x\n"));
        assert!(!m.is("linger[7]: kernel log clock marker 31"));
        assert!(!m.timed_out(200 + MARKER_TIMEOUT_NS));
        assert!(m.timed_out(201 + MARKER_TIMEOUT_NS));
    }
}
