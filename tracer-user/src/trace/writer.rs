//! Streaming writer: a file header, then self-checking chunks, each written with one `write`
//! so that a killed recorder leaves at most its last chunk incomplete.

use std::{
    io::{self, Write},
    path::Path,
};

use bytes::BufMut;
use serde::Serialize;

use super::{
    format::{self, kind},
    meta::TraceMeta,
    reader::{Chunk, StoredChunk},
    record,
    snapshot::Process,
};
use crate::{
    event::{Event, EventData, LossKind},
    output::{Existing, OutputError, OutputFile},
    stream::Tap,
};

#[derive(Clone, Copy, Debug)]
pub struct WriterOptions {
    /// zstd level per chunk; None stores chunks uncompressed.
    pub zstd_level: Option<i32>,
    /// A chunk is written once its body reaches this many bytes...
    pub chunk_bytes: usize,
    /// ...or when a tick comes this long after the chunk's first record: what a killed
    /// recorder can lose.
    pub flush_interval_ns: u64,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            zstd_level: Some(1),
            chunk_bytes: 256 << 10,
            flush_interval_ns: 1_000_000_000,
        }
    }
}

/// What the writer wrote, for the closing summary and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WriteStats {
    pub records: u64,
    pub chunks: u64,
    /// Record bytes before compression.
    pub raw_bytes: u64,
    /// Bytes in the file.
    pub file_bytes: u64,
}

pub struct TraceWriter<W: Write> {
    out: W,
    options: WriterOptions,
    body: Vec<u8>,
    stored: Vec<u8>,
    records: u32,
    t_first: u64,
    t_last: u64,
    seq: u32,
    compressor: Option<zstd::bulk::Compressor<'static>>,
    stats: WriteStats,
    /// The first write error; later writes are skipped. The live loop cannot stop on a
    /// failed record, so the caller checks [`TraceWriter::error`].
    error: Option<io::Error>,
}

/// Why a trace file could not be started.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("writing the file header")]
    Header(#[source] io::Error),
}

/// Creates `path` as an [`OutputFile`] (mode 0600: traces hold command lines) and writes the
/// file header. A replaced file gives way at once: a trace is readable while it grows, and a
/// killed recorder leaves it under its name.
pub fn create(
    path: &Path,
    existing: Existing,
    meta: &TraceMeta,
    options: WriterOptions,
) -> Result<TraceWriter<OutputFile>, CreateError> {
    let mut file = OutputFile::create(path, existing)?;
    file.commit()?;
    TraceWriter::new(file, meta, options).map_err(CreateError::Header)
}

