//! Loads the tracer's programs with their globals and attaches them.

use std::{
    os::fd::{AsFd, OwnedFd},
    time::Instant,
};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf, StackTraceMap},
    Btf, Ebpf, EbpfLoader,
};
use aya_log::EbpfLogger;
use log::debug;
use tracer_common::XidLayout;

use super::{
    attach::{self, AttachError, Cause, Hook},
    devices::{self, GpuDevices},
    library, offsets,
    sampling::Sampler,
    strategy, tracefs, xid, EBPF_OBJECT,
};
use crate::{
    error::{Error, Result},
    event::{DriverHooks, Strategy, BY_DRIVER_UNSEEN, LEAN_UNSEEN, NO_DRIVER_UNSEEN},
    privileges,
};

/// Signals that open an incident by default: the ones that kill a process unless handled,
/// as issued by users, supervisors and the kernel (OOM killer, faults).
pub const DEFAULT_FATAL_SIGNALS: &[i32] = &[
    libc_sig::SIGHUP,
    libc_sig::SIGINT,
    libc_sig::SIGQUIT,
    libc_sig::SIGILL,
    libc_sig::SIGABRT,
    libc_sig::SIGBUS,
    libc_sig::SIGFPE,
    libc_sig::SIGKILL,
    libc_sig::SIGSEGV,
    libc_sig::SIGTERM,
];

mod libc_sig {
    pub const SIGHUP: i32 = 1;
    pub const SIGINT: i32 = 2;
    pub const SIGQUIT: i32 = 3;
    pub const SIGILL: i32 = 4;
    pub const SIGABRT: i32 = 6;
    pub const SIGBUS: i32 = 7;
    pub const SIGFPE: i32 = 8;
    pub const SIGKILL: i32 = 9;
    pub const SIGSEGV: i32 = 11;
    pub const SIGTERM: i32 = 15;
}

#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// Ring buffer size in bytes (a power of two, at least one page).
    pub ring_size: u32,
    pub fatal_signals: Vec<i32>,
    /// Attach the ring buffer throughput benchmark for this pid.
    pub bench_pid: Option<u32>,
    /// Which char devices count as GPU files.
    pub gpu_devices: GpuDevices,
    /// On-CPU stack samples per second of dying GPU processes (0: none; sleeps are still
    /// recorded).
    pub sample_hz: u64,
    /// Follow GPU ioctls (the ledger). Off, holders and teardown are still traced.
    pub ioctls: bool,
    /// No system call tracepoint at all (`--lean`): none of linger's hooks runs for a
    /// process's system calls.
    pub lean: bool,
    /// Which driver hooks to try.
    pub driver_hooks: DriverHooks,
    /// Where the driver's functions cannot be hooked, use the system call tracepoints even
    /// when the NVIDIA libraries can be (`--syscall-hooks`).
    pub syscall_hooks: bool,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            ring_size: 1 << 22,
            fatal_signals: DEFAULT_FATAL_SIGNALS.to_vec(),
            bench_pid: None,
            gpu_devices: GpuDevices::default(),
            sample_hz: 4999,
            ioctls: true,
            lean: false,
            driver_hooks: DriverHooks::Auto,
            syscall_hooks: false,
        }
    }
}

/// Loaded and attached programs. Dropping it detaches everything.
pub struct Probes {
    pub(super) ebpf: Ebpf,
    /// Owns the log map: the programs fail to load without it, so it lives as long as they do.
    logger: Option<EbpfLogger<&'static dyn log::Log>>,
    strategy: Strategy,
    /// Attached only while a GPU process dies.
    sampler: Option<Sampler>,
    /// What is attached, for the strategy record.
    attached: Vec<String>,
    /// When the programs were last asked to walk processes (see `search`).
    pub(super) searching_since: Option<Instant>,
    /// Whether the ioctl tracepoint goes with the others when the driver comes.
    ioctls: bool,
}

