//! The one way a program gets attached, whatever the hook type: load (once) and attach, with
//! the kernel's error kept as the source so callers read its errno instead of its wording.

use std::{error::Error as StdError, fmt, io, path::Path};

use aya::{
    programs::{
        fentry::FEntryLinkId,
        fexit::FExitLinkId,
        kprobe::KProbeLinkId,
        perf_event::{
            PerfEventConfig, PerfEventLink, PerfEventLinkId, PerfEventScope, SamplePolicy,
            SoftwareEvent,
        },
        raw_trace_point::RawTracePointLinkId,
        tp_btf::BtfTracePointLinkId,
        trace_point::TracePointLinkId,
        uprobe::{UProbeAttachLocation, UProbeLinkId, UProbeScope},
        Program, ProgramError,
    },
    Btf, Ebpf,
};
use thiserror::Error;

// The errnos the kernel answers a refused attach with (the same on every architecture).
const EPERM: i32 = 1;
const ENOENT: i32 = 2;
const EACCES: i32 = 13;

/// Where a program is attached.
#[derive(Clone, Copy, Debug)]
pub enum Hook<'a> {
    Tracepoint {
        category: &'a str,
        name: &'a str,
    },
    TpBtf(&'a str),
    RawTp(&'a str),
    Fentry(&'a str),
    Fexit(&'a str),
    Kprobe(&'a str),
    Kretprobe(&'a str),
    Uprobe {
        target: &'a str,
        function: &'a str,
    },
    /// The PLT entry of `import` in `library`, at file offset `offset`.
    PltUprobe {
        library: &'a str,
        import: &'a str,
        offset: u64,
    },
    /// A cpu-clock sampler on one CPU.
    PerfEvent {
        cpu: u32,
        hz: u64,
    },
}

impl fmt::Display for Hook<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tracepoint { category, name } => write!(f, "tracepoint/{category}/{name}"),
            Self::TpBtf(name) => write!(f, "tp_btf/{name}"),
            Self::RawTp(name) => write!(f, "raw_tp/{name}"),
            Self::Fentry(func) => write!(f, "fentry/{func}"),
            Self::Fexit(func) => write!(f, "fexit/{func}"),
            Self::Kprobe(func) => write!(f, "kprobe/{func}"),
            Self::Kretprobe(func) => write!(f, "kretprobe/{func}"),
            Self::Uprobe { target, function } => write!(f, "uprobe/{target}:{function}"),
            Self::PltUprobe {
                library, import, ..
            } => write!(f, "uprobe/{library}:{import}@plt"),
            Self::PerfEvent { cpu, hz } => write!(f, "perf_event/cpu-clock/cpu{cpu}@{hz}Hz"),
        }
    }
}

/// Why a program is not attached.
#[derive(Debug, Error)]
#[error("attaching {program} ({hook}): {}", self.meaning())]
pub struct AttachError {
    pub program: String,
    pub hook: String,
    #[source]
    pub source: Cause,
}

/// What stood in the way: the kernel (its error inside), or something missing before asking it.
#[derive(Debug, Error)]
pub enum Cause {
    #[error(transparent)]
    Kernel(Box<ProgramError>),
    #[error("the program is missing from the object")]
    NoProgram,
    #[error("no kernel BTF")]
    NoBtf,
    #[error("none of the attach points exists on this kernel ({0})")]
    NoAttachPoint(String),
}

impl From<ProgramError> for Cause {
    fn from(e: ProgramError) -> Self {
        Self::Kernel(Box::new(e))
    }
}

impl AttachError {
    pub fn new(program: &str, hook: &Hook, source: impl Into<Cause>) -> Self {
        Self {
            program: program.into(),
            hook: hook.to_string(),
            source: source.into(),
        }
    }

    /// The errno the kernel answered, wherever it sits in the chain of errors.
    pub fn raw_os_error(&self) -> Option<i32> {
        let mut next: Option<&(dyn StdError + 'static)> = Some(&self.source);
        while let Some(e) = next {
            if let Some(code) = e
                .downcast_ref::<io::Error>()
                .and_then(io::Error::raw_os_error)
            {
                return Some(code);
            }
            next = e.source();
        }
        None
    }

    /// What the failure means for the user, then the kernel's own words.
    pub fn reason(&self) -> String {
        format!("{} [{}]", self.meaning(), chain(&self.source))
    }

    /// What the failure means for the user (the kernel's words are in the source).
    pub fn meaning(&self) -> &'static str {
        let kprobe = self.hook.starts_with("kprobe/") || self.hook.starts_with("kretprobe/");
        if kprobe && !Path::new("/sys/bus/event_source/devices/kprobe").exists() {
            "kernel built without CONFIG_KPROBES (no kprobe PMU)"
        } else {
            match self.raw_os_error() {
                Some(EPERM) => {
                    "the kernel refused the program (EPERM): lockdown or a security module \
                     forbids this type"
                }
                Some(ENOENT) => "the attach point does not exist on this kernel",
                Some(EACCES) => "the verifier rejected the program (EACCES)",
                _ => "unavailable",
            }
        }
    }
}

/// An error and its sources, each said once.
pub fn chain(e: &dyn StdError) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
}

/// An attachment, to be detached by [`detach`] (or with the `Ebpf` it belongs to).
#[derive(Debug)]
pub struct Link {
    program: String,
    id: LinkId,
}

#[derive(Debug)]
enum LinkId {
    Tracepoint(TracePointLinkId),
    TpBtf(BtfTracePointLinkId),
    RawTp(RawTracePointLinkId),
    Fentry(FEntryLinkId),
    Fexit(FExitLinkId),
    Kprobe(KProbeLinkId),
    Uprobe(UProbeLinkId),
    PerfEvent(PerfEventLinkId),
}

/// Loads `program` for `hook` unless it is loaded already, without attaching it (so that a
/// refusal shows at start). `btf` is needed by tp_btf, fentry and fexit, whose attach point is
/// chosen at load time.
pub fn load(
    ebpf: &mut Ebpf,
    program: &str,
    hook: &Hook,
    btf: Option<&Btf>,
) -> Result<(), AttachError> {
    let fail = |cause: Cause| AttachError::new(program, hook, cause);
    let p = ebpf
        .program_mut(program)
        .ok_or_else(|| fail(Cause::NoProgram))?;
    if p.fd().is_ok() {
        return Ok(());
    }
    let btf = || btf.ok_or_else(|| fail(Cause::NoBtf));
    let result = match (hook, p) {
        (Hook::Tracepoint { .. }, Program::TracePoint(p)) => p.load(),
        (Hook::TpBtf(name), Program::BtfTracePoint(p)) => p.load(name, btf()?),
        (Hook::RawTp(_), Program::RawTracePoint(p)) => p.load(),
        (Hook::Fentry(func), Program::FEntry(p)) => p.load(func, btf()?),
        (Hook::Fexit(func), Program::FExit(p)) => p.load(func, btf()?),
        (Hook::Kprobe(_) | Hook::Kretprobe(_), Program::KProbe(p)) => p.load(),
        (Hook::Uprobe { .. } | Hook::PltUprobe { .. }, Program::UProbe(p)) => p.load(),
        (Hook::PerfEvent { .. }, Program::PerfEvent(p)) => p.load(),
        _ => Err(ProgramError::UnexpectedProgramType),
    };
    result.map_err(|e| fail(Cause::from(e)))
}

/// Loads `program` (see [`load`]) and attaches it to `hook`.
pub fn attach(
    ebpf: &mut Ebpf,
    program: &str,
    hook: &Hook,
    btf: Option<&Btf>,
) -> Result<Link, AttachError> {
    load(ebpf, program, hook, btf)?;
    let fail = |e: ProgramError| AttachError::new(program, hook, Cause::from(e));
    let p = ebpf
        .program_mut(program)
        .ok_or_else(|| AttachError::new(program, hook, Cause::NoProgram))?;
    let id = match (*hook, p) {
        (Hook::Tracepoint { category, name }, Program::TracePoint(p)) => {
            p.attach(category, name).map(LinkId::Tracepoint)
        }
        (Hook::TpBtf(_), Program::BtfTracePoint(p)) => p.attach().map(LinkId::TpBtf),
        (Hook::RawTp(name), Program::RawTracePoint(p)) => p.attach(name).map(LinkId::RawTp),
        (Hook::Fentry(_), Program::FEntry(p)) => p.attach().map(LinkId::Fentry),
        (Hook::Fexit(_), Program::FExit(p)) => p.attach().map(LinkId::Fexit),
        (Hook::Kprobe(func) | Hook::Kretprobe(func), Program::KProbe(p)) => {
            p.attach(func, 0).map(LinkId::Kprobe)
        }
        (Hook::Uprobe { target, function }, Program::UProbe(p)) => p
            .attach(function, target, UProbeScope::AllProcesses)
            .map(LinkId::Uprobe),
        (
            Hook::PltUprobe {
                library, offset, ..
            },
            Program::UProbe(p),
        ) => p
            .attach(
                UProbeAttachLocation::AbsoluteOffset(offset),
                library,
                UProbeScope::AllProcesses,
            )
            .map(LinkId::Uprobe),
        (Hook::PerfEvent { cpu, hz }, Program::PerfEvent(p)) => p
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(hz),
                false,
            )
            .map(LinkId::PerfEvent),
        _ => Err(ProgramError::UnexpectedProgramType),
    }
    .map_err(fail)?;
    Ok(Link {
        program: program.into(),
        id,
    })
}

