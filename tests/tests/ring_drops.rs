//! A flood of kernel records into a one-page ring nobody reads: the kernel must count the drops
//! and the collector must report them. Kept in its own test binary: cargo runs test binaries one
//! after another, so the flood never overlaps the kill tests (whose default 4 MiB rings would
//! absorb it anyway). The two tests here take turns through [`FLOOD`]: one's flood would refill
//! the other's drained ring.

use std::{
    process::{Command, Stdio},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use linger_tests::{num, require_root, Live, HANG_GUARD};
use nix::{
    sys::{
        signal::Signal,
        wait::{waitpid, WaitPidFlag, WaitStatus},
    },
    unistd::Pid,
};
use tracer_user::{
    clock::boottime_ns,
    event::{EventData, LossKind},
    probe::{ProbeConfig, Probes},
    source::kernel::KernelSource,
};

/// The smallest ring linger accepts: one page.
const RING: u32 = 4096;
/// Every record takes at least 32 bytes of the ring (its 8-byte ring header and the 24-byte
/// record header), so a page holds at most this many.
const RING_RECORDS_MAX: u64 = RING as u64 / 32;

static FLOOD: Mutex<()> = Mutex::new(());

fn flood_alone() -> MutexGuard<'static, ()> {
    // A failed test poisons the lock; the next may still run.
    FLOOD
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Records the ring buffer dropped since the last poll, if any.
fn ring_loss(source: &mut KernelSource) -> Option<u64> {
    source
        .poll_losses(boottime_ns(), Duration::from_secs(1))
        .into_iter()
        .find_map(|e| match e.data {
            EventData::Loss {
                count,
                what: LossKind::Ring,
                ..
            } => Some(count),
            _ => None,
        })
}

/// Runs /bin/true: a fork, an exec and a group-dead exit, at least three records.
fn spawn_one() -> u32 {
    let mut child = Command::new("/bin/true")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawning /bin/true");
    child.wait().expect("waiting for /bin/true");
    child.id()
}

#[test]
fn unread_ring_counts_drops_and_recovers() {
    require_root();
    let _alone = flood_alone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let _enter = runtime.enter();
    let t_load = boottime_ns();
    let probes = Probes::load(&ProbeConfig {
        ring_size: RING,
        ..Default::default()
    })
    .expect("loading the probes");
    let mut source = KernelSource::new(probes).expect("opening the kernel source");

    // Nobody drains the ring, so once it is full every record is dropped: a bounded number of
    // children (each at least three records) must overflow it.
    let mut first = None;
    for _ in 0..RING {
        spawn_one();
        first = ring_loss(&mut source);
        if first.is_some() {
            break;
        }
    }
    let Some(first) = first else {
        panic!("{RING} children did not overflow a {RING}-byte ring: {first:?}");
    };
    assert!(first > 0);

    // The counter keeps rising while the ring stays full: 200 more children make 600+ records,
    // and whatever still squeezes into the ring cannot save more than a page's worth. (A count
    // near half would mean a CPU's counter went missing: the children run on every CPU.)
    for _ in 0..200 {
        spawn_one();
    }
    let Some(more) = ring_loss(&mut source) else {
        panic!("no further drops while the ring was full");
    };
    assert!(
        more >= 600 - RING_RECORDS_MAX,
        "200 children into a full ring dropped only {more} records"
    );
    assert_eq!(source.drops_total(), first + more);

    // What did fit decodes into events of this run.
    let mut events = Vec::new();
    source.drain(&mut events);
    assert!(!events.is_empty(), "a full ring drained to nothing");
    let now = boottime_ns();
    for e in &events {
        assert!(
            (t_load..=now).contains(&e.ts_ns),
            "event outside this run: {e:?}"
        );
    }

    // Drained, the ring takes records again: a child started now is seen whole. Other processes
    // may refill the page first, so a few attempts are allowed.
    let seen = (0..20).any(|_| {
        events.clear();
        source.drain(&mut events);
        let pid = spawn_one();
        source.drain(&mut events);
        let forked = events
            .iter()
            .any(|e| matches!(e.data, EventData::Fork { child_pid, .. } if child_pid == pid));
        let exited = events.iter().any(|e| {
            e.pid == pid
                && matches!(
                    e.data,
                    EventData::TaskExit {
                        group_dead: true,
                        ..
                    }
                )
        });
        forked && exited
    });
    assert!(seen, "after draining, the ring never recorded a new child");
}

#[test]
fn live_reports_drops_of_a_stopped_reader() {
    require_root();
    let _alone = flood_alone();
    // Only incidents of this test process, which nobody signals: stdout holds just loss lines.
    let me = std::process::id().to_string();
    let live = Live::start([
        "--json",
        "--ring-size",
        "4096",
        "--duration",
        "50s",
        "--pid",
        &me,
    ]);
    let pid = Pid::from_raw(live.child.pid() as i32);
    // linger prints its ready line before it installs its Ctrl-C handler; until then SIGINT
    // would kill it without the summary.
    wait_until_caught(live.child.pid(), Signal::SIGINT);

    // Stop linger so it cannot read: the flood then overflows the ring for certain.
    live.child.signal(Signal::SIGSTOP);
    let stopped = waitpid(pid, Some(WaitPidFlag::WUNTRACED)).expect("waiting for the stop");
    assert!(matches!(stopped, WaitStatus::Stopped(_, _)), "{stopped:?}");
    let children = 1000;
    for _ in 0..children {
        spawn_one();
    }
    live.child.signal(Signal::SIGCONT);
    // SIGINT stops linger the way Ctrl-C does: it drains, reports and exits cleanly.
    live.child.signal(Signal::SIGINT);
    let out = live.finish();

    assert!(out.status.success(), "{out:#?}");
    let losses = out.of_type("loss");
    assert!(!losses.is_empty(), "no loss line: {out:#?}");
    let reported: u64 = losses.iter().map(|l| num(l, "/count")).sum();
    // 3000+ records, of which at most a page's worth fit.
    assert!(reported >= 3 * children - RING_RECORDS_MAX, "{out:#?}");
    assert!(losses.iter().all(|l| num(l, "/t_ns") > 0), "{out:#?}");
    // The closing summary on stderr counts the same drops as the loss lines.
    assert!(
        out.stderr
            .contains(&format!("the kernel dropped {reported} record(s)")),
        "{out:#?}"
    );
}

/// Waits until `pid` handles `sig` (its bit in /proc/PID/status SigCgt).
fn wait_until_caught(pid: u32, sig: Signal) {
    let deadline = Instant::now() + HANG_GUARD;
    let bit = 1u64 << (sig as u32 - 1);
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .expect("SigCgt in /proc/PID/status");
        if caught & bit != 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{pid} never handled {sig}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
