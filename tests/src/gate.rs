//! Helpers of the tests that run `linger wait` against holders of the stand-in device.

use std::{
    process::Output,
    sync::{Mutex, MutexGuard, PoisonError},
    thread,
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

/// Every stand-in device is /dev/full's node: one gate at a time in a test binary, or a gate
/// would see the other tests' holders of it.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A gate's exit code and its JSON answer.
pub fn answer(out: Output) -> (Option<i32>, Value) {
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "linger wait's answer is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), json)
}

/// SIGKILLs a process that is not our child and waits until it holds nothing (its parent,
/// init, may leave it a zombie).
pub fn kill_and_wait(pid: u32) {
    let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    let start = Instant::now();
    while tracer_user::source::procfs::stat(pid).is_some_and(|s| s.state != 'Z') {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{pid} did not die"
        );
        thread::sleep(Duration::from_millis(10));
    }
}
