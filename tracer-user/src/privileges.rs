//! Capabilities instead of root. Each command states what it needs the kernel to allow; a
//! run that lacks some is refused before anything is loaded, naming each missing capability
//! and what it is for. Once the programs are attached and the output files open, the
//! collector keeps only what the rest of its run uses (see [`drop_after_attach`] and
//! docs/security.md).

use std::fmt;

use caps::{CapSet, Capability, CapsHashSet};
use log::{debug, warn};
use thiserror::Error;

/// A capability linger needs, with the others the kernel accepts in its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    /// The one to grant first; CAP_SYS_ADMIN also passes the kernel's checks for CAP_BPF and
    /// CAP_PERFMON (and is the only one before Linux 5.8), CAP_DAC_OVERRIDE those for
    /// CAP_DAC_READ_SEARCH.
    pub any_of: &'static [Capability],
    pub why: &'static str,
}

const BPF: Need = Need {
    any_of: &[Capability::CAP_BPF, Capability::CAP_SYS_ADMIN],
    why: "load eBPF programs and use their maps",
};
const PERFMON: Need = Need {
    any_of: &[Capability::CAP_PERFMON, Capability::CAP_SYS_ADMIN],
    why: "attach tracepoints and perf events, and let the programs read kernel memory",
};
const DAC_READ_SEARCH: Need = Need {
    any_of: &[
        Capability::CAP_DAC_READ_SEARCH,
        Capability::CAP_DAC_OVERRIDE,
    ],
    why: "search /sys/kernel/tracing and other users' /proc/PID/fd",
};
const SYS_PTRACE: Need = Need {
    any_of: &[Capability::CAP_SYS_PTRACE],
    why: "read other users' /proc/PID/fd and fdinfo, and compare their open files with kcmp",
};
/// Above 2, `kernel.perf_event_paranoid` is a Debian and Ubuntu patch (their default is 3):
/// perf_event_open then takes CAP_SYS_ADMIN, and CAP_PERFMON is not enough.
const PERF_RESTRICTED: Need = Need {
    any_of: &[Capability::CAP_SYS_ADMIN],
    why: "open perf events (tracepoints, the stack sampler), which this kernel's \
          perf_event_paranoid above 2 allows with CAP_SYS_ADMIN only",
};
const SYSLOG: Need = Need {
    any_of: &[Capability::CAP_SYSLOG],
    why: "read kernel symbol addresses (/proc/kallsyms), which name the sampled stacks",
};

/// `live`, `record`, `demo`: load and attach the programs, follow GPU files through /proc.
pub const TRACE: &[Need] = &[BPF, PERFMON, DAC_READ_SEARCH, SYS_PTRACE];
/// `doctor`: load and attach its test programs.
pub const PROBE: &[Need] = &[BPF, PERFMON, DAC_READ_SEARCH];
/// `holders`: every process's GPU descriptors.
pub const PROC: &[Need] = &[DAC_READ_SEARCH, SYS_PTRACE];

/// What the collector keeps once attached: BPF for its maps (every bpf() call needs it
/// before Linux 5.19 where unprivileged BPF is off) and the stack sampler's attachment, the
/// /proc pair for the processes that become GPU holders; with the sampler, PERFMON for its
/// perf events (attached only while a GPU process dies; CAP_SYS_ADMIN where the kernel's
/// perf_event_paranoid asks for it) and SYSLOG for the kernel symbols read as the collector
/// starts.
fn collector(sampling: bool) -> Vec<Need> {
    let mut needs = vec![BPF, DAC_READ_SEARCH, SYS_PTRACE];
    if sampling {
        needs.extend([PERFMON, SYSLOG]);
    }
    needs
}

/// Some needed capabilities are missing.
#[derive(Debug, Error)]
pub struct Missing {
    /// What could not be done, e.g. "tracing".
    pub action: &'static str,
    pub missing: Vec<Need>,
    pub uid: u32,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let supported = supported();
        let named: Vec<String> = self
            .missing
            .iter()
            .map(|n| format!("{} (to {})", to_grant(n, &supported), n.why))
            .collect();
        write!(
            f,
            "{} needs root, or these capabilities, which linger (uid {}) lacks: {}; \
             run it with sudo, or grant them as ambient capabilities (setpriv --ambient-caps, systemd \
             AmbientCapabilities=)",
            self.action,
            self.uid,
            named.join(", ")
        )
    }
}

/// Fails naming every need of `needs` that no effective capability meets.
pub fn require(action: &'static str, needs: &[Need]) -> Result<(), Missing> {
    let held = effective();
    let missing: Vec<Need> = for_kernel(needs, perf_event_paranoid())
        .iter()
        .filter(|n| !n.any_of.iter().any(|c| held.contains(c)))
        .copied()
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Missing {
        action,
        missing,
        uid: nix::unistd::geteuid().as_raw(),
    })
}

/// A capability set could not be lowered.
#[derive(Debug, Error)]
#[error("dropping capabilities the collector no longer needs: {what}")]
pub struct DropError {
    what: String,
    #[source]
    source: caps::errors::CapsError,
}

