//! What differs between the x86-64 guests and the arm64 (Grace) ones: the emulator and its
//! machine, the kernels, and the tools that build the stand-in driver and library for them.
//! The arm64 guests run on this x86-64 machine under qemu's TCG like the x86-64 ones; their
//! module is cross-built with Debian's own way of doing it: the arm64 headers with the amd64
//! kbuild tools of the same version, and gcc-aarch64-linux-gnu.

use std::{process::Command, time::Duration};

use crate::build::Arch;

#[derive(Clone, Copy)]
pub struct Guest {
    pub arch: Arch,
}

impl Guest {
    /// Debian's name of the architecture, as its packages are qualified (`name:arm64`).
    pub fn debian_arch(self) -> &'static str {
        match self.arch {
            Arch::Host => "amd64",
            Arch::Aarch64 => "arm64",
        }
    }

    /// Where its kernels, modules and images are kept, under target/.
    pub fn dir(self) -> &'static str {
        match self.arch {
            Arch::Host => "target/vm",
            Arch::Aarch64 => "target/vm/arm64",
        }
    }

    /// The compiler of its stand-in module and library.
    pub fn gcc(self) -> &'static str {
        match self.arch {
            Arch::Host => "gcc",
            Arch::Aarch64 => "aarch64-linux-gnu-gcc",
        }
    }

    /// kbuild's arguments beyond the compiler: the architecture to build for.
    pub fn kbuild_args(self) -> &'static [&'static str] {
        match self.arch {
            Arch::Host => &[],
            Arch::Aarch64 => &["ARCH=arm64", "CROSS_COMPILE=aarch64-linux-gnu-"],
        }
    }

    pub fn strip(self) -> &'static str {
        match self.arch {
            Arch::Host => "strip",
            Arch::Aarch64 => "aarch64-linux-gnu-strip",
        }
    }

    /// The emulator with its machine and CPU, and the console the kernel writes to.
    pub fn qemu(self) -> (Command, &'static str) {
        match self.arch {
            Arch::Host => (Command::new("qemu-system-x86_64"), "ttyS0"),
            Arch::Aarch64 => {
                let mut qemu = Command::new("qemu-system-aarch64");
                // virt's default network card needs a boot ROM the package leaves out.
                qemu.args(["-M", "virt", "-nic", "none"]);
                (qemu, "ttyAMA0")
            }
        }
    }

    /// How long its whole run (boot, doctor, the scenarios, the host tests) may take before the
    /// guest counts as hung. The x86-64 run took 102 s under TCG on two busy cores (6.1,
    /// 2026-12-04), before the group kills' two 120 s churns; an emulated arm64 CPU is the
    /// slower one.
    pub fn limit(self) -> Duration {
        match self.arch {
            Arch::Host => Duration::from_secs(900),
            Arch::Aarch64 => Duration::from_secs(1500),
        }
    }
}
