//! Who holds which GPU file, kept up to date from the event stream.
//!
//! An open GPU file is identified by the kernel address of its `struct file`, which every
//! descriptor of that open shares, in whichever process. Descriptors held before tracing began
//! come from a /proc snapshot, grouped by kcmp, and get the kernel address as soon as a kernel
//! record names one of them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use tracer_common::FD_WALK_MAX;

pub use super::holding::{FileId, HeldFile, Holder, How};
use super::id_map::IdMap;
use crate::event::{DriverFunc, Event, EventData, FdOp, ProcInfo};

/// Snapshot group ids live below this; kernel addresses are far above.
const SNAPSHOT_ID_LIMIT: u64 = 1 << 32;

#[derive(Clone, Debug)]
pub struct Fd {
    pub file: FileId,
    pub dev: u32,
    pub cloexec: bool,
    pub how: How,
}

#[derive(Clone, Debug, Default)]
pub struct Process {
    pub comm: String,
    pub ppid: u32,
    pub info: Option<ProcInfo>,
    pub fds: BTreeMap<i32, Fd>,
    /// When it first opened a GPU device itself, as seen.
    pub first_open_ns: Option<u64>,
}

#[derive(Default)]
pub struct Holders {
    procs: IdMap<u32, Process>,
    /// Descriptors listed by the exit walk, waiting for the group-dead record.
    dying: IdMap<u32, Vec<HeldFile>>,
    /// When each of those walks began: the moment its references were counted.
    walked_at: IdMap<u32, u64>,
    /// Descriptors an exec is thought to have kept (no close-on-exec known) that its walk has
    /// not confirmed yet: held meanwhile, dropped when the walk is over without them.
    exec_pending: IdMap<u32, BTreeSet<i32>>,
    /// Descriptors an exec is thought to have closed (close-on-exec as last seen), kept until
    /// the walk is over: a flag cleared with F_SETFD (not traced) shows in the walk, and the
    /// descriptor keeps how it was got.
    exec_closed: IdMap<u32, BTreeMap<i32, Fd>>,
    /// The CPU each pending exec walk runs on: the kernel lists it in the same program run as
    /// the exec record, so any other task's record from that CPU comes after the walk.
    exec_cpu: IdMap<u32, u32>,
    /// Devices named with `--gpu-device`.
    declared: Vec<u32>,
    /// Groups that died lately, by when (oldest first), until their pid is forked again: a
    /// search walk that caught one on its way out (after its exit record, before its files
    /// were closed) would bring back a process holding files whose addresses new opens reuse.
    dead: VecDeque<(u64, u32)>,
    dead_pids: IdMap<u32, u64>,
    /// The stream's time: the latest event's.
    now_ns: u64,
    /// Snapshot groups found to be files linger knows, while their snapshot lasts (group ids
    /// are never reused; the next event that is not part of a snapshot ends it).
    snapshot_files: BTreeMap<u64, FileId>,
    /// Processes /proc would not list the descriptors of, until they die: holders, maybe.
    unreadable: BTreeSet<u32>,
}

/// How long a dead group's pid is remembered: a walk of it comes within microseconds.
const DEAD_FOR_NS: u64 = 10_000_000_000;

