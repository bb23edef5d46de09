//! The replay source: a trace file as the same event stream the live collector produced,
//! kernel records decoded by the live decoder.

use std::{fs::File, io::Read, ops::ControlFlow, path::Path};

use super::decode::decode;
use crate::{
    event::{Event, EventData, LossKind, UNRECORDED_LOSS_PERIOD_NS},
    trace::{
        prefetch::Prefetch,
        reader::{ReadStats, TraceReader},
        record::{Record, Records},
        snapshot::Process,
        EndSummary, TraceError, TraceMeta,
    },
};

/// What a replay met besides events.
#[derive(Clone, Debug, Default)]
pub struct ReplayStats {
    pub events: u64,
    /// Kernel records the decoder rejected (skipped live as well).
    pub undecodable: u64,
    /// Records of kinds, or events of variants, this linger does not know.
    pub unknown: u64,
    /// Events of kinds this linger knows that do not parse (a field missing or of the wrong
    /// type): damaged, not newer.
    pub damaged: u64,
    /// Good chunks whose records ran past their end (a writer bug, not file damage).
    pub malformed_chunks: u64,
}

pub struct Replay<R> {
    meta: TraceMeta,
    chunks: Chunks<R>,
    /// What the prefetching thread met, once it is done.
    read_stats: ReadStats,
    processes: Vec<Process>,
    end: Option<EndSummary>,
    stats: ReplayStats,
    read_to_end: bool,
}

enum Chunks<R> {
    Direct(Box<TraceReader<R>>),
    Prefetched(Prefetch),
}

impl Replay<File> {
    /// Reads the file's chunks on a second thread.
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        Self::prefetched(File::open(path)?)
    }
}

impl<R: Read + Send + 'static> Replay<R> {
    /// Reads `input`'s chunks on a second thread (a file already opened, whose first bytes
    /// were read to tell what it is, chained back in front).
    pub fn prefetched(input: R) -> Result<Self, TraceError> {
        let reader = TraceReader::new(input)?;
        Ok(Self::with(
            reader.meta().clone(),
            Chunks::Prefetched(Prefetch::start(reader)),
        ))
    }
}

impl<R: Read> Replay<R> {
    /// Reads `input` on the caller's thread.
    pub fn new(input: R) -> Result<Self, TraceError> {
        let reader = TraceReader::new(input)?;
        Ok(Self::with(
            reader.meta().clone(),
            Chunks::Direct(Box::new(reader)),
        ))
    }

    fn with(meta: TraceMeta, chunks: Chunks<R>) -> Self {
        Self {
            meta,
            chunks,
            read_stats: ReadStats::default(),
            processes: Vec::new(),
            end: None,
            stats: ReplayStats::default(),
            read_to_end: false,
        }
    }

    pub fn meta(&self) -> &TraceMeta {
        &self.meta
    }

