//! Reads a trace chunk by chunk. A damaged header or body is skipped, counted and described,
//! and reading goes on at the next chunk whose checksums hold; only a file that is not a
//! trace at all, or of a newer major version, is an error.

use std::io::{self, Read};

use bytes::Buf;

use super::{
    format::{self, CHUNK_HEADER_LEN, CHUNK_MAGIC, FILE_HEADER_LEN},
    input::Input,
    meta::TraceMeta,
    record::Records,
};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("the file is empty")]
    Empty,
    #[error("not a linger trace (it starts with {0})")]
    NotATrace(String),
    #[error("the file ends inside its header ({0} bytes): nothing was recorded")]
    TruncatedHeader(u64),
    #[error(
        "trace format {major}.{minor} is newer than this linger reads ({}.x): use a newer linger",
        format::MAJOR
    )]
    NewerMajor { major: u16, minor: u16 },
    #[error("trace format version {0} is invalid")]
    BadMajor(u16),
    #[error(
        "recorded on a big-endian host: this linger decodes little-endian kernel records only"
    )]
    BigEndian,
    /// The I/O error is said in the message, not kept as a source: a chain would say it twice.
    #[error("reading the trace: {0}")]
    Io(io::Error),
}

impl From<io::Error> for TraceError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// A stretch of the file that could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// File offset where the damage starts.
    pub offset: u64,
    /// Bytes skipped.
    pub bytes: u64,
    pub reason: String,
}

#[derive(Clone, Debug, Default)]
pub struct ReadStats {
    pub chunks: u64,
    /// Chunks known lost: gaps in the sequence numbers of the good chunks around damage.
    pub chunks_lost: u64,
    /// Records that were in chunks lost to damage, when their headers said how many.
    pub records_lost: u64,
    pub damage: Vec<Damage>,
}

/// One good chunk, its body decompressed and checked.
pub struct Chunk<'a> {
    pub seq: u32,
    pub records: u32,
    pub t_first_ns: u64,
    pub t_last_ns: u64,
    /// File offset after this chunk.
    pub end_offset: u64,
    pub body: &'a [u8],
}

impl<'a> Chunk<'a> {
    pub fn records(&self) -> Records<'a> {
        Records::new(self.body)
    }
}

/// One good chunk as stored in its file: what copying it into another trace takes.
pub struct StoredChunk<'a> {
    pub records: u32,
    pub raw_len: u32,
    pub codec: u8,
    pub t_first_ns: u64,
    pub t_last_ns: u64,
    pub stored: &'a [u8],
}

struct ChunkHeader {
    seq: u32,
    stored_len: usize,
    raw_len: usize,
    records: u32,
    codec: u8,
    t_first_ns: u64,
    t_last_ns: u64,
    body_crc: u32,
}

pub struct TraceReader<R> {
    input: Input<R>,
    meta: TraceMeta,
    version: (u16, u16),
    body: Vec<u8>,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
    next_seq: Option<u32>,
    stats: ReadStats,
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the file header.
    pub fn new(inner: R) -> Result<Self, TraceError> {
        let mut input = Input::new(inner);
        let head = input.fill(FILE_HEADER_LEN)?;
        let len = head.len() as u64;
        if head.is_empty() {
            return Err(TraceError::Empty);
        }
        let magic_len = head.len().min(format::MAGIC.len());
        if head[..magic_len] != format::MAGIC[..magic_len] {
            return Err(TraceError::NotATrace(describe_start(head)));
        }
        if head.len() < FILE_HEADER_LEN {
            return Err(TraceError::TruncatedHeader(len));
        }
        let mut h = &head[format::MAGIC.len()..];
        let major = h.get_u16_le();
        let minor = h.get_u16_le();
        // Checked before anything else: a newer major may lay out the rest differently.
        if major > format::MAJOR {
            return Err(TraceError::NewerMajor { major, minor });
        }
        if major == 0 {
            return Err(TraceError::BadMajor(major));
        }
        let order = h.get_u8();
        h.advance(3);
        let meta_len = h.get_u32_le() as usize;
        let crc = h.get_u32_le();
        let prefix = head[..FILE_HEADER_LEN - 4].to_vec();
        let mut stats = ReadStats::default();
        let damaged = |reason: &str, bytes: u64| Damage {
            offset: 0,
            bytes,
            reason: reason.to_string(),
        };
        let mut meta = TraceMeta::default();
        if meta_len > format::MAX_META_LEN {
            // The length itself is damaged: find the first chunk by scanning.
            stats
                .damage
                .push(damaged("file header damaged (metadata length)", 0));
            input.consume(FILE_HEADER_LEN);
        } else {
            let all = input.fill(FILE_HEADER_LEN + meta_len)?;
            if all.len() < FILE_HEADER_LEN + meta_len {
                return Err(TraceError::TruncatedHeader(all.len() as u64));
            }
            let json = &all[FILE_HEADER_LEN..FILE_HEADER_LEN + meta_len];
            let crc_ok = crc32c::crc32c_append(crc32c::crc32c(&prefix), json) == crc;
            match serde_json::from_slice::<TraceMeta>(json) {
                Ok(m) => meta = m,
                Err(_) => stats
                    .damage
                    .push(damaged("file header metadata unreadable", meta_len as u64)),
            }
            if !crc_ok && stats.damage.is_empty() {
                stats.damage.push(damaged(
                    "file header checksum mismatch: its metadata may be wrong",
                    0,
                ));
            }
            // A flipped byte-order byte fails the checksum too; only a checked one is trusted.
            if crc_ok && order == format::BIG_ENDIAN {
                return Err(TraceError::BigEndian);
            }
            input.consume(FILE_HEADER_LEN + meta_len);
        }
        Ok(Self {
            input,
            meta,
            version: (major, minor),
            body: Vec::new(),
            decompressor: None,
            next_seq: None,
            stats,
        })
    }