impl Holders {
    pub fn on_event(&mut self, e: &Event) {
        self.now_ns = self.now_ns.max(e.ts_ns);
        if !matches!(
            e.data,
            EventData::SnapshotFd { .. } | EventData::ProcInfo(_)
        ) {
            self.snapshot_files.clear();
        }
        self.end_exec_walk(e);
        match &e.data {
            EventData::FdsUnreadable { holder } => {
                self.unreadable.insert(*holder);
            }
            EventData::Fork {
                child_pid,
                files_shared,
                comm,
            } => {
                // A new process under the pid.
                self.dead_pids.remove(child_pid);
                // A copied table holds the same files; a shared one (CLONE_FILES) too, and
                // both then change together, which this approximates by copying.
                let fds = self
                    .procs
                    .get(&e.pid)
                    .map(|p| p.fds.clone())
                    .unwrap_or_default();
                let (from, t_ns) = (e.pid, e.ts_ns);
                let how = if *files_shared {
                    How::SharedTable { from, t_ns }
                } else {
                    How::Fork { from, t_ns }
                };
                let fds = fds
                    .into_iter()
                    .map(|(n, fd)| (n, Fd { how, ..fd }))
                    .collect();
                self.procs.insert(
                    *child_pid,
                    Process {
                        comm: comm.clone(),
                        ppid: e.pid,
                        info: None,
                        fds,
                        first_open_ns: None,
                    },
                );
            }
            EventData::Exec { comm } => {
                // The kernel lists what survived exec right after this record (HeldAtExec).
                // Until it has, the descriptors without a known close-on-exec flag still count
                // (a parent may die in between); the flags may be stale (F_SETFD is not
                // traced), which the walk corrects.
                let p = self.procs.entry(e.pid).or_default();
                p.comm = comm.clone();
                let (closed, kept): (BTreeMap<i32, Fd>, BTreeMap<i32, Fd>) =
                    std::mem::take(&mut p.fds)
                        .into_iter()
                        .partition(|(_, fd)| fd.cloexec);
                p.fds = kept;
                let kept: BTreeSet<i32> = p.fds.keys().copied().collect();
                if !kept.is_empty() || !closed.is_empty() {
                    self.exec_cpu.insert(e.pid, e.cpu);
                }
                if !kept.is_empty() {
                    self.exec_pending.insert(e.pid, kept);
                }
                if !closed.is_empty() {
                    self.exec_closed.insert(e.pid, closed);
                }
            }
            EventData::GpuFd { .. } => self.gpu_fd(e),
            EventData::GpuCloseRange { first, last, flags } => {
                const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;
                if let Some(p) = self.procs.get_mut(&e.pid) {
                    let range = (*first as i64)..=(*last as i64);
                    for (n, fd) in p.fds.iter_mut() {
                        if range.contains(&(*n as i64)) && flags & CLOSE_RANGE_CLOEXEC != 0 {
                            fd.cloexec = true;
                        }
                    }
                    if flags & CLOSE_RANGE_CLOEXEC == 0 {
                        p.fds.retain(|n, _| !range.contains(&(*n as i64)));
                    }
                }
            }
            EventData::SnapshotFd {
                holder,
                fd,
                dev,
                cloexec,
                group,
            } => self.snapshot_fd(*holder, *fd, *dev, *cloexec, *group),
            EventData::DriverCall {
                func: DriverFunc::Fput,
                exit: false,
                file,
                ..
            } if *file != 0 => {
                // The last reference is gone: nobody holds the file any more (what closes
                // were not traced leave behind).
                for p in self.procs.values_mut() {
                    p.fds.retain(|_, f| f.file != *file);
                }
            }
            EventData::GpuDevices { devs, .. } => self.declared = devs.clone(),
            EventData::ProcInfo(info) => {
                let p = self.procs.entry(info.pid).or_default();
                p.comm = info.comm.clone();
                // The fork record's parent is the truth; /proc may be read after the parent
                // died and say 1.
                if p.ppid == 0 {
                    p.ppid = info.ppid;
                }
                p.info = Some(info.clone());
            }
            _ => {}
        }
    }

    /// A descriptor a /proc snapshot lists (at start, or of a process NVML lists for the first
    /// time). One linger already follows keeps its file's address and how it was got: the
    /// snapshot knows the file only by its group, and its other descriptors in the group
    /// (in any process) are that file too. Replacing a known address by the group would make
    /// the holder hold none of the files a dying child's walk names.
    fn snapshot_fd(&mut self, holder: u32, fd: i32, dev: u32, cloexec: bool, group: u64) {
        let known = self
            .procs
            .get(&holder)
            .and_then(|p| p.fds.get(&fd))
            .filter(|f| f.dev == dev && f.file >= SNAPSHOT_ID_LIMIT)
            .cloned();
        if let Some(known) = known {
            self.snapshot_files.insert(group, known.file);
            self.replace_file(group, known.file);
            return;
        }
        let file = self.snapshot_files.get(&group).copied().unwrap_or(group);
        self.procs.entry(holder).or_default().fds.insert(
            fd,
            Fd {
                file,
                dev,
                cloexec,
                how: How::Snapshot,
            },
        );
    }

