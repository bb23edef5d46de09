//! /proc: facts about processes captured while they are alive, and the GPU files held when
//! tracing begins.

use std::{
    cmp::Ordering,
    collections::HashMap,
    fs,
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::Path,
};

use tracer_common::driver::mkdev;

use super::{kcmp, workload};
use crate::{
    escape,
    event::{EventData, ProcInfo},
    probe::devices::GpuDevices,
    trace::snapshot::Process,
};

/// How processes are described.
#[derive(Clone, Debug, Default)]
pub struct Describe {
    /// Only the program of a command line, not its arguments.
    pub redact_cmdline: bool,
    /// Where pod and container names are found.
    pub names: workload::Names,
}

/// comm, ppid, cmdline, cgroup (and the workload it names), namespace pid and start time of
/// `pid`, if it is still there. The process chose its comm and arguments: bytes that are not
/// UTF-8 are kept as `\xNN` rather than failing the read (which would hide the process).
pub fn proc_info(pid: u32, how: &Describe) -> Option<ProcInfo> {
    let dir = Path::new("/proc").join(pid.to_string());
    let read = |name: &str| fs::read(dir.join(name)).map(|b| escape::bytes(&b).into_owned());
    let stat = read("stat").ok()?;
    let stat = Stat::parse(&stat)?;
    let (comm, ppid) = (stat.comm.to_string(), stat.field(1)?);
    let start_ticks = stat.field(19)?;
    let cmdline = arguments(pid, how.redact_cmdline).join(" ");
    let status = read("status").unwrap_or_default();
    let ns_pid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|p| p.parse().ok())
        .filter(|&p| p != pid);
    let cgroup = workload::pick_cgroup(&read("cgroup").unwrap_or_default());
    let mut workload = how.names.workload(&cgroup);
    if workload.is_none() {
        // Slurm without its cgroup plugins: the job is in the environment the task began with.
        workload = fs::read(dir.join("environ"))
            .ok()
            .and_then(|env| workload::slurm_job_from_environ(&env))
            .map(|job| crate::event::Workload {
                slurm_job: Some(job),
                ..Default::default()
            });
    }
    Some(ProcInfo {
        pid,
        ppid,
        comm,
        cmdline,
        cgroup,
        ns_pid,
        start_ticks,
        workload,
    })
}

/// `/proc/PID/stat`: `pid (comm) state ppid ...`, the comm holding any bytes, spaces and
/// parentheses included.
struct Stat<'a> {
    comm: &'a str,
    /// The fields after the comm, from the state on.
    rest: Vec<&'a str>,
}

impl<'a> Stat<'a> {
    fn parse(stat: &'a str) -> Option<Self> {
        let (head, tail) = stat.rsplit_once(')')?;
        Some(Self {
            comm: head.split_once('(')?.1,
            rest: tail.split_whitespace().collect(),
        })
    }

    /// Field `n` after the comm (0: the state, 1: the ppid, 19: the start time).
    fn field<T: std::str::FromStr>(&self, n: usize) -> Option<T> {
        self.rest.get(n)?.parse().ok()
    }
}

/// A process's arguments (only the program when `redact`), bytes that are not UTF-8 kept as
/// `\xNN`; empty for kernel threads.
fn arguments(pid: u32, redact: bool) -> Vec<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut args: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| escape::bytes(a).into_owned())
        .collect();
    if redact {
        args.truncate(1);
    }
    args
}

/// Every process now (linger included), for a trace's process snapshot. Processes that exit
/// while it is read are left out.
pub fn processes(redact_cmdline: bool) -> Vec<Process> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<Process> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
            let stat = escape::bytes(&stat);
            let stat = Stat::parse(&stat)?;
            Some(Process {
                pid,
                ppid: stat.field(1)?,
                comm: stat.comm.to_string(),
                cmdline: arguments(pid, redact_cmdline),
            })
        })
        .collect();
    out.sort_by_key(|p| p.pid);
    out
}

/// One GPU descriptor found in /proc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub pid: u32,
    pub fd: i32,
    /// The device, kernel dev_t encoding.
    pub dev: u32,
    pub cloexec: bool,
    /// The device node's file system and inode (`st_dev`, `st_ino`): how a memory mapping of
    /// it shows in `/proc/PID/maps`.
    pub node: (u64, u64),
}

