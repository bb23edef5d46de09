//! The processes a gate is about: the pids it was given and their children, a process
//! group, and every process that ran in a cgroup, a Slurm job or a pod. A process once found
//! in the scope stays in it (a worker that calls setsid or moves out of the job's cgroup is
//! still the job's); a pid reused by another process is not (pid and start time together
//! name a process).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs,
    path::Path,
};

use crate::source::{procfs::ProcStat, workload};

/// What the command line put in the scope.
#[derive(Clone, Debug, Default)]
pub struct Selectors {
    pub pids: Vec<u32>,
    pub pgids: Vec<u32>,
    /// Cgroup paths as `/proc/PID/cgroup` shows them.
    pub cgroups: Vec<String>,
    pub jobs: Vec<u64>,
    /// Pod UIDs, with dashes.
    pub pods: Vec<String>,
}

impl Selectors {
    pub fn is_empty(&self) -> bool {
        self.pids.is_empty()
            && self.pgids.is_empty()
            && self.cgroups.is_empty()
            && self.jobs.is_empty()
            && self.pods.is_empty()
    }
}

/// A process of the scope, and why it is one.
#[derive(Clone, Debug)]
pub struct Member {
    pub pid: u32,
    pub start_ticks: u64,
    /// Named with `--pid`: it must be dead, not only rid of its GPU files.
    pub named: bool,
    pub why: String,
    /// Not yet seen dead: its children are followed.
    alive: bool,
}

#[derive(Debug, Default)]
pub struct Scope {
    sel: Selectors,
    members: HashMap<(u32, u64), Member>,
    /// Processes looked at and found outside the scope: not read again.
    outside: HashSet<(u32, u64)>,
    /// Named pids that were gone before the gate first looked: nothing says what they held.
    pub unseen: Vec<u32>,
    looked: bool,
}

impl Scope {
    pub fn new(sel: Selectors) -> Self {
        Self {
            sel,
            ..Self::default()
        }
    }

    pub fn selectors(&self) -> &Selectors {
        &self.sel
    }

    /// Takes in every process now (`procs`: /proc's, by pid).
    pub fn look(&mut self, procs: &BTreeMap<u32, ProcStat>) {
        if !self.looked {
            self.looked = true;
            for pid in self.sel.pids.clone() {
                // A zombie's files are already closed: what it held is as unknown as a
                // process gone.
                match procs.get(&pid).filter(|s| s.state != 'Z') {
                    Some(s) => self.add(pid, s.start_ticks, true, "named".into()),
                    None => self.unseen.push(pid),
                }
            }
        }
        // Parents start before their children: in that order, a child's parent is decided
        // before it is.
        let mut new: Vec<(&u32, &ProcStat)> = procs
            .iter()
            .filter(|(&pid, s)| {
                let id = (pid, s.start_ticks);
                !self.members.contains_key(&id) && !self.outside.contains(&id)
            })
            .collect();
        new.sort_by_key(|(pid, s)| (s.start_ticks, **pid));
        for (&pid, s) in new {
            match self.why(pid, s, procs) {
                Some(why) => self.add(pid, s.start_ticks, false, why),
                None => {
                    self.outside.insert((pid, s.start_ticks));
                }
            }
        }
    }

    /// Children of live members, from `/proc/PID/task/TID/children`: between two looks a
    /// worker forked and orphaned (its parent killed) is otherwise missed. A member found
    /// dead (or its pid another process's) is not followed again.
    pub fn follow_children(&mut self) {
        let mut found = Vec::new();
        for m in self.members.values_mut().filter(|m| m.alive) {
            match crate::source::procfs::stat(m.pid) {
                Some(s) if s.start_ticks == m.start_ticks && s.state != 'Z' => {
                    found.extend(children(m.pid).into_iter().map(|c| (m.pid, c)));
                }
                _ => m.alive = false,
            }
        }
        for (parent, child) in found {
            let Some(s) = crate::source::procfs::stat(child) else {
                continue;
            };
            let id = (child, s.start_ticks);
            if s.ppid == parent && !self.members.contains_key(&id) {
                self.outside.remove(&id);
                self.add(child, s.start_ticks, false, format!("child of {parent}"));
            }
        }
    }

    fn add(&mut self, pid: u32, start_ticks: u64, named: bool, why: String) {
        self.members.insert(
            (pid, start_ticks),
            Member {
                pid,
                start_ticks,
                named,
                why,
                alive: true,
            },
        );
    }

