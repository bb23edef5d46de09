//! The on-CPU stack sampler, attached only while a GPU process is dying: a perf cpu-clock
//! event per CPU interrupts every CPU thousands of times a second, which costs even when the
//! program returns at once (dearly in VMs), so it is off while nobody dies.

use aya::{programs::perf_event::PerfEventLink, util::online_cpus, Ebpf};

use super::attach::{self, attach_all, AttachError, Cause, Hook};
use crate::error::{Error, Result};

const PROGRAM: &str = "teardown_oncpu";

pub struct Sampler {
    hz: u64,
    cpus: Vec<u32>,
    /// One per CPU while on; each detaches when dropped, so the sampler's own drop (or
    /// turning it off) releases every perf event.
    links: Vec<PerfEventLink>,
}

impl Sampler {
    /// Loads the program (so a refusal shows at start) without attaching it.
    pub fn load(ebpf: &mut Ebpf, hz: u64) -> Result<Self> {
        let cpus = online_cpus().map_err(|(path, source)| Error::OnlineCpus { path, source })?;
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
            self.links.clear();
            return Ok(());
        }
        let hooks: Vec<(&str, Hook)> = self
            .cpus
            .iter()
            .map(|&cpu| (PROGRAM, Hook::PerfEvent { cpu, hz: self.hz }))
            .collect();
        let hook = Hook::PerfEvent {
            cpu: 0,
            hz: self.hz,
        };
        let mut taken = Vec::with_capacity(hooks.len());
        let mut refused = None;
        for link in attach_all(ebpf, &hooks, None)? {
            if refused.is_some() {
                // The program stays loaded but runs nowhere; nothing more to undo.
                let _ = attach::detach(ebpf, link);
                continue;
            }
            match attach::take_perf_event(ebpf, link) {
                Ok(owned) => taken.push(owned),
                Err(e) => refused = Some(AttachError::new(PROGRAM, &hook, Cause::from(e))),
            }
        }
        // On a refusal, the links taken detach as `taken` drops.
        if let Some(e) = refused {
            return Err(e.into());
        }
        self.links = taken;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::attach::tests::{link_fds, loaded_object};

    /// Loads the real program: turning the sampler on opens a perf event on every CPU,
    /// dropping it closes them all.
    #[test]
    fn dropping_the_sampler_detaches_its_perf_events() {
        let mut ebpf = loaded_object();
        let before = link_fds();
        let mut sampler = Sampler::load(&mut ebpf, 99).expect("loading the sampler");
        sampler.set(&mut ebpf, true).expect("attaching the sampler");
        assert!(sampler.is_on());
        assert!(
            link_fds() >= before + sampler.cpus.len(),
            "no perf event opened"
        );
        drop(sampler);
        assert_eq!(link_fds(), before, "the sampler's perf events outlived it");
    }
}
