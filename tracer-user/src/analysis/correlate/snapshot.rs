//! A case as an incident record: the facts collected so far, and what follows from them
//! (the mode, the memory's return and who decided it, phases, verdict), computed anew for each
//! report.

use std::sync::Arc;

use tracer_common::driver::dev_minor;

use super::{
    case::{Case, Reported},
    group, Correlator,
};
use crate::analysis::{
    holders::{HeldFile, Holder, How},
    incident::{ExitStatus, GpuPart, Incident, Source, HELD_BY_OWNERS},
    ledger::LedgerPart,
    memory::{tolerance, ImportVia, Role, ShareFrom, Watch},
    signals::{self, Origin, SIGKILL},
    teardown::TeardownLog,
    termination::{self, Mode, SignalSent},
    verdict::{self, gib},
};

/// NVML and the kernel disagree when they are this far apart.
const DISAGREE_NS: u64 = 2_000_000;

impl Correlator {
    pub(super) fn snapshot(&self, id: u64) -> Incident {
        let Some(c) = self.cases.get(&id) else {
            unreachable!("snapshot of a case that is not open");
        };
        let mut inc = c.inc.clone();
        let pid = inc.target.pid;
        let now = self.now_ns;
        let dead = inc.t_group_dead_ns;
        // A SIGKILLed process that would not die counts as killed.
        let killed = ExitStatus {
            signal: Some(SIGKILL),
            status: None,
        };
        let exit = match (&inc.exit, c.signals.iter().any(|s| s.sig == SIGKILL)) {
            (Some(e), _) => Some(e.clone()),
            (None, true) => Some(killed),
            (None, false) => None,
        };
        inc.termination = termination::decide(pid, &c.signals, exit.as_ref(), c.oom);
        self.set_signal(&mut inc, &c.signals, exit.as_ref());

        let w = self.memory.watch(id);
        let back = self.back(id);
        if c.gpu {
            self.gpu_record(id, c, w, back, &mut inc);
        }

        let empty = Default::default();
        let log = self.teardown.get(&pid).unwrap_or(&empty);
        if let (Some(dead), true) = (dead, c.gpu) {
            self.teardown_record(c, log, dead, back, &mut inc);
        }
        if c.gpu {
            inc.collateral =
                self.ledger
                    .refused_others(pid, inc.t_signal_ns, back.map_or(now, |b| b.0));
        }
        if let Some(mine) = self.teardown_of(id) {
            let open: Vec<(u64, _)> = self
                .cases
                .keys()
                .filter_map(|k| Some((*k, self.teardown_of(*k)?)))
                .collect();
            inc.storm = self.storms.view(id, &mine, &open);
        }
        if c.gpu {
            inc.unseen = self.unseen.clone();
        }
        let from = c.signals.first().map_or(inc.t_signal_ns, |s| s.t_ns);
        inc.losses = self.losses.between(from, now);
        inc.lingering = dead.is_some_and(|d| now.saturating_sub(d) >= self.config.linger_after_ns)
            && back.is_none()
            && c.gpu;

        if c.gpu || dead.is_none() {
            let cx = self.verdict_context(id, &inc, w, log);
            inc.verdict = verdict::rules::decide(&inc, &cx);
        }
        let gpu = w.and_then(Watch::gpu);
        let stuck = inc
            .verdict
            .as_ref()
            .is_some_and(|v| v.kind == verdict::VerdictKind::StuckInDriver);
        inc.gpu_errors = self.xids.cited(pid, gpu, inc.t_signal_ns, stuck);
        if !inc.gpu_errors.is_empty() {
            let story = crate::analysis::gpu_errors::story(&inc);
            let advice: Vec<String> = inc.gpu_errors.iter().filter_map(|x| x.advice()).collect();
            if let Some(v) = &mut inc.verdict {
                v.evidence.insert(0, story);
                // What NVIDIA says to do comes first: it decides whether the GPU is usable.
                if let Some(first) = advice.first() {
                    v.hint = format!("{first}; {}", v.hint);
                }
            }
        }
        inc
    }

