//! kcmp(2) KCMP_FILE: whether two descriptors, possibly in two processes, are the same open file.

use nix::libc;

const KCMP_FILE: libc::c_long = 0;

/// True when `pid1`'s `fd1` and `pid2`'s `fd2` refer to the same `struct file`.
pub fn same_file(pid1: u32, fd1: i32, pid2: u32, fd2: i32) -> bool {
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
    r == 0
}
