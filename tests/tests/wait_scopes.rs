//! `linger wait`'s scopes on real processes: a process group, a cgroup the test makes, a
//! Kubernetes pod's cgroup (kubepods-style path), and a GPU named by a UUID this machine does
//! not have. A holder of a stand-in GPU device (a node for /dev/full, declared with
//! --gpu-device) is put in each scope, and the gate, without NVML here, must name it, then
//! call the GPU clean once it is gone.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Output,
};

use linger_tests::{
    gate::{answer, kill_and_wait, one_at_a_time},
    linger, require_root, stand_in_device, FdScenario, TempDir,
};

const SCENARIO: &str = env!("CARGO_BIN_EXE_linger-fd-scenario");

fn gate(device: &Path, state: &TempDir, args: &[&str]) -> Output {
    linger()
        .arg("wait")
        .args(args)
        .arg("--gpu-device")
        .arg(device)
        .args(["--timeout", "1s", "--json", "--state-dir"])
        .arg(state.path())
        .output()
        .expect("running linger wait")
}

/// The gate names `holder` in the scope `args` gives (exit 1), and, once it is dead, calls
/// the GPU clean (exit 0).
fn named_then_clean(device: &Path, args: &[&str], holder: FdScenario) {
    let state = TempDir::new("scope-state");
    let pid = holder.pids[0];
    let (code, busy) = answer(gate(device, &state, args));
    assert_eq!(code, Some(1), "{busy:#}");
    let named: Vec<u64> = busy["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .filter_map(|h| h["pid"].as_u64())
        .collect();
    assert_eq!(named, vec![u64::from(pid)], "{busy:#}");
    kill_and_wait(pid);
    drop(holder);
    let (code, clean) = answer(gate(device, &state, args));
    assert_eq!(code, Some(0), "{clean:#}");
}

/// A cgroup the test makes under a hierarchy of this machine's (v1 `pids` where it is mounted,
/// else the v2 root), removed when dropped.
struct Cgroup {
    dir: PathBuf,
    /// The path /proc/PID/cgroup shows for it.
    path: String,
}

impl Cgroup {
    fn new(relative: &str) -> Self {
        let root = ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"]
            .into_iter()
            .map(PathBuf::from)
            .find(|r| r.join("cgroup.procs").exists())
            .expect("a cgroup hierarchy with cgroup.procs");
        let dir = root.join(relative);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Self {
            dir,
            path: format!("/{relative}"),
        }
    }

    fn enter(&self, pid: u32) {
        fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("moving into the cgroup");
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Innermost first: a cgroup goes only once it has no children and no processes.
        let mut dir = self.dir.clone();
        while dir
            .file_name()
            .is_some_and(|n| n != "pids" && n != "cgroup")
        {
            if fs::remove_dir(&dir).is_err() {
                break;
            }
            dir.pop();
        }
    }
}

#[test]
fn a_process_group_s_holder_is_named() {
    require_root();
    let _alone = one_at_a_time();
    let dir = TempDir::new("scope-pgid");
    let device = stand_in_device(dir.path());
    let holder = FdScenario::start(SCENARIO, &device, "held-before");
    let pgid = tracer_user::source::procfs::stat(holder.pids[0])
        .expect("the holder's stat")
        .pgrp
        .to_string();
    named_then_clean(&device, &["--pgid", &pgid], holder);
}

#[test]
fn a_cgroup_s_holder_is_named() {
    require_root();
    let _alone = one_at_a_time();
    let dir = TempDir::new("scope-cgroup");
    let device = stand_in_device(dir.path());
    let cgroup = Cgroup::new(&format!("linger-test-{}", std::process::id()));
    let holder = FdScenario::start(SCENARIO, &device, "held-before");
    cgroup.enter(holder.pids[0]);
    named_then_clean(&device, &["--cgroup", &cgroup.path], holder);
}

#[test]
fn a_pod_s_holder_is_named_by_its_uid() {
    require_root();
    let _alone = one_at_a_time();
    let dir = TempDir::new("scope-pod");
    let device = stand_in_device(dir.path());
    let uid = "0d1e2f3a-1111-2222-3333-444455556666";
    // The kubelet's systemd driver's layout: the pod's UID with underscores.
    let cgroup = Cgroup::new(&format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/\
         cri-containerd-{}.scope",
        uid.replace('-', "_"),
        std::process::id()
    ));
    let holder = FdScenario::start(SCENARIO, &device, "held-before");
    cgroup.enter(holder.pids[0]);
    named_then_clean(&device, &["--pod", uid], holder);
}

/// Without NVML a UUID cannot be resolved: the gate says which and looks at the declared
/// device alone; with no device declared it cannot tell (exit 3).
#[test]
fn a_uuid_this_machine_does_not_have_is_said() {
    require_root();
    let _alone = one_at_a_time();
    let dir = TempDir::new("scope-uuid");
    let device = stand_in_device(dir.path());
    let state = TempDir::new("scope-uuid-state");
    let uuid = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6";
    let (code, clean) = answer(gate(&device, &state, &["--uuid", uuid, "--any-process"]));
    assert_eq!(code, Some(0), "{clean:#}");
    assert!(clean["notes"].to_string().contains(uuid), "{clean:#}");
    let out = linger()
        .args(["wait", "--uuid", uuid, "--any-process", "--timeout", "0s"])
        .output()
        .expect("linger wait");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(uuid),
        "{out:?}"
    );
}
