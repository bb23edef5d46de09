//! kcmp(2) KCMP_FILE: whether two descriptors, possibly in two processes, are the same open
//! file, and the kernel's order of open files, which lets a set of descriptors be grouped
//! with a binary search per descriptor instead of a comparison with every group.

use std::cmp::Ordering;

use nix::libc;

const KCMP_FILE: libc::c_long = 0;

/// True when `pid1`'s `fd1` and `pid2`'s `fd2` refer to the same `struct file`.
pub fn same_file(pid1: u32, fd1: i32, pid2: u32, fd2: i32) -> bool {
    order(pid1, fd1, pid2, fd2) == Some(Ordering::Equal)
}

/// How `pid1`'s `fd1` compares with `pid2`'s `fd2` in the kernel's (per-boot, scrambled)
/// order of open files; None when kcmp cannot say (a process gone, no permission).
pub fn order(pid1: u32, fd1: i32, pid2: u32, fd2: i32) -> Option<Ordering> {
    // SAFETY: kcmp takes only integers and reads no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid1 as libc::c_long,
            pid2 as libc::c_long,
            KCMP_FILE,
            fd1 as libc::c_long,
            fd2 as libc::c_long,
        )
    };
    match r {
        0 => Some(Ordering::Equal),
        1 => Some(Ordering::Less),
        2 => Some(Ordering::Greater),
        _ => None,
    }
}
