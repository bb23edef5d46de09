//! When a killed process became a zombie, read from the SIGCHLD its group sends its parent:
//! a dying thread that hands a zombie child of its own to a subreaper sends one too, while
//! other threads of its group may still be closing its files. linger takes the one sent with a
//! single thread left (the sender's `signal->nr_threads`, read in the kernel), whichever thread
//! sends it. Alone in its file: this test makes its process a subreaper.

use linger_tests::{num, require_root, Live, Target};
use nix::{
    sys::{signal::Signal, wait::waitpid},
    unistd::Pid,
};
use serde_json::Value;

const CLD_EXITED: i64 = 1;
const CLD_KILLED: i64 = 2;

#[test]
fn the_zombie_is_the_group_s_own_sigchld_not_a_child_handed_on() {
    require_root();
    nix::sys::prctl::set_child_subreaper(true).expect("PR_SET_CHILD_SUBREAPER");
    let mut target = Target::start_with(6, "default", &["--zombie-child"]);
    let child: i32 = target
        .stdout
        .next_line()
        .and_then(|l| l.strip_prefix("child ")?.parse().ok())
        .expect("__target --zombie-child prints its child");
    let live = Live::watch_with(target.pid, "10s", &["--events"]);
    target.child.signal(Signal::SIGKILL);
    target.child.wait();
    // Handed to this process by the target's exit.
    waitpid(Pid::from_raw(child), None).expect("reaping the handed-on child");
    let out = live.finish();

    let sigchlds: Vec<&Value> = out
        .of_type("event")
        .into_iter()
        .map(|v| &v["event"])
        .filter(|e| e["pid"] == target.pid && e["data"]["sig"] == 17)
        .collect();
    let with_code = |code: i64| {
        sigchlds
            .iter()
            .find(|e| e["data"]["code"] == code)
            .unwrap_or_else(|| panic!("no SIGCHLD with code {code}: {sigchlds:#?}"))
    };
    let own = with_code(CLD_KILLED);
    let handed = with_code(CLD_EXITED);
    assert_eq!(num(own, "/data/sender_threads"), 1, "{sigchlds:#?}");
    assert!(num(handed, "/data/sender_threads") >= 1, "{sigchlds:#?}");

    let inc = out.incident_of(target.pid);
    let zombie = num(inc, "/t_zombie_ns");
    // A child handed on by the group's last thread in its own exit comes with one thread left
    // too, microseconds before the group's own: either is after the files were closed.
    let allowed = if num(handed, "/data/sender_threads") == 1 {
        vec![num(own, "/ts_ns"), num(handed, "/ts_ns")]
    } else {
        vec![num(own, "/ts_ns")]
    };
    assert!(
        allowed.contains(&zombie),
        "t_zombie_ns {zombie} of {allowed:?}\n{inc:#}"
    );
}