    pub fn meta(&self) -> &TraceMeta {
        &self.meta
    }

    /// (major, minor) of the file.
    pub fn version(&self) -> (u16, u16) {
        self.version
    }

    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }

    /// Bytes of the file consumed so far.
    pub fn offset(&self) -> u64 {
        self.input.offset()
    }

    /// The next good chunk, skipping and recording damage; None at the end of the file.
    pub fn next_chunk(&mut self) -> io::Result<Option<Chunk<'_>>> {
        loop {
            let Some((h, at)) = self.next_checked()? else {
                return Ok(None);
            };
            let whole = CHUNK_HEADER_LEN + h.stored_len;
            let stored = &self.input.available()[CHUNK_HEADER_LEN..whole];
            let unpacked = match h.codec {
                format::CODEC_NONE => {
                    self.body.clear();
                    self.body.extend_from_slice(stored);
                    Ok(())
                }
                format::CODEC_ZSTD => {
                    unzstd(&mut self.decompressor, stored, h.raw_len, &mut self.body)
                }
                other => Err(format!("chunk codec {other} unknown to this linger")),
            };
            self.input.consume(whole);
            if let Err(reason) = unpacked {
                self.lost(&h, at, whole as u64, &reason);
                continue;
            }
            self.count(&h);
            return Ok(Some(Chunk {
                seq: h.seq,
                records: h.records,
                t_first_ns: h.t_first_ns,
                t_last_ns: h.t_last_ns,
                end_offset: self.input.offset(),
                body: &self.body,
            }));
        }
    }

    /// The next good chunk as it is stored (its body checked, not decompressed), for copying
    /// it into another trace; None at the end of the file.
    pub fn next_stored_chunk(&mut self) -> io::Result<Option<StoredChunk<'_>>> {
        let Some((h, _)) = self.next_checked()? else {
            return Ok(None);
        };
        let whole = CHUNK_HEADER_LEN + h.stored_len;
        self.body.clear();
        self.body
            .extend_from_slice(&self.input.available()[CHUNK_HEADER_LEN..whole]);
        self.input.consume(whole);
        self.count(&h);
        Ok(Some(StoredChunk {
            records: h.records,
            raw_len: h.raw_len as u32,
            codec: h.codec,
            t_first_ns: h.t_first_ns,
            t_last_ns: h.t_last_ns,
            stored: &self.body,
        }))
    }

    /// Finds the next chunk whose header and body checksums hold, skipping and recording
    /// damage; leaves it whole at the start of the input, not consumed. Returns its header
    /// and offset.
    fn next_checked(&mut self) -> io::Result<Option<(ChunkHeader, u64)>> {
        loop {
            let at = self.input.offset();
            let window = self.input.fill(CHUNK_HEADER_LEN)?;
            if window.is_empty() {
                return Ok(None);
            }
            if window.len() < CHUNK_HEADER_LEN {
                if window.starts_with(&CHUNK_MAGIC[..window.len().min(4)]) {
                    let n = window.len();
                    self.skip(
                        at,
                        n as u64,
                        "the file ends inside a chunk header (recorder stopped mid-write)",
                    );
                    self.input.consume(n);
                } else {
                    self.resync(at, "garbage at the end of the file")?;
                }
                continue;
            }
            if window[..4] != CHUNK_MAGIC {
                self.resync(at, "no chunk where one should start")?;
                continue;
            }
            let Some(h) = parse_chunk_header(&window[..CHUNK_HEADER_LEN]) else {
                self.input.consume(1);
                self.resync(at, "chunk header checksum mismatch")?;
                continue;
            };
            if h.stored_len > format::MAX_CHUNK_LEN || h.raw_len > format::MAX_CHUNK_LEN {
                self.input.consume(1);
                self.resync(at, "chunk header with an impossible length")?;
                continue;
            }
            let whole = CHUNK_HEADER_LEN + h.stored_len;
            let window = self.input.fill(whole)?;
            if window.len() < whole {
                let n = window.len();
                self.input.consume(n);
                self.lost(
                    &h,
                    at,
                    n as u64,
                    "the file ends inside a chunk (recorder stopped mid-write)",
                );
                continue;
            }
            if crc32c::crc32c(&window[CHUNK_HEADER_LEN..whole]) != h.body_crc {
                self.input.consume(whole);
                self.lost(&h, at, whole as u64, "chunk body checksum mismatch");
                continue;
            }
            return Ok(Some((h, at)));
        }
    }

    /// Counts a good chunk, and the chunks lost before it by its sequence number.
    fn count(&mut self, h: &ChunkHeader) {
        if let Some(expected) = self.next_seq {
            let gap = h.seq.wrapping_sub(expected);
            if gap > 0 && gap < u32::MAX / 2 {
                self.stats.chunks_lost += u64::from(gap);
            }
        }
        self.next_seq = Some(h.seq.wrapping_add(1));
        self.stats.chunks += 1;
    }

    /// Skips to the next chunk magic after damage at `at`.
    fn resync(&mut self, at: u64, reason: &str) -> io::Result<()> {
        self.input.seek_to(&CHUNK_MAGIC)?;
        let bytes = self.input.offset() - at;
        self.skip(at, bytes, reason);
        Ok(())
    }

    /// A chunk whose header held but whose body did not: its records are counted as lost.
    fn lost(&mut self, h: &ChunkHeader, at: u64, bytes: u64, reason: &str) {
        self.stats.records_lost += u64::from(h.records);
        self.skip(
            at,
            bytes,
            &format!("{reason}: chunk {} with {} records lost", h.seq, h.records),
        );
        self.next_seq = Some(h.seq.wrapping_add(1));
    }

    /// Records damage, merging it with damage that ends where it starts.
    fn skip(&mut self, offset: u64, bytes: u64, reason: &str) {
        if let Some(last) = self.stats.damage.last_mut() {
            if last.offset + last.bytes == offset && last.reason == reason {
                last.bytes += bytes;
                return;
            }
        }
        self.stats.damage.push(Damage {
            offset,
            bytes,
            reason: reason.to_string(),
        });
    }
}

