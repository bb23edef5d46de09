//! Who sees the event stream besides the analysis: a [`Tap`] watches it enter (the trace
//! recorder, the flight recorder), a [`Sink`] takes it (the analysis and what follows it).

use std::{cell::RefCell, ops::ControlFlow, rc::Rc};

use crate::{analysis::Demands, event::Event};

/// Sees the stream as it enters the analysis, in order: kernel records as the ring buffer
/// delivered them, the collector's own events as events. The trace recorder is one.
pub trait Tap {
    fn kernel(&mut self, raw: &[u8]);
    fn event(&mut self, e: &Event);
}

/// No tap.
impl Tap for () {
    fn kernel(&mut self, _: &[u8]) {}
    fn event(&mut self, _: &Event) {}
}

impl<T: Tap + ?Sized> Tap for &mut T {
    fn kernel(&mut self, raw: &[u8]) {
        (**self).kernel(raw);
    }

    fn event(&mut self, e: &Event) {
        (**self).event(e);
    }
}

/// Two taps, in turn.
impl<A: Tap, B: Tap> Tap for (A, B) {
    fn kernel(&mut self, raw: &[u8]) {
        self.0.kernel(raw);
        self.1.kernel(raw);
    }

    fn event(&mut self, e: &Event) {
        self.0.event(e);
        self.1.event(e);
    }
}

/// A tap that something else (the agent's flight recorder, told of incidents) holds too.
impl<T: Tap + ?Sized> Tap for Rc<RefCell<T>> {
    fn kernel(&mut self, raw: &[u8]) {
        self.borrow_mut().kernel(raw);
    }

    fn event(&mut self, e: &Event) {
        self.borrow_mut().event(e);
    }
}

impl<T: Tap> Tap for Option<T> {
    fn kernel(&mut self, raw: &[u8]) {
        if let Some(t) = self {
            t.kernel(raw);
        }
    }

    fn event(&mut self, e: &Event) {
        if let Some(t) = self {
            t.event(e);
        }
    }
}

/// Where the stream goes: each event, then word that a batch of them is done (what the sink
/// buffered can be written out then), answered with what the analysis wants of the GPU side.
pub trait Sink {
    fn event(&mut self, e: &Event) -> ControlFlow<()>;
    fn batch_done(&mut self) -> Demands {
        Demands::default()
    }
}

impl<F: FnMut(&Event) -> ControlFlow<()>> Sink for F {
    fn event(&mut self, e: &Event) -> ControlFlow<()> {
        self(e)
    }
}
