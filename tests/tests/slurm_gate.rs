//! deploy/slurm's epilog and undrain check on a real single-node Slurm (Debian's slurm-wlm
//! and munge, which `cargo xtask test` installs): munged, slurmctld and slurmd started here
//! on a configuration of the test's own, with two stand-in GPU devices (nodes for /dev/full
//! and /dev/zero, `gpu0` and `gpu1`) as the node's GPU gres. Twice: with `proctrack/pgid` and
//! `task/none` (Slurm's defaults), and as GPU clusters run it, `proctrack/cgroup` and
//! `task/cgroup` constraining the devices (cgroup v1 here: this machine's controllers are v1;
//! the GPU machines' pure v2 hierarchy is not available to the tests).

use std::{
    fs,
    net::TcpListener,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use linger_tests::{linger_bin, require_root, stand_in_device, Guarded, TempDir};
use nix::{
    sys::{
        signal::Signal,
        stat::{makedev, mknod, Mode, SFlag},
    },
    unistd::Pid,
};

const SCENARIO: &str = env!("CARGO_BIN_EXE_linger-fd-scenario");
const STUCK_FUSE: &str = env!("CARGO_BIN_EXE_linger-stuck-fuse");
/// How long the epilog waits for the GPUs: short, the test waits for it.
const EPILOG_TIMEOUT: &str = "3s";
/// The longest any Slurm state change here is waited for.
const PATIENCE: Duration = Duration::from_secs(30);

fn kit() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/slurm")
}

/// How Slurm tracks and confines a job's processes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tracking {
    /// `proctrack/pgid`, `task/none`: a worker that calls setsid leaves the job.
    Pgid,
    /// `proctrack/cgroup`, `task/cgroup` with `ConstrainDevices`: the job's cgroup holds
    /// every process it started, and only its own GPUs' files open.
    Cgroup,
}

/// munged, slurmctld and slurmd on a configuration in a temporary directory; jobs cancelled
/// and daemons stopped when dropped.
struct Cluster {
    dir: TempDir,
    node: String,
    tracking: Tracking,
    /// `gpu0` (a node for /dev/full) and `gpu1` (for /dev/zero): distinct devices.
    devices: [PathBuf; 2],
    /// Processes the test must kill itself (workers that escaped their job).
    escaped: Vec<u32>,
    daemons: Vec<Guarded>,
    /// Held until everything above is dropped.
    _one: std::sync::MutexGuard<'static, ()>,
}

impl Cluster {
    /// One cluster at a time: each runs on this host's name, and the next starts once the
    /// last one's daemons are stopped and its directory gone (the guard is dropped last).
    fn start(tracking: Tracking) -> Self {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let one = ONE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Self::start_alone(tracking, one)
    }

