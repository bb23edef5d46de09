//! Loads the tracer's programs with their globals and attaches them.

use std::{
    os::fd::{AsFd, OwnedFd},
    time::Instant,
};

use aya::{Btf, Ebpf, EbpfLoader};
use aya_log::EbpfLogger;
use log::debug;
use tracer_common::XidLayout;

use super::{
    attach::{self, AttachError, Cause, Hook},
    config::ProbeConfig,
    hooks::{self, Entry, Kernel},
    object::EBPF_OBJECT,
    offsets,
    sampling::Sampler,
    strategy::{self, Wanted},
    tracefs, xid,
};
use crate::{
    error::{BtfError, Result},
    event::{Mode, Strategy},
    privileges,
};

/// Loaded and attached programs. Dropping it detaches everything.
pub struct Probes {
    pub(super) ebpf: Ebpf,
    /// Owns the log map: the programs fail to load without it, so it lives as long as they do.
    pub(super) logger: Option<EbpfLogger<&'static dyn log::Log>>,
    pub(super) strategy: Strategy,
    /// Attached only while a GPU process dies.
    pub(super) sampler: Option<Sampler>,
    /// What is attached, for the strategy record.
    pub(super) attached: Vec<String>,
    /// When the programs were last asked to walk processes (see `search`).
    pub(super) searching_since: Option<Instant>,
    /// Whether the ioctl tracepoint goes with the others when the driver comes.
    pub(super) ioctls: bool,
    /// A process the last look found dying (see `refresh_dying_hint`): the hint is set.
    pub(super) dying_seen: Option<u32>,
    /// The hint was cleared since the sampler last read it.
    pub(super) hint_cleared: bool,
    /// See `ProbeConfig::stuck_after_ns`.
    stuck_after_ns: u64,
}

impl Probes {
    pub fn load(config: &ProbeConfig) -> Result<Self> {
        privileges::require("tracing", privileges::TRACE)?;
        tracefs::ensure_mounted()?;
        let vmlinux = offsets::load_vmlinux()?;
        let kernel = Kernel {
            group_dead: offsets::exit_has_group_dead(&vmlinux)?,
        };
        let xid_layout = xid::layout();
        let mut probes = Self::new(load_object(config, &vmlinux, xid_layout.as_ref().ok())?);
        let btf = Btf::from_sys_fs().map_err(BtfError::Loader)?;
        probes.attach_entries(&hooks::PROCESSES, &kernel, &btf)?;
        let xid_tracepoint = probes.attach_xids(xid_layout);
        probes.fill_gpu_devices(&config.gpu_devices)?;
        let pieces = probes.fill_driver_text()?;
        debug!("the driver's code: {pieces} pieces");
        probes.strategy = strategy::attach(&mut probes.ebpf, config.driver_hooks, Some(&btf))?;
        probes.ioctls = config.ioctls;
        probes.stuck_after_ns = config.stuck_after_ns;
        let wanted = Wanted {
            lean: config.lean,
            syscall_hooks: config.syscall_hooks,
            devices: &config.gpu_devices,
            ioctls: config.ioctls,
        };
        probes.choose_mode(&wanted)?;
        // The search's slot is filled before the scheduler hook that jumps to it is loaded:
        // filled later, the kernel would patch the jump into a program running on every
        // context switch (a guest locked up once doing so).
        probes.load_search(&btf);
        probes.attach_entries(&hooks::SCHEDULER, &kernel, &btf)?;
        if config.sample_hz > 0 {
            probes.sampler = Some(Sampler::load(&mut probes.ebpf, config.sample_hz)?);
        }
        if config.bench_pid.is_some() {
            probes.attach_entries(&[hooks::BENCH], &kernel, &btf)?;
        }
        probes.note_xids(xid_tracepoint);
        probes.record_hooks(config.sample_hz > 0);
        // Every program is attached: deaths are followed from now on, each seen whole.
        probes.set_flag("ARMED", 1)?;
        Ok(probes)
    }

    fn new(ebpf: Ebpf) -> Self {
        let mut ebpf = ebpf;
        let logger = match EbpfLogger::init(&mut ebpf) {
            Ok(l) => Some(l),
            Err(e) => {
                debug!("eBPF logging unavailable: {e}");
                None
            }
        };
        Self {
            ebpf,
            logger,
            strategy: Strategy::default(),
            sampler: None,
            attached: Vec::new(),
            searching_since: None,
            dying_seen: None,
            hint_cleared: false,
            ioctls: false,
            stuck_after_ns: 0,
        }
    }

    /// See `ProbeConfig::stuck_after_ns`.
    pub fn stuck_after_ns(&self) -> u64 {
        self.stuck_after_ns
    }

    /// Attaches each entry of a hook table whose gate this kernel opens.
    fn attach_entries(&mut self, entries: &[Entry], kernel: &Kernel, btf: &Btf) -> Result<()> {
        for entry in entries.iter().filter(|e| e.open(kernel)) {
            self.attach(entry.program, entry.hook, Some(btf))?;
        }
        Ok(())
    }