impl Probes {
    pub fn load(config: &ProbeConfig) -> Result<Self> {
        privileges::require("tracing", privileges::TRACE)?;
        tracefs::ensure_mounted()?;
        let vmlinux = offsets::load_vmlinux()?;
        let offsets = offsets::resolve(&vmlinux)?;
        let has_group_dead = offsets::exit_has_group_dead(&vmlinux)?;
        let mask = config
            .fatal_signals
            .iter()
            .filter(|s| (1..64).contains(*s))
            .fold(0u64, |m, s| m | 1 << s);
        let bench_pid = config.bench_pid.unwrap_or(0);
        // The programs format a log record only at a level the log crate would print: a
        // debug line per fatal signal otherwise costs every kill a record and a wake-up.
        let log_level = log::max_level() as u8;
        let xid_layout = xid::layout();
        let mut ebpf = EbpfLoader::new()
            .override_global(aya_log::LEVEL, &log_level, true)
            .override_global("OFFSETS", &offsets, true)
            .override_global("FATAL_SIGNALS", &mask, true)
            .override_global("BENCH_PID", &bench_pid, true)
            .override_global("SELF_PID", &std::process::id(), true)
            .override_global("LEAN", &u32::from(config.lean), true)
            .override_global(
                "XID_LAYOUT",
                xid_layout.as_ref().unwrap_or(&XidLayout::default()),
                true,
            )
            .map_max_entries("EVENTS", config.ring_size)
            .load(EBPF_OBJECT)
            .map_err(|e| Error::Load(e.to_string()))?;
        let logger = match EbpfLogger::init(&mut ebpf) {
            Ok(l) => Some(l),
            Err(e) => {
                debug!("eBPF logging unavailable: {e}");
                None
            }
        };
        let btf = Btf::from_sys_fs().map_err(|e| Error::Btf(e.to_string()))?;
        let mut probes = Self {
            ebpf,
            logger,
            strategy: Strategy::default(),
            sampler: None,
            attached: Vec::new(),
            searching_since: None,
            ioctls: false,
        };

        let exit_program = if has_group_dead {
            "task_exit_group_dead"
        } else {
            "task_exit_legacy"
        };
        for (program, tracepoint) in [
            ("signal_generate", "signal_generate"),
            ("process_fork", "sched_process_fork"),
            ("process_exec", "sched_process_exec"),
            (exit_program, "sched_process_exit"),
            ("process_free", "sched_process_free"),
            ("signal_deliver", "signal_deliver"),
        ] {
            probes.attach_btf(program, tracepoint, &btf)?;
        }
        // The OOM killer's victims; fires only when it kills.
        if tracefs::has_event("oom", "mark_victim") {
            probes.attach_tracepoint("oom_victim", "oom", "mark_victim")?;
        }
        let xid_tracepoint = probes.attach_xids(xid_layout);
        probes.fill_gpu_devices(&config.gpu_devices)?;
        probes.strategy = strategy::attach(&mut probes.ebpf, config.driver_hooks, Some(&btf))?;
        // The driver's own open and ioctl entries replace the system call tracepoints where
        // they are hooked, unless a declared `--gpu-device` (no driver behind it) needs them.
        let by_driver = !config.lean
            && config.gpu_devices.devs.is_empty()
            && strategy::driver_answers(&probes.strategy);
        if by_driver {
            probes.answer_by_driver()?;
        }
        // Next best: the NVIDIA libraries' own calls, which trap only in the processes that
        // load them.
        let by_library = !config.lean
            && !by_driver
            && !config.syscall_hooks
            && config.gpu_devices.devs.is_empty()
            && library::hook(
                &mut probes.ebpf,
                &mut probes.strategy,
                &mut probes.attached,
                config.ioctls,
            );
        // No NVIDIA driver registered and no device declared: no GPU file can be opened
        // until the driver comes (`watch_driver`), so the system call tracepoints would
        // see nothing of GPUs.
        let no_driver = !config.lean
            && !by_driver
            && !by_library
            && !config.syscall_hooks
            && strategy::no_gpu_files(&config.gpu_devices);
        // Any system call tracepoint sends every system call of every task through the slow
        // path: --lean, the driver's or the libraries' hooks, and no driver at all attach none.
        if !(config.lean || by_driver || by_library || no_driver) {
            probes.attach_syscall_hooks(config.ioctls)?;
        }
        if no_driver {
            probes.strategy.no_driver = true;
            probes.strategy.unseen = NO_DRIVER_UNSEEN.iter().map(|s| s.to_string()).collect();
            probes
                .strategy
                .reasons
                .push(strategy::NO_DRIVER_REASON.into());
            probes.ioctls = config.ioctls;
        }
        // The search's slot is filled before the scheduler hook that jumps to it is loaded:
        // filled later, the kernel would patch the jump into a program running on every
        // context switch (a guest locked up once doing so).
        probes.load_search(&btf);
        probes.attach_btf("teardown_switch", "sched_switch", &btf)?;
        probes.attach_btf("teardown_wakeup", "sched_wakeup", &btf)?;
        if config.sample_hz > 0 {
            probes.sampler = Some(Sampler::load(&mut probes.ebpf, config.sample_hz)?);
        }
        if config.bench_pid.is_some() {
            probes.attach_tracepoint("bench_tick", "syscalls", "sys_enter_getppid")?;
        }
        probes.strategy.xid_tracepoint = xid_tracepoint.is_ok();
        probes.strategy.reasons.push(match xid_tracepoint {
            Ok(()) => format!("{}tracepoint nvidia/nvidia_dev_xid", super::xid::REASONS),
            Err(why) => format!("{}{why}", super::xid::REASONS),
        });
        if config.lean {
            probes.strategy.lean = true;
            probes.strategy.unseen = LEAN_UNSEEN.iter().map(|s| s.to_string()).collect();
        }
        if config.sample_hz > 0 {
            probes
                .attached
                .push("perf_event/cpu-clock (while a GPU process dies)".into());
        }
        probes.strategy.hooks = std::mem::take(&mut probes.attached);
        probes.strategy.hooks.extend(
            probes
                .strategy
                .fput
                .map(|k| format!("{k:?}/__fput").to_lowercase()),
        );
        let driver: Vec<String> = probes
            .strategy
            .driver_functions
            .iter()
            .map(|f| format!("kprobe/{f}"))
            .collect();
        probes.strategy.hooks.extend(driver);
        // Every program is attached: deaths are followed from now on, each seen whole.
        probes.set_flag("ARMED", 1)?;
        Ok(probes)
    }