impl<W: Write> TraceWriter<W> {
    pub fn new(mut out: W, meta: &TraceMeta, options: WriterOptions) -> io::Result<Self> {
        let meta_json = serde_json::to_vec(meta)?;
        let mut header = Vec::with_capacity(format::FILE_HEADER_LEN + meta_json.len());
        header.extend_from_slice(&format::MAGIC);
        header.put_u16_le(format::MAJOR);
        header.put_u16_le(format::MINOR);
        header.put_u8(if cfg!(target_endian = "little") {
            format::LITTLE_ENDIAN
        } else {
            format::BIG_ENDIAN
        });
        header.put_bytes(0, 3);
        header.put_u32_le(meta_json.len() as u32);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&header), &meta_json);
        header.put_u32_le(crc);
        header.extend_from_slice(&meta_json);
        out.write_all(&header)?;
        out.flush()?;
        let compressor = match options.zstd_level {
            Some(level) => Some(zstd::bulk::Compressor::new(level)?),
            None => None,
        };
        Ok(Self {
            out,
            options,
            body: Vec::with_capacity(options.chunk_bytes + 4096),
            stored: Vec::new(),
            records: 0,
            t_first: u64::MAX,
            t_last: 0,
            seq: 0,
            compressor,
            stats: WriteStats {
                file_bytes: header.len() as u64,
                ..Default::default()
            },
            error: None,
        })
    }

    /// A ring buffer record, verbatim.
    pub fn kernel(&mut self, raw: &[u8]) {
        let ts = raw
            .get(8..16)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes);
        record::put(&mut self.body, kind::KERNEL, raw);
        self.added(ts);
    }

    /// A user-space event: the collector's own kinds compactly, any other as JSON.
    pub fn event(&mut self, e: &Event) {
        let zero = e.cpu == 0 && e.pid == 0 && e.tid == 0;
        match e.data {
            EventData::Tick if zero => record::put_tick(&mut self.body, e.ts_ns),
            EventData::Loss {
                count,
                what: LossKind::Ring,
                period_ns,
            } if zero => record::put_loss(&mut self.body, e.ts_ns, count, period_ns),
            _ => match serde_json::to_vec(e) {
                Ok(json) => record::put(&mut self.body, kind::EVENT, &json),
                Err(err) => return self.fail(err.into()),
            },
        }
        self.added(Some(e.ts_ns));
        if matches!(e.data, EventData::Tick)
            && e.ts_ns.saturating_sub(self.t_first) >= self.options.flush_interval_ns
        {
            self.flush_chunk();
        }
    }

    pub fn processes(&mut self, processes: &[Process]) {
        self.json_record(kind::PROCESSES, &processes);
    }

    /// Writes the closing summary and the last chunk.
    pub fn finish(mut self, summary: &impl Serialize) -> io::Result<(W, WriteStats)> {
        self.json_record(kind::END, summary);
        self.flush_chunk();
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok((self.out, self.stats)),
        }
    }

    pub fn error(&self) -> Option<&io::Error> {
        self.error.as_ref()
    }

    pub fn stats(&self) -> WriteStats {
        self.stats
    }

    /// Records so far, the unwritten chunk's included.
    pub fn records(&self) -> u64 {
        self.stats.records + u64::from(self.records)
    }

    /// An event record holding `value` as it is, for tests of what a reader makes of events it
    /// cannot parse.
    #[cfg(test)]
    pub fn raw_event(&mut self, value: &serde_json::Value) {
        self.json_record(kind::EVENT, value);
    }

    fn json_record(&mut self, kind_id: u16, value: &impl Serialize) {
        match serde_json::to_vec(value) {
            Ok(json) => {
                record::put(&mut self.body, kind_id, &json);
                self.added(None);
            }
            Err(e) => self.fail(e.into()),
        }
    }

    fn added(&mut self, ts: Option<u64>) {
        self.records += 1;
        if let Some(ts) = ts {
            self.t_first = self.t_first.min(ts);
            self.t_last = self.t_last.max(ts);
        }
        if self.body.len() >= self.options.chunk_bytes {
            self.flush_chunk();
        }
    }

    /// Writes the pending records as one chunk.
    pub fn flush_chunk(&mut self) {
        if self.records == 0 {
            return;
        }
        if self.error.is_none() {
            if let Err(e) = self.write_chunk() {
                self.fail(e);
            }
        }
        self.stats.records += u64::from(self.records);
        self.stats.raw_bytes += self.body.len() as u64;
        self.body.clear();
        self.records = 0;
        self.t_first = u64::MAX;
        self.t_last = 0;
    }

    /// Writes a chunk of another trace as it was stored, after the pending records, in this
    /// file's sequence: a join of traces without decompressing them.
    pub fn copy_chunk(&mut self, chunk: &StoredChunk) {
        self.flush_chunk();
        if self.error.is_some() {
            return;
        }
        self.stored.clear();
        put_chunk_header(
            &mut self.stored,
            &Header {
                seq: self.seq,
                stored_len: chunk.stored.len() as u32,
                raw_len: chunk.raw_len,
                records: chunk.records,
                codec: chunk.codec,
                t_first_ns: chunk.t_first_ns,
                t_last_ns: chunk.t_last_ns,
            },
            chunk.stored,
        );
        let written = self
            .out
            .write_all(&self.stored)
            .and_then(|()| self.out.write_all(chunk.stored))
            .and_then(|()| self.out.flush());
        if let Err(e) = written {
            return self.fail(e);
        }
        self.seq = self.seq.wrapping_add(1);
        self.stats.chunks += 1;
        self.stats.records += u64::from(chunk.records);
        self.stats.raw_bytes += u64::from(chunk.raw_len);
        self.stats.file_bytes += (self.stored.len() + chunk.stored.len()) as u64;
    }

    fn write_chunk(&mut self) -> io::Result<()> {
        let chunk = Chunk {
            seq: self.seq,
            records: self.records,
            t_first_ns: if self.t_first == u64::MAX {
                0
            } else {
                self.t_first
            },
            t_last_ns: self.t_last,
            end_offset: 0,
            body: &self.body,
        };
        encode_chunk(&chunk, self.compressor.as_mut(), &mut self.stored)?;
        self.out.write_all(&self.stored)?;
        self.out.flush()?;
        self.seq = self.seq.wrapping_add(1);
        self.stats.chunks += 1;
        self.stats.file_bytes += self.stored.len() as u64;
        Ok(())
    }

    fn fail(&mut self, e: io::Error) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }
}

impl<W: Write> Tap for TraceWriter<W> {
    fn kernel(&mut self, raw: &[u8]) {
        TraceWriter::kernel(self, raw);
    }

    fn event(&mut self, e: &Event) {
        TraceWriter::event(self, e);
    }
}

/// `chunk` as it stands in a file, into `out`: its header and its body, compressed where that
/// makes it smaller.
pub fn encode_chunk(
    chunk: &Chunk,
    compressor: Option<&mut zstd::bulk::Compressor<'static>>,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let compressed = match compressor {
        Some(c) => Some(c.compress(chunk.body)?),
        None => None,
    };
    let (codec, stored) = match &compressed {
        Some(z) if z.len() < chunk.body.len() => (format::CODEC_ZSTD, z.as_slice()),
        _ => (format::CODEC_NONE, chunk.body),
    };
    out.clear();
    put_chunk_header(
        out,
        &Header {
            seq: chunk.seq,
            stored_len: stored.len() as u32,
            raw_len: chunk.body.len() as u32,
            records: chunk.records,
            codec,
            t_first_ns: chunk.t_first_ns,
            t_last_ns: chunk.t_last_ns,
        },
        stored,
    );
    out.extend_from_slice(stored);
    Ok(())
}

/// A chunk header's fields, less its checksums.
struct Header {
    seq: u32,
    stored_len: u32,
    raw_len: u32,
    records: u32,
    codec: u8,
    t_first_ns: u64,
    t_last_ns: u64,
}

/// Appends the chunk header of a body stored as `stored`.
fn put_chunk_header(out: &mut Vec<u8>, h: &Header, stored: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&format::CHUNK_MAGIC);
    out.put_u32_le(h.seq);
    out.put_u32_le(h.stored_len);
    out.put_u32_le(h.raw_len);
    out.put_u32_le(h.records);
    out.put_u8(h.codec);
    out.put_bytes(0, 3);
    out.put_u64_le(h.t_first_ns);
    out.put_u64_le(h.t_last_ns);
    out.put_u32_le(crc32c::crc32c(stored));
    let header_crc = crc32c::crc32c(&out[start..]);
    out.put_u32_le(header_crc);
}