    /// The member `pid` is now, if it is one (the same process: its start time matches).
    pub fn member(&self, pid: u32, start_ticks: u64) -> Option<&Member> {
        self.members.get(&(pid, start_ticks))
    }

    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// Whether the gate has seen `pid` as a member at some point (it may be dead now).
    pub fn ever(&self, pid: u32) -> bool {
        self.members.values().any(|m| m.pid == pid) || self.sel.pids.contains(&pid)
    }

    /// Why a process not yet looked at is in the scope; None when it is not.
    fn why(&self, pid: u32, s: &ProcStat, procs: &BTreeMap<u32, ProcStat>) -> Option<String> {
        if self.sel.pgids.contains(&s.pgrp) {
            return Some(format!("in process group {}", s.pgrp));
        }
        if let Some(parent) = procs.get(&s.ppid) {
            if self.member(s.ppid, parent.start_ticks).is_some() {
                return Some(format!("child of {}", s.ppid));
            }
        }
        let by_cgroup =
            !(self.sel.cgroups.is_empty() && self.sel.jobs.is_empty() && self.sel.pods.is_empty());
        if by_cgroup {
            let content = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if let Some(why) = self.in_cgroup(&content) {
                return Some(why);
            }
        }
        if !self.sel.jobs.is_empty() {
            let environ = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if let Some(job) = slurm_job_of(&environ).filter(|j| self.sel.jobs.contains(j)) {
                return Some(format!(
                    "ran for Slurm job {job} (SLURM_JOB_ID in its environment)"
                ));
            }
        }
        None
    }

    /// Why `/proc/PID/cgroup`'s `content` puts a process in the scope.
    fn in_cgroup(&self, content: &str) -> Option<String> {
        for path in content.lines().filter_map(|l| l.splitn(3, ':').nth(2)) {
            if let Some(c) = self.sel.cgroups.iter().find(|c| under(path, c)) {
                return Some(format!("in cgroup {c}"));
            }
            let Some(w) = workload::from_cgroup(path) else {
                continue;
            };
            if let Some(job) = w.slurm_job.filter(|j| self.sel.jobs.contains(j)) {
                return Some(format!("in Slurm job {job}'s cgroup"));
            }
            if let Some(pod) = w.pod_uid.filter(|p| self.sel.pods.contains(p)) {
                return Some(format!("in pod {pod}"));
            }
        }
        None
    }
}

/// Whether cgroup `path` is `top` or below it.
fn under(path: &str, top: &str) -> bool {
    let top = top.trim_end_matches('/');
    top.is_empty() || path == top || path.strip_prefix(top).is_some_and(|r| r.starts_with('/'))
}

/// The Slurm job an environment (`/proc/PID/environ`) says a process ran for.
fn slurm_job_of(environ: &[u8]) -> Option<u64> {
    environ.split(|&b| b == 0).find_map(|var| {
        let value = var
            .strip_prefix(b"SLURM_JOB_ID=")
            .or_else(|| var.strip_prefix(b"SLURM_JOBID="))?;
        std::str::from_utf8(value).ok()?.parse().ok()
    })
}