/// Attaches every pair, or none: a failure detaches what this call had attached.
pub fn attach_all(
    ebpf: &mut Ebpf,
    pairs: &[(&str, Hook)],
    btf: Option<&Btf>,
) -> Result<Vec<Link>, AttachError> {
    let mut links = Vec::with_capacity(pairs.len());
    for (program, hook) in pairs {
        match attach(ebpf, program, hook, btf) {
            Ok(link) => links.push(link),
            Err(e) => {
                for link in links {
                    // The program stays loaded but runs nowhere; a failed detach leaves
                    // nothing more to undo.
                    let _ = detach(ebpf, link);
                }
                return Err(e);
            }
        }
    }
    Ok(links)
}

/// Undoes one [`attach`].
pub fn detach(ebpf: &mut Ebpf, link: Link) -> Result<(), ProgramError> {
    let Some(p) = ebpf.program_mut(&link.program) else {
        return Err(ProgramError::NotAttached);
    };
    match (p, link.id) {
        (Program::TracePoint(p), LinkId::Tracepoint(id)) => p.detach(id),
        (Program::BtfTracePoint(p), LinkId::TpBtf(id)) => p.detach(id),
        (Program::RawTracePoint(p), LinkId::RawTp(id)) => p.detach(id),
        (Program::FEntry(p), LinkId::Fentry(id)) => p.detach(id),
        (Program::FExit(p), LinkId::Fexit(id)) => p.detach(id),
        (Program::KProbe(p), LinkId::Kprobe(id)) => p.detach(id),
        (Program::UProbe(p), LinkId::Uprobe(id)) => p.detach(id),
        (Program::PerfEvent(p), LinkId::PerfEvent(id)) => p.detach(id),
        _ => Err(ProgramError::UnexpectedProgramType),
    }
}

