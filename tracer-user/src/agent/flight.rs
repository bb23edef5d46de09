//! The agent's flight recorder: the stream of the last `keep` in trace segments under
//! `state-dir/flight/`, opening with a checkpoint (the collector's start-up facts, the GPU
//! holders /proc shows now, the latest NVML reading) from which they replay. When an incident
//! ends with any verdict but `released`, or lingers, the segments from the last checkpoint
//! before its first signal are joined into one trace file that `linger replay` opens.
//!
//! A busy node has such incidents every second or so: they wait for the segment being written
//! to close (a few seconds), and the incidents of one window share one file (hard links, one
//! per incident), joined by copying the segments' compressed chunks. A segment that opens
//! within `CHECKPOINT_EVERY_NS` of the last checkpoint continues it without one: the /proc
//! scan of a checkpoint was most of the recorder's CPU on such a node. Incident traces count
//! towards the byte budget with the segments, the oldest going first, and each deletion is
//! logged and counted.
//!
//! What a window does not hold: allocations made before its checkpoint (the ledger starts at
//! the checkpoint), and stacks symbolized before it. Writing never stops the agent: a failure
//! is counted and logged.

use std::{
    collections::{HashSet, VecDeque},
    fs::{self, File},
    io::BufReader,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use log::warn;
use prometheus_client::metrics::counter::Counter;

use crate::{
    analysis::{verdict::VerdictKind, Incident},
    escape,
    event::{Event, EventData},
    output::{check_state_dir, Existing, OutputFile},
    source::procfs::{self, Snapshot},
    stream::Tap,
    trace::{writer, EndSummary, TraceMeta, TraceReader, TraceWriter, WriterOptions},
};

/// At most one log line about failed writes this often.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// A segment covers at most this share of the window (ten segments per window).
const SEGMENTS_PER_WINDOW: u64 = 10;
/// ... and at least this long.
const MIN_SEGMENT_NS: u64 = 10_000_000_000;
/// An incident waiting for its trace closes the segment being written once it is this old:
/// its file comes within seconds, and a busy node's segments close at most this often.
const PENDING_CLOSE_NS: u64 = 5_000_000_000;
/// A segment opens with a checkpoint when the last one is this old (or gone): a busy node's
/// segments close every `PENDING_CLOSE_NS`, and an incident's trace then begins at most this
/// much before its window.
const CHECKPOINT_EVERY_NS: u64 = MIN_SEGMENT_NS;

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
    /// Incident traces written, oldest first.
    traces: VecDeque<Written>,
    /// Incidents worth a trace, waiting for the segment being written to close.
    pending: Vec<Pending>,
    /// Incidents with a flight file already (or on its way).
    written: HashSet<u64>,
    errors: Counter,
    /// Incident traces deleted for the byte budget.
    dropped: Counter,
    warned: Option<Instant>,
}

struct Segment {
    writer: TraceWriter<OutputFile>,
    path: PathBuf,
    start_ns: u64,
    /// Chunks holding the process list and the checkpoint, which open the segment (none for
    /// one that continues the segment before).
    checkpoint_chunks: u64,
}

struct Closed {
    path: PathBuf,
    start_ns: u64,
    end_ns: u64,
    bytes: u64,
    checkpoint_chunks: u64,
    /// Chunks before the one that holds only the closing summary.
    body_chunks: u64,
}

impl Closed {
    /// Whether a join can begin here: it opens with a checkpoint.
    fn checkpointed(&self) -> bool {
        self.checkpoint_chunks > 0
    }
}

struct Pending {
    id: u64,
    pid: u32,
    /// Where its window starts.
    from_ns: u64,
}

/// One incident trace: a file and its other names, one per incident of its window.
struct Written {
    names: Vec<PathBuf>,
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
        dropped: Counter,
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
            traces: VecDeque::new(),
            pending: Vec::new(),
            written: HashSet::new(),
            errors,
            dropped,
            warned: None,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// One event of the stream, in the analysis's order (a kernel record's comes from
    /// [`Tap::kernel`], as it was delivered).
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
                let age = e.ts_ns.saturating_sub(s.start_ns);
                let close_at = if self.pending.is_empty() {
                    self.segment_ns
                } else {
                    PENDING_CLOSE_NS
                };
                age >= close_at && matches!(e.data, EventData::Tick)
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
    /// gets its flight file (once), when the segment being written closes.
    pub fn incident(&mut self, inc: &Incident) {
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
        let from_ns = inc
            .holders
            .iter()
            .filter_map(|h| h.how.t_ns())
            .fold(first_signal, u64::min);
        self.pending.push(Pending {
            id: inc.id,
            pid: inc.target.pid,
            from_ns,
        });
    }

