//! Pod attribution for real: a GPU holder (of a stand-in device) runs in a cgroup made in the
//! live cgroup file system under a kubepods path, with a kubelet log directory tree under a
//! temporary root; its incident names the pod, the namespace and the container.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use linger_tests::{num, stand_in_device, Live, TempDir};

const SCENARIO: &str = env!("CARGO_BIN_EXE_linger-fd-scenario");
const UID: &str = "3f1c2b9a-7d4e-4a21-9c3b-5e6f7a8b9c0d";
const CID: &str = "c0ffee00112233445566778899aabbccddeeff00112233445566778899aabbcc";

/// Where a cgroup can be made here: cgroup v2's unified tree, or v1's `pids` hierarchy.
fn cgroup_root() -> PathBuf {
    let unified = Path::new("/sys/fs/cgroup");
    if unified.join("cgroup.controllers").exists() {
        unified.to_path_buf()
    } else {
        unified.join("pids")
    }
}

struct Cgroup(PathBuf);

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Innermost first; a cgroup goes only once its processes are gone.
        for dir in self.0.ancestors().take(4) {
            let _ = fs::remove_dir(dir);
        }
    }
}

#[test]
fn a_holder_in_a_kubepods_cgroup_is_named_by_pod_namespace_and_container() {
    let tmp = TempDir::new("workload");
    // The kubelet's layout: pods/<namespace>_<pod>_<uid>/<container>/ and
    // containers/<pod>_<namespace>_<container>-<id>.log.
    let logs = tmp.join("logs");
    fs::create_dir_all(logs.join(format!("pods/ml-team_trainer-7f9c_{UID}/worker")))
        .expect("pods dir");
    fs::create_dir_all(logs.join(format!("pods/ml-team_trainer-7f9c_{UID}/sidecar")))
        .expect("pods dir");
    fs::create_dir_all(logs.join("containers")).expect("containers dir");
    fs::write(
        logs.join(format!("containers/trainer-7f9c_ml-team_worker-{CID}.log")),
        "",
    )
    .expect("container log");
    let device = stand_in_device(tmp.path());

    // The cgroupfs driver's layout: kubepods/burstable/pod<uid>/<container id>.
    let cgroup = Cgroup(
        cgroup_root()
            .join("kubepods")
            .join("burstable")
            .join(format!("pod{UID}"))
            .join(CID),
    );
    fs::create_dir_all(&cgroup.0).expect("a cgroup in the live cgroup file system");

    let live = Live::start([
        "--json",
        "--no-nvml",
        "--duration",
        "20s",
        "--count",
        "1",
        "--gpu-device",
        device.to_str().expect("UTF-8"),
        "--kubelet-logs",
        logs.to_str().expect("UTF-8"),
    ]);
    // Into the cgroup first, then open the device: /proc is read at the open.
    let mut holder = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec {SCENARIO} {} held-before",
            cgroup.0.display(),
            device.display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .expect("holder");
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().expect("stdout")),
        &mut ready,
    )
    .expect("ready line");
    assert!(ready.starts_with("ready"), "{ready:?}");
    let pid = holder.id();
    // linger reads /proc when it drains the open's record (within a 20 ms tick): a holder
    // that dies sooner is traced without its workload.
    std::thread::sleep(std::time::Duration::from_millis(200));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    let _ = holder.wait();
    let out = live.finish();
    let inc = out.incident_of(pid);
    assert_eq!(num(inc, "/target/pid"), pid as u64);
    let w = &inc["target"]["workload"];
    assert_eq!(w["pod_uid"], UID, "{inc}");
    assert_eq!(w["namespace"], "ml-team", "{inc}");
    assert_eq!(w["pod"], "trainer-7f9c", "{inc}");
    assert_eq!(w["container"], "worker", "{inc}");
    assert_eq!(w["container_id"], CID, "{inc}");
    drop(cgroup);
}
