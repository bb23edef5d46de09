//! The live loop: kernel records, drop reports and clock ticks, in one stream.

use std::{ops::ControlFlow, time::Duration};

use tokio::time::{interval, sleep, MissedTickBehavior};

use super::{
    cost::{Cost, Part, Stopwatch},
    gpu::GpuSources,
    kernel::KernelSource,
};
use crate::{
    clock::boottime_ns,
    event::{Event, EventData},
    stream::{Sink, Tap},
};

/// How often the collector advances the analysis clock.
pub const TICK: Duration = Duration::from_millis(20);
/// How often it reads the kernel's loss counters (one report per kind and period at most).
pub const LOSS_PERIOD: Duration = Duration::from_secs(1);

/// A tap whose time is charged to a part of the collector's work.
pub struct Timed<T> {
    tap: T,
    watch: Stopwatch,
    part: Part,
}

impl<T> Timed<T> {
    pub fn new(tap: T, watch: Stopwatch, part: Part) -> Self {
        Self { tap, watch, part }
    }
}

impl<T: Tap> Tap for Timed<T> {
    fn kernel(&mut self, raw: &[u8]) {
        self.watch.within(self.part, || self.tap.kernel(raw));
    }

    fn event(&mut self, e: &Event) {
        self.watch.within(self.part, || self.tap.event(e));
    }
}

/// Feeds every event to `sink` until it breaks, `duration` passes, or SIGINT/SIGTERM arrive.
pub async fn run(
    source: KernelSource,
    duration: Option<Duration>,
    sink: impl FnMut(&Event) -> ControlFlow<()>,
) -> std::io::Result<KernelSource> {
    run_tapped(source, None, duration, &mut (), || {}, sink).await
}

/// [`run`] with the GPU-side inputs, showing every event to `tap` before the sink sees it;
/// `ready` runs once Ctrl-C and SIGTERM would stop it cleanly.
pub async fn run_tapped(
    mut source: KernelSource,
    mut gpu: Option<&mut GpuSources>,
    duration: Option<Duration>,
    tap: &mut impl Tap,
    ready: impl FnOnce(),
    mut sink: impl Sink,
) -> std::io::Result<KernelSource> {
    let mut ticker = interval(TICK);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let deadline = sleep(duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
    tokio::pin!(deadline);
    let mut stop = stop_signals()?;
    ready();
    let watch = gpu
        .as_deref()
        .map_or_else(|| Cost::default().watch(Part::Housekeeping), |g| g.watch());
    let tap = &mut Timed::new(tap, watch.clone(), Part::Record);

    let mut batch = Vec::with_capacity(1024);
    let mut losses_read = 0;
    let mut nvml_reading = None; // or a GPU error from the kernel log
    if let Some(gpu) = gpu.as_deref_mut() {
        for e in gpu.take_startup() {
            push(&mut batch, tap, e);
        }
    }
    loop {
        watch.settle();
        tokio::select! {
            ready = source.readable() => {
                ready?;
                drain(&mut source, gpu.as_deref_mut(), &mut batch, tap, &watch);
            }
            Some(reading) = next_side_event(gpu.as_deref_mut()) => nvml_reading = Some(reading),
            _ = ticker.tick() => {
                let now = boottime_ns();
                // Bulk records do not wake us: take them now.
                drain(&mut source, gpu.as_deref_mut(), &mut batch, tap, &watch);
                watch.switch(Part::Housekeeping);
                source.refresh_hints();
                if now.saturating_sub(losses_read) >= LOSS_PERIOD.as_nanos() as u64 {
                    losses_read = now;
                    for loss in source.poll_losses(now, LOSS_PERIOD) {
                        push(&mut batch, tap, loss);
                    }
                    for stuck in source.poll_asleep(now) {
                        push(&mut batch, tap, stuck);
                    }
                    driver_check(&mut source, gpu.as_deref_mut(), &mut batch, tap, now);
                }
                let tick = Event::collector(now, EventData::Tick);
                push(&mut batch, tap, tick);
            }
            _ = &mut deadline => break,
            _ = stop.recv() => break,
        }
        if let Some(reading) = nvml_reading.take() {
            // --lean learns new GPU holders from NVML's process list.
            watch.switch(Part::Enrich);
            let found = gpu.as_deref_mut().map(|g| g.discover(&reading));
            push(&mut batch, tap, reading);
            if let Some((events, pids)) = found {
                for e in events {
                    push(&mut batch, tap, e);
                }
                source.add_holders(pids);
            }
        }
        watch.switch(Part::Analysis);
        for event in batch.drain(..) {
            if sink.event(&event).is_break() {
                return Ok(source);
            }
        }
        let demands = sink.batch_done();
        watch.switch(Part::Housekeeping);
        if let Some(gpu) = gpu.as_deref_mut() {
            gpu.steer(demands);
            watch.switch(Part::Search);
            if let Some(pids) = gpu.take_search() {
                source.search(&pids);
            }
            watch.within(Part::Sampler, || source.sample_while_dying());
            gpu.forget_stacks(boottime_ns());
        }
    }
    // Whatever arrived before the stop still counts.
    drain(&mut source, gpu, &mut batch, tap, &watch);

    for loss in source.poll_losses(boottime_ns(), LOSS_PERIOD) {
        push(&mut batch, tap, loss);
    }
    for event in batch.drain(..) {
        if sink.event(&event).is_break() {
            break;
        }
    }
    sink.batch_done();
    watch.settle();
    Ok(source)
}

/// Kernel records available now, each followed by what the GPU side learns from it
/// (/proc facts, symbolized stacks), in the order the recorder sees them too.
fn drain(
    source: &mut KernelSource,
    gpu: Option<&mut GpuSources>,
    batch: &mut Vec<Event>,
    tap: &mut impl Tap,
    watch: &Stopwatch,
) {
    let from = batch.len();
    watch.switch(Part::Ring);
    source.drain_tapped(batch, tap);
    if let Some(gpu) = gpu {
        watch.switch(Part::Enrich);
        let found: Vec<Event> = batch[from..].iter().filter_map(|e| gpu.enrich(e)).collect();
        for e in found {
            push(batch, tap, e);
        }
    }
}

/// Tracing began without an NVIDIA driver: once it registers, the system call tracepoints
/// are attached (see [`KernelSource::watch_driver`]); the new strategy, the devices and who
/// holds them already go into the stream.
fn driver_check(
    source: &mut KernelSource,
    gpu: Option<&mut GpuSources>,
    batch: &mut Vec<Event>,
    tap: &mut impl Tap,
    now: u64,
) {
    let Some((strategy, devices)) = source.watch_driver() else {
        return;
    };
    push(
        batch,
        tap,
        Event::collector(now, EventData::Strategy(strategy)),
    );
    if let Some(gpu) = gpu {
        let (events, holders) = gpu.driver_registered(devices, now);
        for e in events {
            push(batch, tap, e);
        }
        source.add_holders(holders);
    }
}

async fn next_side_event(gpu: Option<&mut GpuSources>) -> Option<Event> {
    match gpu {
        Some(g) => g.next_side_event().await,
        None => std::future::pending().await,
    }
}

/// Queues a user-space event for the sink, showing it to the tap in the same order.
fn push(batch: &mut Vec<Event>, tap: &mut impl Tap, event: Event) {
    tap.event(&event);
    batch.push(event);
}

struct StopSignals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl StopSignals {
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

fn stop_signals() -> std::io::Result<StopSignals> {
    use tokio::signal::unix::{signal, SignalKind};
    Ok(StopSignals {
        int: signal(SignalKind::interrupt())?,
        term: signal(SignalKind::terminate())?,
    })
}
