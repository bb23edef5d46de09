//! References to a dead process's GPU files that no known holder accounts for. The exit walk
//! reads each file's reference count while the dying process's table is intact: every
//! descriptor in any table holds one, and so do a descriptor in flight in a unix socket and a
//! mapping of the file. A lone CUDA process's /dev/nvidiaN files have exactly one per
//! descriptor then (every recording in tests/data/h200/suite), so more references than the
//! descriptors linger knows of mean someone it has not seen holds the file: one that received
//! it over a socket, took it with pidfd_getfd, or maps it.

use std::collections::BTreeMap;

use tracer_common::driver::{dev_major, dev_minor, NVIDIA_MAJOR};

use super::holders::{Fd, FileId, HeldFile, Holders, How};

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

/// References a dying holder's exit walk (`walk`) shows to a dead process's `files` beyond
/// the descriptors linger knew it had (`known`): references that were counted as nobody's.
/// Without traced opens, a child inherits descriptors its parent opened after linger last
/// read the parent's table.
pub fn revealed(walk: &[HeldFile], known: &[Fd], files: &[FileId], declared: &[u32]) -> u64 {
    let shown = walk
        .iter()
        .filter(|h| h.refcount > 0 && counts_holders(h.dev, declared) && files.contains(&h.file))
        .count();
    let known = known
        .iter()
        .filter(|f| {
            counts_holders(f.dev, declared)
                && files.contains(&f.file)
                && !matches!(f.how, How::SharedTable { .. })
        })
        .count();
    shown.saturating_sub(known) as u64
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

#[cfg(test)]
mod tests {
    use tracer_common::driver::{mkdev, NVIDIA_MAJOR};

    use super::{revealed, Fd, HeldFile, How};

    const GPU0: u32 = mkdev(NVIDIA_MAJOR, 0);
    const CTL: u32 = mkdev(NVIDIA_MAJOR, 255);

    fn walked(fd: i32, file: u64, dev: u32) -> HeldFile {
        HeldFile {
            fd,
            file,
            dev,
            refcount: 2,
        }
    }

    fn known(file: u64, how: How) -> Fd {
        Fd {
            file,
            dev: GPU0,
            cloexec: false,
            how,
        }
    }

    #[test]
    fn a_holders_walk_reveals_the_gpu_references_linger_did_not_know_it_had() {
        let fork = How::Fork { from: 1, t_ns: 0 };
        let dead_files = [100, 101, 102, 200];
        // It was known to hold 100 (inherited); its walk shows 100, 101 and 102 of the dead
        // process's files (opened before the fork, unseen), nvidiactl's 200 (whose count says
        // nothing) and a file of its own.
        let walk = [
            walked(8, 100, GPU0),
            walked(9, 101, GPU0),
            walked(10, 102, GPU0),
            walked(11, 200, CTL),
            walked(12, 300, GPU0),
        ];
        assert_eq!(revealed(&walk, &[known(100, fork)], &dead_files, &[]), 2);
        // A table shared with the dead process (CLONE_FILES) holds no reference of its own.
        let shared = How::SharedTable { from: 1, t_ns: 0 };
        assert_eq!(revealed(&walk, &[known(100, shared)], &dead_files, &[]), 3);
        // Without a walk (refcount 0: the descriptors linger knew) nothing is revealed.
        let unwalked: Vec<HeldFile> = walk
            .iter()
            .map(|h| HeldFile {
                refcount: 0,
                ..h.clone()
            })
            .collect();
        assert_eq!(revealed(&unwalked, &[], &dead_files, &[]), 0);
    }
}
