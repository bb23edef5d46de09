//! deploy/slurm's epilog and undrain check on a real single-node Slurm (Debian's slurm-wlm
//! and munge, which `cargo xtask test` installs): munged, slurmctld and slurmd started here
//! on a configuration of the test's own, with a stand-in GPU device (a node for /dev/full) as
//! the node's one GPU gres.

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
use nix::{sys::signal::Signal, unistd::Pid};

const SCENARIO: &str = env!("CARGO_BIN_EXE_linger-fd-scenario");
/// How long the epilog waits for the GPUs: short, the test waits for it.
const EPILOG_TIMEOUT: &str = "3s";
/// The longest any Slurm state change here is waited for.
const PATIENCE: Duration = Duration::from_secs(30);

fn kit() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/slurm")
}

/// munged, slurmctld and slurmd on a configuration in a temporary directory; jobs cancelled
/// and daemons stopped when dropped.
struct Cluster {
    dir: TempDir,
    node: String,
    device: PathBuf,
    /// Processes the test must kill itself (workers that escaped their job).
    escaped: Vec<u32>,
    daemons: Vec<Guarded>,
}

impl Cluster {
    fn start() -> Self {
        let dir = TempDir::new("slurm");
        let device = stand_in_device(dir.path());
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
            device,
            escaped: Vec::new(),
            daemons: Vec::new(),
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
        let conf = format!(
            "ClusterName=lingertest\n\
             SlurmctldHost={node}(127.0.0.1)\n\
             SlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\n\
             AuthType=auth/munge\nAuthInfo=socket={d}/munge.sock\nCredType=cred/munge\n\
             SlurmUser=root\nSlurmdUser=root\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
             # pgid: a worker that calls setsid leaves the job, as with linuxproc a daemon.\n\
             ProctrackType=proctrack/pgid\nTaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nMpiDefault=none\n\
             GresTypes=gpu\nReturnToService=2\n\
             Epilog={d}/epilog\n\
             NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:1 State=UNKNOWN\n\
             PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        );
        fs::write(self.dir.join("slurm.conf"), conf).expect("slurm.conf");
        fs::write(
            self.dir.join("gres.conf"),
            format!("NodeName={node} Name=gpu File={}\n", self.device.display()),
        )
        .expect("gres.conf");
        // No cgroup plugin is used (proctrack/pgid, task/none): Slurm's own default, said.
        fs::write(self.dir.join("cgroup.conf"), "CgroupPlugin=autodetect\n").expect("cgroup.conf");
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
    }

    /// The gate's options here: the stand-in device, and no agent's incident log.
    fn wait_args(&self) -> String {
        format!(
            "--gpu-device {} --state-dir {}",
            self.device.display(),
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

    /// Submits the stand-in scenario `name` as a job with the GPU; its job id and the pids
    /// on its `ready` line.
    fn job(&self, name: &str) -> (String, Vec<u32>) {
        let output = self.path(&format!("{name}.out"));
        let out = self.client(
            "sbatch",
            &[
                "--parsable",
                "--gres=gpu:1",
                "--output",
                &output,
                "--wrap",
                &format!("exec {SCENARIO} {} {name}", self.device.display()),
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
        (id, pids)
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
    let mut cluster = Cluster::start();

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
}