/// Takes a perf event attachment out of its program: the link returned detaches when dropped.
pub fn take_perf_event(ebpf: &mut Ebpf, link: Link) -> Result<PerfEventLink, ProgramError> {
    match (ebpf.program_mut(&link.program), link.id) {
        (Some(Program::PerfEvent(p)), LinkId::PerfEvent(id)) => p.take_link(id),
        (None, _) => Err(ProgramError::NotAttached),
        _ => Err(ProgramError::UnexpectedProgramType),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::fs;

    use aya::{programs::trace_point::TracePointError, EbpfLoader};

    use super::*;
    use crate::probe::object::EBPF_OBJECT;

    /// The real object, with a one-page ring, loaded into the running kernel (as root).
    pub(in crate::probe) fn loaded_object() -> Ebpf {
        // A fresh machine mounts no tracefs until linger does; the tests attach tracepoints.
        crate::probe::tracefs::ensure_mounted().expect("mounting tracefs (as root)");
        EbpfLoader::new()
            .map_max_entries("EVENTS", 4096)
            .load(EBPF_OBJECT)
            .expect("loading the object (as root)")
    }

    /// Open perf events and BPF links: what an attachment is made of.
    pub(in crate::probe) fn link_fds() -> usize {
        fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
            .filter(|l| {
                let l = l.to_string_lossy();
                l == "anon_inode:[perf_event]" || l == "anon_inode:bpf_link"
            })
            .count()
    }

    #[test]
    fn the_errno_is_read_through_the_chain() {
        let kernel = ProgramError::TracePointError(TracePointError::FileError {
            filename: "/sys/kernel/tracing/events/x/y/id".into(),
            io_error: io::Error::from_raw_os_error(ENOENT),
        });
        let hook = Hook::Tracepoint {
            category: "x",
            name: "y",
        };
        let e = AttachError::new("p", &hook, kernel);
        assert_eq!(e.raw_os_error(), Some(ENOENT));
        assert!(e.reason().starts_with("the attach point does not exist"));
        let missing = AttachError::new("p", &hook, Cause::NoProgram);
        assert_eq!(missing.raw_os_error(), None);
    }

    /// Loads real programs: a pair whose second hook does not exist leaves no perf link of
    /// the first behind.
    #[test]
    fn a_partial_failure_detaches_what_it_attached() {
        let mut ebpf = loaded_object();
        let before = link_fds();
        let exit = Hook::Tracepoint {
            category: "sched",
            name: "sched_process_exit",
        };
        let link = attach(&mut ebpf, "doctor_tracepoint", &exit, None).expect("attaching");
        assert_eq!(link_fds(), before + 1);
        detach(&mut ebpf, link).expect("detaching");
        assert_eq!(link_fds(), before);

        let pairs = [
            ("doctor_tracepoint", exit),
            (
                "doctor_raw_tracepoint",
                Hook::RawTp("no_such_tracepoint_here"),
            ),
        ];
        let Err(e) = attach_all(&mut ebpf, &pairs, None) else {
            panic!("a tracepoint that does not exist was attached");
        };
        assert_eq!(e.program, "doctor_raw_tracepoint");
        assert!(e.raw_os_error().is_some(), "{e}");
        assert_eq!(link_fds(), before, "the first attachment leaked");
    }
}
