//! The file header's metadata: where and how a trace was recorded.
//!
//! JSON, so fields can be added within a major version: readers ignore fields they do not know
//! and default the ones an older recorder did not write.

use std::fs;

use serde::{Deserialize, Serialize};

use crate::{
    analysis::CorrelatorConfig,
    clock::{boottime_ns, WallAnchor},
};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TraceMeta {
    /// linger version that wrote the file.
    pub recorder: String,
    pub host: String,
    /// `uname -r` and `uname -v`.
    pub kernel_release: String,
    pub kernel_version: String,
    pub arch: String,
    /// First line of /proc/driver/nvidia/version; null without the NVIDIA driver.
    pub driver: Option<String>,
    /// NVML library version; null when NVML could not be loaded.
    pub nvml: Option<String>,
    /// Character and block device majors whose name contains "nvidia" (/proc/devices).
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
    /// Describes this machine now; the caller fills in the recording options.
    pub fn collect(anchor: &WallAnchor) -> Self {
        let proc = |name: &str| {
            fs::read_to_string(format!("/proc/sys/kernel/{name}"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        Self {
            recorder: env!("CARGO_PKG_VERSION").into(),
            host: proc("hostname"),
            kernel_release: proc("osrelease"),
            kernel_version: proc("version"),
            arch: std::env::consts::ARCH.into(),
            driver: fs::read_to_string("/proc/driver/nvidia/version")
                .ok()
                .and_then(|v| v.lines().next().map(|l| l.trim().to_string())),
            nvml: nvml_wrapper::Nvml::init()
                .ok()
                .and_then(|n| n.sys_nvml_version().ok()),
            device_majors: fs::read_to_string("/proc/devices")
                .map(|s| nvidia_majors(&s))
                .unwrap_or_default(),
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

/// `/proc/devices`: a "Character devices:" and a "Block devices:" section of `major name` lines.
fn nvidia_majors(devices: &str) -> Vec<DeviceMajor> {
    let mut class = "char";
    let mut out = Vec::new();
    for line in devices.lines() {
        if line.starts_with("Block") {
            class = "block";
        }
        let mut words = line.split_whitespace();
        if let (Some(Ok(major)), Some(name)) = (words.next().map(str::parse), words.next()) {
            if name.contains("nvidia") {
                out.push(DeviceMajor {
                    name: name.into(),
                    major,
                    class: class.into(),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majors_come_from_both_sections() {
        let devices = "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-uvm\n\n\
                       Block devices:\n  8 sd\n259 blkext\n";
        let m = nvidia_majors(devices);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].major, m[0].name.as_str()), (195, "nvidia-frontend"));
        assert_eq!((m[1].major, m[1].class.as_str()), (508, "char"));
    }
}