    /// The agent stops: the segment being written closes, and the incidents waiting for it
    /// get their file.
    pub fn finish(&mut self, now_ns: u64) {
        self.close_current(now_ns);
        self.write_pending();
    }

    /// Closes the segment being written, writes the traces of the incidents waiting for it,
    /// and starts the next segment with a checkpoint; forgets what is out of the window or
    /// over the byte budget.
    fn rotate(&mut self, now_ns: u64) {
        self.close_current(now_ns);
        self.write_pending();
        self.forget_old(now_ns);
        let checkpoint = self
            .closed
            .iter()
            .rfind(|c| c.checkpointed())
            .is_none_or(|c| now_ns.saturating_sub(c.start_ns) >= CHECKPOINT_EVERY_NS);
        match self.start_segment(now_ns, checkpoint) {
            Ok(s) => self.current = Some(s),
            Err(e) => self.failed(&format!("starting a segment: {e}")),
        }
    }

    fn close_current(&mut self, now_ns: u64) {
        let Some(mut s) = self.current.take() else {
            return;
        };
        // The closing summary in a chunk of its own: a join copies the chunks before it.
        s.writer.flush_chunk();
        let body_chunks = s.writer.stats().chunks;
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
                checkpoint_chunks: s.checkpoint_chunks,
                body_chunks,
            }),
            Err(e) => {
                self.failed(&format!("closing {}: {e}", escape::path(&s.path)));
                let _ = fs::remove_file(&s.path);
            }
        }
    }

    /// One trace for the incidents waiting, from the earliest of their windows, under the
    /// first one's name and linked under the others'.
    fn write_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let Some(from_ns) = pending.iter().map(|p| p.from_ns).min() else {
            return;
        };
        let dir = self.dir.clone();
        let name = |p: &Pending| dir.join(format!("incident-{}-{}.trace", p.id, p.pid));
        let path = name(&pending[0]);
        let bytes = match self.join(from_ns, &path) {
            Ok(bytes) => bytes,
            Err(e) => {
                let _ = fs::remove_file(&path);
                return self.failed(&format!("writing {}: {e}", escape::path(&path)));
            }
        };
        let mut names = vec![path.clone()];
        for p in &pending[1..] {
            let link = name(p);
            match fs::hard_link(&path, &link) {
                Ok(()) => names.push(link),
                Err(e) => self.failed(&format!("linking {}: {e}", escape::path(&link))),
            }
        }
        for (p, n) in pending.iter().zip(&names) {
            log::info!("flight recorder: incident {} in {}", p.id, escape::path(n));
        }
        let end_ns = self.closed.back().map_or(0, |c| c.end_ns);
        self.traces.push_back(Written {
            names,
            end_ns,
            bytes,
        });
    }

    /// A segment from `now_ns`, opening with a checkpoint if `checkpoint`.
    fn start_segment(&self, now_ns: u64, checkpoint: bool) -> anyhow::Result<Segment> {
        let path = self.dir.join(format!("segment-{now_ns}.trace"));
        let mut events: Vec<Event> = Vec::new();
        if checkpoint {
            events.extend(self.once.iter().cloned());
            events.extend(
                (self.snapshot)()
                    .into_iter()
                    .map(|d| Event::collector(now_ns, d)),
            );
            events.extend(self.last_nvml.clone());
        }
        let meta = TraceMeta {
            start_boot_ns: now_ns,
            checkpoint_events: events.len() as u64,
            ..self.meta.clone()
        };
        let options = WriterOptions {
            zstd_level: Some(1),
            ..Default::default()
        };
        let mut w = writer::create(&path, Existing::Replace, &meta, options)?;
        if checkpoint {
            w.processes(&procfs::processes(self.redact_cmdline));
            for e in &events {
                w.event(e);
            }
            // The checkpoint in chunks of its own: a join leaves them out of later segments.
            w.flush_chunk();
        }
        Ok(Segment {
            checkpoint_chunks: w.stats().chunks,
            writer: w,
            path,
            start_ns: now_ns,
        })
    }

    /// Deletes the segments out of the window, then, while the segments and incident traces
    /// pass the byte budget, the oldest of them.
    fn forget_old(&mut self, now_ns: u64) {
        while let Some(old) = self.closed.front() {
            if now_ns.saturating_sub(old.end_ns) <= self.keep_ns {
                break;
            }
            self.delete_oldest_segment();
        }
        let mut bytes: u64 = self.closed.iter().map(|c| c.bytes).sum::<u64>()
            + self.traces.iter().map(|t| t.bytes).sum::<u64>();
        while bytes > self.max_bytes {
            let segment_end = self.closed.front().map(|c| c.end_ns);
            let trace_end = self.traces.front().map(|t| t.end_ns);
            let segment_first = match (segment_end, trace_end) {
                (Some(s), Some(t)) => s <= t,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            if segment_first {
                bytes -= self.delete_oldest_segment();
            } else if let Some(old) = self.traces.pop_front() {
                for n in &old.names {
                    let _ = fs::remove_file(n);
                    log::warn!(
                        "flight recorder: deleted {} to stay within --flight-max-bytes",
                        escape::path(n)
                    );
                }
                self.dropped.inc();
                bytes -= old.bytes;
            }
        }
    }

    /// Deletes the oldest closed segment, and the segments that continued it (no join can
    /// begin with them); returns their bytes.
    fn delete_oldest_segment(&mut self) -> u64 {
        let mut bytes = 0;
        while let Some(old) = self.closed.pop_front() {
            let _ = fs::remove_file(&old.path);
            bytes += old.bytes;
            if self.closed.front().is_none_or(Closed::checkpointed) {
                break;
            }
        }
        bytes
    }

    /// Writes the closed segments from the last checkpoint at or before `from_ns` (or the
    /// oldest kept) into one trace file, copying their stored chunks: that segment whole, the
    /// later ones without their checkpoints. Returns the file's bytes.
    fn join(&self, from_ns: u64, out: &Path) -> anyhow::Result<u64> {
        let first = self
            .closed
            .iter()
            .rposition(|c| c.checkpointed() && c.start_ns <= from_ns)
            .or_else(|| self.closed.iter().position(Closed::checkpointed))
            .unwrap_or(0);
        let parts: Vec<&Closed> = self.closed.iter().skip(first).collect();
        let Some(head) = parts.first() else {
            anyhow::bail!("no segment kept");
        };
        let meta = open_segment(&head.path)?.meta().clone();
        let mut w = writer::create(out, Existing::Replace, &meta, WriterOptions::default())?;
        for (i, part) in parts.iter().enumerate() {
            let mut r = open_segment(&part.path)?;
            let from = if i == 0 { 0 } else { part.checkpoint_chunks };
            let mut n = 0;
            while let Some(chunk) = r.next_stored_chunk()? {
                if (from..part.body_chunks).contains(&n) {
                    w.copy_chunk(&chunk);
                }
                n += 1;
            }
            if !r.stats().damage.is_empty() || n != part.body_chunks + 1 {
                anyhow::bail!("segment {} is damaged", escape::path(&part.path));
            }
        }
        let summary = EndSummary {
            end_boot_ns: parts.last().map_or(0, |p| p.end_ns),
            kernel_drops: 0,
            records: w.records(),
        };
        let (_, stats) = w.finish(&summary)?;
        Ok(stats.file_bytes)
    }

    fn failed(&mut self, what: &str) {
        self.errors.inc();
        if self.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            self.warned = Some(Instant::now());
            warn!("flight recorder: {what} (counted in linger_flight_recorder_errors_total)");
        }
    }
}

/// Sees the stream as the `--record` trace does: kernel records verbatim, the collector's
/// events.
impl Tap for FlightRecorder {
    fn kernel(&mut self, raw: &[u8]) {
        if let Some(s) = &mut self.current {
            s.writer.kernel(raw);
        }
    }

    fn event(&mut self, e: &Event) {
        FlightRecorder::event(self, e);
    }
}

fn open_segment(path: &Path) -> anyhow::Result<TraceReader<BufReader<File>>> {
    Ok(TraceReader::new(BufReader::new(File::open(path)?))?)
}

#[cfg(test)]
#[path = "flight_tests.rs"]
mod tests;
