//! Which GPUs a gate looks at: NVML indices, UUIDs, and the GPUs a job's environment names,
//! as NVML indices (for its readings) and as device files (`/dev/nvidiaN`, for the look at who
//! holds them). Devices named with `--gpu-device` always count.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::{
    probe::devices::{nvidia_listing, GpuDevices},
    source::machine,
};
use tracer_common::driver::mkdev;

/// The variables a job's GPUs are read from, first set first.
pub const JOB_VARIABLES: [&str; 3] = [
    "SLURM_JOB_GPUS",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
];

/// A GPU as the user or an environment named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuRef {
    /// NVML's index (nvidia-smi's).
    Index(u32),
    /// The device file's number (`/dev/nvidiaN`): Slurm's GPU numbers with
    /// `File=/dev/nvidia[0-N]` in gres.conf.
    Minor(u32),
    /// `GPU-...` (or a unique prefix of one, as CUDA accepts), or `MIG-...`.
    Uuid(String),
}

/// The GPUs a job's environment names, from the first of [`JOB_VARIABLES`] that is set, and
/// that variable's name; None for every GPU (`NVIDIA_VISIBLE_DEVICES=all`).
pub fn from_environment(
    get: impl Fn(&str) -> Option<String>,
) -> Result<(&'static str, Option<Vec<GpuRef>>), String> {
    let (name, value) = JOB_VARIABLES
        .iter()
        .find_map(|&name| Some((name, get(name)?)))
        .ok_or_else(|| format!("--job-gpus: none of {} is set", JOB_VARIABLES.join(", ")))?;
    let value = value.trim();
    if name == "NVIDIA_VISIBLE_DEVICES" && value == "all" {
        return Ok((name, None));
    }
    if value.is_empty() || ["none", "void", "NoDevFiles", "-1"].contains(&value) {
        return Err(format!("--job-gpus: {name}={value:?} gives the job no GPU"));
    }
    let refs = value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.parse::<u32>() {
            Ok(n) if name == "SLURM_JOB_GPUS" => Ok(GpuRef::Minor(n)),
            Ok(n) => Ok(GpuRef::Index(n)),
            Err(_) if e.starts_with("GPU-") || e.starts_with("MIG-") => {
                Ok(GpuRef::Uuid(e.to_string()))
            }
            Err(_) => Err(format!("--job-gpus: {name} names {e:?}, not a GPU")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name, Some(refs)))
}

/// A GPU of this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub index: u32,
    pub uuid: Option<String>,
    pub minor: Option<u32>,
}

/// The driver's own list (`/proc/driver/nvidia/gpus/<bus id>/information`), for when NVML is
/// missing: NVML numbers GPUs in PCI bus order, as the directory names sort.
pub fn driver_identities(root: &Path) -> Vec<Identity> {
    let mut buses: Vec<_> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    buses.sort();
    buses
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let info = fs::read_to_string(dir.join("information")).unwrap_or_default();
            let field = |key: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .map(|v| v.trim_start_matches(':').trim().to_string())
            };
            Identity {
                index: i as u32,
                uuid: field("GPU UUID"),
                minor: field("Device Minor").and_then(|m| m.parse().ok()),
            }
        })
        .collect()
}

/// The GPUs `refs` name among `known`, and what named none of them (said, not fatal: the
/// files of `--gpu-device` may stand in for them).
pub fn resolve(refs: &[GpuRef], known: &[Identity]) -> (Vec<Identity>, Vec<String>) {
    let mut found: Vec<Identity> = Vec::new();
    let mut unresolved = Vec::new();
    for r in refs {
        let matches: Vec<&Identity> = known
            .iter()
            .filter(|g| match r {
                GpuRef::Index(n) => g.index == *n,
                GpuRef::Minor(n) => g.minor == Some(*n),
                GpuRef::Uuid(u) => g
                    .uuid
                    .as_deref()
                    .is_some_and(|id| id.to_ascii_lowercase().starts_with(&u.to_ascii_lowercase())),
            })
            .collect();
        match matches.as_slice() {
            [one] => {
                if !found.contains(one) {
                    found.push((*one).clone());
                }
            }
            [] => unresolved.push(describe(r)),
            _ => unresolved.push(format!("{} (more than one GPU matches)", describe(r))),
        }
    }
    (found, unresolved)
}

pub fn describe(r: &GpuRef) -> String {
    match r {
        GpuRef::Index(n) => format!("GPU index {n}"),
        GpuRef::Minor(n) => format!("/dev/nvidia{n}"),
        GpuRef::Uuid(u) => u.clone(),
    }
}

/// The number a device file's name ends in (`nvidia3`, `gpu1`): Slurm numbers the files of
/// a gres by it (`SLURM_JOB_GPUS`), as the NVIDIA driver numbers `/dev/nvidiaN` by minor.
pub fn file_number(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    name[stem.len()..].parse().ok()
}

/// The `--gpu-device` files (path, device) the named GPUs take, and the device numbers they
/// answered: where GPUs are named by device number (`SLURM_JOB_GPUS`), a file whose name ends
/// in a number is that GPU's file and counts only when it is named (a file may stand for a
/// GPU NVML does not know); any other file always counts.
pub fn named_files(refs: &[GpuRef], files: &[(PathBuf, u32)]) -> (Vec<u32>, Vec<u32>) {
    let minors: Vec<u32> = refs
        .iter()
        .filter_map(|r| match r {
            GpuRef::Minor(n) => Some(*n),
            _ => None,
        })
        .collect();
    let mut devs = Vec::new();
    let mut answered = Vec::new();
    for (path, dev) in files {
        match file_number(path).filter(|_| !minors.is_empty()) {
            Some(n) if minors.contains(&n) => {
                devs.push(*dev);
                answered.push(n);
            }
            Some(_) => {}
            None => devs.push(*dev),
        }
    }
    (devs, answered)
}

