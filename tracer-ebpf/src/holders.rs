//! Processes that hold a GPU file: the early filter of the ioctl, close, exit, sleep and
//! search programs, below all of them.

use aya_ebpf::{macros::map, maps::HashMap};
use tracer_common::Loss;

use crate::emit::count_loss;

/// Processes that hold (or held) a GPU file: the early filter of the ioctl, close and exit
/// programs. Kernel-maintained, seeded by user space with the holders found at start.
#[map]
pub static HOLDERS: HashMap<u32, u8> = HashMap::with_max_entries(16384, 0);

pub fn is_holder(tgid: u32) -> bool {
    // SAFETY: the value is not held beyond the lookup.
    unsafe { HOLDERS.get(tgid).is_some() }
}

/// Marks `tgid` a GPU holder; a full map is counted (its GPU work then goes unseen).
pub fn add_holder(tgid: u32) {
    if HOLDERS.insert(tgid, 0, 0).is_err() {
        count_loss(Loss::Holders);
    }
}