/// The fields of `/proc/PID/stat` a gate needs to follow a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcStat {
    pub comm: String,
    /// `R`, `S`, `D` (uninterruptible: in a driver call), `Z` (zombie), ...
    pub state: char,
    pub ppid: u32,
    pub pgrp: u32,
    pub session: u32,
    /// Clock ticks after boot: with the pid, who the process is (pids are reused).
    pub start_ticks: u64,
    /// Its exit has begun (PF_EXITING): its descriptor table may be gone from /proc while
    /// its exit still closes, or is stuck closing, what it held.
    pub exiting: bool,
}

/// `task_struct.flags`: the task is exiting.
const PF_EXITING: u32 = 0x4;

/// `/proc/PID/stat`, if the process is still there.
pub fn stat(pid: u32) -> Option<ProcStat> {
    let raw = fs::read(format!("/proc/{pid}/stat")).ok()?;
    let text = escape::bytes(&raw);
    let s = Stat::parse(&text)?;
    Some(ProcStat {
        comm: s.comm.to_string(),
        state: s.field::<char>(0)?,
        ppid: s.field(1)?,
        pgrp: s.field(2)?,
        session: s.field(3)?,
        start_ticks: s.field(19)?,
        exiting: s.field::<u32>(6)? & PF_EXITING != 0,
    })
}

/// The processes holding GPU files now, as /proc says (snapshot events), taken when asked.
pub type Snapshot = Box<dyn Fn() -> Vec<EventData>>;

/// Every GPU descriptor held now, as snapshot events (descriptors of one open file share a
/// group, found with kcmp, numbered from 1), plus each holder's /proc facts.
pub fn snapshot(devices: &GpuDevices, how: &Describe) -> Vec<EventData> {
    snapshot_of(others(), devices, how, 0)
}

/// Every process holding a GPU file now (linger aside).
pub fn holding_gpu_files(devices: &GpuDevices) -> Vec<u32> {
    let mut pids: Vec<u32> = scan(others(), devices).into_iter().map(|f| f.pid).collect();
    pids.dedup();
    pids
}

/// The kernel's first pid namespace (PROC_PID_INIT_INO): the host's.
const INITIAL_PID_NS: u64 = 0xEFFF_FFFC;

/// The pid namespace /proc shows when it is not the host's (a pod without hostPID, `unshare
/// --pid --mount-proc`): processes outside it are not in /proc. That of its PID 1, else (PID 1
/// unreadable) this process's own. None: /proc shows the host's processes.
pub fn partial_pid_view() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let ns = |path: &str| fs::metadata(path).ok().map(|m| m.ino());
    let seen = ns("/proc/1/ns/pid").or_else(|| ns("/proc/self/ns/pid"))?;
    (seen != INITIAL_PID_NS).then_some(seen)
}

