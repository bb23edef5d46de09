//! The on-CPU stack sampler, attached only while a GPU process is dying: a perf cpu-clock
//! event per CPU interrupts every CPU thousands of times a second, which costs even when the
//! program returns at once (dearly in VMs), so it is off while nobody dies.

use aya::{
    programs::{
        perf_event::{
            PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent,
        },
        PerfEvent,
    },
    util::online_cpus,
    Ebpf,
};

use crate::error::{Error, Result};

const PROGRAM: &str = "teardown_oncpu";

pub struct Sampler {
    hz: u64,
    cpus: Vec<u32>,
    links: Vec<PerfEventLinkId>,
}

impl Sampler {
    /// Loads the program (so a refusal shows at start) without attaching it.
    pub fn load(ebpf: &mut Ebpf, hz: u64) -> Result<Self> {
        let cpus = online_cpus().map_err(|(path, e)| Error::Load(format!("{path}: {e}")))?;
        program(ebpf)?.load().map_err(attach_error)?;
        Ok(Self {
            hz,
            cpus,
            links: Vec::new(),
        })
    }

    pub fn is_on(&self) -> bool {
        !self.links.is_empty()
    }

    /// Attaches a sampler to every CPU, or detaches them all.
    pub fn set(&mut self, ebpf: &mut Ebpf, on: bool) -> Result<()> {
        if on == self.is_on() {
            return Ok(());
        }
        let program = program(ebpf)?;
        if !on {
            for link in self.links.drain(..) {
                program.detach(link).map_err(attach_error)?;
            }
            return Ok(());
        }
        for &cpu in &self.cpus {
            let link = program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(self.hz),
                    false,
                )
                .map_err(attach_error)?;
            self.links.push(link);
        }
        Ok(())
    }
}

fn program(ebpf: &mut Ebpf) -> Result<&mut PerfEvent> {
    ebpf.program_mut(PROGRAM)
        .ok_or_else(|| Error::Load(format!("{PROGRAM} missing from the object")))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| Error::Load(e.to_string()))
}

fn attach_error(e: aya::programs::ProgramError) -> Error {
    Error::Attach {
        program: format!("{PROGRAM} (perf_event cpu-clock)"),
        reason: e.to_string(),
    }
}