    /// The driver's GPU-error tracepoint, where it exists with a known layout; it fires only on
    /// GPU errors. Why not, otherwise (the kernel log is read instead).
    fn attach_xids(
        &mut self,
        layout: std::result::Result<XidLayout, String>,
    ) -> std::result::Result<(), String> {
        layout?;
        self.attach_tracepoint("gpu_xid", "nvidia", "nvidia_dev_xid")
            .map_err(|e| e.to_string())
    }

    fn attach_btf(&mut self, program: &str, tracepoint: &str, btf: &Btf) -> Result<()> {
        self.attach(program, Hook::TpBtf(tracepoint), Some(btf))
    }

    fn attach_tracepoint(&mut self, program: &str, category: &str, name: &str) -> Result<()> {
        self.attach(program, Hook::Tracepoint { category, name }, None)
    }

    fn attach(&mut self, program: &str, hook: Hook, btf: Option<&Btf>) -> Result<()> {
        // The link belongs to the program: it lasts as long as `ebpf`.
        attach::attach(&mut self.ebpf, program, &hook, btf)?;
        self.attached.push(hook.to_string());
        Ok(())
    }

    /// The system call tracepoints that see GPU files' opens, dups, closes and ioctls, and
    /// wait4. Exits only: an entry hook would be a second tracepoint call on every system call
    /// of every process.
    fn attach_syscall_hooks(&mut self, ioctls: bool) -> Result<()> {
        const HOOKS: [(&str, &[&str]); 5] = [
            ("wait4_exit", &["sys_exit_wait4"]),
            (
                "fd_installed",
                &[
                    "sys_exit_open",
                    "sys_exit_openat",
                    "sys_exit_openat2",
                    "sys_exit_dup",
                    "sys_exit_dup2",
                    "sys_exit_dup3",
                ],
            ),
            ("fcntl_exit", &["sys_exit_fcntl"]),
            ("fd_close", &["sys_exit_close"]),
            ("fd_close_range", &["sys_exit_close_range"]),
        ];
        for (program, syscalls) in HOOKS {
            self.attach_syscalls(program, syscalls)?;
        }
        if ioctls {
            self.attach_syscalls("ioctl_exit", &["sys_exit_ioctl"])?;
        }
        Ok(())
    }