/// The device files of `gpus` (`/dev/nvidiaN`: the NVIDIA major, their minors) and `extra`.
pub fn devices_of(gpus: &[Identity], extra: &GpuDevices) -> GpuDevices {
    let major = machine::proc_devices()
        .ok()
        .and_then(|text| {
            nvidia_listing(&text)
                .into_iter()
                .find(|d| d.char && (d.name == "nvidia" || d.name == "nvidia-frontend"))
        })
        .map_or(NVIDIA_MAJOR, |d| d.major);
    let mut devs: Vec<u32> = gpus
        .iter()
        .filter_map(|g| g.minor)
        .map(|m| mkdev(major, m))
        .collect();
    devs.extend(&extra.devs);
    GpuDevices {
        majors: Vec::new(),
        devs,
    }
}

/// The major of `/dev/nvidiaN`, when /proc/devices does not list the driver.
const NVIDIA_MAJOR: u32 = 195;

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn slurm_numbers_are_device_files_and_come_first() {
        let vars = [("CUDA_VISIBLE_DEVICES", "0,1"), ("SLURM_JOB_GPUS", "2,3")];
        assert_eq!(
            from_environment(env(&vars)),
            Ok((
                "SLURM_JOB_GPUS",
                Some(vec![GpuRef::Minor(2), GpuRef::Minor(3)])
            ))
        );
    }

    #[test]
    fn visible_devices_take_indices_uuids_and_all() {
        let uuid = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6";
        let vars = [("NVIDIA_VISIBLE_DEVICES", uuid)];
        assert_eq!(
            from_environment(env(&vars)),
            Ok((
                "NVIDIA_VISIBLE_DEVICES",
                Some(vec![GpuRef::Uuid(uuid.into())])
            ))
        );
        let all = [("NVIDIA_VISIBLE_DEVICES", "all")];
        assert_eq!(
            from_environment(env(&all)),
            Ok(("NVIDIA_VISIBLE_DEVICES", None))
        );
        let cuda = [("CUDA_VISIBLE_DEVICES", "1, GPU-ab")];
        assert_eq!(
            from_environment(env(&cuda)),
            Ok((
                "CUDA_VISIBLE_DEVICES",
                Some(vec![GpuRef::Index(1), GpuRef::Uuid("GPU-ab".into())])
            ))
        );
    }

    #[test]
    fn no_gpu_or_garbage_is_an_error_not_every_gpu() {
        for vars in [
            &[][..],
            &[("NVIDIA_VISIBLE_DEVICES", "void")],
            &[("CUDA_VISIBLE_DEVICES", "")],
            &[("CUDA_VISIBLE_DEVICES", "-1")],
            &[("CUDA_VISIBLE_DEVICES", "0,../etc")],
        ] {
            assert!(from_environment(env(vars)).is_err(), "{vars:?}");
        }
    }

    #[test]
    fn numbered_device_files_count_only_for_the_gpus_named_by_number() {
        let files = [
            (PathBuf::from("/run/gres/gpu0"), 7),
            (PathBuf::from("/run/gres/gpu1"), 5),
            (PathBuf::from("/dev/nvidiactl"), 9),
        ];
        assert_eq!(file_number(Path::new("/dev/nvidia12")), Some(12));
        assert_eq!(file_number(Path::new("/dev/nvidiactl")), None);
        assert_eq!(
            named_files(&[GpuRef::Minor(1)], &files),
            (vec![5, 9], vec![1])
        );
        // Named otherwise (index, UUID): every file counts, as it always did.
        assert_eq!(named_files(&[GpuRef::Index(1)], &files).0, vec![7, 5, 9]);
    }

    #[test]
    fn uuids_resolve_by_unique_prefix_and_minors_by_number() {
        let known = [
            Identity {
                index: 0,
                uuid: Some("GPU-aa11".into()),
                minor: Some(3),
            },
            Identity {
                index: 1,
                uuid: Some("GPU-aa22".into()),
                minor: Some(0),
            },
        ];
        let (found, missing) = resolve(
            &[
                GpuRef::Uuid("gpu-AA22".into()),
                GpuRef::Minor(3),
                GpuRef::Uuid("GPU-aa".into()),
                GpuRef::Index(7),
            ],
            &known,
        );
        assert_eq!(
            found.iter().map(|g| g.index).collect::<Vec<_>>(),
            vec![1, 0]
        );
        assert_eq!(missing.len(), 2, "{missing:?}");
        assert!(missing[0].contains("more than one"));
    }

    #[test]
    fn the_drivers_list_is_read_in_bus_order() {
        let dir = std::env::temp_dir().join(format!("linger-gpus-{}", std::process::id()));
        for (bus, uuid, minor) in [("0000:c1:00.0", "GPU-c1", 1), ("0000:41:00.0", "GPU-41", 0)] {
            fs::create_dir_all(dir.join(bus)).expect("dir");
            fs::write(
                dir.join(bus).join("information"),
                format!("Model: \t\t H200\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\n"),
            )
            .expect("information");
        }
        let ids = driver_identities(&dir);
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(
            ids,
            vec![
                Identity {
                    index: 0,
                    uuid: Some("GPU-41".into()),
                    minor: Some(0)
                },
                Identity {
                    index: 1,
                    uuid: Some("GPU-c1".into()),
                    minor: Some(1)
                },
            ]
        );
    }
}
