//! Who a process ran for: the Kubernetes pod and container, or the Slurm job, named by its
//! cgroup path, with the pod's namespace and name and the container's name from the kubelet's
//! log directories (`/var/log/pods/<namespace>_<pod>_<uid>/<container>/`, and
//! `/var/log/containers/<pod>_<namespace>_<container>-<id>.log`). No kubelet API is asked.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::event::Workload;

/// The directory holding the kubelet's `pods/` and `containers/` log directories.
pub const KUBELET_LOGS: &str = "/var/log";

/// Container runtimes as their cgroup scopes name them (systemd driver), or as the cgroupfs
/// driver's parents name them.
const RUNTIMES: [(&str, &str); 4] = [
    ("cri-containerd-", "containerd"),
    ("crio-", "cri-o"),
    ("docker-", "docker"),
    ("containerd-", "containerd"),
];

/// The cgroup path of `/proc/PID/cgroup`'s content that says most about the workload: the
/// first (v2's unified line first, then the v1 hierarchies) that names a pod, a container or
/// a job; else the unified one, else the first.
pub fn pick_cgroup(content: &str) -> String {
    let paths: Vec<(&str, &str)> = content
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((controllers, path))
        })
        .collect();
    let unified = paths.iter().find(|(c, _)| c.is_empty()).map(|(_, p)| *p);
    let ordered = unified
        .into_iter()
        .chain(paths.iter().filter(|(c, _)| !c.is_empty()).map(|(_, p)| *p));
    let mut first_non_root = None;
    for path in ordered {
        if from_cgroup(path).is_some() {
            return path.to_string();
        }
        if path != "/" && first_non_root.is_none() {
            first_non_root = Some(path);
        }
    }
    first_non_root
        .or(unified)
        .or(paths.first().map(|(_, p)| *p))
        .unwrap_or_default()
        .to_string()
}

/// What the cgroup path alone says: pod UID, container ID and runtime, Slurm job.
pub fn from_cgroup(path: &str) -> Option<Workload> {
    let mut w = Workload::default();
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let in_kubepods = parts.first().is_some_and(|p| p.starts_with("kubepods"));
    for (i, part) in parts.iter().enumerate() {
        if let Some(uid) = pod_uid(part) {
            w.pod_uid = Some(uid);
        } else if let Some(job) = part.strip_prefix("job_") {
            w.slurm_job = job.parse().ok();
        } else if let Some((id, runtime)) = container(part) {
            w.container_id = Some(id);
            w.runtime = runtime.map(String::from);
        } else if in_kubepods && i == parts.len() - 1 && w.pod_uid.is_some() && is_id(part) {
            // The cgroupfs driver names the container's cgroup by its bare ID.
            w.container_id = Some(part.to_string());
        }
    }
    (w.pod_uid.is_some() || w.container_id.is_some() || w.slurm_job.is_some()).then_some(w)
}

/// The Slurm job of a process whose cgroup does not say (Slurm without its cgroup plugins):
/// `SLURM_JOB_ID` in the environment it was started with (`/proc/PID/environ`, NUL-separated).
/// Nothing else of the environment is kept.
pub fn slurm_job_from_environ(environ: &[u8]) -> Option<u64> {
    environ
        .split(|&b| b == 0)
        .find_map(|var| var.strip_prefix(b"SLURM_JOB_ID="))
        .and_then(|id| std::str::from_utf8(id).ok()?.parse().ok())
}

