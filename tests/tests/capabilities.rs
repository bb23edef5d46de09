//! Capabilities instead of root: a non-root user granted the documented set traces a kill;
//! without it linger names what is missing; and once attached, the collector holds only the
//! few capabilities it still uses, in every thread, with nothing to regain through exec.

use std::process::{Command, Stdio};

use linger_tests::{linger_bin, require_root, Guarded, Lines, Target, READY};
use nix::sys::signal::Signal;
use serde_json::Value;
use tracer_user::probe::tracefs;

const NOBODY: &str = "65534";
/// What `live` is granted here: docs/security.md's set, nothing else.
const GRANTED: &str = "+bpf,+perfmon,+dac_read_search,+sys_ptrace,+syslog";

// Capability numbers (linux/capability.h).
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYSLOG: u32 = 34;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

fn mask(caps: &[u32]) -> u64 {
    caps.iter().fold(0, |m, c| m | 1 << c)
}

/// `setpriv` running linger as nobody, no groups, with `caps` as its ambient capabilities.
fn as_nobody(caps: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"]);
    if !caps.is_empty() {
        cmd.arg(format!("--inh-caps={caps}"))
            .arg(format!("--ambient-caps={caps}"));
    }
    cmd.arg("--").arg(linger_bin());
    cmd
}

/// `linger live --json ARGS` started by `cmd`, once attached.
fn live(mut cmd: Command, args: &[&str]) -> (Guarded, Lines, Lines) {
    let mut child = Guarded(
        cmd.arg("live")
            .args(["--json", "--duration", "20s"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting linger live (setpriv is util-linux's)"),
    );
    let stdout = Lines::read(child.0.stdout.take().expect("piped stdout"));
    let mut stderr = Lines::read(child.0.stderr.take().expect("piped stderr"));
    loop {
        match stderr.next_line() {
            Some(line) if line == READY => break,
            Some(_) => {}
            None => panic!("linger live ended before attaching: {:?}", stderr.all()),
        }
    }
    (child, stdout, stderr)
}

/// One thread's capability sets and no_new_privs, as /proc shows them.
#[derive(Debug)]
struct ThreadCaps {
    name: String,
    effective: u64,
    permitted: u64,
    bounding: u64,
    inheritable: u64,
    ambient: u64,
    no_new_privs: bool,
}

fn thread_caps(pid: u32) -> Vec<ThreadCaps> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("its threads");
    tasks
        .map(|t| {
            let status = std::fs::read_to_string(t.expect("a thread").path().join("status"))
                .expect("status");
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(str::trim)
                    .unwrap_or_else(|| panic!("no {name} in {status}"))
                    .to_string()
            };
            let hex = |name| u64::from_str_radix(&field(name), 16).expect("a hex set");
            ThreadCaps {
                name: field("Name:"),
                effective: hex("CapEff:"),
                permitted: hex("CapPrm:"),
                bounding: hex("CapBnd:"),
                inheritable: hex("CapInh:"),
                ambient: hex("CapAmb:"),
                no_new_privs: field("NoNewPrivs:") == "1",
            }
        })
        .collect()
}

/// Kills `target` while `live` watches it; the incident it reports.
fn incident_of_kill(target: &mut Target, child: &mut Guarded, stdout: &mut Lines) -> Value {
    target.child.signal(Signal::SIGKILL);
    target.child.wait();
    let status = child.wait();
    let records: Vec<Value> = stdout
        .all()
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert!(status.success(), "linger live failed: {records:?}");
    records
        .into_iter()
        .find(|r| r["type"] == "incident" && r["target"]["pid"] == target.pid)
        .unwrap_or_else(|| panic!("no incident for {}", target.pid))
}

#[test]
fn after_attaching_the_collector_keeps_only_what_it_uses() {
    require_root();
    let always = [CAP_BPF, CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE];
    let sampler = [CAP_PERFMON, CAP_SYSLOG];
    for (sample_hz, kept) in [
        ("4999", mask(&always) | mask(&sampler)),
        ("0", mask(&always)),
    ] {
        let mut target = Target::start(2, "default");
        let pid = target.pid.to_string();
        let (mut child, mut stdout, _stderr) = live(
            Command::new(linger_bin()),
            &["--pid", &pid, "--count", "1", "--sample-hz", sample_hz],
        );
        for t in thread_caps(child.pid()) {
            let what = format!("thread {} (--sample-hz {sample_hz}): {t:x?}", t.name);
            assert_eq!(
                (t.effective, t.permitted, t.bounding),
                (kept, kept, kept),
                "{what}"
            );
            assert_eq!((t.inheritable, t.ambient), (0, 0), "{what}");
            assert!(t.no_new_privs, "{what}");
        }
        // And it still traces with what it kept.
        let incident = incident_of_kill(&mut target, &mut child, &mut stdout);
        assert_eq!(incident["signal_name"], "SIGKILL");
    }
}

#[test]
fn a_user_granted_the_capabilities_traces_without_root() {
    require_root();
    // Mounting tracefs is the one step that takes CAP_SYS_ADMIN: done once, as root.
    tracefs::ensure_mounted().expect("mounting tracefs");
    let mut target = Target::start(3, "default");
    let pid = target.pid.to_string();
    let (mut child, mut stdout, _stderr) =
        live(as_nobody(GRANTED), &["--pid", &pid, "--count", "1"]);
    let threads = thread_caps(child.pid());
    let all = mask(&[
        CAP_BPF,
        CAP_PERFMON,
        CAP_DAC_READ_SEARCH,
        CAP_SYS_PTRACE,
        CAP_SYSLOG,
    ]);
    assert!(
        threads.iter().all(|t| t.effective == all && t.ambient == 0),
        "after attaching, only the collector's set, none ambient: {threads:?}"
    );
    let incident = incident_of_kill(&mut target, &mut child, &mut stdout);
    assert_eq!(incident["target"]["threads"], 3, "{incident}");
    assert!(!incident["t_reaped_ns"].is_null(), "{incident}");

    let holders = as_nobody("+dac_read_search,+sys_ptrace")
        .args(["holders", "--json"])
        .output()
        .expect("linger holders");
    assert!(holders.status.success(), "{holders:?}");
}

#[test]
fn a_user_without_them_is_told_which_are_missing() {
    require_root();
    let out = as_nobody("+bpf,+perfmon")
        .args(["live", "--duration", "1s"])
        .output()
        .expect("linger live");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("uid 65534"), "{stderr}");
    for named in ["CAP_DAC_READ_SEARCH (to ", "CAP_SYS_PTRACE (to "] {
        assert!(stderr.contains(named), "{named} not named: {stderr}");
    }
    for granted in ["CAP_BPF", "CAP_PERFMON"] {
        assert!(!stderr.contains(granted), "{granted} is held: {stderr}");
    }
}