    /// Feeds every event to `sink` in recorded order until it breaks or the file ends;
    /// `progress` gets the bytes read after each chunk.
    pub fn run(
        &mut self,
        mut sink: impl FnMut(&Event) -> ControlFlow<()>,
        mut progress: impl FnMut(u64),
    ) -> std::io::Result<()> {
        loop {
            let next = match &mut self.chunks {
                Chunks::Direct(r) => r.next_chunk()?.map(|c| (c.body, c.end_offset)),
                Chunks::Prefetched(p) => p.next_body()?,
            };
            let Some((body, offset)) = next else { break };
            for record in Records::new(body) {
                let event = match record {
                    Ok(Record::Kernel(raw)) => match decode(raw) {
                        Ok(e) => e,
                        Err(_) => {
                            self.stats.undecodable += 1;
                            continue;
                        }
                    },
                    Ok(Record::Tick { ts_ns }) => Event::collector(ts_ns, EventData::Tick),
                    Ok(Record::Loss {
                        ts_ns,
                        count,
                        period_ns,
                    }) => Event::collector(
                        ts_ns,
                        EventData::Loss {
                            count,
                            what: LossKind::Ring,
                            period_ns: period_ns.unwrap_or(UNRECORDED_LOSS_PERIOD_NS),
                        },
                    ),
                    Ok(Record::Event(json)) => match serde_json::from_slice(json) {
                        Ok(e) => e,
                        Err(e) => {
                            // serde names a tag it does not know so; anything else is damage.
                            if e.to_string().contains("unknown variant") {
                                self.stats.unknown += 1;
                            } else {
                                self.stats.damaged += 1;
                            }
                            continue;
                        }
                    },
                    Ok(Record::Processes(json)) => {
                        self.processes = serde_json::from_slice(json).unwrap_or_default();
                        continue;
                    }
                    Ok(Record::End(json)) => {
                        self.end = Some(serde_json::from_slice(json).unwrap_or_default());
                        continue;
                    }
                    Ok(Record::Unknown { .. }) => {
                        self.stats.unknown += 1;
                        continue;
                    }
                    Err(_) => {
                        self.stats.malformed_chunks += 1;
                        continue;
                    }
                };
                self.stats.events += 1;
                if sink(&event).is_break() {
                    self.stop();
                    return Ok(());
                }
            }
            progress(offset);
        }
        self.stop();
        self.read_to_end = true;
        Ok(())
    }

    /// Ends the prefetching thread, keeping what it met.
    fn stop(&mut self) {
        if let Chunks::Prefetched(p) = &mut self.chunks {
            if let Some(stats) = p.finish() {
                self.read_stats = stats;
            }
        }
    }

    /// The last `run` read the whole file (the sink did not stop it).
    pub fn read_to_end(&self) -> bool {
        self.read_to_end
    }

    pub fn stats(&self) -> &ReplayStats {
        &self.stats
    }

    /// Damage met so far (with a prefetching reader: once `run` returned).
    pub fn read_stats(&self) -> &ReadStats {
        match &self.chunks {
            Chunks::Direct(r) => r.stats(),
            Chunks::Prefetched(_) => &self.read_stats,
        }
    }

    /// Processes alive when recording started (empty until the replay has read them).
    pub fn processes(&self) -> &[Process] {
        &self.processes
    }

    /// The recorder's closing summary; None if it did not close the file (killed), or the
    /// replay did not get that far.
    pub fn end(&self) -> Option<&EndSummary> {
        self.end.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Replay;
    use crate::event::{Event, EventData};
    use crate::trace::{TraceMeta, TraceWriter, WriterOptions};

    /// An event of a kind this linger knows whose field has the wrong type is damage; one of a
    /// kind it does not know was written by a newer linger. Both are skipped, counted apart.
    #[test]
    fn a_damaged_known_event_is_told_from_a_newer_kind() {
        let mut w = TraceWriter::new(Vec::new(), &TraceMeta::default(), WriterOptions::default())
            .expect("in memory");
        let good = Event::collector(1, EventData::Tick);
        let mut damaged =
            serde_json::to_value(Event::collector(2, EventData::Nvml { gpus: Vec::new() }))
                .expect("JSON");
        damaged["data"]["gpus"] = json!("not a list");
        let mut newer = damaged.clone();
        newer["data"] = json!({"kind": "from_the_future"});
        w.event(&Event { pid: 1, ..good });
        w.raw_event(&damaged);
        w.raw_event(&newer);
        let bytes = w.finish(&"end").expect("in memory").0;
        let mut replay = Replay::new(bytes.as_slice()).expect("a trace");
        let mut seen = 0;
        replay
            .run(
                |_| {
                    seen += 1;
                    std::ops::ControlFlow::Continue(())
                },
                |_| {},
            )
            .expect("read");
        assert_eq!(seen, 1);
        assert_eq!((replay.stats().damaged, replay.stats().unknown), (1, 1));
    }
}
