//! The programs' maps as user space reads and fills them: flags, the GPU devices, the holders
//! found before tracing, and the maps taken out for the readers.

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, RingBuf, StackTraceMap};

use log::warn;
use tracer_common::{
    asleep::Asleep,
    driver_text::{TextRange, DRIVER_TEXT_RANGES},
};

use super::{devices::GpuDevices, load::Probes};
use crate::{
    error::{ObjectError, Result},
    source::kallsyms::{Kallsyms, DRIVER_MODULES},
};

impl Probes {
    /// Slot 0 of the one-slot array `name`, a flag the programs read.
    fn flag(&mut self, name: &str) -> Option<u32> {
        let flag: Array<_, u32> = Array::try_from(self.ebpf.map_mut(name)?).ok()?;
        flag.get(&0, 0).ok()
    }

    /// Sets slot 0 of the one-slot array `name`.
    pub(super) fn set_flag(&mut self, name: &str, v: u32) -> Result<()> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| ObjectError::MissingMap(name.into()))?;
        let mut flag: Array<_, u32> = Array::try_from(map).map_err(ObjectError::map(name))?;
        flag.set(0, v, 0).map_err(ObjectError::map(name))?;
        Ok(())
    }

    /// Tells the programs which devices are GPU files.
    pub(super) fn fill_gpu_devices(&mut self, devices: &GpuDevices) -> Result<()> {
        self.insert_all("GPU_MAJORS", devices.majors.iter().copied())?;
        self.insert_all("GPU_DEVS", devices.devs.iter().copied())
    }

    /// Tells the programs where the driver's code is (see `driver_text` in the programs), from
    /// /proc/kallsyms: without it (no driver loaded, addresses hidden) no thread is ever seen
    /// inside the driver, and a release is timed as before. The ranges told.
    pub(super) fn fill_driver_text(&mut self) -> Result<usize> {
        let mut ranges = Kallsyms::load().module_text(&DRIVER_MODULES);
        let room = DRIVER_TEXT_RANGES as usize;
        if ranges.len() > room {
            // The largest: a stack deep in the driver has a frame in its main code.
            ranges.sort_by_key(|(s, e)| std::cmp::Reverse(e - s));
            warn!(
                "the driver's code is in {} pieces; {room} told to the programs",
                ranges.len()
            );
            ranges.truncate(room);
        }
        let name = "DRIVER_TEXT";
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| ObjectError::MissingMap(name.into()))?;
        let mut text: Array<_, TextRange> = Array::try_from(map).map_err(ObjectError::map(name))?;
        for (i, &(start, end)) in ranges.iter().enumerate() {
            let range = TextRange { start, end };
            text.set(i as u32, range, 0)
                .map_err(ObjectError::map(name))?;
        }
        Ok(ranges.len())
    }

    /// Marks processes found holding GPU files before tracing began.
    pub fn add_holders(&mut self, pids: impl IntoIterator<Item = u32>) -> Result<()> {
        self.insert_all("HOLDERS", pids)
    }

    /// Inserts each key into the set `name` (a hash map whose values are unused).
    fn insert_all(&mut self, name: &str, keys: impl IntoIterator<Item = u32>) -> Result<()> {
        let mut set: HashMap<_, u32, u8> = self.map_mut(name)?;
        for key in keys {
            set.insert(key, 1, 0).map_err(ObjectError::map(name))?;
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
            .ok_or_else(|| ObjectError::MissingMap(name.into()))?;
        Ok(HashMap::try_from(map).map_err(ObjectError::map(name))?)
    }

    fn take_map(&mut self, name: &str) -> Result<Map, ObjectError> {
        self.ebpf
            .take_map(name)
            .ok_or_else(|| ObjectError::MissingMap(name.into()))
    }

    /// Takes the ring buffer out for the reader.
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>> {
        let map = self.take_map("EVENTS")?;
        Ok(RingBuf::try_from(map).map_err(ObjectError::map("EVENTS"))?)
    }

    /// Takes the kernel stack map out for the symbolizer.
    pub fn take_stacks(&mut self) -> Result<StackTraceMap<MapData>> {
        let map = self.take_map("STACKS")?;
        Ok(StackTraceMap::try_from(map).map_err(ObjectError::map("STACKS"))?)
    }

    /// Takes the holders' uninterruptible sleeps and their stacks out for the stuck watch.
    pub fn take_asleep(
        &mut self,
    ) -> Result<(HashMap<MapData, u32, Asleep>, StackTraceMap<MapData>)> {
        let sleeps = self.take_map("HOLDERS_ASLEEP")?;
        let sleeps = HashMap::try_from(sleeps).map_err(ObjectError::map("HOLDERS_ASLEEP"))?;
        let stacks = self.take_map("ASLEEP_STACKS")?;
        let stacks = StackTraceMap::try_from(stacks).map_err(ObjectError::map("ASLEEP_STACKS"))?;
        Ok((sleeps, stacks))
    }

    /// Takes the per-CPU drop counter out for the reader.
    pub fn take_drops(&mut self) -> Result<PerCpuArray<MapData, u64>> {
        let map = self.take_map("DROPS")?;
        Ok(PerCpuArray::try_from(map).map_err(ObjectError::map("DROPS"))?)
    }

    /// Clears the programs' "someone is dying" hint once nobody is, so the scheduler hooks
    /// cost one array read; sets it again if a process started dying meanwhile.
    pub fn refresh_dying_hint(&mut self) {
        // Still dying (the hint is set then: only this clears it): the map is not empty, and
        // a churn of jobs keeps it so. A walk starts at the first bucket, thousands of them
        // before a lone entry.
        if let Some(pid) = self.dying_seen {
            if self.dying(|d| d.get(&pid, 0).is_ok()) == Some(true) {
                return;
            }
        } else if self.flag("DYING_HINT") == Some(0) {
            // Clear already: nothing to look at.
            return;
        }
        // The first key: None when the map is empty (Some(None): one that did not read).
        let first = |d: &HashMap<&mut MapData, u32, u64>| d.keys().next().map(Result::ok);
        match self.dying(first) {
            Some(None) => self.dying_seen = None,
            Some(Some(pid)) => {
                self.dying_seen = pid;
                return;
            }
            None => return,
        }
        // A failed write leaves the hint set: the hooks then only look up DYING.
        if self.set_flag("DYING_HINT", 0).is_ok() {
            self.hint_cleared = true;
        }
        if self.dying(first) != Some(None) {
            let _ = self.set_flag("DYING_HINT", 1);
        }
    }

    /// `look` at the DYING map; None when it cannot be opened.
    fn dying<T>(&mut self, look: impl Fn(&HashMap<&mut MapData, u32, u64>) -> T) -> Option<T> {
        Some(look(&self.map_mut("DYING").ok()?))
    }

    /// Samples on-CPU stacks on every CPU while a GPU holder may be dying (the programs' hint;
    /// an unreadable one says yes), or stops; see [`Sampler`](super::sampling::Sampler).
    pub fn sample_while_dying(&mut self) -> Result<()> {
        let Some(sampler) = &self.sampler else {
            return Ok(());
        };
        // On, it stays on until a tick clears the hint: no need to read it meanwhile.
        if sampler.is_on() && !self.hint_cleared {
            return Ok(());
        }
        self.hint_cleared = false;
        let on = self.flag("DYING_HINT") != Some(0);
        match &mut self.sampler {
            Some(sampler) => sampler.set(&mut self.ebpf, on),
            None => Ok(()),
        }
    }
}
