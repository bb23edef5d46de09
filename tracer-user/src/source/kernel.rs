//! The kernel source: ring buffer records and drop counts as events.

use std::time::Duration;

use aya::maps::{MapData, PerCpuArray, RingBuf};
use log::warn;
use tokio::io::{unix::AsyncFd, Interest};

use super::{
    asleep::AsleepWatch,
    asleep_at_start::{asleep_now, THREADS_LOOKED_AT},
    decode::decode,
};
use crate::{
    clock::boottime_ns,
    error::Result,
    event::{Event, EventData, Strategy},
    probe::{devices::GpuDevices, Probes},
    stream::Tap,
};

pub struct KernelSource {
    ring: AsyncFd<RingBuf<MapData>>,
    /// Per-CPU loss counters by `tracer_common::Loss` slot (slot 0: ring buffer drops).
    drops: PerCpuArray<MapData, u64>,
    /// What was reported of each slot so far.
    reported: [u64; tracer_common::Loss::COUNT],
    undecodable: u64,
    /// Holders' threads stuck in the driver; None with `stuck_after` 0.
    asleep: Option<AsleepWatch>,
    probes: Probes,
}

impl KernelSource {
    /// Must be called inside a tokio runtime (the ring buffer is registered with its reactor).
    pub fn new(mut probes: Probes) -> Result<Self> {
        let ring = probes.take_events()?;
        // SAFETY: the AsyncFd owns the ring buffer, which owns its fd, so the fd stays open and
        // unshared for as long as it is registered.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;

        let drops = probes.take_drops()?;
        let asleep = match probes.stuck_after_ns() {
            0 => None,
            after_ns => {
                let (sleeps, stacks) = probes.take_asleep()?;
                // After the programs are attached: a sleep begun since is in their map.
                let early = asleep_now(boottime_ns(), THREADS_LOOKED_AT);
                if early.not_looked_at > 0 {
                    warn!(
                        "{} threads not looked at for sleeps in the NVIDIA driver begun before \
                         tracing (at most {THREADS_LOOKED_AT} are)",
                        early.not_looked_at
                    );
                }
                Some(AsleepWatch::new(sleeps, stacks, after_ns, early.sleeps))
            }
        };
        Ok(Self {
            ring,
            drops,
            reported: Default::default(),
            undecodable: 0,
            asleep,
            probes,
        })
    }

    /// Waits until the kernel has written records.
    pub async fn readable(&mut self) -> std::io::Result<()> {
        let mut guard = self.ring.readable_mut().await?;
        guard.clear_ready();
        Ok(())
    }

    /// Decodes every record available now into `out`.
    pub fn drain(&mut self, out: &mut Vec<Event>) {
        self.drain_tapped(out, &mut ());
    }

    /// [`KernelSource::drain`], showing each raw record to `tap` first, undecodable ones too.
    pub fn drain_tapped(&mut self, out: &mut Vec<Event>, tap: &mut impl Tap) {
        let ring = self.ring.get_mut();
        while let Some(item) = ring.next() {
            tap.kernel(&item);
            match decode(&item) {
                Ok(event) => out.push(event),
                Err(e) => {
                    self.undecodable += 1;
                    if self.undecodable == 1 {
                        warn!("skipping undecodable kernel record ({e}); further ones are counted");
                    }
                }
            }
        }
        self.probes.flush_logs();
    }

    /// Marks processes found holding GPU files in /proc as holders for the programs.
    pub fn add_holders(&mut self, pids: Vec<u32>) {
        if pids.is_empty() {
            return;
        }
        if let Err(e) = self.probes.add_holders(pids) {
            warn!("could not mark new GPU holders: {e}");
        }
    }

    /// Samples stacks while a GPU holder dies, or stops (see [`Probes::sample_while_dying`]).
    /// Each sample costs every CPU an interrupt, and only dying holders' tasks are sampled:
    /// NVML's fast readings for victims not known to hold GPU files (a kill storm's) do not
    /// need it.
    pub fn sample_while_dying(&mut self) {
        if let Err(e) = self.probes.sample_while_dying() {
            warn!("stack sampling could not be switched on or off: {e}");
        }
    }

    /// See [`Probes::refresh_dying_hint`] and [`Probes::refresh_search`].
    pub fn refresh_hints(&mut self) {
        self.probes.refresh_dying_hint();
        self.probes.refresh_search();
    }

    /// See [`Probes::watch_driver`]: the strategy then, and the driver's devices.
    pub fn watch_driver(&mut self) -> Option<(Strategy, GpuDevices)> {
        let devices = self.probes.watch_driver()?;
        warn!(
            "{}",
            self.probes
                .strategy()
                .reasons
                .last()
                .map_or("", |r| r.as_str())
        );
        Some((self.probes.strategy().clone(), devices))
    }

    /// See [`Probes::search`].
    pub fn search(&mut self, pids: &[u32]) {
        if let Err(e) = self.probes.search(pids) {
            warn!("could not search for the holders of a dead process's files: {e}");
        }
    }

    /// [`EventData::Loss`] events for what the kernel lost since the last call: ring buffer
    /// drops first, then failed map inserts by kind. The collector polls every `period`.
    pub fn poll_losses(&mut self, now_ns: u64, period: Duration) -> Vec<Event> {
        let period_ns = period.as_nanos() as u64;
        let mut out = Vec::new();
        for (slot, reported) in self.reported.iter_mut().enumerate() {
            let Some(what) = tracer_common::Loss::from_raw(slot as u32) else {
                continue;
            };
            let total: u64 = match self.drops.get(&(slot as u32), 0) {
                Ok(per_cpu) => per_cpu.iter().sum(),
                Err(e) => {
                    warn!("reading the loss counters failed: {e}");
                    return out;
                }
            };
            let count = total.saturating_sub(*reported);
            if count > 0 {
                *reported = total;
                let what = what.into();
                let loss = EventData::Loss {
                    count,
                    what,
                    period_ns,
                };
                out.push(Event::collector(now_ns, loss));
            }
        }
        out
    }

    /// Holders' threads newly stuck in the driver, and those no longer (see [`AsleepWatch`]).
    pub fn poll_asleep(&mut self, now_ns: u64) -> Vec<Event> {
        self.asleep
            .as_mut()
            .map_or_else(Vec::new, |watch| watch.poll(now_ns))
    }

    /// Records the kernel dropped from the ring buffer since loading.
    pub fn drops_total(&self) -> u64 {
        self.reported[tracer_common::Loss::Ring as usize]
    }
}
