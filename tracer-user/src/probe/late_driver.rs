//! A driver that registers after tracing began: where no GPU file could exist at start, nothing
//! was attached for them; when the driver comes, the mode is chosen as at start.

use super::{
    attach,
    devices::{self, GpuDevices},
    load::Probes,
    strategy::{self, Wanted},
};
use crate::{
    error::Result,
    event::{DriverHooks, Mode},
};

impl Probes {
    /// Where tracing began without an NVIDIA driver: once /proc/devices lists its majors,
    /// tells the programs about them and attaches what the mode then chosen needs (once,
    /// whatever comes of it: the strategy's `reasons` says). The driver's devices, when it
    /// came.
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
            .and_then(|()| self.fill_driver_text().map(drop))
            .and_then(|()| self.answer_late_driver(&devices));
        self.strategy.reasons.push(match attached {
            Ok(how) => format!(
                "NVIDIA driver registered after start (majors {:?}): {how}, holders from a /proc \
                 snapshot",
                devices.majors
            ),
            Err(e) => format!(
                "NVIDIA driver registered after start: its hooks could not be attached ({})",
                attach::chain(&e)
            ),
        });
        let new = std::mem::take(&mut self.attached);
        self.strategy.hooks.extend(new);
        Some(devices)
    }

    /// The driver's own functions are hooked where the kernel let `__fput` be hooked at start
    /// (kprobes or fentry), as they would have been then; then the mode is chosen as at start
    /// (the NVIDIA libraries are looked for again: a driver container installs them with the
    /// module).
    fn answer_late_driver(&mut self, devices: &GpuDevices) -> Result<&'static str> {
        if self.strategy.fput.is_some() && self.strategy.requested != DriverHooks::Off {
            strategy::attach_driver(&mut self.ebpf, &mut self.strategy);
            let kprobes = self.strategy.driver_functions.iter();
            self.attached.extend(kprobes.map(|f| format!("kprobe/{f}")));
        }
        let wanted = Wanted {
            lean: false,
            syscall_hooks: false,
            devices,
            ioctls: self.ioctls,
        };
        Ok(match self.choose_mode(&wanted)? {
            Mode::Driver => "its own functions hooked, no system call tracepoint",
            Mode::Libraries => "the NVIDIA libraries' calls hooked, no system call tracepoint",
            _ => "system call tracepoints attached",
        })
    }
}