    /// A GPU descriptor opened, dup'ed, closed or listed by a walk.
    fn gpu_fd(&mut self, e: &Event) {
        let EventData::GpuFd {
            op,
            fd,
            dev,
            cloexec,
            truncated,
            file,
            refcount,
        } = &e.data
        else {
            return;
        };
        if *op == FdOp::HeldAtSearch && self.dead_pids.contains_key(&e.pid) {
            return;
        }
        if *truncated {
            self.walk_stopped(e.pid, *op);
            return;
        }
        if *fd < 0 {
            // The driver's open hook: the descriptor is not installed yet.
            self.opened_by_driver(e, *file, *dev);
            return;
        }
        let file = self.learn(e.pid, *fd, *file);
        let how = match op {
            FdOp::Open => How::Open { t_ns: e.ts_ns },
            FdOp::Dup => How::Dup { t_ns: e.ts_ns },
            _ => How::Seen { t_ns: e.ts_ns },
        };
        match op {
            FdOp::Open | FdOp::Dup | FdOp::HeldAtExec | FdOp::HeldAtSearch => {
                if *op == FdOp::HeldAtExec {
                    if let Some(pending) = self.exec_pending.get_mut(&e.pid) {
                        pending.remove(fd);
                    }
                }
                let closed = self.exec_closed.get(&e.pid).and_then(|c| c.get(fd));
                let p = self.procs.entry(e.pid).or_default();
                if *op == FdOp::Open {
                    p.first_open_ns.get_or_insert(e.ts_ns);
                }
                let keep = p
                    .fds
                    .get(fd)
                    .or(closed)
                    .filter(|old| old.file == file)
                    .map(|old| old.how);
                // A walk names the descriptor a driver-seen open got.
                let unnumbered = p
                    .fds
                    .iter()
                    .find(|(n, f)| **n < 0 && f.file == file)
                    .map(|(n, f)| (*n, f.how));
                let keep = keep.or(unnumbered.map(|(_, how)| how));
                if let Some((n, _)) = unnumbered {
                    p.fds.remove(&n);
                }
                p.fds.insert(
                    *fd,
                    Fd {
                        file,
                        dev: *dev,
                        cloexec: *cloexec,
                        how: keep.unwrap_or(how),
                    },
                );
            }
            FdOp::Close => {
                if let Some(p) = self.procs.get_mut(&e.pid) {
                    p.fds.remove(fd);
                }
            }
            FdOp::HeldAtExit => {
                self.walked_at.entry(e.pid).or_insert(e.ts_ns);
                self.dying.entry(e.pid).or_default().push(HeldFile {
                    fd: *fd,
                    file,
                    dev: *dev,
                    refcount: *refcount,
                })
            }
        }
    }

    /// When `pid`'s exit walk counted its files' references (before its group-dead record,
    /// which other CPUs' records can come between).
    pub fn walked_at(&self, pid: u32) -> Option<u64> {
        self.walked_at.get(&pid).copied()
    }