/// Whether /proc has `pid` (alive, or a zombie).
pub fn exists(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Whether `pid` is gone: no /proc entry (dead, or in a pid namespace hidden from linger), or
/// a zombie.
pub fn dead_or_invisible(pid: u32) -> bool {
    let Ok(stat) = fs::read(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let stat = escape::bytes(&stat);
    Stat::parse(&stat)
        .and_then(|s| s.field::<String>(0))
        .is_none_or(|state| state == "Z" || state == "X")
}

/// Every process in /proc but linger: its own NVML use opens nvidiactl, which holds no GPU
/// memory.
pub fn others() -> impl Iterator<Item = u32> {
    let me = std::process::id();
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(move |&pid| pid != me)
}

/// [`snapshot`] of some processes only, group ids numbered after `last_group`.
pub fn snapshot_of(
    pids: impl IntoIterator<Item = u32>,
    devices: &GpuDevices,
    how: &Describe,
    last_group: u64,
) -> Vec<EventData> {
    let mut found = Vec::new();
    let mut events: Vec<EventData> = Vec::new();
    for pid in pids {
        match descriptors_of(pid, devices) {
            Ok(fds) => found.extend(fds),
            Err(()) => events.push(EventData::FdsUnreadable { holder: pid }),
        }
    }
    let groups = group_by_open_file(&found, last_group);
    let mut pids: Vec<u32> = found.iter().map(|f| f.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    events.extend(
        pids.iter()
            .filter_map(|&p| proc_info(p, how))
            .map(EventData::ProcInfo),
    );
    events.extend(
        found
            .iter()
            .zip(groups)
            .map(|(f, group)| EventData::SnapshotFd {
                holder: f.pid,
                fd: f.fd,
                dev: f.dev,
                cloexec: f.cloexec,
                group,
            }),
    );
    events
}

fn scan(pids: impl IntoIterator<Item = u32>, devices: &GpuDevices) -> Vec<Found> {
    pids.into_iter()
        .flat_map(|pid| gpu_descriptors(pid, devices))
        .collect()
}

/// The GPU descriptors `pid` holds now (none when it is gone).
pub fn gpu_descriptors(pid: u32, devices: &GpuDevices) -> Vec<Found> {
    descriptors_of(pid, devices).unwrap_or_default()
}

/// The GPU descriptors `pid` holds now (none when it is gone, or a zombie); Err when /proc has
/// it but will not list its descriptors.
fn descriptors_of(pid: u32, devices: &GpuDevices) -> Result<Vec<Found>, ()> {
    let mut found = Vec::new();
    let dir = Path::new("/proc").join(pid.to_string());
    let fds = match fs::read_dir(dir.join("fd")) {
        Ok(fds) => fds,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) if e.raw_os_error() == Some(nix::libc::ESRCH) => return Ok(found),
        Err(_) => return Err(()),
    };
    for fd_entry in fds.flatten() {
        let Ok(fd) = fd_entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // metadata() follows the magic link to the open file's inode.
        let Ok(meta) = fs::metadata(fd_entry.path()) else {
            continue;
        };
        if !meta.file_type().is_char_device() {
            continue;
        }
        let rdev = meta.rdev();
        let dev = mkdev(
            nix::sys::stat::major(rdev) as u32,
            nix::sys::stat::minor(rdev) as u32,
        );
        if !devices.is_gpu(dev) {
            continue;
        }
        let info = dir.join("fdinfo").join(fd.to_string());
        let cloexec = fs::read_to_string(info)
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("flags:"))
                    .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
            })
            .is_some_and(|flags| flags & 0o2000000 != 0);
        found.push(Found {
            pid,
            fd,
            dev,
            cloexec,
            node: (meta.dev(), meta.ino()),
        });
    }
    Ok(found)
}

/// Group ids (after `last`: last + 1, last + 2, ...) such that two descriptors share one
/// exactly when they are the same open file.
fn group_by_open_file(found: &[Found], last: u64) -> Vec<u64> {
    // One representative descriptor per group, by device, in the kernel's order of open
    // files: a busy node's snapshot has hundreds of GPU descriptors, nearly all distinct, and
    // comparing each with every group took tens of thousands of kcmp calls.
    let mut reps: HashMap<u32, Representatives> = HashMap::new();
    let mut next = last;
    (0..found.len())
        .map(|i| {
            reps.entry(found[i].dev)
                .or_default()
                .group(found, i, &mut next)
        })
        .collect()
}

/// One device's groups: (index of a descriptor in the scan, group id), sorted by kcmp's
/// order while every comparison answered; a failed one (a process gone mid-scan) leaves them
/// unsorted, compared one by one from then on.
#[derive(Default)]
struct Representatives {
    reps: Vec<(usize, u64)>,
    unsorted: bool,
}

impl Representatives {
    /// The group of `found[i]`: an existing one's, or `next` advanced for a new one.
    fn group(&mut self, found: &[Found], i: usize, next: &mut u64) -> u64 {
        let f = &found[i];
        let cmp = |j: usize| kcmp::order(found[j].pid, found[j].fd, f.pid, f.fd);
        let (mut lo, mut hi) = (0, self.reps.len());
        while !self.unsorted && lo < hi {
            let mid = (lo + hi) / 2;
            match cmp(self.reps[mid].0) {
                Some(Ordering::Equal) => return self.reps[mid].1,
                Some(Ordering::Less) => lo = mid + 1,
                Some(Ordering::Greater) => hi = mid,
                None => self.unsorted = true,
            }
        }
        if self.unsorted {
            if let Some(&(_, group)) = self
                .reps
                .iter()
                .find(|(j, _)| cmp(*j) == Some(Ordering::Equal))
            {
                return group;
            }
            lo = self.reps.len();
        }
        *next += 1;
        self.reps.insert(lo, (i, *next));
        *next
    }
}

