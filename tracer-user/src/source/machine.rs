//! What the machine is: host name, kernel, boot, NVIDIA driver and device majors, read once
//! from /proc for the trace header, the incidents' provenance, doctor and device discovery.

use std::fs;

/// The machine's identity and software, as /proc says now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Machine {
    pub host: String,
    /// `uname -r` and `uname -v`.
    pub kernel_release: String,
    pub kernel_version: String,
    /// A fresh value every boot: incidents from several boots (and nodes) merge by it.
    pub boot_id: Option<String>,
    /// First line of /proc/driver/nvidia/version; None without the NVIDIA driver.
    pub driver: Option<String>,
}

fn kernel(name: &str) -> Option<String> {
    fs::read_to_string(format!("/proc/sys/kernel/{name}"))
        .ok()
        .map(|s| s.trim().to_string())
}

pub fn read() -> Machine {
    Machine {
        host: kernel("hostname").unwrap_or_default(),
        kernel_release: kernel("osrelease").unwrap_or_default(),
        kernel_version: kernel("version").unwrap_or_default(),
        boot_id: kernel("random/boot_id"),
        driver: driver(),
    }
}

/// The NVIDIA kernel driver's version line; None when it is not loaded.
pub fn driver() -> Option<String> {
    fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|v| v.lines().next().map(|l| l.trim().to_string()))
}

/// /proc/devices: the registered character and block device majors.
pub fn proc_devices() -> std::io::Result<String> {
    fs::read_to_string("/proc/devices")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_has_a_boot_id_and_a_kernel() {
        let m = read();
        let id = m.boot_id.expect("boot_id");
        assert_eq!(id.len(), 36, "{id}");
        assert!(!m.kernel_release.is_empty());
        assert_eq!(m.kernel_release, read().kernel_release);
    }
}
