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

/// One row of a table of who blocks: a process, the gate's policy, and the kind and words
/// it blocks with (None: it does not).
struct Case<'a> {
    case: &'static str,
    process: Process<'a>,
    policy: Policy,
    blocks: Option<(Kind, &'static str)>,
}

fn check(cases: &[Case]) {
    for c in cases {
        let got = blocks(&c.process, &c.policy);
        assert_eq!(
            got.as_ref().map(|(k, how)| (*k, how.as_str())),
            c.blocks,
            "{}",
            c.case
        );
    }
}

const BASE: Process = Process {
    pid: 200,
    state: 'S',
    session: 100,
    ppid: 100,
    exiting: false,
    scope: None,
    holding: None,
    nvml_bytes: None,
    shares_with: None,
    got_from_scope: None,
    allowed: false,
};

const NAMED: Option<InScope> = Some(InScope {
    named: true,
    why: "named",
});
const CHILD: Option<InScope> = Some(InScope {
    named: false,
    why: "child of 100",
});
const IN_CGROUP: Option<InScope> = Some(InScope {
    named: false,
    why: "in cgroup /job",
});

const NO_POLICY: Policy = Policy {
    any_process: false,
    unattributed: false,
};
const ANY_PROCESS: Policy = Policy {
    any_process: true,
    unattributed: false,
};
const UNATTRIBUTED: Policy = Policy {
    any_process: false,
    unattributed: true,
};

#[test]
fn members_of_the_scope_block_while_alive_named_or_holding() {
    let (two_fds, one_fd) = (holding(2, 0), holding(1, 0));
    check(&[
        Case {
            case: "a named process alive, holding nothing",
            process: Process {
                scope: NAMED,
                ..BASE
            },
            policy: NO_POLICY,
            blocks: Some((Kind::NotDead, "alive")),
        },
        Case {
            case: "a named process alive, with files and memory",
            process: Process {
                scope: NAMED,
                holding: Some(&two_fds),
                nvml_bytes: Some(Some(512 * MIB)),
                ..BASE
            },
            policy: NO_POLICY,
            blocks: Some((
                Kind::NotDead,
                "alive: 2 GPU descriptor(s), 512 MiB NVML accounts to it",
            )),
        },
        Case {
            case: "a forked worker that outlived the job, on its own",
            process: Process {
                scope: CHILD,
                holding: Some(&one_fd),
                session: 200,
                ppid: 1,
                ..BASE
            },
            policy: NO_POLICY,
            blocks: Some((
                Kind::LiveHolder,
                "holds: 1 GPU descriptor(s) (child of 100): inherited from its parent, or \
                 opened itself; in a session of its own (setsid); orphaned (its parent is \
                 gone, init adopted it)",
            )),
        },
        Case {
            case: "a member sharing a file with another",
            process: Process {
                scope: IN_CGROUP,
                holding: Some(&one_fd),
                nvml_bytes: Some(Some(MIB)),
                shares_with: Some(201),
                ..BASE
            },
            policy: NO_POLICY,
            blocks: Some((
                Kind::LiveHolder,
                "holds: 1 GPU descriptor(s) (in cgroup /job): the same open GPU file as 201 \
                 (inherited or passed)",
            )),
        },
        Case {
            case: "a member listed by NVML alone",
            process: Process {
                scope: IN_CGROUP,
                nvml_bytes: Some(None),
                ..BASE
            },
            policy: NO_POLICY,
            blocks: Some((
                Kind::LiveHolder,
                "holds (in cgroup /job): opened itself, or inherited in the scope",
            )),
        },
        Case {
            case: "a member exiting, its files not closed yet",
            process: Process {
                scope: CHILD,
                exiting: true,
                ..BASE
            },
            policy: NO_POLICY,
            blocks: Some((
                Kind::NotDead,
                "exiting: what its exit closes may still be held",
            )),
        },
        Case {
            case: "a member holding nothing",
            process: Process {
                scope: CHILD,
                ..BASE
            },
            policy: ANY_PROCESS,
            blocks: None,
        },
    ]);
}

#[test]
fn others_block_by_what_they_got_and_what_was_asked() {
    let (one_fd, mapped) = (holding(1, 0), holding(0, 1));
    check(&[
        Case {
            case: "a process outside the scope with a file of the scope's",
            process: Process {
                holding: Some(&one_fd),
                got_from_scope: Some("inherited from 100"),
                ..BASE
            },
            policy: ANY_PROCESS,
            blocks: Some((Kind::SharedFd, "inherited from 100")),
        },
        Case {
            case: "any process: one not allowed, listed by NVML",
            process: Process {
                nvml_bytes: Some(None),
                ..BASE
            },
            policy: ANY_PROCESS,
            blocks: Some((
                Kind::GpuBusy,
                "not allowed here: memory NVML accounts to it",
            )),
        },
        Case {
            case: "any process: one allowed",
            process: Process {
                holding: Some(&one_fd),
                allowed: true,
                ..BASE
            },
            policy: ANY_PROCESS,
            blocks: None,
        },
        Case {
            case: "without NVML or the agent: a holder that may have the gone process's files",
            process: Process {
                holding: Some(&mapped),
                ..BASE
            },
            policy: UNATTRIBUTED,
            blocks: Some((
                Kind::Unattributed,
                "whose, nothing says: 1 mapping(s) of GPU files",
            )),
        },
        Case {
            case: "a holder outside the scope, nothing else asked",
            process: Process {
                holding: Some(&one_fd),
                ..BASE
            },
            policy: NO_POLICY,
            blocks: None,
        },
        Case {
            case: "outside the scope, holding nothing",
            process: BASE,
            policy: UNATTRIBUTED,
            blocks: None,
        },
    ]);
}

#[test]
fn each_blocker_has_what_to_do() {
    let p = BASE;
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