    /// What the verdict is decided from beside the incident itself: the threads still asleep,
    /// processes NVML lists that linger knows nothing of, and what is still in flight.
    fn verdict_context(
        &self,
        id: u64,
        inc: &Incident,
        w: Option<&Watch>,
        log: &TeardownLog,
    ) -> verdict::facts::Context {
        let pid = inc.target.pid;
        let now = self.now_ns;
        let asleep = log
            .asleep(now)
            .into_iter()
            .map(|(tid, since, id)| {
                let frames = self
                    .stacks
                    .get(&id)
                    .map(|s| s.frames.to_vec())
                    .unwrap_or_default();
                (tid, since, frames)
            })
            .collect();
        let unknown_nvml_pids = self
            .memory
            .latest()
            .flat_map(|g| g.processes.iter().map(|p| p.pid))
            .filter(|&p| p != pid && self.holders.process(p).is_none())
            .filter(|&p| !self.cases.values().any(|o| o.inc.target.pid == p))
            .collect();
        verdict::facts::Context {
            deferral: log.deferral(&self.stacks),
            asleep,
            unknown_nvml_pids,
            unreconciled: self.unreconciled(&inc.holders),
            ambiguous: w
                .map(|w| {
                    w.ambiguous
                        .iter()
                        .map(|(p, b)| (*p, self.name_of(*p).map(|n| n.0).unwrap_or_default(), *b))
                        .collect()
                })
                .unwrap_or_default(),
            // Not listed means something only once NVML was read after its files' release.
            still_listed: w
                .map(Watch::listed)
                .filter(|_| self.memory.nvml())
                .filter(|listed| {
                    *listed
                        || inc
                            .gpu
                            .as_ref()
                            .and_then(|g| g.t_files_released_ns)
                            .is_some_and(|t| self.memory.read_since(t))
                }),
            others_in_flight: self.others_in_flight(id),
            slow_after_ns: self.config.slow_after_ns,
            now_ns: now,
        }
    }

    /// Where a dead GPU process's teardown time went, from its death to its own release of
    /// its files: phases, the hooked release, and the stacks for flamegraphs.
    fn teardown_record(
        &self,
        c: &Case,
        log: &TeardownLog,
        dead: u64,
        back: Option<(u64, Source)>,
        inc: &mut Incident,
    ) {
        let to = c.kernel_release.map_or(self.now_ns, |k| k.0);
        let (mut phases, mut coverage) = match c.dead_tid {
            Some(tid) => log.phases(&self.stacks, tid, dead, to),
            None => (Vec::new(), None),
        };
        if phases.is_empty() {
            phases = log.hooked_phases(dead, to);
            let covered: u64 = phases.iter().map(|p| p.ns).sum();
            coverage = (!phases.is_empty() && to > dead)
                .then(|| (covered as f64 / (to - dead) as f64).min(1.0));
        }
        inc.phases = phases;
        inc.phases_coverage = coverage;
        inc.release = log.driver_release(dead, to);
        let end = back.map_or(to, |b| b.0.max(to));
        inc.teardown_stacks = log
            .weighted_stacks(dead, end)
            .into_iter()
            .map(|(id, ns)| {
                let frames = self.stacks.get(&id).map(|s| s.frames.clone());
                (frames.unwrap_or_else(|| Arc::new([])), ns)
            })
            .collect();
    }

