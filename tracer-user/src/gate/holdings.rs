//! The GPU files a process holds: its descriptors of GPU device nodes, and its memory
//! mappings of them. A mapping keeps the file (and the GPU memory behind it) after every
//! descriptor is closed: a forked child that closes the descriptors it inherited still holds
//! the parent's mappings.

use std::{collections::HashMap, fs, os::unix::fs::MetadataExt, path::Path};

use crate::{
    probe::devices::GpuDevices,
    source::{kcmp, procfs},
};
use tracer_common::driver::mkdev;

/// What one process holds.
#[derive(Clone, Debug, Default)]
pub struct Holding {
    pub fds: Vec<procfs::Found>,
    /// The devices of its GPU mappings, one entry per mapping.
    pub mapped: Vec<u32>,
}

impl Holding {
    pub fn is_empty(&self) -> bool {
        self.fds.is_empty() && self.mapped.is_empty()
    }

    /// Whether `self` holds an open file `other` holds too (the same `struct file`: inherited
    /// by fork or passed over a socket, never two opens of one node).
    pub fn shares_with(&self, other: &Holding) -> bool {
        self.fds.iter().any(|a| {
            other
                .fds
                .iter()
                .any(|b| a.dev == b.dev && kcmp::same_file(a.pid, a.fd, b.pid, b.fd))
        })
    }
}

/// GPU device nodes as `/proc/PID/maps` names them: the node's file system (`major:minor`)
/// and inode, to its device.
#[derive(Clone, Debug, Default)]
pub struct Nodes(HashMap<(u32, u32, u64), u32>);

impl Nodes {
    /// The nodes of `paths` (the NVIDIA nodes in /dev, `--gpu-device` paths) that are GPU
    /// files.
    pub fn of_paths<'a>(paths: impl IntoIterator<Item = &'a Path>, devices: &GpuDevices) -> Self {
        let mut nodes = Self::default();
        for path in paths {
            if let Ok(meta) = fs::metadata(path) {
                let dev = rdev(meta.rdev());
                if devices.is_gpu(dev) {
                    nodes.0.insert(key(meta.dev(), meta.ino()), dev);
                }
            }
        }
        nodes
    }

    /// The nodes behind descriptors found open (a container's /dev may have its own).
    pub fn learn(&mut self, fds: &[procfs::Found]) {
        for f in fds {
            self.0.insert(key(f.node.0, f.node.1), f.dev);
        }
    }
}

fn key(st_dev: u64, ino: u64) -> (u32, u32, u64) {
    (
        nix::sys::stat::major(st_dev) as u32,
        nix::sys::stat::minor(st_dev) as u32,
        ino,
    )
}

fn rdev(raw: u64) -> u32 {
    mkdev(
        nix::sys::stat::major(raw) as u32,
        nix::sys::stat::minor(raw) as u32,
    )
}

/// The NVIDIA device nodes in /dev.
pub fn nvidia_nodes() -> Vec<std::path::PathBuf> {
    fs::read_dir("/dev")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("nvidia"))
        .map(|e| e.path())
        .collect()
}

/// What `pid` holds now: its GPU descriptors, and (when `maps` is asked) its mappings of
/// the GPU nodes in `nodes` or behind its own descriptors.
pub fn of(pid: u32, devices: &GpuDevices, nodes: &Nodes, maps: bool) -> Holding {
    let fds = procfs::gpu_descriptors(pid, devices);
    let mapped = if maps {
        let mut known = nodes.clone();
        known.learn(&fds);
        fs::read_to_string(format!("/proc/{pid}/maps"))
            .map(|m| mappings(&m, &known))
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    Holding { fds, mapped }
}

/// The GPU devices of the mappings in a `/proc/PID/maps` listing.
fn mappings(maps: &str, nodes: &Nodes) -> Vec<u32> {
    maps.lines()
        .filter_map(|line| {
            // address perms offset dev inode [path]
            let mut f = line.split_ascii_whitespace().skip(3);
            let (major, minor) = f.next()?.split_once(':')?;
            let ino: u64 = f.next()?.parse().ok()?;
            if ino == 0 {
                return None;
            }
            let k = (
                u32::from_str_radix(major, 16).ok()?,
                u32::from_str_radix(minor, 16).ok()?,
                ino,
            );
            nodes.0.get(&k).copied()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_of_known_nodes_only() {
        let mut nodes = Nodes::default();
        nodes.0.insert((0, 5, 1234), mkdev(195, 0));
        let maps = "\
7f00-7f10 rw-s 00000000 00:05 1234                       /dev/nvidia0
7f10-7f20 rw-s 00001000 00:05 1234                       /dev/nvidia0
7f20-7f30 r-xp 00000000 fd:01 1234                       /usr/lib/libc.so.6
7f30-7f40 rw-p 00000000 00:00 0 
garbage line
";
        assert_eq!(mappings(maps, &nodes), vec![mkdev(195, 0); 2]);
    }
}
