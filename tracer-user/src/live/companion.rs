//! What runs beside the live pipeline (the agent's metrics and flight recorder), and the
//! stream's end that feeds both it and the report.

use std::{cell::RefCell, io::Write, ops::ControlFlow, rc::Rc};

use super::report::Report;
use crate::{
    analysis::{Demands, Output as Record},
    event::{Event, Strategy},
    source::{
        cost::{Part, Stopwatch},
        gpu::GpuSources,
    },
    stream::{Sink, Tap},
    trace::TraceMeta,
};

/// Sees what the live pipeline sees.
pub trait Companion {
    /// Once, on the collector's runtime, before the first event; `meta` describes the run
    /// as a recording would.
    fn start(&mut self, _gpu: &GpuSources, _strategy: &Strategy, _meta: &TraceMeta) {}
    /// After `start`: a tap that records the stream as `--record` does (the flight
    /// recorder), seeing kernel records before they are decoded.
    fn tap(&self) -> Option<Rc<RefCell<dyn Tap>>> {
        None
    }
    fn event(&mut self, _e: &Event) {}
    fn record(&mut self, _r: &Record) {}
    /// Once, after the last event.
    fn finish(&mut self) {}
}

impl Companion for () {}

/// The live stream's end: the report, then the companion.
pub(super) struct LiveSink<'r, 'o, W: Write, C: Companion> {
    pub report: &'r mut Report<'o, W>,
    pub companion: &'r mut C,
    /// The companion's time is its own part of the collector's cost.
    pub watch: Stopwatch,
}

impl<W: Write, C: Companion> Sink for LiveSink<'_, '_, W, C> {
    fn event(&mut self, event: &Event) -> ControlFlow<()> {
        let flow = self.report.on_event(event);
        let written = self.report.take_written();
        self.watch.within(Part::Companion, || {
            self.companion.event(event);
            for record in written {
                self.companion.record(&record);
            }
        });
        flow
    }

    fn batch_done(&mut self) -> Demands {
        let demands = self.report.demands();
        self.report.flush();
        demands
    }
}