    /// The GPU part of a case's record: its share, who holds it, when it was back and by
    /// which account, each GPU's part, and the evidence in words.
    fn gpu_record(
        &self,
        id: u64,
        c: &Case,
        w: Option<&Watch>,
        back: Option<(u64, Source)>,
        inc: &mut Incident,
    ) {
        let pid = inc.target.pid;
        inc.holders = self.holders_of_case(c, w);
        let mut evidence = self.share_evidence(c, w, pid);
        evidence.extend(self.release_evidence(inc, back, c.kernel_release));
        let held = back.and_then(|(b, _)| self.held_until(c, w, b));
        // Where the moment is the kernel's upper bound, the window says how far it may be off.
        if let (Some(h), Some((b, Source::Confirmed | Source::Kernel))) = (held, back) {
            evidence.push(window_evidence(inc, h, b));
        }
        let gpu = inc.gpu.get_or_insert_with(Default::default);
        if let Some((share, from)) = w.and_then(|w| w.share()) {
            gpu.share_bytes = share;
            gpu.share_from = from.label();
        } else {
            gpu.share_from = "none";
        }
        if w.is_some_and(|w| w.role == Role::Nothing) {
            gpu.share_from = HELD_BY_OWNERS;
        }
        if let Some(w) = w {
            gpu.index = w.gpu();
            gpu.bytes_nvml = w.nvml_figure();
            gpu.nvml_used_before = w.devices.values().next().and_then(|d| d.used_before);
            gpu.released_bytes = w.released();
        }
        gpu.t_files_released_ns = c.kernel_release.map(|k| k.0);
        gpu.files_released_by = c.kernel_release.map(|k| k.1);
        gpu.t_holders_gone_ns = (!c.holder_gone.is_empty())
            .then(|| {
                c.holder_gone
                    .values()
                    .try_fold(0, |t, g| g.map(|g| t.max(g)))
            })
            .flatten();
        gpu.unaccounted_references = c.unaccounted.total();
        gpu.t_memory_back_ns = back.map(|b| b.0);
        gpu.memory_back_by = back.map(|b| b.1);
        gpu.t_memory_held_until_ns = held.map(|h| h.0);
        gpu.memory_back_known_to_ns = match back {
            Some((b, Source::Confirmed | Source::Kernel)) => self.moment_known_to(c, b),
            _ => None,
        };
        let held_elsewhere = !c.fd_holders.is_empty()
            || c.unaccounted.any()
            || w.is_some_and(|w| w.residuals().next().is_some());
        if let (Some((b, _)), Some((k, _)), true) = (back, c.kernel_release, held_elsewhere) {
            gpu.held_elsewhere_ns = Some(b.saturating_sub(k));
        }
        gpu.gpus = self.gpu_parts(id, &gpu.files, &c.ledger_parts);
        if let Some((k, Source::Confirmed)) = back {
            // The kernel released the files, and with them every GPU's part, at once.
            gpu.released_bytes = gpu.share_bytes;
            for p in &mut gpu.gpus {
                p.t_memory_back_ns = Some(k);
                p.released_bytes = p.share_bytes;
            }
        }
        // The ledger's bytes on the GPUs NVML lists it on (all of them, in a trace
        // recorded before the ledger placed memory).
        let ledger_listed = if c.ledger_parts.is_empty() {
            gpu.bytes_ledger
        } else {
            gpu.gpus
                .iter()
                .filter(|p| p.bytes_nvml.is_some())
                .filter_map(|p| p.bytes_ledger)
                .sum()
        };
        if let (Some(n), true) = (gpu.bytes_nvml, ledger_listed > 0) {
            if n.abs_diff(ledger_listed) > tolerance(n) {
                evidence.push(format!(
                    "NVML's figure ({}) and the ledger ({} of video memory) differ: NVML \
                     counts the CUDA context's own memory and allocations made before \
                     tracing; the share is NVML's",
                    gib(n),
                    gib(ledger_listed)
                ));
            }
        }
        evidence.extend(placement_evidence(&c.ledger_parts, &gpu.gpus));
        gpu.evidence = evidence;
    }

    /// The last moment a victim's own memory was surely still held, and what says so: its
    /// death or a holder's (none lets go before its exit), or later a sampled thread of one of
    /// them inside the driver's free of its RM clients.
    fn held_until(&self, c: &Case, w: Option<&Watch>, back: u64) -> Option<(u64, bool)> {
        if !w.is_some_and(|w| matches!(w.role, Role::Own { .. })) {
            return None;
        }
        let dead = c.inc.t_group_dead_ns?.min(back);
        let deaths = c.fd_holders.iter().filter_map(|h| h.t_dead_ns);
        let deaths = deaths.chain(c.co_victims.values().filter_map(|v| v.dead_ns));
        let died = deaths.filter(|&t| t <= back).fold(dead, u64::max);
        let pids = std::iter::once(c.inc.target.pid).chain(c.fd_holders.iter().map(|h| h.pid));
        let freeing = pids
            .filter_map(|pid| self.teardown.get(&pid))
            .filter_map(|log| log.last_rm_client_free(&self.stacks, dead, back))
            .max();
        Some(match freeing {
            Some(t) if t >= died => (t, true),
            _ => (died, false),
        })
    }

