//! Reaps through waitid, as service managers and Go (`os.Process.Wait`, through a pidfd) do:
//! with the system call tracepoints, linger names the reaper and the reap's moment from
//! waitid's siginfo, and a WNOWAIT peek (the child reported, left a zombie) is no reap.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use linger_tests::{assert_reaped_by, num, require_root, Live, Target};
use nix::{
    libc,
    sys::{
        signal::Signal,
        wait::{waitid, Id, WaitPidFlag, WaitStatus},
    },
    time::{clock_gettime, ClockId},
    unistd::Pid,
};

fn boottime_ns() -> u64 {
    let t = clock_gettime(ClockId::CLOCK_BOOTTIME).expect("CLOCK_BOOTTIME");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

/// Kills a target under `linger live --syscall-hooks` and lets `reap` reap it; returns the
/// incident and the moment `reap` began its reaping call.
fn killed_and_reaped(reap: impl FnOnce(Pid) -> u64) -> serde_json::Value {
    require_root();
    let target = Target::start(1, "default");
    let live = Live::watch_with(target.pid, "10s", &["--syscall-hooks"]);
    target.child.signal(Signal::SIGKILL);
    let pid = Pid::from_raw(target.pid as i32);
    let reaping_began = reap(pid);
    let out = live.finish();
    let inc = out.incident_of(target.pid).clone();
    assert_reaped_by(&inc, std::process::id(), Some("wait"));
    let reaped = num(&inc, "/t_reaped_ns");
    assert!(
        reaped >= reaping_began,
        "reaped before the reaping call: {inc:#}"
    );
    assert!(reaped >= num(&inc, "/t_zombie_ns"), "{inc:#}");
    inc
}

fn reaped_by_waitid(id: Id) {
    match waitid(id, WaitPidFlag::WEXITED) {
        Ok(WaitStatus::Signaled(_, Signal::SIGKILL, _)) => {}
        other => panic!("waitid: {other:?}"),
    }
}

#[test]
fn a_reap_by_waitid_names_its_reaper() {
    killed_and_reaped(|pid| {
        let began = boottime_ns();
        reaped_by_waitid(Id::Pid(pid));
        began
    });
}

#[test]
fn a_reap_through_a_pidfd_names_its_reaper() {
    killed_and_reaped(|pid| {
        // SAFETY: pidfd_open returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
        assert!(fd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
        // SAFETY: a descriptor just opened, owned by nothing else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let began = boottime_ns();
        reaped_by_waitid(Id::PIDFd(pidfd.as_fd()));
        began
    });
}

#[test]
fn a_wnowait_peek_is_no_reap() {
    killed_and_reaped(|pid| {
        let peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(pid), peek) {
            Ok(WaitStatus::Signaled(..)) => {}
            other => panic!("waitid WNOWAIT: {other:?}"),
        }
        // The reap is the second call's, whatever the first one said.
        let began = boottime_ns();
        reaped_by_waitid(Id::Pid(pid));
        began
    });
}
