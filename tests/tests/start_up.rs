//! Kills while `linger live` is still attaching its programs: the hooks come up one after the
//! other, so a kill seen by the first (signal generation) could miss its delivery, exit and reap,
//! which later ones record. Each incident must be whole or not be at all: never a verdict drawn
//! from the hooks that were there yet ("not delivered" about a process that died).

use std::{
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

use linger_tests::{list, require_root, text, Live};
use nix::sys::signal::Signal;

#[test]
fn kills_during_start_up_give_whole_incidents_only() {
    require_root();
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicU64::new(0));
    let last = Arc::new(AtomicU32::new(0));
    // Spawn /bin/sleep, SIGKILL it, reap it, over and over, from before linger starts until
    // after it is ready.
    let storm = {
        let (stop, kills, last) = (stop.clone(), kills.clone(), last.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut child = Command::new("/bin/sleep")
                    .arg("60")
                    .stdin(Stdio::null())
                    .spawn()
                    .expect("spawning /bin/sleep");
                child.kill().expect("SIGKILL to /bin/sleep");
                child.wait().expect("reaping /bin/sleep");
                last.store(child.id(), Ordering::Relaxed);
                kills.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut live = Live::start(["--json"]);
    let before_ready = kills.load(Ordering::Relaxed);
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    storm.join().expect("the storm thread");
    let after_ready = kills.load(Ordering::Relaxed) - before_ready;
    // An incident comes out once its process is reaped, which this mode sees when the kernel
    // frees the task, an RCU grace period later (sometimes hundreds of ms on a busy machine):
    // the last kill's incident comes after the others'.
    let last = last.load(Ordering::Relaxed);
    while let Some(record) = live.next_record() {
        if record["type"] == "incident" && record["target"]["pid"] == last {
            break;
        }
    }
    live.child.signal(Signal::SIGINT);
    let out = live.finish();
    assert!(out.status.success(), "{out:#?}");

    let me = u64::from(std::process::id());
    let ours: Vec<_> = out
        .of_type("incident")
        .into_iter()
        .filter(|r| r["sender"]["pid"] == me && r["signal_name"] == "SIGKILL")
        .collect();
    assert!(
        before_ready > 0 && after_ready > 0,
        "the storm must run across the start ({before_ready} kills before ready, \
         {after_ready} after)"
    );
    // Every kill after the ready line is reported; some before it may be too.
    assert!(
        ours.len() as u64 >= after_ready,
        "{} incidents for {after_ready} kills after ready",
        ours.len()
    );
    for inc in &ours {
        assert_eq!(text(inc, "/outcome"), "exited", "{inc:#}");
        assert!(inc["verdict"].is_null(), "{inc:#}");
        assert_eq!(list(inc, "/deliveries").len(), 1, "{inc:#}");
        assert_eq!(list(inc, "/exits").len(), 1, "{inc:#}");
        assert!(inc["t_reaped_ns"].is_u64(), "{inc:#}");
    }
}
