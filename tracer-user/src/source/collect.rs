//! The live loop: kernel records, drop reports and clock ticks, in one stream.

use std::{ops::ControlFlow, time::Duration};

use tokio::time::{interval, sleep, MissedTickBehavior};

use super::kernel::KernelSource;
use crate::{
    clock::boottime_ns,
    event::{Event, EventData},
};

/// How often the collector advances the analysis clock and checks the drop counter.
pub const TICK: Duration = Duration::from_millis(20);

/// Feeds every event to `sink` until it breaks, `duration` passes, or SIGINT/SIGTERM arrive.
pub async fn run(
    mut source: KernelSource,
    duration: Option<Duration>,
    mut sink: impl FnMut(&Event) -> ControlFlow<()>,
) -> std::io::Result<KernelSource> {
    let mut ticker = interval(TICK);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let deadline = sleep(duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
    tokio::pin!(deadline);
    let mut stop = stop_signals()?;
    let mut batch = Vec::with_capacity(1024);
    loop {
        tokio::select! {
            ready = source.readable() => {
                ready?;
                source.drain(&mut batch);
            }
            _ = ticker.tick() => {
                let now = boottime_ns();
                batch.extend(source.poll_drops(now));
                batch.push(Event { ts_ns: now, cpu: 0, pid: 0, tid: 0, data: EventData::Tick });
            }
            _ = &mut deadline => break,
            _ = stop.recv() => break,
        }
        for event in batch.drain(..) {
            if sink(&event).is_break() {
                return Ok(source);
            }
        }
    }
    // Whatever arrived before the stop still counts.
    source.drain(&mut batch);
    batch.extend(source.poll_drops(boottime_ns()));
    for event in batch.drain(..) {
        if sink(&event).is_break() {
            break;
        }
    }
    Ok(source)
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