    /// Chooses the mode (see [`strategy::choose_mode`]), attaches what it needs and records
    /// it in the strategy.
    pub(super) fn choose_mode(&mut self, wanted: &Wanted) -> Result<Mode> {
        let mode = strategy::choose_mode(
            &mut self.ebpf,
            &mut self.strategy,
            &mut self.attached,
            wanted,
        );
        match mode {
            // The driver's open and ioctl programs answer for the system call hooks.
            Mode::Driver => self.set_flag("DRIVER_ANSWERS", 1)?,
            // Any system call tracepoint sends every system call of every task through the
            // slow path: every other mode attaches none.
            Mode::Syscalls => self.attach_syscall_hooks(wanted.ioctls)?,
            Mode::Lean | Mode::Libraries | Mode::NoDriver => {}
        }
        self.strategy.enter(mode);
        Ok(mode)
    }

    /// Records whether GPU errors come from the driver's tracepoint, and why not.
    fn note_xids(&mut self, tracepoint: std::result::Result<(), String>) {
        self.strategy.xid_tracepoint = tracepoint.is_ok();
        self.strategy.reasons.push(match tracepoint {
            Ok(()) => format!("{}tracepoint nvidia/nvidia_dev_xid", xid::REASONS),
            Err(why) => format!("{}{why}", xid::REASONS),
        });
    }

    /// The strategy's list of every hook attached: the tables', the sampler's, the driver's.
    fn record_hooks(&mut self, sampling: bool) {
        if sampling {
            self.attached
                .push("perf_event/cpu-clock (while a GPU process dies)".into());
        }
        let s = &mut self.strategy;
        s.hooks = std::mem::take(&mut self.attached);
        s.hooks
            .extend(s.fput.map(|k| format!("{k:?}/__fput").to_lowercase()));
        let driver = s.driver_functions.iter().map(|f| format!("kprobe/{f}"));
        let driver: Vec<String> = driver.collect();
        s.hooks.extend(driver);
    }

    /// The driver's GPU-error tracepoint, where it exists with a known layout; it fires only on
    /// GPU errors. Why not, otherwise (the kernel log is read instead).
    fn attach_xids(
        &mut self,
        layout: std::result::Result<XidLayout, String>,
    ) -> std::result::Result<(), String> {
        layout?;
        let hook = Hook::Tracepoint {
            category: "nvidia",
            name: "nvidia_dev_xid",
        };
        self.attach("gpu_xid", hook, None)
            .map_err(|e| e.to_string())
    }

    fn attach(&mut self, program: &str, hook: Hook, btf: Option<&Btf>) -> Result<()> {
        // The link belongs to the program: it lasts as long as `ebpf`.
        attach::attach(&mut self.ebpf, program, &hook, btf)?;
        self.attached.push(hook.to_string());
        Ok(())
    }

    /// The system call tracepoints of [`Mode::Syscalls`] (`hooks::SYSCALLS`).
    pub(super) fn attach_syscall_hooks(&mut self, ioctls: bool) -> Result<()> {
        for (program, syscalls) in hooks::SYSCALLS {
            self.attach_syscalls(program, syscalls)?;
        }
        if ioctls {
            let (program, syscalls) = hooks::SYSCALL_IOCTLS;
            self.attach_syscalls(program, syscalls)?;
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
            let hook = Hook::Tracepoint {
                category: "syscalls",
                name,
            };
            self.attach(program, hook, None)?;
        }
        Ok(())
    }

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

    /// The driver hooks and the mode chosen, and why.
    pub fn strategy(&self) -> &Strategy {
        &self.strategy
    }

    /// Forwards pending log lines of the programs to the `log` crate.
    pub fn flush_logs(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }
}

/// The object with its globals: the kernel's offsets, the signals that open an incident, who
/// linger is, and the ring buffer's size.
fn load_object(
    config: &ProbeConfig,
    vmlinux: &btf_rs::Btf,
    xid_layout: Option<&XidLayout>,
) -> Result<Ebpf> {
    let offsets = offsets::resolve(vmlinux)?;
    let mask = config
        .fatal_signals
        .iter()
        .filter(|s| (1..64).contains(*s))
        .fold(0u64, |m, s| m | 1 << s);
    let bench_pid = config.bench_pid.unwrap_or(0);
    // The programs format a log record only at a level the log crate would print: a debug
    // line per fatal signal otherwise costs every kill a record and a wake-up.
    let log_level = log::max_level() as u8;
    let ebpf = EbpfLoader::new()
        .override_global(aya_log::LEVEL, &log_level, true)
        .override_global("OFFSETS", &offsets, true)
        .override_global("FATAL_SIGNALS", &mask, true)
        .override_global("BENCH_PID", &bench_pid, true)
        .override_global("SELF_PID", &std::process::id(), true)
        .override_global("LEAN", &u32::from(config.lean), true)
        .override_global(
            "XID_LAYOUT",
            xid_layout.unwrap_or(&XidLayout::default()),
            true,
        )
        .map_max_entries("EVENTS", config.ring_size)
        .load(EBPF_OBJECT)?;
    Ok(ebpf)
}
