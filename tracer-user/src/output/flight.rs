//! The agent's flight recorder: the stream of the last `keep` in trace segments under
//! `state-dir/flight/`, each opening with a checkpoint (the collector's start-up facts, the GPU
//! holders /proc shows now, the latest NVML reading) so that it replays on its own. When an
//! incident ends with any verdict but `released`, or lingers, the segments from the one before
//! its first signal are joined into one trace file that `linger replay` opens.
//!
//! What a window does not hold: allocations made before its checkpoint (the ledger starts at
//! the checkpoint), and stacks symbolized before it. Writing never stops the agent: a failure
//! is counted and logged.

use std::{
    collections::{HashSet, VecDeque},
    fs,
    ops::ControlFlow,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use log::warn;
use prometheus_client::metrics::counter::Counter;

use super::{check_state_dir, Existing, OutputFile};
use crate::{
    analysis::{verdict::VerdictKind, Incident},
    escape,
    event::{Event, EventData},
    source::{procfs, replay::Replay},
    trace::{writer, EndSummary, TraceMeta, TraceWriter, WriterOptions},
};

/// At most one log line about failed writes this often.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// A segment covers at most this share of the window (ten segments per window).
const SEGMENTS_PER_WINDOW: u64 = 10;
/// ... and at least this long.
const MIN_SEGMENT_NS: u64 = 10_000_000_000;

/// The processes holding GPU files now, as /proc says (snapshot events).
pub type Snapshot = Box<dyn Fn() -> Vec<EventData>>;

pub struct FlightOptions {
    /// How much of the past the segments keep.
    pub keep: Duration,
    /// The segments' bytes on disk at most (the oldest go first).
    pub max_bytes: u64,
    /// Keep only the program of each command line.
    pub redact_cmdline: bool,
}

pub struct FlightRecorder {
    dir: PathBuf,
    keep_ns: u64,
    max_bytes: u64,
    segment_ns: u64,
    redact_cmdline: bool,
    meta: TraceMeta,
    snapshot: Snapshot,
    /// Start-up facts of the stream (who traces, how, which devices, which GPUs), repeated
    /// in every checkpoint.
    once: Vec<Event>,
    last_nvml: Option<Event>,
    current: Option<Segment>,
    closed: VecDeque<Closed>,
    /// Incidents with a flight file already.
    written: HashSet<u64>,
    errors: Counter,
    warned: Option<Instant>,
}

struct Segment {
    writer: TraceWriter<OutputFile>,
    path: PathBuf,
    start_ns: u64,
}

struct Closed {
    path: PathBuf,
    start_ns: u64,
    end_ns: u64,
    bytes: u64,
}

impl FlightRecorder {
    /// Opens `state_dir/flight` (created; checked safe to write in as root); `meta` describes
    /// the recording (each segment's header, with its own start).
    pub fn open(
        state_dir: &Path,
        options: FlightOptions,
        meta: TraceMeta,
        snapshot: Snapshot,
        errors: Counter,
    ) -> anyhow::Result<Self> {
        let dir = state_dir.join("flight");
        if !dir.exists() {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(|e| anyhow::anyhow!("creating {}: {e}", escape::path(&dir)))?;
        }
        check_state_dir(&dir)?;
        let keep_ns = options.keep.as_nanos() as u64;
        Ok(Self {
            dir,
            keep_ns,
            max_bytes: options.max_bytes,
            segment_ns: (keep_ns / SEGMENTS_PER_WINDOW).max(MIN_SEGMENT_NS),
            redact_cmdline: options.redact_cmdline,
            meta,
            snapshot,
            once: Vec::new(),
            last_nvml: None,
            current: None,
            closed: VecDeque::new(),
            written: HashSet::new(),
            errors,
            warned: None,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// One event of the stream, in the analysis's order.
    pub fn event(&mut self, e: &Event) {
        match &e.data {
            EventData::Collector { .. }
            | EventData::Strategy(_)
            | EventData::GpuDevices { .. }
            | EventData::Gpus { .. } => self.once.push(e.clone()),
            EventData::Nvml { .. } => self.last_nvml = Some(e.clone()),
            _ => {}
        }
        // The first segment starts with the first event, not the first tick: a fork in
        // between (a holder started right after the agent) would be missing from every
        // segment, and its incident's flight file would say the child held the files from
        // before tracing began.
        let due = match &self.current {
            None => true,
            Some(s) => {
                e.ts_ns.saturating_sub(s.start_ns) >= self.segment_ns
                    && matches!(e.data, EventData::Tick)
            }
        };
        if due {
            self.rotate(e.ts_ns);
        }
        if let Some(s) = &mut self.current {
            s.writer.event(e);
        }
    }

    /// An incident record: one that ends with a verdict other than `released`, or lingers,
    /// gets its flight file (once).
    pub fn incident(&mut self, inc: &Incident, now_ns: u64) {
        let verdict = inc.verdict.as_ref().map(|v| v.kind);
        let worth =
            (inc.settled && verdict.is_some_and(|v| v != VerdictKind::Released)) || inc.lingering;
        if !worth || !self.written.insert(inc.id) {
            return;
        }
        // From before its first signal, and before its holders got its files where the
        // window still has that: the replay then knows how they did.
        let first_signal = inc
            .termination
            .signals
            .first()
            .map_or(inc.t_signal_ns, |s| s.t_ns);
        let from = inc
            .holders
            .iter()
            .filter_map(|h| h.how.t_ns())
            .fold(first_signal, u64::min);
        self.rotate(now_ns);
        let name = format!("incident-{}-{}.trace", inc.id, inc.target.pid);
        match self.join(from, &self.dir.join(&name)) {
            Ok(()) => log::info!(
                "flight recorder: incident {} ({:?}) in {}",
                inc.id,
                verdict,
                escape::path(&self.dir.join(&name))
            ),
            Err(e) => self.failed(&format!("writing {name}: {e}")),
        }
    }

    /// Closes the segment being written and starts the next with a checkpoint; forgets the
    /// segments out of the window or over the byte budget.
    fn rotate(&mut self, now_ns: u64) {
        if let Some(s) = self.current.take() {
            let summary = EndSummary {
                end_boot_ns: now_ns,
                kernel_drops: 0,
                records: s.writer.records(),
            };
            match s.writer.finish(&summary) {
                Ok((_, stats)) => self.closed.push_back(Closed {
                    path: s.path,
                    start_ns: s.start_ns,
                    end_ns: now_ns,
                    bytes: stats.file_bytes,
                }),
                Err(e) => {
                    self.failed(&format!("closing {}: {e}", escape::path(&s.path)));
                    let _ = fs::remove_file(&s.path);
                }
            }
        }
        self.forget_old(now_ns);
        match self.start_segment(now_ns) {
            Ok(s) => self.current = Some(s),
            Err(e) => self.failed(&format!("starting a segment: {e}")),
        }
    }

    fn start_segment(&self, now_ns: u64) -> anyhow::Result<Segment> {
        let path = self.dir.join(format!("segment-{now_ns}.trace"));
        let mut checkpoint: Vec<Event> = self.once.clone();
        checkpoint.extend(
            (self.snapshot)()
                .into_iter()
                .map(|d| Event::collector(now_ns, d)),
        );
        checkpoint.extend(self.last_nvml.clone());
        let meta = TraceMeta {
            start_boot_ns: now_ns,
            checkpoint_events: checkpoint.len() as u64,
            ..self.meta.clone()
        };
        let options = WriterOptions {
            zstd_level: Some(1),
            ..Default::default()
        };
        let mut w = writer::create(&path, Existing::Replace, &meta, options)?;
        w.processes(&procfs::processes(self.redact_cmdline));
        for e in &checkpoint {
            w.event(e);
        }
        Ok(Segment {
            writer: w,
            path,
            start_ns: now_ns,
        })
    }

    fn forget_old(&mut self, now_ns: u64) {
        let mut bytes: u64 = self.closed.iter().map(|c| c.bytes).sum();
        while let Some(old) = self.closed.front() {
            let stale = now_ns.saturating_sub(old.end_ns) > self.keep_ns;
            if !stale && bytes <= self.max_bytes {
                break;
            }
            bytes -= old.bytes;
            let _ = fs::remove_file(&old.path);
            self.closed.pop_front();
        }
    }

    /// Writes the closed segments from the last one that began at or before `from_ns` (or
    /// the oldest kept) into one trace file: that segment whole, the later ones without
    /// their checkpoints.
    fn join(&self, from_ns: u64, out: &Path) -> anyhow::Result<()> {
        let first = self
            .closed
            .iter()
            .rposition(|c| c.start_ns <= from_ns)
            .unwrap_or(0);
        let parts: Vec<&Closed> = self.closed.iter().skip(first).collect();
        let Some(head) = parts.first() else {
            anyhow::bail!("no segment kept");
        };
        let replay = Replay::open(&head.path)?;
        let meta = replay.meta().clone();
        drop(replay);
        let options = WriterOptions {
            zstd_level: Some(1),
            ..Default::default()
        };
        let mut w = writer::create(out, Existing::Replace, &meta, options)?;
        let mut processes_written = false;
        for (i, part) in parts.iter().enumerate() {
            let mut replay = Replay::open(&part.path)?;
            let skip = if i == 0 {
                0
            } else {
                replay.meta().checkpoint_events
            };
            let mut seen = 0;
            replay.run(
                |e| {
                    seen += 1;
                    if seen > skip {
                        w.event(e);
                    }
                    ControlFlow::Continue(())
                },
                |_| {},
            )?;
            if !processes_written {
                w.processes(replay.processes());
                processes_written = true;
            }
        }
        let summary = EndSummary {
            end_boot_ns: parts.last().map_or(0, |p| p.end_ns),
            kernel_drops: 0,
            records: w.records(),
        };
        w.finish(&summary)?;
        Ok(())
    }

    fn failed(&mut self, what: &str) {
        self.errors.inc();
        if self.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            self.warned = Some(Instant::now());
            warn!("flight recorder: {what} (counted in linger_flight_recorder_errors_total)");
        }
    }
}