    /// Each GPU of the case's memory (its own, or its owner's for an alias) and of its
    /// device files, with that GPU's part.
    fn gpu_parts(&self, id: u64, files: &[HeldFile], ledger: &[LedgerPart]) -> Vec<GpuPart> {
        let own = self
            .memory
            .watch(id)
            .is_some_and(|w| matches!(w.role, Role::Own { .. }));
        let infos = self.xids.gpus();
        let mut parts: Vec<GpuPart> = Vec::new();
        if let Some(w) = self.memory.memory_of(id) {
            for (&index, d) in &w.devices {
                let info = infos.iter().find(|g| g.index == index);
                let (share, from) = w
                    .device_share(index)
                    .filter(|_| own)
                    .unwrap_or((0, ShareFrom::None));
                parts.push(GpuPart {
                    index: Some(index),
                    uuid: info.map(|g| g.uuid.clone()),
                    minor: info.and_then(|g| g.minor),
                    share_bytes: share,
                    share_from: from.label(),
                    bytes_nvml: w.device_figure(index),
                    nvml_used_before: d.used_before,
                    t_memory_back_ns: d.back_ns().filter(|_| self.memory.nvml()),
                    released_bytes: if own { w.device_released(index) } else { 0 },
                    ..Default::default()
                });
            }
        }
        // The ledger's figure on each GPU (by device instance where NVML does not name it).
        for l in ledger {
            let at = parts.iter().position(|p| match l.gpu {
                Some(gpu) => p.index == Some(gpu),
                None => p.index.is_none() && p.device_instance == l.device_instance,
            });
            let i = at.unwrap_or_else(|| {
                let info = infos.iter().find(|g| Some(g.index) == l.gpu);
                parts.push(GpuPart {
                    index: l.gpu,
                    uuid: info.map(|g| g.uuid.clone()),
                    minor: info.and_then(|g| g.minor),
                    share_from: ShareFrom::None.label(),
                    ..Default::default()
                });
                parts.len() - 1
            });
            let part = &mut parts[i];
            part.device_instance = part.device_instance.or(l.device_instance);
            *part.bytes_ledger.get_or_insert(0) += l.bytes;
        }
        // Its /dev/nvidiaN descriptors, on the GPU whose minor NVML gave (or on a part of
        // their own: without NVML, or for a GPU it had no memory on).
        for f in files
            .iter()
            .filter(|f| crate::analysis::references::is_gpu_node(f.dev))
        {
            let minor = dev_minor(f.dev);
            let index = if infos.iter().any(|g| g.minor.is_some()) {
                infos
                    .iter()
                    .find(|g| g.minor == Some(minor))
                    .map(|g| g.index)
            } else {
                // A trace recorded before minors were read: on a one-GPU machine (or with the
                // memory on one GPU), that GPU.
                match (infos, parts.as_slice()) {
                    ([only], _) => Some(only.index),
                    ([], [one]) => one.index,
                    _ => None,
                }
            };
            let at = parts
                .iter()
                .position(|p| p.minor == Some(minor) || (index.is_some() && p.index == index));
            let i = match at {
                Some(i) => i,
                None => {
                    parts.push(GpuPart {
                        index,
                        uuid: infos
                            .iter()
                            .find(|g| Some(g.index) == index)
                            .map(|g| g.uuid.clone()),
                        minor: Some(minor),
                        share_from: ShareFrom::None.label(),
                        ..Default::default()
                    });
                    parts.len() - 1
                }
            };
            let part = &mut parts[i];
            part.minor = Some(minor);
            if !part.fds.contains(&f.fd) {
                part.fds.push(f.fd);
            }
        }
        parts
    }

    /// Other processes holding the case's memory: its files' holders at death (with when each
    /// let go) and the importers found.
    fn holders_of_case(&self, c: &Case, w: Option<&Watch>) -> Vec<Holder> {
        let mut out = c.fd_holders.clone();
        for h in &mut out {
            h.t_released_ns = c.holder_gone.get(&h.pid).copied().flatten();
            group::mark_co_victim(h, c);
        }
        for r in w.iter().flat_map(|w| w.residuals()) {
            let (comm, ppid) = c
                .importer_names
                .get(&r.importer)
                .cloned()
                .or_else(|| self.name_of(r.importer))
                .unwrap_or_default();
            out.push(Holder {
                pid: r.importer,
                comm,
                ppid,
                fds: Vec::new(),
                how: How::Import {
                    t_ns: r.found_ns,
                    bytes: r.bytes,
                    via: r.via,
                },
                t_released_ns: r.back_ns,
                t_dead_ns: None,
                t_killed_ns: None,
            });
        }
        out
    }

    /// Importers only NVML suggests whose driver calls the ledger traces: it would have seen
    /// an import.
    fn unreconciled(&self, holders: &[Holder]) -> Vec<u32> {
        holders
            .iter()
            .filter(|h| {
                matches!(
                    h.how,
                    How::Import {
                        via: ImportVia::Nvml,
                        ..
                    }
                )
            })
            .map(|h| h.pid)
            .filter(|pid| self.ioctls_traced && self.ledger.traces(*pid))
            .collect()
    }