    /// Attaches one program to several syscall tracepoints; those this kernel lacks (open on
    /// architectures without it, openat2 before 5.6) are skipped.
    fn attach_syscalls(&mut self, program: &str, names: &[&str]) -> Result<()> {
        let present: Vec<&str> = names
            .iter()
            .copied()
            .filter(|name| {
                let there = tracefs::has_event("syscalls", name);
                if !there {
                    debug!("{program}: no tracepoint syscalls/{name} on this kernel");
                }
                there
            })
            .collect();
        if present.is_empty() {
            let hook = Hook::Tracepoint {
                category: "syscalls",
                name: names[0],
            };
            let cause = Cause::NoAttachPoint(names.join(", "));
            return Err(AttachError::new(program, &hook, cause).into());
        }
        for name in present {
            self.attach_tracepoint(program, "syscalls", name)?;
        }
        Ok(())
    }

    /// Tells the driver's open and ioctl programs that they answer for the system call hooks.
    /// The driver's hooked functions answer opens and ioctls: the programs are told, and the
    /// strategy says what that leaves unseen.
    fn answer_by_driver(&mut self) -> Result<()> {
        self.set_flag("DRIVER_ANSWERS", 1)?;
        self.strategy.by_driver = true;
        self.strategy.unseen = BY_DRIVER_UNSEEN.iter().map(|s| s.to_string()).collect();
        Ok(())
    }

    /// Sets slot 0 of the one-slot array `name`, a flag the programs read.
    fn flag(&mut self, name: &str) -> Option<u32> {
        let flag: Array<_, u32> = Array::try_from(self.ebpf.map_mut(name)?).ok()?;
        flag.get(&0, 0).ok()
    }