fn children(pid: u32) -> Vec<u32> {
    let tasks = Path::new("/proc").join(pid.to_string()).join("task");
    fs::read_dir(tasks)
        .into_iter()
        .flatten()
        .flatten()
        .map(|t| fs::read_to_string(t.path().join("children")).unwrap_or_default())
        .collect::<Vec<String>>()
        .iter()
        .flat_map(|c| c.split_whitespace())
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// A cgroup named on the command line as `/proc/PID/cgroup` shows it: a path under a cgroup
/// file system's mount point (`/sys/fs/cgroup/...`) becomes the path within the hierarchy.
pub fn cgroup_path(arg: &str, mountinfo: &str) -> String {
    for line in mountinfo.lines() {
        let Some((mount, fs)) = line.split_once(" - ") else {
            continue;
        };
        if !(fs.starts_with("cgroup ") || fs.starts_with("cgroup2 ")) {
            continue;
        }
        let fields: Vec<&str> = mount.split(' ').collect();
        let (Some(root), Some(point)) = (fields.get(3), fields.get(4)) else {
            continue;
        };
        if let Some(rest) = arg
            .strip_prefix(point)
            .filter(|r| r.is_empty() || r.starts_with('/'))
        {
            let joined = format!("{}{rest}", root.trim_end_matches('/'));
            return if joined.is_empty() {
                "/".into()
            } else {
                joined
            };
        }
    }
    arg.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(ppid: u32, pgrp: u32, start_ticks: u64) -> ProcStat {
        ProcStat {
            comm: "x".into(),
            state: 'S',
            ppid,
            pgrp,
            session: pgrp,
            start_ticks,
            exiting: false,
        }
    }

    #[test]
    fn children_and_their_children_join_and_a_reused_pid_does_not() {
        let mut scope = Scope::new(Selectors {
            pids: vec![10, 99],
            ..Selectors::default()
        });
        // 10 named; 12 its child; 13 the child's (listed before its parent by pid only);
        // 11 unrelated; 99 gone already.
        let procs = BTreeMap::from([
            (10, stat(1, 10, 100)),
            (11, stat(1, 11, 50)),
            (13, stat(12, 13, 120)),
            (12, stat(10, 10, 110)),
        ]);
        scope.look(&procs);
        let mut ids: Vec<(u32, &str)> = scope.members().map(|m| (m.pid, m.why.as_str())).collect();
        ids.sort();
        assert_eq!(
            ids,
            vec![(10, "named"), (12, "child of 10"), (13, "child of 12")]
        );
        assert_eq!(scope.unseen, vec![99]);
        // 10 dies; its pid goes to an unrelated process: not the named one.
        let later = BTreeMap::from([(10, stat(1, 10, 900)), (13, stat(1, 13, 120))]);
        scope.look(&later);
        assert!(scope.member(10, 900).is_none());
        assert!(
            scope.member(13, 120).is_some(),
            "reparented, still the scope's"
        );
    }

    #[test]
    fn a_live_members_new_child_joins_between_looks() {
        let me = std::process::id();
        let mut scope = Scope::new(Selectors {
            pids: vec![me],
            ..Selectors::default()
        });
        let own = crate::source::procfs::stat(me).expect("own stat");
        scope.look(&BTreeMap::from([(me, own)]));
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .expect("sleep");
        scope.follow_children();
        let started = crate::source::procfs::stat(child.id()).map(|s| s.start_ticks);
        let joined = started.and_then(|t| scope.member(child.id(), t).map(|m| m.why.clone()));
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(joined, Some(format!("child of {me}")));
    }

    #[test]
    fn process_groups_join() {
        let mut scope = Scope::new(Selectors {
            pgids: vec![40],
            ..Selectors::default()
        });
        scope.look(&BTreeMap::from([
            (41, stat(1, 40, 5)),
            (42, stat(1, 42, 5)),
        ]));
        let pids: Vec<u32> = scope.members().map(|m| m.pid).collect();
        assert_eq!(pids, vec![41]);
    }

    #[test]
    fn cgroups_jobs_and_pods_match_any_hierarchy() {
        let scope = Scope::new(Selectors {
            cgroups: vec!["/slurm/uid_0/job_7".into()],
            jobs: vec![12],
            pods: vec!["0d1e2f3a-1111-2222-3333-444455556666".into()],
            ..Selectors::default()
        });
        let v1 = "4:memory:/slurm/uid_0/job_7/step_0\n0::/\n";
        assert_eq!(
            scope.in_cgroup(v1).as_deref(),
            Some("in cgroup /slurm/uid_0/job_7")
        );
        assert!(scope.in_cgroup("0::/slurm/uid_0/job_70/step_0\n").is_none());
        assert_eq!(
            scope
                .in_cgroup("0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0\n")
                .as_deref(),
            Some("in Slurm job 12's cgroup")
        );
        let pod = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0d1e2f3a_1111_2222_3333_444455556666.slice/cri-containerd-ab.scope\n";
        assert!(scope
            .in_cgroup(pod)
            .is_some_and(|w| w.starts_with("in pod")));
    }

    #[test]
    fn the_job_in_an_environment() {
        assert_eq!(slurm_job_of(b"A=1\0SLURM_JOB_ID=42\0B=2\0"), Some(42));
        assert_eq!(slurm_job_of(b"SLURM_JOBID=7\0"), Some(7));
        assert_eq!(slurm_job_of(b"SLURM_JOB_ID=x\xff\0"), None);
        assert_eq!(slurm_job_of(b""), None);
    }

    #[test]
    fn mount_points_become_hierarchy_paths() {
        let mountinfo = "30 25 0:26 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n\
                         31 25 0:27 /kubepods /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup_path("/sys/fs/cgroup/freezer/slurm/job_3", mountinfo),
            "/slurm/job_3"
        );
        assert_eq!(
            cgroup_path("/sys/fs/cgroup/unified/pod1", mountinfo),
            "/kubepods/pod1"
        );
        assert_eq!(cgroup_path("/slurm/job_3", mountinfo), "/slurm/job_3");
        assert!(under("/a/b", "/a") && !under("/ab", "/a") && under("/a", "/a/"));
    }
}
