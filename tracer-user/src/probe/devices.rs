//! Which char devices are GPU files: the NVIDIA majors from /proc/devices, plus any device the
//! user names with `--gpu-device`.

use std::{fs, os::unix::fs::FileTypeExt, os::unix::fs::MetadataExt, path::Path};

use tracer_common::driver::mkdev;

use crate::error::{Error, Result};

/// Names in /proc/devices whose every minor is a GPU file.
const NVIDIA_DRIVERS: &[&str] = &[
    "nvidia",
    "nvidiactl",
    "nvidia-uvm",
    "nvidia-caps",
    "nvidia-modeset",
];

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuDevices {
    /// Char majors (every minor counts).
    pub majors: Vec<u32>,
    /// Single devices, kernel dev_t encoding.
    pub devs: Vec<u32>,
}

impl GpuDevices {
    /// The NVIDIA majors registered now, plus `extra` device paths.
    pub fn discover(extra: &[impl AsRef<Path>]) -> Result<Self> {
        let text = crate::source::machine::proc_devices()?;
        let mut devices = Self {
            majors: nvidia_majors(&text),
            devs: Vec::new(),
        };
        for path in extra {
            devices.devs.push(char_device(path.as_ref())?);
        }
        Ok(devices)
    }

    pub fn is_gpu(&self, dev: u32) -> bool {
        self.devs.contains(&dev) || self.majors.contains(&(dev >> 20))
    }
}

/// A major of an NVIDIA driver in /proc/devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverMajor {
    pub name: String,
    pub major: u32,
    /// Listed among the character devices (else the block devices).
    pub char: bool,
}

/// The NVIDIA drivers' majors in a /proc/devices listing, character and block.
pub fn nvidia_listing(proc_devices: &str) -> Vec<DriverMajor> {
    let mut char = true;
    let mut out = Vec::new();
    for line in proc_devices.lines() {
        if line.starts_with("Block") {
            char = false;
        }
        let mut words = line.split_whitespace();
        if let (Some(Ok(major)), Some(name)) = (words.next().map(str::parse), words.next()) {
            if NVIDIA_DRIVERS.contains(&name) {
                out.push(DriverMajor {
                    name: name.into(),
                    major,
                    char,
                });
            }
        }
    }
    out
}

/// The char majors of the NVIDIA drivers in a /proc/devices listing.
pub fn nvidia_majors(proc_devices: &str) -> Vec<u32> {
    let mut majors: Vec<u32> = nvidia_listing(proc_devices)
        .into_iter()
        .filter(|d| d.char)
        .map(|d| d.major)
        .collect();
    majors.sort_unstable();
    majors.dedup();
    majors
}

/// The kernel dev_t of a char device node.
pub fn char_device(path: &Path) -> Result<u32> {
    let meta = fs::metadata(path)?;
    if !meta.file_type().is_char_device() {
        return Err(Error::NotCharDevice(path.into()));
    }
    let rdev = meta.rdev();
    Ok(mkdev(
        nix::sys::stat::major(rdev) as u32,
        nix::sys::stat::minor(rdev) as u32,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majors_from_the_h200_listing() {
        // /proc/devices as recorded on the H200 (tests/data/h200/gpu-facts.txt).
        let facts = include_str!("../../../tests/data/h200/gpu-facts.txt");
        let listing = facts
            .split("== /proc/devices\n")
            .nth(1)
            .and_then(|s| s.split("\n== ").next())
            .expect("the recording has a /proc/devices section");
        assert_eq!(nvidia_majors(listing), vec![195, 238, 241]);
    }

    #[test]
    fn the_listing_has_both_sections() {
        let devices =
            "Character devices:\n  1 mem\n195 nvidia\n508 nvidia-uvm\n511 nvidia-frontend\n\n\
                       Block devices:\n  8 sd\n259 blkext\n";
        let m = nvidia_listing(devices);
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!((m[0].major, m[0].name.as_str()), (195, "nvidia"));
        assert_eq!((m[1].major, m[1].char), (508, true));
    }
}