    /// What the death was to give back, in words.
    fn share_evidence(&self, c: &Case, w: Option<&Watch>, pid: u32) -> Vec<String> {
        let sentence = match w.map(|w| w.role) {
            Some(Role::Own { .. }) => match w.and_then(|w| w.share()) {
                Some((share, ShareFrom::Nvml)) => {
                    format!("its share: {} (NVML's figure for pid {pid})", gib(share))
                }
                Some((share, ShareFrom::Ledger)) => format!(
                    "its share: {} (its ledger; NVML never listed pid {pid})",
                    gib(share)
                ),
                _ => "NVML never listed it and its ledger is empty: no GPU memory of its own"
                    .to_string(),
            },
            Some(Role::AliasOf(owner)) => {
                let who = c.owner.as_deref().unwrap_or("another dead process");
                format!("its GPU files carry the memory of {who} (incident {owner}): back with it")
            }
            Some(Role::Nothing) => {
                let owners: Vec<String> = c
                    .fd_holders
                    .iter()
                    .map(|h| format!("{}[{}]", h.comm, h.pid))
                    .collect();
                format!(
                    "its GPU files stay open in {}, which own the memory: its death released none \
                     of it",
                    owners.join(", ")
                )
            }
            _ => return Vec::new(),
        };
        vec![sentence]
    }

    /// The incident's headline signal: the one that killed it (the SIGKILL of an escalation,
    /// the catchable signal whose handler exited), or none for a plain exit.
    fn set_signal(&self, inc: &mut Incident, sent: &[SignalSent], exit: Option<&ExitStatus>) {
        let by_exit = exit.and_then(|e| e.signal);
        let deciding = match by_exit {
            Some(sig) => sent.iter().find(|s| s.sig == sig),
            None if inc.termination.mode == Mode::Term => sent.iter().find(|s| s.sig != SIGKILL),
            None => None,
        };
        match (deciding, by_exit) {
            (Some(s), _) => {
                inc.signal = s.sig;
                inc.signal_name = s.name.clone();
                inc.origin = s.origin;
                inc.si_code = s.si_code;
                inc.sender = Some(s.sender.clone());
                inc.t_signal_ns = s.t_ns;
            }
            (None, sig) => {
                // Exited on its own, or killed by a signal outside the traced set.
                inc.signal = sig.unwrap_or(0);
                inc.signal_name = sig.map_or("exit".into(), signals::name);
                inc.origin = Origin::User;
                inc.si_code = 0;
                inc.sender = None;
                inc.t_signal_ns = inc.t_group_dead_ns.unwrap_or(inc.t_signal_ns);
            }
        }
    }

    /// Which source decided the memory's return, and where the sources disagree.
    fn release_evidence(
        &self,
        inc: &Incident,
        back: Option<(u64, Source)>,
        kernel: Option<(u64, Source)>,
    ) -> Vec<String> {
        let ms = |t: u64| inc.ms_after_signal(t);
        let mut out = Vec::new();
        let importers: Vec<String> = inc
            .holders
            .iter()
            .filter(|h| matches!(h.how, How::Import { .. }))
            .map(|h| format!("{}[{}]", h.comm, h.pid))
            .collect();
        if let Some((k, how)) = kernel {
            out.push(format!(
                "its own release of its GPU files ended at +{:.1} ms ({})",
                ms(k),
                match how {
                    Source::Fput => "the driver hooks' last __fput",
                    Source::LeftDriver =>
                        "its threads' first sight outside the driver after their last inside",
                    Source::Exited =>
                        "its last thread's final switch, nobody reaping it: an \
                                       upper bound",
                    _ => "the zombie transition: an upper bound",
                }
            ));
        }
        match back {
            Some((b, Source::Nvml)) => {
                out.push(format!(
                    "memory back at +{:.1} ms: NVML stopped listing pid {} and the device's used \
                     memory came down by its share",
                    ms(b),
                    inc.target.pid
                ));
                if let Some((k, _)) = kernel {
                    if inc.holders.is_empty() && b.abs_diff(k) > DISAGREE_NS {
                        out.push(format!(
                            "NVML and the kernel are {:.1} ms apart: the memory's return is \
                             NVML's reading (the device's memory is the fact); the kernel's time \
                             is that of the files, and NVML's reads queue behind the driver's \
                             lock during teardowns",
                            b.abs_diff(k) as f64 / 1e6
                        ));
                    }
                }
            }
            Some((b, Source::Confirmed)) if importers.is_empty() => out.push(format!(
                "memory back at +{:.1} ms: its last holder's release by the kernel's account, with \
                 no NVML reading since listing pid {}{} (the device's used memory moves with \
                 other jobs too)",
                ms(b),
                inc.target.pid,
                if self.ioctls_traced {
                    " and no import in its driver calls"
                } else {
                    "; without driver calls an import shows only as another process's NVML \
                     figure rising as it left the list"
                }
            )),
            Some((b, Source::Confirmed)) => out.push(format!(
                "memory back at +{:.1} ms: the last release by the kernel's account, its own or \
                 its importers' ({}: with their exit, or their free of the duplicates its \
                 driver calls showed), with no NVML reading since listing pid {} or them (NVML \
                 sees an import's return only in the importer's figure, which moves with its \
                 own memory too)",
                ms(b),
                importers.join(", "),
                inc.target.pid
            )),
            Some((b, _)) => out.push(format!(
                "memory back at +{:.1} ms by the kernel's account: its last holder's release (no \
                 NVML reading to confirm it)",
                ms(b)
            )),
            None => {}
        }
        out
    }
}

