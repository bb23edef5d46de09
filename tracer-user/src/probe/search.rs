//! Asking the programs to walk the descriptor tables of given processes at their next context
//! switch (tracer-ebpf's `search`): how holders that no hook saw get their files are found.

use std::time::{Duration, Instant};

use aya::{
    maps::{HashMap, ProgramArray},
    Btf,
};
use log::{debug, warn};

use super::{attach, attach::Hook, Probes};
use crate::error::{ObjectError, Result};

/// A process that has not run for this long after the request is left out (it holds its
/// files asleep; it shows when it wakes or dies, or in `linger holders`).
const SEARCH_FOR: Duration = Duration::from_secs(30);

impl Probes {
    /// Loads the walk the scheduler hook jumps to (it must be loaded for the same attach point)
    /// and puts it in its slot. Without it, holders no hook saw stay unnamed: said, not fatal.
    pub(super) fn load_search(&mut self, btf: &Btf) {
        if let Err(e) = self.try_load_search(btf) {
            warn!(
                "the search for holders no hook saw is unavailable: {}",
                attach::chain(&e)
            );
        }
    }

    fn try_load_search(&mut self, btf: &Btf) -> Result<()> {
        let hook = Hook::TpBtf("sched_switch");
        attach::load(&mut self.ebpf, "search_walk", &hook, Some(btf))?;
        let program = self
            .ebpf
            .program("search_walk")
            .ok_or_else(|| ObjectError::MissingProgram("search_walk".into()))?;
        let fd = program
            .fd()
            .and_then(|fd| fd.try_clone().map_err(Into::into))
            .map_err(|source| ObjectError::Program {
                name: "search_walk".into(),
                source,
            })?;
        let map = self
            .ebpf
            .map_mut("SEARCH_WALK")
            .ok_or_else(|| ObjectError::MissingMap("SEARCH_WALK".into()))?;
        let mut slots = ProgramArray::try_from(map).map_err(ObjectError::map("SEARCH_WALK"))?;
        slots
            .set(0, &fd, 0)
            .map_err(ObjectError::map("SEARCH_WALK"))?;
        Ok(())
    }

    /// Walks `pids` (their descriptors come as `held_at_search` records) at their next switch.
    pub fn search(&mut self, pids: &[u32]) -> Result<()> {
        let mut wanted: HashMap<_, u32, u8> = self.map_mut("SEARCH")?;
        for &pid in pids {
            // A full map leaves the rest unwalked; they are still listed by `linger holders`.
            if let Err(e) = wanted.insert(pid, 1, 0) {
                debug!("search: pid {pid} not asked for: {e}");
            }
        }
        self.set_flag("SEARCH_HINT", 1)?;
        self.searching_since = Some(Instant::now());
        Ok(())
    }

    /// Ends the search once every process asked for was walked, or after [`SEARCH_FOR`].
    pub fn refresh_search(&mut self) {
        let Some(since) = self.searching_since else {
            return;
        };
        let Ok(mut wanted) = self.map_mut::<u32, u8>("SEARCH") else {
            return;
        };
        let left: Vec<u32> = wanted.keys().flatten().collect();
        if !left.is_empty() && since.elapsed() < SEARCH_FOR {
            return;
        }
        for pid in left {
            let _ = wanted.remove(&pid);
        }
        if self.set_flag("SEARCH_HINT", 0).is_ok() {
            self.searching_since = None;
        }
    }
}