#[cfg(test)]
mod tests {
    use std::{ffi::CString, os::fd::AsFd};

    use super::*;

    #[test]
    fn a_comm_with_escapes_and_invalid_utf8_is_read_and_kept_as_escapes() {
        let name = CString::new(&b"\x1b]0;pwn\x07\xff(x) y"[..]).expect("no NUL");
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            nix::sys::prctl::set_name(&name).expect("prctl(PR_SET_NAME)");
            tid_tx
                .send(nix::unistd::gettid().as_raw() as u32)
                .expect("send");
            let _ = done_rx.recv();
        });
        let tid = tid_rx.recv().expect("the thread's id");
        // /proc/TID is there for every thread, though only processes are listed.
        let info = proc_info(tid, &Describe::default());
        done_tx.send(()).expect("send");
        thread.join().expect("the renamed thread");
        let info = info.expect("the thread's /proc entry");
        assert_eq!(info.comm, "\x1b]0;pwn\x07\\xff(x) y");
        assert_eq!(info.ppid, nix::unistd::getppid().as_raw() as u32);
    }

    #[test]
    fn stat_with_odd_comm() {
        let s = Stat::parse("42 (a) b (c)) S 7 42 42 0").expect("parsed");
        assert_eq!((s.comm, s.field::<u32>(1)), ("a) b (c)", Some(7)));
        assert!(Stat::parse("garbage").is_none());
    }

    #[test]
    fn the_process_listing_redacts_to_the_program() {
        let me = std::process::id();
        let find = |redact| {
            processes(redact)
                .into_iter()
                .find(|p| p.pid == me)
                .expect("own process")
        };
        let (full, redacted) = (find(false), find(true));
        assert!(redacted.cmdline.len() <= 1);
        assert_eq!(redacted.cmdline.first(), full.cmdline.first());
        assert_eq!(full.ppid, nix::unistd::getppid().as_raw() as u32);
        assert!(!dead_or_invisible(me));
    }

    #[test]
    fn descriptors_share_a_group_exactly_when_they_are_one_open_file() {
        use std::os::fd::AsRawFd;
        // Thirty opens of one device, each duplicated, scanned in a scrambled order: the
        // search through the groups must find each duplicate's original however they sort.
        let files: Vec<fs::File> = (0..30)
            .map(|_| fs::File::open("/dev/null").expect("open /dev/null"))
            .collect();
        let dups: Vec<std::os::fd::OwnedFd> = files
            .iter()
            .map(|f| f.as_fd().try_clone_to_owned().expect("dup"))
            .collect();
        let me = std::process::id();
        let mut order: Vec<(usize, i32)> = files
            .iter()
            .map(|f| f.as_raw_fd())
            .chain(dups.iter().map(|d| d.as_raw_fd()))
            .enumerate()
            .map(|(i, fd)| (i % files.len(), fd))
            .collect();
        order.sort_by_key(|&(file, fd)| (fd as usize * 7919 + file) % 61);
        let found: Vec<Found> = order
            .iter()
            .map(|&(_, fd)| Found {
                pid: me,
                fd,
                dev: 7,
                cloexec: false,
                node: (0, 0),
            })
            .collect();
        let groups = group_by_open_file(&found, 100);
        for (a, ga) in order.iter().zip(&groups) {
            for (b, gb) in order.iter().zip(&groups) {
                assert_eq!(a.0 == b.0, ga == gb, "{a:?} {b:?}");
            }
        }
        assert_eq!(groups.iter().min(), Some(&101));
        assert_eq!(groups.iter().max(), Some(&130));
        // A descriptor kcmp cannot compare (closed meanwhile) is a group of its own, and the
        // rest are still grouped right after it.
        let mut with_gone = found.clone();
        with_gone.insert(
            5,
            Found {
                fd: 9999,
                ..found[0].clone()
            },
        );
        let groups = group_by_open_file(&with_gone, 0);
        let kept: Vec<u64> = groups
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 5)
            .map(|(_, g)| *g)
            .collect();
        for (a, ga) in order.iter().zip(&kept) {
            for (b, gb) in order.iter().zip(&kept) {
                assert_eq!(a.0 == b.0, ga == gb, "{a:?} {b:?}");
            }
        }
        assert!(!kept.contains(&groups[5]));
    }
}
