//! The analysis half of the pipeline, shared by `live` and `replay`: the same events in the
//! same order give the same lines.

use std::{io::Write, ops::ControlFlow};

use super::loss_notice::LossNotice;
use crate::{
    analysis::{incident::Node, Correlator, CorrelatorConfig, Demands, Output as Record},
    clock::WallAnchor,
    escape,
    event::{Event, EventData, LossKind},
    sink::{json, text},
    trace::TraceMeta,
};
use serde_json::json;

#[derive(Clone, Copy, Debug, Default)]
pub struct Output {
    /// JSON lines instead of text.
    pub json: bool,
    /// Also every event as a JSON line.
    pub events: bool,
    /// Stop after this many incidents.
    pub count: Option<usize>,
}

pub struct Report<'a, W: Write> {
    out: &'a mut W,
    output: Output,
    anchor: WallAnchor,
    correlator: Correlator,
    closed: Vec<Record>,
    /// Incident records written (updates not counted). Records themselves are not kept: a
    /// collector runs for months.
    incidents: usize,
    failure: Option<std::io::Error>,
    /// Records written since the last [`Report::take_written`], when someone wants them.
    written: Option<Vec<Record>>,
    /// Where the events happened, stamped on every incident record.
    node: Node,
    /// The kernel's losses, for stderr in text mode.
    losses: LossNotice,
}

impl<'a, W: Write> Report<'a, W> {
    pub fn new(
        out: &'a mut W,
        output: Output,
        anchor: WallAnchor,
        config: CorrelatorConfig,
        node: Node,
    ) -> Self {
        Self {
            out,
            output,
            anchor,
            correlator: Correlator::new(config),
            closed: Vec::new(),
            incidents: 0,
            failure: None,
            written: None,
            node,
            losses: LossNotice::default(),
        }
    }

    /// Feeds one event; breaks when writing failed or `count` incidents were written.
    pub fn on_event(&mut self, event: &Event) -> ControlFlow<()> {
        if self.failure.is_some() {
            return ControlFlow::Break(());
        }
        if let EventData::Loss { count, what, .. } = event.data {
            if let Err(e) = self.report_loss(event.ts_ns, count, what) {
                self.failure = Some(e);
                return ControlFlow::Break(());
            }
        }
        if self.output.events {
            let line = json!({"type": "event", "event": event});
            if let Err(e) = json::append_line(self.out, &line) {
                self.failure = Some(e);
                return ControlFlow::Break(());
            }
        }
        self.correlator.on_event(event, &mut self.closed);
        self.emit()
    }

    /// Keeps each record written for [`Report::take_written`].
    pub fn keep_written(&mut self) {
        self.written.get_or_insert_with(Vec::new);
    }

    /// The records written since the last call (none unless [`Report::keep_written`]).
    pub fn take_written(&mut self) -> Vec<Record> {
        self.written
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// What the analysis wants of the GPU side after the events so far (see [`Demands`]).
    pub fn demands(&mut self) -> Demands {
        Demands::of(&mut self.correlator)
    }

    /// Writes out what the records since the last flush left buffered: once per batch of
    /// events, so a burst of incidents costs one write.
    pub fn flush(&mut self) {
        if self.failure.is_none() {
            if let Err(e) = self.out.flush() {
                self.failure = Some(e);
            }
        }
    }

    /// Closes what is still open (unless `count` was reached); returns the number of
    /// incidents written.
    pub fn finish(mut self) -> std::io::Result<usize> {
        if let Some(e) = self.failure.take() {
            return Err(e);
        }
        if !self.count_reached() {
            self.correlator.finish(&mut self.closed);
            let _ = self.emit();
        }
        self.flush();
        for line in self.losses.finish() {
            eprintln!("{line}");
        }
        match self.failure.take() {
            Some(e) => Err(e),
            None => Ok(self.incidents),
        }
    }

    fn count_reached(&self) -> bool {
        self.output.count.is_some_and(|n| self.incidents >= n)
    }

    fn emit(&mut self) -> ControlFlow<()> {
        for mut record in std::mem::take(&mut self.closed) {
            stamp(&mut record, &self.node, &self.anchor);
            let written = if self.output.json {
                json::append_line(self.out, &record)
            } else {
                // The last guard before the terminal: names are escaped where they are laid
                // out, and nothing a field let through is obeyed here either.
                let text = text::render(&record, &self.anchor);
                self.out.write_all(escape::terminal_lines(&text).as_bytes())
            };
            if let Err(e) = written {
                self.failure = Some(e);
                return ControlFlow::Break(());
            }
            if matches!(&record, Record::Incident(i) if i.record_type == "incident") {
                self.incidents += 1;
            }
            if let Some(kept) = &mut self.written {
                kept.push(record);
            }
            if self.count_reached() {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    fn report_loss(&mut self, ts_ns: u64, count: u64, what: LossKind) -> std::io::Result<()> {
        if self.output.json {
            json::append_line(
                self.out,
                &json!({"type": "loss", "t_ns": ts_ns, "count": count, "what": what}),
            )
        } else {
            if let Some(line) = self.losses.lost(ts_ns, count, what) {
                eprintln!("{line}");
            }
            Ok(())
        }
    }
}

/// Marks a record with the machine and boot it is about, and its wall-clock time.
pub fn stamp(record: &mut Record, node: &Node, anchor: &WallAnchor) {
    match record {
        Record::Incident(inc) => {
            inc.node = Some(node.clone());
            inc.wall_time = anchor.rfc3339(inc.t_signal_ns);
        }
        Record::GpuError(r) => r.head.stamp(node, anchor.rfc3339(r.error.t_ns)),
        Record::Stuck(r) => r.head.stamp(node, anchor.rfc3339(r.t_ns)),
        Record::Unheld(r) => r.head.stamp(node, anchor.rfc3339(r.t_ns)),
        Record::Signal(_) => {}
    }
}

/// The machine a recording was made on.
pub fn node_of(meta: &TraceMeta) -> Node {
    Node {
        host: meta.host.clone(),
        boot_id: meta.boot_id.clone(),
        driver: meta.driver.clone(),
    }
}
