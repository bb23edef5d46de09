//! References to a dead process's GPU files that no known holder accounts for. The exit walk
//! reads each file's reference count while the dying process's table is intact: every
//! descriptor in any table holds one, and so do a descriptor in flight in a unix socket and a
//! mapping of the file, and, for as long as it lasts, a poll or a system call under way in a
//! thread of a multi-threaded holder. A lone CUDA process's /dev/nvidiaN files have exactly
//! one per descriptor then (every recording in tests/data/h200/suite), so more references than
//! the descriptors linger knows of mean someone it has not seen holds the file (one that
//! received it over a socket, took it with pidfd_getfd, or maps it), unless a holder it knows
//! is alive (a CUDA process's threads poll its files: a child exiting beside its live parent
//! sees a few more on the H100) or has died without closing them yet.

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

/// References to a dead process's GPU files that no holder linger knows accounts for, per
/// file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unseen(BTreeMap<FileId, u64>);

impl Unseen {
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    pub fn any(&self) -> bool {
        self.0.values().any(|n| *n > 0)
    }

    /// Whether references to `file` are among them.
    pub fn counts(&self, file: FileId) -> bool {
        self.0.get(&file).is_some_and(|n| *n > 0)
    }

    /// Keeps the counts of the files `keep` says are still unexplained.
    pub fn retain(&mut self, mut keep: impl FnMut(FileId) -> bool) {
        self.0.retain(|f, n| *n > 0 && keep(*f));
    }

    /// A later walk counted the references to `files` again (`fresh`, which leaves out those
    /// it found none unseen on): its counts replace the earlier ones of those files.
    pub fn recount(&mut self, files: &[FileId], fresh: Unseen) {
        self.0.retain(|f, _| !files.contains(f));
        self.0.extend(fresh.0);
    }

    /// Each file's count is at most `other`'s (a search found holders of some).
    pub fn at_most(&mut self, other: &Unseen) {
        for (f, n) in self.0.iter_mut() {
            *n = (*n).min(other.0.get(f).copied().unwrap_or(0));
        }
        self.0.retain(|_, n| *n > 0);
    }

    /// A holder nobody knew of died holding `held`: its descriptors were some of the unseen
    /// references.
    pub fn found_in(&mut self, held: &[HeldFile]) {
        for h in held {
            if let Some(n) = self.0.get_mut(&h.file) {
                *n = n.saturating_sub(1);
            }
        }
        self.0.retain(|_, n| *n > 0);
    }
}

/// References to `pid`'s GPU files (`held`: a walk of its table, or of a holder's at its
/// death) held outside its own table and those of known holders, per file.
pub fn unaccounted(held: &[HeldFile], holders: &Holders, pid: u32) -> Unseen {
    // Per file: its count and the walked process's own descriptors of it.
    let mut files: BTreeMap<FileId, (u64, u64)> = BTreeMap::new();
    for h in held
        .iter()
        .filter(|h| h.refcount > 0 && counts_holders(h.dev, holders.declared()))
    {
        let entry = files.entry(h.file).or_insert((h.refcount, 0));
        entry.1 += 1;
    }
    Unseen(
        files
            .into_iter()
            .map(|(file, (refs, own))| {
                (
                    file,
                    refs.saturating_sub(own + holders.references_of(file, pid)),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use tracer_common::driver::{mkdev, NVIDIA_MAJOR};

    use super::{unaccounted, HeldFile, Holders};
    use crate::event::{Event, EventData, FdOp};

    const GPU0: u32 = mkdev(NVIDIA_MAJOR, 0);
    const CTL: u32 = mkdev(NVIDIA_MAJOR, 255);

    fn walked(fd: i32, file: u64, dev: u32, refcount: u64) -> HeldFile {
        HeldFile {
            fd,
            file,
            dev,
            refcount,
        }
    }

    /// A live process 20 holds file 100 twice (an open and a dup): a dead process's walk of
    /// 100 with five references and its own two leaves one nobody known accounts for;
    /// nvidiactl's count says nothing; a file nobody else holds leaves its extra reference.
    #[test]
    fn references_beyond_every_known_descriptor_are_counted_per_file() {
        let mut holders = Holders::default();
        for fd in [3, 4] {
            holders.on_event(&Event {
                ts_ns: 1,
                cpu: 0,
                pid: 20,
                tid: 20,
                data: EventData::GpuFd {
                    op: FdOp::Open,
                    fd,
                    dev: GPU0,
                    cloexec: false,
                    truncated: false,
                    file: 100,
                    refcount: 1,
                },
            });
        }
        let walk = [
            walked(8, 100, GPU0, 5),
            walked(9, 100, GPU0, 5),
            walked(10, 200, CTL, 9),
            walked(11, 300, GPU0, 2),
        ];
        let mut unseen = unaccounted(&walk, &holders, 10);
        assert_eq!(unseen.total(), 2);
        unseen.retain(|f| f != 100);
        assert_eq!(unseen.total(), 1, "only file 300's is left");
        unseen.found_in(&[walked(5, 300, GPU0, 1)]);
        assert!(!unseen.any());
    }
}
