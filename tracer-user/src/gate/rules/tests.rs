//! `linger wait`'s answers and who blocks them, from tables: no root, no /proc, no NVML.

use super::*;
use crate::source::procfs::Found;

const MIB: u64 = 1 << 20;

fn holding(fds: i32, mappings: usize) -> Holding {
    Holding {
        fds: (0..fds)
            .map(|fd| Found {
                pid: 0,
                fd: 3 + fd,
                dev: 195 << 20,
                cloexec: false,
                node: (5, 1234),
            })
            .collect(),
        mapped: vec![195 << 20; mappings],
    }
}

#[test]
fn each_answer_and_its_exit_code() {
    // (blockers, dead processes' memory not back, failed NVML answers) → the answer.
    let cases = [
        ("nothing holds the GPUs", (0, 0, 0), Answer::Clean, 0),
        ("a live process blocks", (1, 0, 0), Answer::Held, 1),
        (
            "a dead process's memory is not back",
            (0, 1, 0),
            Answer::Held,
            1,
        ),
        (
            "blockers name what holds despite NVML failing",
            (2, 1, 3),
            Answer::Held,
            1,
        ),
        (
            "NVML failed and nothing else was found",
            (0, 0, 3),
            Answer::CannotTell,
            3,
        ),
    ];
    for (case, (blockers, dead, failures), want, code) in cases {
        let got = answer(blockers, dead, failures);
        assert_eq!(got, want, "{case}");
        assert_eq!(got.exit_code(), code, "{case}");
    }
    // Raised as errors before or while looking: each has a code of its own.
    assert_eq!(Answer::NotPermitted.exit_code(), 2);
    assert_eq!(Answer::CannotTell.exit_code(), 3);
}

#[test]
fn what_cannot_be_decided_is_refused_before_waiting() {
    let refused = partial_view(4026531836, false).expect_err("refused without the flag");
    assert!(refused.contains("pid namespace 4026531836"), "{refused}");
    assert!(refused.contains("cannot tell"), "{refused}");
    assert!(refused.contains("--allow-partial-view"), "{refused}");
    let note = partial_view(4026531836, true).expect("taken on with the flag");
    assert!(note.contains("holders outside it are not seen"), "{note}");

    let nvml = "NVML is not available (libnvidia-ml.so.1 not found)";
    let cases = [
        (
            "no GPU file either",
            false,
            true,
            Some("no GPU device file to look at: cannot tell"),
        ),
        (
            "nothing named",
            true,
            false,
            Some("without NVML, name what to wait for"),
        ),
        ("the GPU files decide for what is named", true, true, None),
    ];
    for (case, files, named, refusal) in cases {
        match (without_nvml(nvml, files, named), refusal) {
            (Ok(()), None) => {}
            (Err(e), Some(want)) => {
                assert!(e.starts_with(nvml) && e.contains(want), "{case}: {e}");
            }
            (got, want) => panic!("{case}: {got:?}, wanted a refusal: {want:?}"),
        }
    }
}