/// Where the memory's return lies, when linger cannot place it closer than its bounds.
fn window_evidence(inc: &Incident, (held, freeing): (u64, bool), back: u64) -> String {
    format!(
        "back between +{:.1} and +{:.1} ms: still held at the first ({}), and no moment \
         before the second that linger saw says it was back",
        inc.ms_after_signal(held),
        inc.ms_after_signal(back),
        if freeing {
            "a thread of it was in the driver's free of its RM clients"
        } else {
            "its death"
        }
    )
}

/// Where the ledger's GPUs and NVML's disagree, or the ledger could not place memory on a
/// GPU, in words: each GPU's share is NVML's where NVML lists the process, the ledger's where
/// only the ledger saw memory.
fn placement_evidence(ledger: &[LedgerPart], parts: &[GpuPart]) -> Vec<String> {
    let mut out = Vec::new();
    for l in ledger.iter().filter(|l| l.gpu.is_none()) {
        let on = match (l.device_instance, &l.pci_bus_id) {
            (Some(i), Some(pci)) => {
                format!("the driver's device instance {i}, PCI {pci}, which NVML did not name")
            }
            (Some(i), None) => format!(
                "the driver's device instance {i}, which no GET_ID_INFO control named while \
                 tracing"
            ),
            (None, _) => "a device object made before tracing began".to_string(),
        };
        out.push(format!(
            "the ledger saw {} of video memory on {on}: not placed on a GPU",
            gib(l.bytes)
        ));
    }
    let listed: Vec<String> = parts
        .iter()
        .filter(|p| p.bytes_nvml.is_some_and(|b| b > 0))
        .filter_map(|p| Some(format!("GPU{}", p.index?)))
        .collect();
    for p in parts {
        let (Some(index), Some(bytes)) = (p.index, p.bytes_ledger) else {
            continue;
        };
        if p.bytes_nvml.unwrap_or(0) == 0 && bytes > tolerance(bytes) && !listed.is_empty() {
            out.push(format!(
                "GPU{index}: the ledger saw {} that NVML did not list there (NVML listed it on \
                 {}): awaited on GPU{index} by the ledger's figure",
                gib(bytes),
                listed.join(", ")
            ));
        }
    }
    out
}

/// What changed since the last report, in words.
pub(super) fn changes(prev: Option<&Reported>, inc: &Incident) -> Vec<String> {
    let mut out = Vec::new();
    let Some(gpu) = inc.gpu.as_ref() else {
        return out;
    };
    let gone: Vec<String> = inc
        .holders
        .iter()
        .filter(|h| h.t_released_ns.is_some())
        .filter(|h| prev.is_some_and(|p| p.holders_left.contains(&h.pid)))
        .map(|h| format!("{}[{}]", h.comm, h.pid))
        .collect();
    if !gone.is_empty() {
        out.push(format!("let go: {}", gone.join(", ")));
    }
    if prev.is_some_and(|p| !p.dead) && inc.t_group_dead_ns.is_some() {
        out.push("the process died".into());
    }
    if gpu.t_memory_back_ns.is_some() {
        out.push("memory back".into());
    } else if inc.lingering && prev.is_some_and(|p| !p.lingering) {
        out.push("lingering".into());
    }
    out
}