fn parse_chunk_header(mut h: &[u8]) -> Option<ChunkHeader> {
    let stored_crc = u32::from_le_bytes(h[CHUNK_HEADER_LEN - 4..].try_into().ok()?);
    if crc32c::crc32c(&h[..CHUNK_HEADER_LEN - 4]) != stored_crc {
        return None;
    }
    h.advance(4);
    let seq = h.get_u32_le();
    let stored_len = h.get_u32_le() as usize;
    let raw_len = h.get_u32_le() as usize;
    let records = h.get_u32_le();
    let codec = h.get_u8();
    h.advance(3);
    Some(ChunkHeader {
        seq,
        stored_len,
        raw_len,
        records,
        codec,
        t_first_ns: h.get_u64_le(),
        t_last_ns: h.get_u64_le(),
        body_crc: h.get_u32_le(),
    })
}

/// Decompresses into `out`, refusing anything but exactly `raw_len` bytes.
fn unzstd(
    decompressor: &mut Option<zstd::bulk::Decompressor<'static>>,
    stored: &[u8],
    raw_len: usize,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let d = match decompressor {
        Some(d) => d,
        None => decompressor.insert(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?),
    };
    out.clear();
    out.reserve(raw_len);
    let n = d
        .decompress_to_buffer(stored, out)
        .map_err(|e| format!("chunk does not decompress ({e})"))?;
    if n != raw_len {
        return Err(format!("chunk decompresses to {n} bytes, not {raw_len}"));
    }
    Ok(())
}

fn describe_start(head: &[u8]) -> String {
    let shown = &head[..head.len().min(8)];
    if shown.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("{:?}", String::from_utf8_lossy(shown))
    } else {
        shown
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}