/// `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid with _>.slice` (systemd).
fn pod_uid(part: &str) -> Option<String> {
    let name = part.strip_suffix(".slice").unwrap_or(part);
    let at = name.rfind("pod")?;
    let before = &name[..at];
    if !(before.is_empty() || before.ends_with('-')) {
        return None;
    }
    let uid = name[at + 3..].replace('_', "-");
    let ok = uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    ok.then_some(uid)
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`, or `docker/<id>`'s id.
fn container(part: &str) -> Option<(String, Option<&'static str>)> {
    let name = part.strip_suffix(".scope").unwrap_or(part);
    RUNTIMES.iter().find_map(|(prefix, runtime)| {
        let id = name.strip_prefix(prefix)?;
        is_id(id).then(|| (id.to_string(), Some(*runtime)))
    })
}

fn is_id(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// Resolves pod and container names from the kubelet's log directories under `root`.
#[derive(Clone, Debug)]
pub struct Names {
    root: PathBuf,
}

impl Default for Names {
    fn default() -> Self {
        Self::new(Path::new(KUBELET_LOGS))
    }
}

impl Names {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    /// The workload of a process in `cgroup`, with every name the node shows.
    pub fn workload(&self, cgroup: &str) -> Option<Workload> {
        let mut w = from_cgroup(cgroup)?;
        if let Some(uid) = w.pod_uid.clone() {
            self.name_pod(&mut w, &uid);
        }
        Some(w)
    }

    fn name_pod(&self, w: &mut Workload, uid: &str) {
        let Ok(pods) = fs::read_dir(self.root.join("pods")) else {
            return;
        };
        let suffix = format!("_{uid}");
        let Some(dir) = pods
            .flatten()
            .find(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(&suffix)))
        else {
            return;
        };
        let name = dir.file_name().to_string_lossy().into_owned();
        // Namespaces and pod names are DNS names: no '_' inside them.
        let mut parts = name.splitn(3, '_');
        let (Some(namespace), Some(pod)) = (parts.next(), parts.next()) else {
            return;
        };
        w.namespace = Some(namespace.to_string());
        w.pod = Some(pod.to_string());
        w.container = w
            .container_id
            .as_deref()
            .and_then(|id| self.container_name(pod, namespace, id))
            .or_else(|| only_child(&dir.path()));
    }

    /// From `containers/<pod>_<namespace>_<container>-<id>.log`.
    fn container_name(&self, pod: &str, namespace: &str, id: &str) -> Option<String> {
        let prefix = format!("{pod}_{namespace}_");
        let suffix = format!("-{id}.log");
        fs::read_dir(self.root.join("containers"))
            .ok()?
            .flatten()
            .find_map(|e| {
                let name = e.file_name().to_str()?.to_string();
                let container = name.strip_prefix(&prefix)?.strip_suffix(&suffix)?;
                Some(container.to_string())
            })
    }
}

/// The pod directory's one container directory, when it has exactly one.
fn only_child(dir: &Path) -> Option<String> {
    let mut names = fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(String::from));
    let first = names.next()?;
    names.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f2a6c3e-5b1d-4c7a-9e8f-1a2b3c4d5e6f";
    const CID: &str = "4f5e6d7c8b9a0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899a";

    #[test]
    fn systemd_driver_paths_name_pod_and_container() {
        let uid = UID.replace('-', "_");
        for (scope, runtime) in [
            (format!("cri-containerd-{CID}.scope"), "containerd"),
            (format!("crio-{CID}.scope"), "cri-o"),
            (format!("docker-{CID}.scope"), "docker"),
        ] {
            let path = format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/{scope}"
            );
            let w = from_cgroup(&path).expect("a workload");
            assert_eq!(w.pod_uid.as_deref(), Some(UID), "{path}");
            assert_eq!(w.container_id.as_deref(), Some(CID), "{path}");
            assert_eq!(w.runtime.as_deref(), Some(runtime), "{path}");
        }
        let guaranteed = format!("/kubepods.slice/kubepods-pod{uid}.slice/crio-{CID}.scope");
        let w = from_cgroup(&guaranteed).expect("a workload");
        assert_eq!(w.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn cgroupfs_driver_paths_name_pod_and_container() {
        let w = from_cgroup(&format!("/kubepods/besteffort/pod{UID}/{CID}")).expect("a workload");
        assert_eq!(w.pod_uid.as_deref(), Some(UID));
        assert_eq!(w.container_id.as_deref(), Some(CID));
        assert_eq!(w.runtime, None);
    }

    #[test]
    fn slurm_jobs_and_plain_docker() {
        let w = from_cgroup("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0")
            .expect("a job");
        assert_eq!(w.slurm_job, Some(4242));
        let v1 = from_cgroup("/slurm/uid_1000/job_17/step_batch").expect("a job");
        assert_eq!(v1.slurm_job, Some(17));
        let d = from_cgroup(&format!("/system.slice/docker-{CID}.scope")).expect("a container");
        assert_eq!(d.container_id.as_deref(), Some(CID));
        assert_eq!(d.pod_uid, None);
    }

    #[test]
    fn a_jobs_environment_names_it_and_nothing_else_does() {
        let env = b"PATH=/bin\0SLURM_JOB_ID=4243\0SLURM_JOB_ID_X=1\0";
        assert_eq!(slurm_job_from_environ(env), Some(4243));
        assert_eq!(slurm_job_from_environ(b"SLURM_JOB_IDX=7\0HOME=/"), None);
        assert_eq!(slurm_job_from_environ(b"SLURM_JOB_ID=abc\0"), None);
        assert_eq!(slurm_job_from_environ(b""), None);
    }

    #[test]
    fn paths_of_nobody_in_particular_name_nothing() {
        for path in [
            "/",
            "/user.slice/user-1000.slice/session-2.scope",
            "/system.slice/sshd.service",
            "/kubepods/burstable/podnot-a-uid/abc",
            "/process_api/3205c962252365c364842bd917f7aa92",
        ] {
            assert_eq!(from_cgroup(path), None, "{path}");
        }
    }

    #[test]
    fn the_hierarchy_that_names_the_workload_wins() {
        let v1 = format!("9:name=systemd:/\n4:memory:/kubepods/pod{UID}/{CID}\n0::/\n");
        assert_eq!(pick_cgroup(&v1), format!("/kubepods/pod{UID}/{CID}"));
        assert_eq!(
            pick_cgroup("0::/system.slice/x.service\n"),
            "/system.slice/x.service"
        );
        let plain = "9:name=systemd:/\n4:memory:/process_api/3205\n0::/\n";
        assert_eq!(pick_cgroup(plain), "/process_api/3205");
        assert_eq!(pick_cgroup("0::/\n"), "/");
    }
}