#[test]
fn who_blocks_and_why() {
    let two_fds = holding(2, 0);
    let one_fd = holding(1, 0);
    let mapped = holding(0, 1);
    let named = Some(InScope {
        named: true,
        why: "named",
    });
    let child = Some(InScope {
        named: false,
        why: "child of 100",
    });
    let in_cgroup = Some(InScope {
        named: false,
        why: "in cgroup /job",
    });
    let base = Process {
        pid: 200,
        state: 'S',
        session: 100,
        ppid: 100,
        ..Process::default()
    };
    let none = Policy::default();
    let any = Policy {
        any_process: true,
        ..Policy::default()
    };
    let unattributed = Policy {
        unattributed: true,
        ..Policy::default()
    };
    let cases: [(&str, Process, Policy, Option<(Kind, &str)>); 13] = [
        (
            "a named process alive, holding nothing",
            Process {
                scope: named,
                ..base
            },
            none,
            Some((Kind::NotDead, "alive")),
        ),
        (
            "a named process alive, with files and memory",
            Process {
                scope: named,
                holding: Some(&two_fds),
                nvml_bytes: Some(Some(512 * MIB)),
                ..base
            },
            none,
            Some((
                Kind::NotDead,
                "alive: 2 GPU descriptor(s), 512 MiB NVML accounts to it",
            )),
        ),
        (
            "a forked worker that outlived the job, on its own",
            Process {
                scope: child,
                holding: Some(&one_fd),
                session: 200,
                ppid: 1,
                ..base
            },
            none,
            Some((
                Kind::LiveHolder,
                "holds: 1 GPU descriptor(s) (child of 100): inherited from its parent, or \
                 opened itself; in a session of its own (setsid); orphaned (its parent is \
                 gone, init adopted it)",
            )),
        ),
        (
            "a member sharing a file with another",
            Process {
                scope: in_cgroup,
                holding: Some(&one_fd),
                nvml_bytes: Some(Some(MIB)),
                shares_with: Some(201),
                ..base
            },
            none,
            Some((
                Kind::LiveHolder,
                "holds: 1 GPU descriptor(s) (in cgroup /job): the same open GPU file as 201 \
                 (inherited or passed)",
            )),
        ),
        (
            "a member listed by NVML alone",
            Process {
                scope: in_cgroup,
                nvml_bytes: Some(None),
                ..base
            },
            none,
            Some((
                Kind::LiveHolder,
                "holds (in cgroup /job): opened itself, or inherited in the scope",
            )),
        ),
        (
            "a member exiting, its files not closed yet",
            Process {
                scope: child,
                exiting: true,
                ..base
            },
            none,
            Some((
                Kind::NotDead,
                "exiting: what its exit closes may still be held",
            )),
        ),
        (
            "a member holding nothing",
            Process {
                scope: child,
                ..base
            },
            any,
            None,
        ),
        (
            "a process outside the scope with a file of the scope's",
            Process {
                holding: Some(&one_fd),
                got_from_scope: Some("inherited from 100"),
                ..base
            },
            any,
            Some((Kind::SharedFd, "inherited from 100")),
        ),
        (
            "any process: one not allowed, listed by NVML",
            Process {
                nvml_bytes: Some(None),
                ..base
            },
            any,
            Some((
                Kind::GpuBusy,
                "not allowed here: memory NVML accounts to it",
            )),
        ),
        (
            "any process: one allowed",
            Process {
                holding: Some(&one_fd),
                allowed: true,
                ..base
            },
            any,
            None,
        ),
        (
            "without NVML or the agent: a holder that may have the gone process's files",
            Process {
                holding: Some(&mapped),
                ..base
            },
            unattributed,
            Some((
                Kind::Unattributed,
                "whose, nothing says: 1 mapping(s) of GPU files",
            )),
        ),
        (
            "a holder outside the scope, nothing else asked",
            Process {
                holding: Some(&one_fd),
                ..base
            },
            none,
            None,
        ),
        (
            "outside the scope, holding nothing",
            base,
            unattributed,
            None,
        ),
    ];
    for (case, process, policy, want) in cases {
        let got = blocks(&process, &policy);
        assert_eq!(
            got.as_ref().map(|(k, how)| (*k, how.as_str())),
            want,
            "{case}"
        );
    }
}

#[test]
fn each_blocker_has_what_to_do() {
    let p = Process {
        pid: 200,
        state: 'S',
        ..Process::default()
    };
    let cases = [
        (Kind::NotDead, "200 is still alive: SIGKILL it"),
        (
            Kind::LiveHolder,
            "200 outlived the job and keeps its GPU memory",
        ),
        (
            Kind::SharedFd,
            "stop 200, or have it close the GPU files it got",
        ),
        (Kind::GpuBusy, "stop 200, or allow it with --allow-pid 200"),
        (Kind::Unattributed, "stop 200 if it is the job's"),
    ];
    for (kind, want) in cases {
        let hint = hint(kind, &p);
        assert!(hint.starts_with(want), "{kind:?}: {hint}");
    }
    // Asleep in the kernel, no signal helps: whatever the kind.
    let asleep = Process { state: 'D', ..p };
    assert!(
        hint(Kind::NotDead, &asleep).contains("sleeps in the kernel where no signal reaches it")
    );
}