    pub(super) fn set_flag(&mut self, name: &str, v: u32) -> Result<()> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| Error::Load(format!("map {name} missing")))?;
        let mut flag: Array<_, u32> =
            Array::try_from(map).map_err(|e| Error::Load(e.to_string()))?;
        flag.set(0, v, 0).map_err(|e| Error::Load(e.to_string()))
    }

    /// Tells the programs which devices are GPU files, and who held them before we started.
    fn fill_gpu_devices(&mut self, devices: &GpuDevices) -> Result<()> {
        let mut majors: HashMap<_, u32, u8> = self.map_mut("GPU_MAJORS")?;
        for &major in &devices.majors {
            majors
                .insert(major, 1, 0)
                .map_err(|e| Error::Load(e.to_string()))?;
        }
        let mut devs: HashMap<_, u32, u8> = self.map_mut("GPU_DEVS")?;
        for &dev in &devices.devs {
            devs.insert(dev, 1, 0)
                .map_err(|e| Error::Load(e.to_string()))?;
        }
        Ok(())
    }

    /// Where tracing began without an NVIDIA driver: once /proc/devices lists its majors,
    /// tells the programs about them and attaches the system call tracepoints (once, whatever
    /// comes of it: the strategy's `reasons` says). The driver's devices, when it came.
    pub fn watch_driver(&mut self) -> Option<GpuDevices> {
        if !self.strategy.no_driver {
            return None;
        }
        let listing = crate::source::machine::proc_devices().ok()?;
        let devices = GpuDevices {
            majors: devices::nvidia_majors(&listing),
            devs: Vec::new(),
        };
        if devices.majors.is_empty() {
            return None;
        }
        self.strategy.no_driver = false;
        let attached = self
            .fill_gpu_devices(&devices)
            .and_then(|()| self.answer_late_driver());
        self.strategy.reasons.push(match attached {
            Ok(how) => format!(
                "NVIDIA driver registered after start (majors {:?}): {how}, holders from a /proc \
                 snapshot",
                devices.majors
            ),
            Err(e) => format!(
                "NVIDIA driver registered after start: its hooks could not be attached ({e})"
            ),
        });
        let new = std::mem::take(&mut self.attached);
        self.strategy.hooks.extend(new);
        Some(devices)
    }

    /// The driver registered after start: its own functions answer where the kernel let
    /// `__fput` be hooked at start (kprobes or fentry), as they would have then; next, the
    /// NVIDIA libraries, looked for again (a driver container installs them with the module);
    /// else the system call tracepoints.
    fn answer_late_driver(&mut self) -> Result<&'static str> {
        if self.strategy.fput.is_some() && self.strategy.requested != DriverHooks::Off {
            strategy::attach_driver(&mut self.ebpf, &mut self.strategy);
            let kprobes = self.strategy.driver_functions.iter();
            self.attached.extend(kprobes.map(|f| format!("kprobe/{f}")));
            if strategy::driver_answers(&self.strategy) {
                self.answer_by_driver()?;
                return Ok("its own functions hooked, no system call tracepoint");
            }
        }
        if library::hook(
            &mut self.ebpf,
            &mut self.strategy,
            &mut self.attached,
            self.ioctls,
        ) {
            return Ok("the NVIDIA libraries' calls hooked, no system call tracepoint");
        }
        self.attach_syscall_hooks(self.ioctls)?;
        self.strategy.unseen.clear();
        Ok("system call tracepoints attached")
    }

    /// Marks processes found holding GPU files before tracing began.
    pub fn add_holders(&mut self, pids: impl IntoIterator<Item = u32>) -> Result<()> {
        let mut holders: HashMap<_, u32, u8> = self.map_mut("HOLDERS")?;
        for pid in pids {
            holders
                .insert(pid, 1, 0)
                .map_err(|e| Error::Load(e.to_string()))?;
        }
        Ok(())
    }

    pub(super) fn map_mut<K: aya::Pod, V: aya::Pod>(
        &mut self,
        name: &str,
    ) -> Result<HashMap<&mut MapData, K, V>> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| Error::Load(format!("map {name} missing")))?;
        HashMap::try_from(map).map_err(|e| Error::Load(e.to_string()))
    }

    /// The driver hooks chosen, and why.
    /// Each loaded program's name with a descriptor of its own, which outlives `self`: the
    /// kernel's statistics of the programs are read through them.
    pub fn program_fds(&self) -> Vec<(String, OwnedFd)> {
        self.ebpf
            .programs()
            .filter_map(|(name, p)| {
                let fd = p.fd().ok()?.as_fd().try_clone_to_owned().ok()?;
                Some((name.to_string(), fd))
            })
            .collect()
    }

    pub fn strategy(&self) -> &Strategy {
        &self.strategy
    }

    /// Takes the ring buffer out for the reader.
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map("EVENTS")
            .ok_or_else(|| Error::Load("map EVENTS missing".into()))?;
        RingBuf::try_from(map).map_err(|e| Error::Load(e.to_string()))
    }

    /// Takes the kernel stack map out for the symbolizer.
    pub fn take_stacks(&mut self) -> Result<StackTraceMap<MapData>> {
        let map = self
            .ebpf
            .take_map("STACKS")
            .ok_or_else(|| Error::Load("map STACKS missing".into()))?;
        StackTraceMap::try_from(map).map_err(|e| Error::Load(e.to_string()))
    }

    /// Clears the programs' "someone is dying" hint once nobody is, so the scheduler hooks
    /// cost one array read; sets it again if a process started dying meanwhile.
    pub fn refresh_dying_hint(&mut self) {
        // Clear already: nothing to look at (walking the empty hash map costs a scan of all
        // its buckets, every tick).
        if self.flag("DYING_HINT") == Some(0) {
            return;
        }
        let empty = |p: &mut Self| -> Option<bool> {
            let dying: HashMap<_, u32, u64> = p.map_mut("DYING").ok()?;
            Some(dying.keys().next().is_none())
        };
        if empty(self) != Some(true) {
            return;
        }
        // A failed write leaves the hint set: the hooks then only look up DYING.
        let _ = self.set_flag("DYING_HINT", 0);
        if empty(self) == Some(false) {
            let _ = self.set_flag("DYING_HINT", 1);
        }
    }

    /// Samples on-CPU stacks on every CPU while a GPU holder may be dying (the programs' hint;
    /// an unreadable one says yes), or stops; see [`Sampler`].
    pub fn sample_while_dying(&mut self) -> Result<()> {
        if self.sampler.is_none() {
            return Ok(());
        }
        let on = self.flag("DYING_HINT") != Some(0);
        match &mut self.sampler {
            Some(sampler) => sampler.set(&mut self.ebpf, on),
            None => Ok(()),
        }
    }

    /// Takes the per-CPU drop counter out for the reader.
    pub fn take_drops(&mut self) -> Result<PerCpuArray<MapData, u64>> {
        let map = self
            .ebpf
            .take_map("DROPS")
            .ok_or_else(|| Error::Load("map DROPS missing".into()))?;
        PerCpuArray::try_from(map).map_err(|e| Error::Load(e.to_string()))
    }

    /// Forwards pending log lines of the programs to the `log` crate.
    pub fn flush_logs(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }
}
