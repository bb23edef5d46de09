//! References to a dead process's GPU files that no known holder accounts for. The exit walk
//! reads each file's reference count while the dying process's table is intact: every
//! descriptor in any table holds one, and so do a descriptor in flight in a unix socket and a
//! mapping of the file. A lone CUDA process's /dev/nvidiaN files have exactly one per
//! descriptor then (every recording in tests/data/h200/suite), so more references than the
//! descriptors linger knows of mean someone it has not seen holds the file: one that received
//! it over a socket, took it with pidfd_getfd, or maps it.

use std::collections::BTreeMap;

use tracer_common::driver::{dev_major, dev_minor, NVIDIA_MAJOR};

use super::holders::{FileId, HeldFile, Holders};

/// The highest minor of a GPU node (/dev/nvidiaN); 254 and 255 are nvidia-modeset and
/// nvidiactl.
const LAST_GPU_MINOR: u32 = 247;

/// Whether a file's count says who holds it: /dev/nvidiaN's does (measured on the H200: a lone
/// process's files have exactly one reference per descriptor), and a `--gpu-device`'s. The
/// driver takes references of its own on nvidiactl (one per /dev/nvidiaN registered with it)
/// and UVM on its files, which no descriptor accounts for.
fn counts_holders(dev: u32, declared: &[u32]) -> bool {
    is_gpu_node(dev) || declared.contains(&dev)
}

/// Whether `dev` is a GPU's own node, /dev/nvidiaN.
pub fn is_gpu_node(dev: u32) -> bool {
    dev_major(dev) == NVIDIA_MAJOR && dev_minor(dev) <= LAST_GPU_MINOR
}

/// References to `pid`'s GPU files held outside its own table and those of known holders.
pub fn unaccounted(held: &[HeldFile], holders: &Holders, pid: u32) -> u64 {
    // Per file: its count and the dead process's own descriptors of it.
    let mut files: BTreeMap<FileId, (u64, u64)> = BTreeMap::new();
    for h in held
        .iter()
        .filter(|h| h.refcount > 0 && counts_holders(h.dev, holders.declared()))
    {
        let entry = files.entry(h.file).or_insert((h.refcount, 0));
        entry.1 += 1;
    }
    files
        .into_iter()
        .map(|(file, (refs, own))| refs.saturating_sub(own + holders.references_of(file, pid)))
        .sum()
}