    /// The group of `pid` died: returns what it held (from the exit walk, else from the table)
    /// and forgets the process.
    pub fn group_died(&mut self, pid: u32) -> Vec<HeldFile> {
        self.remember_dead(pid);
        self.unreadable.remove(&pid);
        self.exec_pending.remove(&pid);
        self.exec_closed.remove(&pid);
        self.exec_cpu.remove(&pid);
        let proc = self.procs.remove(&pid);
        self.walked_at.remove(&pid);
        match self.dying.remove(&pid) {
            Some(walk) => walk,
            None => proc
                .map(|p| {
                    p.fds
                        .into_iter()
                        .map(|(fd, f)| HeldFile {
                            fd,
                            file: f.file,
                            dev: f.dev,
                            refcount: 0,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    fn remember_dead(&mut self, pid: u32) {
        let now = self.now_ns;
        while let Some(&(t, old)) = self.dead.front() {
            if now.saturating_sub(t) < DEAD_FOR_NS {
                break;
            }
            self.dead.pop_front();
            if self.dead_pids.get(&old) == Some(&t) {
                self.dead_pids.remove(&old);
            }
        }
        self.dead.push_back((now, pid));
        self.dead_pids.insert(pid, now);
    }

    /// A walk of `pid`'s table ended at `FD_WALK_MAX` (a loss the kernel counts): what was
    /// known of the descriptors above stays, where an exec walk would drop what it did not
    /// list, and an exit walk would list only what it saw.
    fn walk_stopped(&mut self, pid: u32, op: FdOp) {
        let above = |fd: &i32| *fd >= FD_WALK_MAX as i32;
        match op {
            FdOp::HeldAtExec => {
                if let Some(pending) = self.exec_pending.get_mut(&pid) {
                    pending.retain(|fd| !above(fd));
                }
            }
            FdOp::HeldAtExit => {
                let Some(p) = self.procs.get(&pid) else {
                    return;
                };
                let unseen = p
                    .fds
                    .iter()
                    .filter(|(fd, _)| above(fd))
                    .map(|(&fd, f)| HeldFile {
                        fd,
                        file: f.file,
                        dev: f.dev,
                        refcount: 0,
                    });
                self.dying.entry(pid).or_default().extend(unseen);
            }
            _ => {}
        }
    }

    /// An open seen by the driver's hook, before its descriptor exists: held under a number
    /// below -1 (one per open) until a walk of the table names the real one.
    fn opened_by_driver(&mut self, e: &Event, file: FileId, dev: u32) {
        let p = self.procs.entry(e.pid).or_default();
        p.first_open_ns.get_or_insert(e.ts_ns);
        let key = p.fds.keys().next().map_or(-2, |&n| n.min(-1) - 1);
        p.fds.insert(
            key,
            Fd {
                file,
                dev,
                cloexec: false,
                how: How::Open { t_ns: e.ts_ns },
            },
        );
    }

    /// The first record of a process after its exec walk ends the walk, and so does the first
    /// record of another task from the CPU the walk ran on (a process may do nothing traced
    /// for long after its exec): what the walk did not list was closed on exec, or earlier
    /// by a close not traced.
    fn end_exec_walk(&mut self, e: &Event) {
        if e.pid != 0 && !matches!(e.data, EventData::ProcInfo(_)) {
            let done: Vec<u32> = self
                .exec_cpu
                .iter()
                .filter(|(pid, cpu)| **pid != e.pid && **cpu == e.cpu)
                .map(|(pid, _)| *pid)
                .collect();
            for pid in done {
                self.end_walk_of(pid);
            }
        }
        let walking = matches!(
            e.data,
            EventData::GpuFd {
                op: FdOp::HeldAtExec,
                ..
            } | EventData::ProcInfo(_)
                | EventData::Exec { .. }
        );
        if walking {
            return;
        }
        self.end_walk_of(e.pid);
    }

    fn end_walk_of(&mut self, pid: u32) {
        self.exec_closed.remove(&pid);
        self.exec_cpu.remove(&pid);
        if let (Some(pending), Some(p)) = (self.exec_pending.remove(&pid), self.procs.get_mut(&pid))
        {
            p.fds.retain(|fd, _| !pending.contains(fd));
        }
    }

    /// Whether a living process may hold GPU files unknown here (/proc would not list its
    /// descriptors).
    pub fn some_unreadable(&self) -> bool {
        !self.unreadable.is_empty()
    }

    pub fn holds_gpu_files(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| !p.fds.is_empty())
    }

    pub fn process(&self, pid: u32) -> Option<&Process> {
        self.procs.get(&pid)
    }

    /// Whether any process linger follows holds `file`.
    pub fn holds_file(&self, file: FileId) -> bool {
        self.procs
            .values()
            .any(|p| p.fds.values().any(|fd| fd.file == file))
    }

    /// Whether `pid` holds any of `files`.
    pub fn holds_any(&self, pid: u32, files: &[FileId]) -> bool {
        self.procs
            .get(&pid)
            .is_some_and(|p| p.fds.values().any(|fd| files.contains(&fd.file)))
    }

    pub fn holders_of(&self, files: &[FileId], except: u32) -> Vec<Holder> {
        let mut out: Vec<Holder> = self
            .procs
            .iter()
            .filter(|(&pid, _)| pid != except)
            .filter_map(|(&pid, p)| {
                let held: Vec<(&i32, &Fd)> = p
                    .fds
                    .iter()
                    .filter(|(_, fd)| files.contains(&fd.file))
                    .collect();
                let (_, first) = held.first()?;
                Some(Holder {
                    pid,
                    comm: p.comm.clone(),
                    ppid: p.ppid,
                    fds: held.iter().map(|(n, _)| **n).filter(|n| *n >= 0).collect(),
                    how: first.how,
                    t_released_ns: None,
                    t_dead_ns: None,
                    t_killed_ns: None,
                })
            })
            .collect();
        out.sort_by_key(|h| h.pid);
        out
    }

    /// Descriptors of `file` in tables other than `except`'s. A table shared with CLONE_FILES
    /// holds one reference per descriptor however many share it: its sharers count nothing.
    pub fn references_of(&self, file: FileId, except: u32) -> u64 {
        self.procs
            .iter()
            .filter(|(&pid, _)| pid != except)
            .flat_map(|(_, p)| p.fds.values())
            .filter(|fd| fd.file == file && !matches!(fd.how, How::SharedTable { .. }))
            .count() as u64
    }

    /// Devices named with `--gpu-device`.
    pub fn declared(&self) -> &[u32] {
        &self.declared
    }

    /// Every process holding GPU files now, with its descriptors.
    pub fn all(&self) -> impl Iterator<Item = (u32, &Process)> {
        self.procs
            .iter()
            .filter(|(_, p)| !p.fds.is_empty())
            .map(|(&pid, p)| (pid, p))
    }

    /// Replaces a snapshot group id by the kernel address a kernel record gave for `pid`'s
    /// `fd`, everywhere; returns the id to use.
    fn learn(&mut self, pid: u32, fd: i32, file: FileId) -> FileId {
        let group = self
            .procs
            .get(&pid)
            .and_then(|p| p.fds.get(&fd))
            .map(|f| f.file)
            .filter(|&id| id < SNAPSHOT_ID_LIMIT);
        if let Some(group) = group {
            self.replace_file(group, file);
        }
        file
    }

    /// Every descriptor of snapshot group `group` is the open file at `file`.
    fn replace_file(&mut self, group: FileId, file: FileId) {
        for p in self.procs.values_mut() {
            for f in p.fds.values_mut() {
                if f.file == group {
                    f.file = file;
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "holders_tests.rs"]
mod tests;
