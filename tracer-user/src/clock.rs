//! The stream's clock (CLOCK_BOOTTIME, as `bpf_ktime_get_boot_ns`) and its wall-clock anchor.

use nix::time::{clock_gettime, ClockId};

pub fn boottime_ns() -> u64 {
    clock_ns(ClockId::CLOCK_BOOTTIME)
}

/// CLOCK_MONOTONIC: the kernel log's clock (boot time less time suspended).
pub fn monotonic_ns() -> u64 {
    clock_ns(ClockId::CLOCK_MONOTONIC)
}

fn clock_ns(id: ClockId) -> u64 {
    // Both clocks exist on every Linux this runs on; a failure would be a kernel bug.
    let ts = clock_gettime(id).unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// Maps boot-time stamps to wall-clock time: `realtime - boottime`, read once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WallAnchor {
    pub realtime_minus_boottime_ns: i128,
}

impl WallAnchor {
    pub fn now() -> Self {
        let boot = boottime_ns() as i128;
        let real = clock_ns(ClockId::CLOCK_REALTIME) as i128;
        Self {
            realtime_minus_boottime_ns: real - boot,
        }
    }

    /// Wall-clock nanoseconds since the Unix epoch for a boot-time stamp.
    pub fn wall_ns(&self, boot_ns: u64) -> i128 {
        boot_ns as i128 + self.realtime_minus_boottime_ns
    }

    /// RFC 3339 in UTC to the millisecond (`2026-12-01T14:26:36.409Z`).
    pub fn rfc3339(&self, boot_ns: u64) -> Option<String> {
        let ts = jiff::Timestamp::from_nanosecond(self.wall_ns(boot_ns)).ok()?;
        Some(format!("{ts:.3}"))
    }

    /// `HH:MM:SS.mmm` in the system's time zone.
    pub fn format_local(&self, boot_ns: u64) -> String {
        let tz = jiff::tz::TimeZone::system();
        match jiff::Timestamp::from_nanosecond(self.wall_ns(boot_ns)) {
            Ok(ts) => ts
                .to_zoned_datetime(tz)
                .strftime("%H:%M:%S%.3f")
                .to_string(),
            Err(_) => format!("boot+{:.3}s", boot_ns as f64 / 1e9),
        }
    }
}