    fn start_alone(tracking: Tracking, one: std::sync::MutexGuard<'static, ()>) -> Self {
        static CLUSTERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = CLUSTERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = TempDir::new(&format!("slurm-{n}"));
        let gpu0 = stand_in_device(dir.path());
        let gpu1 = dir.path().join("gpu1");
        mknod(
            &gpu1,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            makedev(1, 5),
        )
        .expect("a node for /dev/zero");
        let devices = [gpu0, gpu1];
        // slurmctld runs only where SlurmctldHost names the host's short name.
        let node = fs::read_to_string("/proc/sys/kernel/hostname")
            .expect("hostname")
            .trim()
            .split('.')
            .next()
            .expect("a host name")
            .to_string();
        let mut cluster = Self {
            dir,
            node,
            tracking,
            devices,
            escaped: Vec::new(),
            daemons: Vec::new(),
            _one: one,
        };
        cluster.configure();
        cluster.daemons.push(cluster.daemon(
            "/usr/sbin/munged",
            &[
                "--foreground",
                "--force",
                &format!("--socket={}", cluster.path("munge.sock")),
                &format!("--key-file={}", cluster.path("munge.key")),
                &format!("--log-file={}", cluster.path("munged.log")),
                &format!("--pid-file={}", cluster.path("munged.pid")),
                &format!("--seed-file={}", cluster.path("munged.seed")),
            ],
        ));
        wait_for("munged's socket", || {
            cluster.dir.join("munge.sock").exists()
        });
        let conf = cluster.path("slurm.conf");
        cluster
            .daemons
            .push(cluster.daemon("/usr/sbin/slurmctld", &["-D", "-f", &conf]));
        let node = cluster.node.clone();
        cluster
            .daemons
            .push(cluster.daemon("/usr/sbin/slurmd", &["-D", "-f", &conf, "-N", &node]));
        wait_for("the node to be idle", || cluster.state() == "idle");
        cluster
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn configure(&self) {
        let key: Vec<u8> = (0..1024).map(|i| (i * 7919 % 251) as u8).collect();
        let key_path = self.dir.join("munge.key");
        fs::write(&key_path, key).expect("munge key");
        fs::set_permissions(&key_path, fs::Permissions::from_mode(0o400)).expect("key mode");
        for sub in ["state", "spool", "empty-state"] {
            fs::create_dir_all(self.dir.join(sub)).expect("slurm dirs");
        }
        let (ctld_port, slurmd_port) = (free_port(), free_port());
        let (d, node) = (self.dir.path().display(), &self.node);
        // As many as slurmd finds: a node configured with more is set down.
        let cpus = thread::available_parallelism().map_or(1, |n| n.get());
        let tracking = match self.tracking {
            // pgid: a worker that calls setsid leaves the job, as with linuxproc a daemon.
            Tracking::Pgid => "ProctrackType=proctrack/pgid\nTaskPlugin=task/none\n",
            Tracking::Cgroup => "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n",
        };
        let conf = format!(
            "ClusterName=lingertest\n\
             SlurmctldHost={node}(127.0.0.1)\n\
             SlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\n\
             AuthType=auth/munge\nAuthInfo=socket={d}/munge.sock\nCredType=cred/munge\n\
             SlurmUser=root\nSlurmdUser=root\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
             {tracking}\
             JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nMpiDefault=none\n\
             GresTypes=gpu\nReturnToService=2\n\
             Epilog={d}/epilog\n\
             UnkillableStepProgram={d}/unkillable\nUnkillableStepTimeout=5\nKillWait=2\n\
             NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:2 State=UNKNOWN\n\
             PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        );
        fs::write(self.dir.join("slurm.conf"), conf).expect("slurm.conf");
        // Slurm numbers the files by their names' last digits: SLURM_JOB_GPUS says 0 or 1.
        fs::write(
            self.dir.join("gres.conf"),
            format!("NodeName={node} Name=gpu File={d}/gpu[0-1]\n"),
        )
        .expect("gres.conf");
        let cgroup = match self.tracking {
            // No cgroup plugin is used (proctrack/pgid, task/none): Slurm's own default, said.
            Tracking::Pgid => "CgroupPlugin=autodetect\n",
            Tracking::Cgroup => "CgroupPlugin=cgroup/v1\nConstrainDevices=yes\n",
        };
        fs::write(self.dir.join("cgroup.conf"), cgroup).expect("cgroup.conf");
        // The site's wrapper: the kit's epilog with this node's settings.
        let epilog = self.dir.join("epilog");
        fs::write(
            &epilog,
            format!(
                "#!/bin/sh\nLINGER={} LINGER_TIMEOUT={EPILOG_TIMEOUT} \
                 LINGER_WAIT_ARGS='{}' exec {}/linger-epilog\n",
                linger_bin().display(),
                self.wait_args(),
                kit().display()
            ),
        )
        .expect("epilog");
        fs::set_permissions(&epilog, fs::Permissions::from_mode(0o755)).expect("epilog mode");
        // slurmstepd runs it for a step that outlived its SIGKILL by UnkillableStepTimeout,
        // in an environment of its own (no SLURM_CONF: a site's is in /etc/slurm): the kit's
        // program, then a mark that it ran.
        let unkillable = self.dir.join("unkillable");
        fs::write(
            &unkillable,
            format!(
                "#!/bin/sh\nenv | grep ^SLURM > {d}/unkillable.env\n\
                 SLURM_CONF={d}/slurm.conf LINGER={0} LINGER_WAIT_ARGS='{1}' \
                 {2}/linger-unkillable > {d}/unkillable.out 2>&1\n\
                 echo $? > {d}/unkillable.ran\n",
                linger_bin().display(),
                self.wait_args(),
                kit().display()
            ),
        )
        .expect("unkillable");
        fs::set_permissions(&unkillable, fs::Permissions::from_mode(0o755)).expect("mode");
    }

    /// The gate's options here: the stand-in devices, and no agent's incident log.
    fn wait_args(&self) -> String {
        format!(
            "--gpu-device {} --gpu-device {} --state-dir {}",
            self.devices[0].display(),
            self.devices[1].display(),
            self.path("empty-state")
        )
    }

    fn daemon(&self, program: &str, args: &[&str]) -> Guarded {
        let log = fs::File::create(self.dir.join(format!(
            "{}.out",
            Path::new(program).file_name().expect("name").to_string_lossy()
        )))
        .expect("daemon log");
        Guarded(
            Command::new(program)
                .args(args)
                .env("SLURM_CONF", self.path("slurm.conf"))
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("{program}: {e} (cargo xtask test installs slurm-wlm and munge)")
                }),
        )
    }

    /// A Slurm client command's output.
    fn client(&self, program: &str, args: &[&str]) -> Output {
        Command::new(program)
            .args(args)
            .env("SLURM_CONF", self.path("slurm.conf"))
            .env("LINGER", linger_bin())
            .env("LINGER_WAIT_ARGS", self.wait_args())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    }

    fn sinfo(&self, format: &str) -> String {
        let out = self.client("sinfo", &["--noheader", "--Node", "--format", format]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The node's state, without sinfo's flags (`*` not responding, `~` powered down).
    fn state(&self) -> String {
        self.sinfo("%T")
            .trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-'])
            .to_string()
    }

    /// Submits the stand-in scenario `name` as a job with one GPU, on the device Slurm gives
    /// it; its job id and the pids on its `ready` line.
    fn job(&self, name: &str) -> (String, Vec<u32>) {
        let (id, pids, _) = self.job_on_gpu(name);
        (id, pids)
    }

    /// [`Cluster::job`], with the job's SLURM_JOB_GPUS.
    fn job_on_gpu(&self, name: &str) -> (String, Vec<u32>, String) {
        self.job_with(name, &[])
    }

    /// [`Cluster::job_on_gpu`] with more arguments for the scenario.
    fn job_with(&self, name: &str, more: &[&str]) -> (String, Vec<u32>, String) {
        static JOBS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let output = self.path(&format!("{name}-{n}.out"));
        let out = self.client(
            "sbatch",
            &[
                "--parsable",
                "--gres=gpu:1",
                "--output",
                &output,
                "--wrap",
                &format!(
                    "echo gpus $SLURM_JOB_GPUS; exec {SCENARIO} {}/gpu$SLURM_JOB_GPUS {name} {}",
                    self.dir.path().display(),
                    more.join(" ")
                ),
            ],
        );
        assert!(out.status.success(), "sbatch: {out:?}");
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let mut pids = Vec::new();
        wait_for("the job's scenario to be ready", || {
            let text = fs::read_to_string(&output).unwrap_or_default();
            pids = text
                .lines()
                .find_map(|l| l.strip_prefix("ready "))
                .map(|l| {
                    l.split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            !pids.is_empty()
        });
        let text = fs::read_to_string(&output).unwrap_or_default();
        let gpus = text
            .lines()
            .find_map(|l| l.strip_prefix("gpus "))
            .unwrap_or("");
        (id, pids, gpus.to_string())
    }

    fn cancel(&self, id: &str) {
        let out = self.client("scancel", &[id]);
        assert!(out.status.success(), "scancel: {out:?}");
        wait_for("the job to end", || {
            let q = self.client("squeue", &["--noheader", "--jobs", id]);
            String::from_utf8_lossy(&q.stdout).trim().is_empty()
        });
    }

    fn undrain(&self) -> String {
        let out = Command::new(kit().join("linger-undrain"))
            .arg(&self.node)
            .env("SLURM_CONF", self.path("slurm.conf"))
            .env("LINGER", linger_bin())
            .env("LINGER_WAIT_ARGS", self.wait_args())
            .output()
            .expect("linger-undrain");
        assert!(out.status.success(), "linger-undrain: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The kit's UnkillableStepProgram, run as slurmstepd runs it for a step of `job` (with
    /// the job's GPUs in the environment).
    fn unkillable(&self, job: &str) {
        let out = Command::new(kit().join("linger-unkillable"))
            .env("SLURM_CONF", self.path("slurm.conf"))
            .env("SLURMD_NODENAME", &self.node)
            .env("SLURM_JOB_ID", job)
            .env("SLURM_STEP_ID", "0")
            .env("SLURM_JOB_GPUS", "0")
            .env("LINGER", linger_bin())
            .env("LINGER_WAIT_ARGS", self.wait_args())
            .output()
            .expect("linger-unkillable");
        assert!(out.status.success(), "linger-unkillable: {out:?}");
    }

    /// What the run was on, for the test's closing line: the plugins configured and this
    /// machine's cgroup hierarchy.
    fn plugins(&self) -> String {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        format!(
            "ran with {}; cgroups: {}",
            match self.tracking {
                Tracking::Pgid => "ProctrackType=proctrack/pgid, TaskPlugin=task/none",
                Tracking::Cgroup =>
                    "ProctrackType=proctrack/cgroup, TaskPlugin=task/cgroup, CgroupPlugin=cgroup/v1",
            },
            if v2 { "v2" } else { "v1 controllers (hybrid)" }
        )
    }

    /// The daemons' logs, for a failure's message.
    fn logs(&self) -> String {
        ["slurmctld.log", "slurmd.log"]
            .iter()
            .map(|f| {
                let text = fs::read_to_string(self.dir.join(f)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                format!(
                    "{f}:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.client("scancel", &["--user", "root"]);
        for &pid in &self.escaped {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        // slurmd, slurmctld, then munged: Guarded kills and reaps each.
        while self.daemons.pop().is_some() {}
    }
}

/// Whether Slurm's cgroup/v1 plugin can run here (a v1 freezer); when not, the test cannot run
/// (a failure under CI, said locally). Slurm 22.05's cgroup/v2 needs systemd to make its scope,
/// so the tests configure v1.
fn cgroup_v1_freezer() -> bool {
    let here = Path::new("/sys/fs/cgroup/freezer/cgroup.procs").exists();
    if !here {
        linger_tests::cannot_run_here(
            "no cgroup v1 freezer here (a pure cgroup v2 machine): Slurm's proctrack/cgroup \
             and task/cgroup are not tried",
        );
    }
    here
}

/// A helper process, once it printed its first line (`ready`).
fn started(cmd: &mut Command) -> Guarded {
    let mut child = Guarded(
        cmd.stdout(Stdio::piped())
            .spawn()
            .expect("a helper process"),
    );
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.0.stdout.take().expect("stdout")),
        &mut ready,
    )
    .expect("its ready line");
    child
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "waited {PATIENCE:?} for {what}");
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_epilog_drains_the_node_for_a_worker_that_left_its_job_and_undrain_returns_it() {
    require_root();
    let mut cluster = Cluster::start(Tracking::Pgid);

    // A job killed with nothing left behind: the node stays up.
    let (clean, _) = cluster.job("held-before");
    cluster.cancel(&clean);
    wait_for("the clean job's epilog", || cluster.state() == "idle");
    assert_eq!(cluster.sinfo("%E"), "none", "{}", cluster.logs());

    // A job whose worker calls setsid (out of the job's process group, which is all Slurm
    // kills here) and keeps the device open.
    let (job, pids) = cluster.job("setsid-worker");
    let worker = pids[1];
    cluster.escaped.push(worker);
    cluster.cancel(&job);
    wait_for("the node to drain", || cluster.state().starts_with("drain"));
    let reason = cluster.sinfo("%E");
    assert!(
        reason.starts_with("linger: live_holder: ") && reason.contains(&format!("[{worker}]")),
        "the reason names the worker {worker}: {reason:?}\n{}",
        cluster.logs()
    );
    assert!(reason.contains(&format!("Slurm job {job}")), "{reason:?}");
    assert!(
        reason.ends_with(&format!("(job {job}, gpus 0)")),
        "{reason:?}"
    );

    // The unkillable-step program (run here as slurmstepd would) names it too.
    cluster.unkillable(&job);
    let reason = cluster.sinfo("%E");
    assert!(
        reason.contains(&format!("[{worker}]"))
            && reason.ends_with(&format!("(job {job}, step 0, unkillable, gpus 0)")),
        "{reason:?}"
    );

    // While the worker lives, the check leaves the node drained.
    assert_eq!(cluster.undrain(), "");
    assert!(cluster.state().starts_with("drain"));
    nix::sys::signal::kill(Pid::from_raw(worker as i32), Signal::SIGKILL).expect("kill worker");
    wait_for("the worker to die", || {
        tracer_user::source::procfs::stat(worker).is_none_or(|s| s.state == 'Z')
    });
    assert_eq!(cluster.undrain(), cluster.node);
    wait_for("the node to be back", || cluster.state() == "idle");
    println!("{}", cluster.plugins());
}

/// As GPU clusters run Slurm: the job's cgroup holds the worker that called setsid, and
/// slurmstepd kills it with the job, so the node stays up. The epilog looks only at the job's
/// own GPU (SLURM_JOB_GPUS, the number of the gres file): a holder of the other GPU outside any
/// job leaves a job on the first one clean, and drains the node after a job on its GPU.
#[test]
fn with_cgroup_tracking_the_worker_dies_with_its_job_and_the_gate_looks_at_the_jobs_gpu() {
    require_root();
    if !cgroup_v1_freezer() {
        return;
    }
    let mut cluster = Cluster::start(Tracking::Cgroup);
    let (job, pids) = cluster.job("setsid-worker");
    let worker = pids[1];
    cluster.escaped.push(worker);
    // proctrack/cgroup put the worker in the job's cgroup, setsid or not.
    let cgroups = fs::read_to_string(format!("/proc/{worker}/cgroup")).unwrap_or_default();
    assert!(
        cgroups.contains(&format!("/job_{job}/")),
        "the worker in job {job}'s cgroup: {cgroups}"
    );
    cluster.cancel(&job);
    wait_for("the worker to die with its job", || {
        tracer_user::source::procfs::stat(worker).is_none_or(|s| s.state == 'Z')
    });
    wait_for("the clean job's epilog", || cluster.state() == "idle");
    assert_eq!(cluster.sinfo("%E"), "none", "{}", cluster.logs());

    // A process outside Slurm holding gpu1, which Slurm knows nothing of.
    let holder = started(
        Command::new(SCENARIO)
            .arg(&cluster.devices[1])
            .arg("held-before"),
    );
    let outsider = holder.pid();
    let (on_gpu0, _, gpus) = cluster.job_on_gpu("held-before");
    assert_eq!(gpus, "0", "the first free GPU");
    cluster.cancel(&on_gpu0);
    wait_for("the epilog of the job on gpu0", || {
        cluster.state() == "idle"
    });
    assert_eq!(cluster.sinfo("%E"), "none", "{}", cluster.logs());

    // gpu0 taken by a running job, the next job gets gpu1: its epilog finds the outsider.
    let (first, _, gpus) = cluster.job_on_gpu("held-before");
    assert_eq!(gpus, "0");
    let (second, _, gpus) = cluster.job_on_gpu("held-before");
    assert_eq!(gpus, "1");
    cluster.cancel(&second);
    wait_for("the node to drain", || cluster.state().starts_with("drain"));
    let reason = cluster.sinfo("%E");
    assert!(
        reason.contains(&format!("[{outsider}]"))
            && reason.ends_with(&format!("(job {second}, gpus 1)")),
        "the reason names the holder of gpu1, {outsider}: {reason:?}\n{}",
        cluster.logs()
    );
    cluster.cancel(&first);
    drop(holder);
    assert_eq!(cluster.undrain(), cluster.node);
    wait_for("the node to be back", || cluster.state() == "idle");
    println!("{}", cluster.plugins());
}

/// A step SIGKILL cannot end (its process sleeps uninterruptibly in its exit, closing a file
/// whose FUSE daemon never answers, the GPU file still held): slurmstepd itself runs the
/// kit's UnkillableStepProgram, which drains the node naming the process and its state.
#[test]
fn a_step_that_will_not_die_runs_the_kits_unkillable_step_program() {
    require_root();
    if !cgroup_v1_freezer() {
        return;
    }
    let cluster = Cluster::start(Tracking::Cgroup);
    let fuse = cluster.dir.join("fuse");
    fs::create_dir_all(&fuse).expect("mount point");
    let daemon = started(Command::new(STUCK_FUSE).arg(&fuse));
    let stuck = fuse.join("stuck").display().to_string();
    let (job, pids, _) = cluster.job_with("stuck", &[&stuck]);
    let out = cluster.client("scancel", &[&job]);
    assert!(out.status.success(), "scancel: {out:?}");
    let ran = cluster.dir.join("unkillable.ran");
    let start = Instant::now();
    while !ran.exists() {
        assert!(
            start.elapsed() < PATIENCE,
            "slurmstepd did not run UnkillableStepProgram: {:?}\n{}",
            tracer_user::source::procfs::stat(pids[0]).map(|s| s.state),
            cluster.logs()
        );
        thread::sleep(Duration::from_millis(100));
    }
    let state = tracer_user::source::procfs::stat(pids[0]).map(|s| s.state);
    assert_eq!(state, Some('D'), "still dying, uninterruptibly");
    let reason = cluster.sinfo("%E");
    assert!(
        reason.contains(&format!("[{}]", pids[0])) && reason.contains("unkillable"),
        "the reason names the stuck process {}: {reason:?}\n{}\n{}\n{}",
        pids[0],
        fs::read_to_string(cluster.dir.join("unkillable.env")).unwrap_or_default(),
        fs::read_to_string(cluster.dir.join("unkillable.out")).unwrap_or_default(),
        cluster.logs()
    );
    assert!(reason.contains(&format!("(job {job}, step ")), "{reason:?}");
    // The daemon's end aborts the connection: the exit finishes.
    drop(daemon);
    wait_for("the stuck process to end", || {
        tracer_user::source::procfs::stat(pids[0]).is_none_or(|s| s.state == 'Z')
    });
    let _ = nix::mount::umount2(&fuse, nix::mount::MntFlags::MNT_DETACH);
    println!("{}", cluster.plugins());
}
