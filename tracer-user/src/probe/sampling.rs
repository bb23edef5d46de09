//! The on-CPU stack sampler, attached only while a GPU process is dying: a perf cpu-clock
//! event per CPU interrupts every CPU thousands of times a second, which costs even when the
//! program returns at once (dearly in VMs), so it is off while nobody dies.

use aya::{util::online_cpus, Ebpf};

use super::attach::{self, attach_all, AttachError, Cause, Hook};
use crate::error::{Error, Result};

const PROGRAM: &str = "teardown_oncpu";

pub struct Sampler {
    hz: u64,
    cpus: Vec<u32>,
    links: Vec<attach::Link>,
}

impl Sampler {
    /// Loads the program (so a refusal shows at start) without attaching it.
    pub fn load(ebpf: &mut Ebpf, hz: u64) -> Result<Self> {
        let cpus = online_cpus().map_err(|(path, e)| Error::Load(format!("{path}: {e}")))?;
        attach::load(ebpf, PROGRAM, &Hook::PerfEvent { cpu: 0, hz }, None)?;
        Ok(Self {
            hz,
            cpus,
            links: Vec::new(),
        })
    }

    pub fn is_on(&self) -> bool {
        !self.links.is_empty()
    }

    /// Attaches a sampler to every CPU, or detaches them all; a CPU refused leaves none.
    pub fn set(&mut self, ebpf: &mut Ebpf, on: bool) -> Result<()> {
        if on == self.is_on() {
            return Ok(());
        }
        if !on {
            let hook = Hook::PerfEvent {
                cpu: 0,
                hz: self.hz,
            };
            for link in self.links.drain(..) {
                attach::detach(ebpf, link)
                    .map_err(|e| AttachError::new(PROGRAM, &hook, Cause::from(e)))?;
            }
            return Ok(());
        }
        let hooks: Vec<(&str, Hook)> = self
            .cpus
            .iter()
            .map(|&cpu| (PROGRAM, Hook::PerfEvent { cpu, hz: self.hz }))
            .collect();
        self.links = attach_all(ebpf, &hooks, None)?;
        Ok(())
    }
}
