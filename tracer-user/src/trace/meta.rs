//! The file header's metadata: where and how a trace was recorded.
//!
//! JSON, so fields can be added within a major version: readers ignore fields they do not know
//! and default the ones an older recorder did not write.

use serde::{Deserialize, Serialize};

use crate::{
    analysis::CorrelatorConfig,
    clock::{boottime_ns, WallAnchor},
    probe::devices::DriverMajor,
    source::machine::Machine,
};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TraceMeta {
    /// linger version that wrote the file.
    pub recorder: String,
    pub host: String,
    /// /proc/sys/kernel/random/boot_id of the recording machine; null from older recorders.
    pub boot_id: Option<String>,
    /// `uname -r` and `uname -v`.
    pub kernel_release: String,
    pub kernel_version: String,
    pub arch: String,
    /// First line of /proc/driver/nvidia/version; null without the NVIDIA driver.
    pub driver: Option<String>,
    /// NVML library version; null when NVML could not be loaded.
    pub nvml: Option<String>,
    /// Character and block device majors of the NVIDIA drivers (/proc/devices).
    pub device_majors: Vec<DeviceMajor>,
    /// CLOCK_REALTIME - CLOCK_BOOTTIME in ns when recording started: wall time of any `ts_ns`.
    pub realtime_minus_boottime_ns: i64,
    /// IANA time zone of the recorder, for reference (reports use the reader's zone).
    pub time_zone: Option<String>,
    /// CLOCK_BOOTTIME when recording started.
    pub start_boot_ns: u64,
    /// Signals the kernel programs reported (a kernel-side filter: replay cannot widen it).
    pub signals: Vec<u32>,
    pub ring_size: u32,
    /// Analysis options of the recording command, the defaults of a replay.
    pub analysis: AnalysisDefaults,
    /// Process command lines were reduced to their first word.
    pub redacted_cmdlines: bool,
    /// The first this many events are a checkpoint of the state at `start_boot_ns` (a flight
    /// recorder segment: GPU holders from /proc, the latest NVML reading, the collector's
    /// start-up facts), not things that happened then.
    pub checkpoint_events: u64,
}

/// The END record: written when the recorder closes the file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EndSummary {
    /// CLOCK_BOOTTIME when recording stopped.
    pub end_boot_ns: u64,
    /// Records the kernel dropped (ring buffer full) over the whole recording.
    pub kernel_drops: u64,
    /// Records written before this one.
    pub records: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMajor {
    pub name: String,
    pub major: u32,
    /// `char` or `block`.
    pub class: String,
}

/// The live run's analysis options, the replay's defaults. Options a file does not name (an
/// older recorder) take today's defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AnalysisDefaults {
    #[serde(flatten)]
    pub config: CorrelatorConfig,
    pub count: Option<u64>,
}

impl AnalysisDefaults {
    pub fn new(config: &CorrelatorConfig, count: Option<usize>) -> Self {
        Self {
            config: config.clone(),
            count: count.map(|n| n as u64),
        }
    }
}

impl TraceMeta {
    /// Describes `machine` now (`nvml`: the NVML library's version, when it loads); the
    /// caller fills in the recording options.
    pub fn describe(
        anchor: &WallAnchor,
        machine: &Machine,
        devices: &[DriverMajor],
        nvml: Option<String>,
    ) -> Self {
        Self {
            recorder: env!("CARGO_PKG_VERSION").into(),
            host: machine.host.clone(),
            boot_id: machine.boot_id.clone(),
            kernel_release: machine.kernel_release.clone(),
            kernel_version: machine.kernel_version.clone(),
            arch: std::env::consts::ARCH.into(),
            driver: machine.driver.clone(),
            nvml,
            device_majors: devices
                .iter()
                .map(|d| DeviceMajor {
                    name: d.name.clone(),
                    major: d.major,
                    class: if d.char { "char" } else { "block" }.into(),
                })
                .collect(),
            realtime_minus_boottime_ns: anchor.realtime_minus_boottime_ns as i64,
            time_zone: jiff::tz::TimeZone::system().iana_name().map(str::to_string),
            start_boot_ns: boottime_ns(),
            ..Default::default()
        }
    }

    pub fn anchor(&self) -> WallAnchor {
        WallAnchor {
            realtime_minus_boottime_ns: self.realtime_minus_boottime_ns as i128,
        }
    }
}
