//! The replay source: a trace file as the same event stream the live collector produced,
//! kernel records decoded by the live decoder.

use std::{fs::File, io::Read, ops::ControlFlow, path::Path};

use super::decode::decode;
use crate::{
    event::{Event, EventData},
    trace::{
        reader::{ReadStats, TraceReader},
        record::Record,
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
    /// Good chunks whose records ran past their end (a writer bug, not file damage).
    pub malformed_chunks: u64,
}

pub struct Replay<R> {
    reader: TraceReader<R>,
    processes: Vec<Process>,
    end: Option<EndSummary>,
    stats: ReplayStats,
    read_to_end: bool,
}

impl Replay<File> {
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        Self::new(File::open(path)?)
    }
}

impl<R: Read> Replay<R> {
    pub fn new(input: R) -> Result<Self, TraceError> {
        Ok(Self {
            reader: TraceReader::new(input)?,
            processes: Vec::new(),
            end: None,
            stats: ReplayStats::default(),
            read_to_end: false,
        })
    }

    pub fn meta(&self) -> &TraceMeta {
        self.reader.meta()
    }

    /// Feeds every event to `sink` in recorded order until it breaks or the file ends;
    /// `progress` gets the bytes read after each chunk.
    pub fn run(
        &mut self,
        mut sink: impl FnMut(&Event) -> ControlFlow<()>,
        mut progress: impl FnMut(u64),
    ) -> std::io::Result<()> {
        while let Some(chunk) = self.reader.next_chunk()? {
            for record in chunk.records() {
                let event = match record {
                    Ok(Record::Kernel(raw)) => match decode(raw) {
                        Ok(e) => e,
                        Err(_) => {
                            self.stats.undecodable += 1;
                            continue;
                        }
                    },
                    Ok(Record::Tick { ts_ns }) => collector_event(ts_ns, EventData::Tick),
                    Ok(Record::Loss { ts_ns, count }) => {
                        collector_event(ts_ns, EventData::Loss { count })
                    }
                    Ok(Record::Event(json)) => match serde_json::from_slice(json) {
                        Ok(e) => e,
                        Err(_) => {
                            self.stats.unknown += 1;
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
                    return Ok(());
                }
            }
            progress(self.reader.offset());
        }
        self.read_to_end = true;
        Ok(())
    }

    /// The last `run` read the whole file (the sink did not stop it).
    pub fn read_to_end(&self) -> bool {
        self.read_to_end
    }

    pub fn stats(&self) -> &ReplayStats {
        &self.stats
    }

    pub fn read_stats(&self) -> &ReadStats {
        self.reader.stats()
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

/// The collector's own events carry no task.
fn collector_event(ts_ns: u64, data: EventData) -> Event {
    Event {
        ts_ns,
        cpu: 0,
        pid: 0,
        tid: 0,
        data,
    }
}
