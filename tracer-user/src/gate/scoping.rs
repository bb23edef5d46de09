//! A request turned into what the gate looks at: the GPUs (named or all), the selectors of
//! the scope, and what the report says of them.

use std::{fs, path::PathBuf};

use super::{
    decision::Gate,
    gpus::{self, GpuRef, Identity},
    report::{GpuReport, ScopeReport},
    request::Request,
    scope::{self, Selectors},
};
use crate::{probe::devices::GpuDevices, source::nvml};

/// The GPUs NVML lists; without NVML, those the driver lists (and a note of what that
/// leaves unseen).
pub(super) fn known_gpus(
    reader: &Result<nvml::Reader, String>,
    notes: &mut Vec<String>,
) -> Vec<Identity> {
    let e = match reader {
        Ok(r) => {
            return r
                .identities()
                .into_iter()
                .map(|(index, uuid, minor)| Identity { index, uuid, minor })
                .collect()
        }
        Err(e) => e,
    };
    notes.push(format!(
        "NVML is not available ({e}): decided from the GPU files alone (their \
         descriptors and memory mappings in /proc); memory the driver still frees \
         after the last file closed is not seen"
    ));
    gpus::driver_identities(std::path::Path::new("/proc/driver/nvidia/gpus"))
}

/// The GPUs the gate looks at.
pub(super) struct ScopedGpus {
    /// Their device files, and those declared with `--gpu-device`.
    pub(super) devices: GpuDevices,
    /// Their NVML indices; None: every GPU.
    pub(super) indices: Option<Vec<u32>>,
    /// Those named and found.
    pub(super) shown: Vec<Identity>,
    /// Those named and not found.
    pub(super) unresolved: Vec<String>,
}

/// Every GPU when none is named; else those named that are here (an error when none is), with
/// the `--gpu-device` files they take (`files`, path and device).
pub(super) fn scope_gpus(
    named: Option<&[GpuRef]>,
    known: &[Identity],
    discovered: &GpuDevices,
    files: &[(PathBuf, u32)],
) -> anyhow::Result<ScopedGpus> {
    let Some(refs) = named else {
        return Ok(ScopedGpus {
            devices: discovered.clone(),
            indices: None,
            shown: Vec::new(),
            unresolved: Vec::new(),
        });
    };
    let (found, unresolved) = gpus::resolve(refs, known);
    let (devs, answered) = gpus::named_files(refs, files);
    let unresolved: Vec<String> = unresolved
        .into_iter()
        .filter(|u| {
            !answered
                .iter()
                .any(|n| *u == gpus::describe(&GpuRef::Minor(*n)))
        })
        .collect();
    let extra = GpuDevices {
        majors: Vec::new(),
        devs,
    };
    if found.is_empty() && extra.devs.is_empty() {
        anyhow::bail!(
            "none of the GPUs named is on this machine ({}): cannot tell",
            unresolved.join(", ")
        );
    }
    Ok(ScopedGpus {
        devices: gpus::devices_of(&found, &extra),
        indices: Some(found.iter().map(|g| g.index).collect()),
        shown: found,
        unresolved,
    })
}

/// What was waited for, as the report says it.
pub(super) fn scope_report(
    args: &Request,
    selectors: &Selectors,
    scoped: &ScopedGpus,
    gpus_from: Option<&'static str>,
    discovered: &GpuDevices,
) -> ScopeReport {
    ScopeReport {
        pids: selectors.pids.clone(),
        pgids: selectors.pgids.clone(),
        cgroups: selectors.cgroups.clone(),
        slurm_jobs: selectors.jobs.clone(),
        pods: selectors.pods.clone(),
        gpus: scoped
            .shown
            .iter()
            .map(|g| GpuReport {
                index: g.index,
                uuid: g.uuid.clone(),
                minor: g.minor,
            })
            .collect(),
        gpus_from,
        unresolved_gpus: scoped.unresolved.clone(),
        devices: discovered
            .devs
            .iter()
            .map(|d| format!("{}:{}", d >> 20, d & 0xfffff))
            .collect(),
        any_process: args.any_process,
        allowed: args.allowed.clone(),
        ..ScopeReport::default()
    }
}

/// The GPUs named, and the variable `--job-gpus` read; None: every GPU.
pub(super) fn gpu_scope(
    args: &Request,
) -> anyhow::Result<(Option<Vec<GpuRef>>, Option<&'static str>)> {
    let mut refs: Vec<GpuRef> = args.gpus.iter().map(|&i| GpuRef::Index(i)).collect();
    refs.extend(args.uuids.iter().map(|u| GpuRef::Uuid(u.clone())));
    let mut from = None;
    if args.job_gpus {
        let (name, named) =
            gpus::from_environment(|v| std::env::var(v).ok()).map_err(anyhow::Error::msg)?;
        from = Some(name);
        match named {
            Some(named) => refs.extend(named),
            // Every GPU: as if none were named, unless other options name some.
            None if refs.is_empty() => return Ok((None, from)),
            None => {}
        }
    }
    Ok(((!refs.is_empty()).then_some(refs), from))
}

pub(super) fn selectors(args: &Request) -> anyhow::Result<Selectors> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let pods = args
        .pods
        .iter()
        .map(|p| {
            let uid = p.replace('_', "-").to_ascii_lowercase();
            let ok = uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
            if ok {
                Ok(uid)
            } else {
                Err(anyhow::anyhow!(
                    "--pod {}: not a pod UID (36 characters, hex and dashes)",
                    crate::escape::terminal(p)
                ))
            }
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Selectors {
        pids: args.pids.clone(),
        pgids: args.pgids.clone(),
        cgroups: args
            .cgroups
            .iter()
            .map(|c| scope::cgroup_path(c, &mountinfo))
            .collect(),
        jobs: args.jobs.clone(),
        pods,
    })
}

pub(super) fn unseen_note(gate: &Gate) -> String {
    let pids: Vec<String> = gate.scope().unseen.iter().map(u32::to_string).collect();
    let how = if gate.has_nvml() {
        "NVML tells whether their memory is back; children they left are known only from the \
         agent's incident log"
    } else {
        "unless the agent's incident log names their holders, every process holding GPU files \
         on these GPUs may hold theirs and keeps the gate closed"
    };
    format!(
        "pid {} was gone when the gate first looked: {how} (start the gate before the kill, or \
         scope it by cgroup, job or pod, to know)",
        pids.join(", ")
    )
}