/// Once the programs are attached and the output files open: keeps in every set only what
/// the collector uses for the rest of its run (for each need, the first capability of its
/// list that is held), clears the ambient and inheritable sets, lowers the bounding set
/// where allowed, and sets no_new_privs, so that nothing comes back through an exec.
/// Capabilities are per thread: call it before the collector starts any thread.
pub fn drop_after_attach(sampling: bool) -> Result<(), DropError> {
    let held = effective();
    let needs = for_kernel(&collector(sampling), perf_event_paranoid());
    let keep: CapsHashSet = needs
        .iter()
        .filter_map(|n| n.any_of.iter().find(|c| held.contains(c)).copied())
        .collect();
    say_stand_ins(&needs, &held);
    let failed = |what: &str| {
        let what = what.to_string();
        move |source| DropError { what, source }
    };
    // Bounding first: lowering it takes CAP_SETPCAP, which goes next.
    if held.contains(&Capability::CAP_SETPCAP) {
        for cap in caps::read(None, CapSet::Bounding).map_err(failed("reading the bounding set"))? {
            if !keep.contains(&cap) {
                caps::drop(None, CapSet::Bounding, cap).map_err(failed("the bounding set"))?;
            }
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(failed("the ambient set"))?;
    caps::clear(None, CapSet::Inheritable).map_err(failed("the inheritable set"))?;
    // Effective before permitted: it may never hold more than permitted.
    caps::set(None, CapSet::Effective, &keep).map_err(failed("the effective set"))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(failed("the permitted set"))?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| DropError {
        what: "no_new_privs".into(),
        source: e.to_string().into(),
    })?;
    let mut kept: Vec<String> = keep.iter().map(ToString::to_string).collect();
    kept.sort();
    debug!("capabilities kept for the collector: {}", kept.join(", "));
    Ok(())
}

/// Warns where the collector keeps a broader capability for its whole run because the one a
/// need names first was not granted (CAP_SYS_ADMIN in place of CAP_BPF or CAP_PERFMON, on a
/// kernel that knows them).
fn say_stand_ins(needs: &[Need], held: &CapsHashSet) {
    let supported = supported();
    for need in needs {
        let first = need.any_of[0];
        let Some(kept) = need.any_of.iter().find(|c| held.contains(c)) else {
            continue;
        };
        if *kept != first && supported.contains(&first) {
            warn!(
                "keeping {kept} for the whole run in place of {first}, which linger was not \
                 granted (to {}): grant {first} and {kept} is dropped once attached",
                need.why
            );
        }
    }
}

/// `needs` on a kernel with this `perf_event_paranoid`.
fn for_kernel(needs: &[Need], perf_event_paranoid: i32) -> Vec<Need> {
    let mut needs = needs.to_vec();
    if perf_event_paranoid > 2 && needs.contains(&PERFMON) {
        needs.push(PERF_RESTRICTED);
    }
    needs
}

fn perf_event_paranoid() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(2)
}

fn effective() -> CapsHashSet {
    caps::read(None, CapSet::Effective).unwrap_or_default()
}

/// The capabilities this kernel knows (CAP_BPF and CAP_PERFMON only since 5.8).
fn supported() -> CapsHashSet {
    caps::runtime::procfs_all_supported(None).unwrap_or_else(|_| caps::all())
}

fn to_grant(need: &Need, supported: &CapsHashSet) -> Capability {
    need.any_of
        .iter()
        .copied()
        .find(|c| supported.contains(c))
        .unwrap_or(need.any_of[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_capabilities_are_named_with_their_purpose() {
        let missing = Missing {
            action: "tracing",
            missing: vec![BPF, SYS_PTRACE],
            uid: 1000,
        };
        let text = missing.to_string();
        assert!(text.starts_with("tracing needs root"), "{text}");
        assert!(text.contains("uid 1000"), "{text}");
        assert!(
            text.contains("CAP_BPF (to load eBPF programs and use their maps)"),
            "{text}"
        );
        assert!(
            text.contains("CAP_SYS_PTRACE (to read other users'"),
            "{text}"
        );
        assert!(!text.contains("CAP_PERFMON"), "{text}");
    }

    #[test]
    fn a_distribution_s_stricter_perf_event_paranoid_needs_cap_sys_admin() {
        let admin = |needs: &[Need]| {
            needs
                .iter()
                .any(|n| n.any_of == [Capability::CAP_SYS_ADMIN])
        };
        assert!(!admin(&for_kernel(TRACE, 2)));
        assert!(admin(&for_kernel(TRACE, 3)));
        assert!(admin(&for_kernel(PROBE, 3)));
        assert!(!admin(&for_kernel(PROC, 3)), "no perf events for /proc");
        // The collector keeps it only for the sampler, which opens perf events later.
        assert!(admin(&for_kernel(&collector(true), 3)));
        assert!(!admin(&for_kernel(&collector(false), 3)));
        assert!(!admin(&for_kernel(&collector(true), 2)));
    }

    #[test]
    fn before_cap_bpf_existed_cap_sys_admin_is_the_one_to_grant() {
        let mut old_kernel = caps::all();
        old_kernel.remove(&Capability::CAP_BPF);
        old_kernel.remove(&Capability::CAP_PERFMON);
        assert_eq!(to_grant(&BPF, &old_kernel), Capability::CAP_SYS_ADMIN);
        assert_eq!(to_grant(&BPF, &caps::all()), Capability::CAP_BPF);
    }
}
