//! Reads of `task_struct` and `signal_struct` fields through offsets resolved from BTF.

use aya_ebpf::helpers::bpf_probe_read_kernel;
use tracer_common::{KernelOffsets, COMM_LEN};

#[unsafe(no_mangle)]
static OFFSETS: KernelOffsets = KernelOffsets {
    task_pid: 0,
    task_tgid: 0,
    task_comm: 0,
    task_group_leader: 0,
    task_signal: 0,
    task_exit_code: 0,
    signal_nr_threads: 0,
    signal_live: 0,
};

#[inline(always)]
fn offsets() -> KernelOffsets {
    // SAFETY: a read-only global that user space fills before load; volatile keeps the
    // compiler from folding the zero initial values.
    unsafe { core::ptr::read_volatile(&OFFSETS) }
}

#[inline(always)]
fn read<T: Copy + Default>(base: *const u8, off: u32) -> T {
    // SAFETY: bpf_probe_read_kernel validates the address; a failed read yields the default.
    unsafe { bpf_probe_read_kernel(base.add(off as usize) as *const T).unwrap_or_default() }
}

#[derive(Clone, Copy)]
pub struct Task(pub *const u8);

impl Task {
    pub fn tgid(self) -> u32 {
        read::<i32>(self.0, offsets().task_tgid) as u32
    }
    pub fn pid(self) -> u32 {
        read::<i32>(self.0, offsets().task_pid) as u32
    }
    pub fn exit_code(self) -> u32 {
        read::<i32>(self.0, offsets().task_exit_code) as u32
    }
    pub fn comm(self) -> [u8; COMM_LEN] {
        read(self.0, offsets().task_comm)
    }
    pub fn group_leader(self) -> Task {
        Task(read::<u64>(self.0, offsets().task_group_leader) as *const u8)
    }
    fn signal(self) -> *const u8 {
        read::<u64>(self.0, offsets().task_signal) as *const u8
    }
    pub fn nr_threads(self) -> u32 {
        read::<i32>(self.signal(), offsets().signal_nr_threads) as u32
    }
    /// Zero once every thread of the group has started exiting.
    pub fn live_threads(self) -> u32 {
        read::<i32>(self.signal(), offsets().signal_live) as u32
    }
}
