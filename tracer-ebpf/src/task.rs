//! Reads of `task_struct` and `signal_struct` fields through offsets resolved from BTF.

use aya_ebpf::helpers::{bpf_get_current_task, bpf_probe_read_kernel};
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
    task_files: 0,
    files_fdt: 0,
    fdtable_max_fds: 0,
    fdtable_fd: 0,
    fdtable_close_on_exec: 0,
    fdtable_open_fds: 0,
    file_inode: 0,
    file_refcount: 0,
    file_refcount_bias: 0,
    inode_rdev: 0,
    file_private_data: 0,
    task_stack: 0,
    stack_regs: 0,
    task_state: 0,
    switch_prev_state: 0,
    task_nvcsw: 0,
};

#[inline(always)]
pub fn offsets() -> KernelOffsets {
    // SAFETY: a read-only global that user space fills before load; volatile keeps the
    // compiler from folding the zero initial values.
    unsafe { core::ptr::read_volatile(&OFFSETS) }
}

/// Where the saved user registers sit above the kernel stack; 0 where `bpf_task_pt_regs`
/// exists. Read alone (not with the whole table) so that the verifier sees a constant and never
/// checks the code for the other kind of kernel, which it might reject.
#[inline(always)]
pub fn stack_regs() -> u32 {
    // SAFETY: as in `offsets`.
    unsafe { core::ptr::read_volatile(core::ptr::addr_of!(OFFSETS.stack_regs)) }
}

/// Whether `sched_switch` passes `prev_state`; read alone, as `stack_regs`: older verifiers
/// refuse a read of an argument the tracepoint does not have.
#[inline(always)]
pub fn switch_passes_prev_state() -> bool {
    // SAFETY: as in `offsets`.
    unsafe { core::ptr::read_volatile(core::ptr::addr_of!(OFFSETS.switch_prev_state)) != 0 }
}

#[inline(always)]
pub fn read<T: Copy + Default>(base: *const u8, off: u32) -> T {
    // SAFETY: bpf_probe_read_kernel validates the address; a failed read yields the default.
    unsafe { bpf_probe_read_kernel(base.add(off as usize) as *const T).unwrap_or_default() }
}

#[derive(Clone, Copy)]
pub struct Task(pub *const u8);

impl Task {
    /// The running task.
    pub fn current() -> Task {
        // SAFETY: the running task is valid for the program's run.
        Task(unsafe { bpf_get_current_task() } as *const u8)
    }
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
        self.comm_word().to_ne_bytes()
    }
    /// `comm` as one word: a failed read's zero is then two stores, where a byte array's
    /// would be a call to `memset` (a global subprogram, which verifiers before 5.12 refuse
    /// to take a stack pointer).
    pub fn comm_word(self) -> u128 {
        read(self.0, offsets().task_comm)
    }
    /// The state the task is in (`__state` or `state`; the low 32 bits suffice).
    pub fn state(self) -> u32 {
        read::<u32>(self.0, offsets().task_state)
    }
    /// Its voluntary context switches (`nvcsw`, an unsigned long).
    pub fn voluntary_switches(self) -> u64 {
        read::<u64>(self.0, offsets().task_nvcsw)
    }
    /// The base of the task's kernel stack.
    pub fn stack(self) -> *const u8 {
        read::<u64>(self.0, offsets().task_stack) as *const u8
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

impl Task {
    /// The task's fd table (`files->fdt`), or None for a task without files (a kernel thread,
    /// or one past exit_files).
    pub fn fdtable(self) -> Option<FdTable> {
        let o = offsets();
        let files = read::<u64>(self.0, o.task_files) as *const u8;
        if files.is_null() {
            return None;
        }
        let fdt = read::<u64>(files, o.files_fdt) as *const u8;
        (!fdt.is_null()).then_some(FdTable(fdt))
    }

    pub fn files_ptr(self) -> u64 {
        read::<u64>(self.0, offsets().task_files)
    }
}

#[derive(Clone, Copy)]
pub struct FdTable(*const u8);

impl FdTable {
    /// The table at `addr`, an address passed as a number (to a global subprogram).
    pub fn at(addr: u64) -> FdTable {
        FdTable(addr as *const u8)
    }

    pub fn addr(self) -> u64 {
        self.0 as u64
    }

    pub fn max_fds(self) -> u32 {
        read::<u32>(self.0, offsets().fdtable_max_fds)
    }

    /// The `struct file *` at `fd`, or 0.
    pub fn file(self, fd: u32) -> u64 {
        if fd >= self.max_fds() {
            return 0;
        }
        self.slots().file(fd)
    }

    /// The `struct file *` array (`fdtable.fd`), read once for a walk of many descriptors.
    pub fn slots(self) -> FdSlots {
        FdSlots(read::<u64>(self.0, offsets().fdtable_fd) as *const u8)
    }

    /// Which of descriptors `64 * word` to `64 * word + 63` are open, one bit each.
    pub fn open_word(self, word: u32) -> u64 {
        let bits = read::<u64>(self.0, offsets().fdtable_open_fds) as *const u8;
        if bits.is_null() {
            return 0;
        }
        read::<u64>(bits, word.wrapping_mul(8))
    }

    pub fn cloexec(self, fd: u32) -> bool {
        let bits = read::<u64>(self.0, offsets().fdtable_close_on_exec) as *const u8;
        if bits.is_null() {
            return false;
        }
        let word = read::<u64>(bits, (fd / 64).wrapping_mul(8));
        word >> (fd % 64) & 1 != 0
    }
}

#[derive(Clone, Copy)]
pub struct FdSlots(*const u8);

impl FdSlots {
    /// The `struct file *` at `fd` (below the table's `max_fds`), or 0.
    pub fn file(self, fd: u32) -> u64 {
        if self.0.is_null() {
            return 0;
        }
        read::<u64>(self.0, fd.wrapping_mul(8))
    }
}

/// A `struct file`'s device number (`f_inode->i_rdev`).
pub fn file_dev(file: u64) -> u32 {
    let o = offsets();
    let inode = read::<u64>(file as *const u8, o.file_inode) as *const u8;
    if inode.is_null() {
        return 0;
    }
    read::<u32>(inode, o.inode_rdev)
}

pub fn file_private_data(file: u64) -> u64 {
    read::<u64>(file as *const u8, offsets().file_private_data)
}

pub fn file_refcount(file: u64) -> u64 {
    let o = offsets();
    (read::<i64>(file as *const u8, o.file_refcount) + o.file_refcount_bias as i64) as u64
}
