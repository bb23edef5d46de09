//! Cuts recordings into fuzz seeds that a whole replay runs thousands of times a second: each
//! piece a recording of its own of at most MAX_LEN bytes (the file header and metadata as
//! recorded, then one uncompressed chunk of consecutive records, so that a mutation lands in
//! records, not in zstd's stream), the successful RM controls no rule reads left out (most of
//! a CUDA program's driver calls). At most PER_FILE pieces of a recording, spread over it.
//!
//! usage: linger-fuzz-seeds MAX_LEN PER_FILE OUT_DIR RECORDING...

use std::{fs, path::Path};

use tracer_user::{
    analysis::ledger::is_unread_control,
    source::decode::decode,
    trace::{
        format::{kind, CHUNK_HEADER_LEN, FILE_HEADER_LEN, RECORD_HEADER_LEN},
        reader::Chunk,
        writer::encode_chunk,
        TraceReader,
    },
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [max_len, per_file, out, recordings @ ..] = args.as_slice() else {
        return Err("usage: linger-fuzz-seeds MAX_LEN PER_FILE OUT_DIR RECORDING...".into());
    };
    let (max_len, per_file): (usize, usize) = (max_len.parse()?, per_file.parse()?);
    let out = Path::new(out);
    fs::create_dir_all(out)?;
    let mut written = 0;
    for path in recordings {
        let pieces = pieces(Path::new(path), max_len)?;
        let step = pieces.len().div_ceil(per_file.max(1)).max(1);
        let name = path.replace('/', "_");
        for (i, piece) in pieces.iter().enumerate().step_by(step) {
            fs::write(out.join(format!("{name}.{i}")), piece)?;
            written += 1;
        }
    }
    eprintln!("linger-fuzz-seeds: {written} pieces of at most {max_len} bytes");
    Ok(())
}

/// Every piece of one recording, in order.
fn pieces(path: &Path, max_len: usize) -> Result<Vec<Vec<u8>>, Box<dyn std::error::Error>> {
    let bytes = fs::read(path)?;
    let meta_len = u32::from_le_bytes(bytes[16..20].try_into()?) as usize;
    let head = &bytes[..FILE_HEADER_LEN + meta_len];
    let room = max_len.saturating_sub(head.len() + CHUNK_HEADER_LEN);
    let mut reader = TraceReader::new(bytes.as_slice())?;
    let mut pieces = Vec::new();
    let mut body = Vec::new();
    let mut records = 0;
    let mut span = (u64::MAX, 0);
    while let Some(chunk) = reader.next_chunk()? {
        let mut rest = chunk.body;
        while rest.len() >= RECORD_HEADER_LEN {
            let record_kind = u16::from_le_bytes([rest[0], rest[1]]);
            let len = u32::from_le_bytes(rest[2..6].try_into()?) as usize;
            let Some(record) = rest.get(..RECORD_HEADER_LEN + len) else {
                break;
            };
            rest = &rest[record.len()..];
            let payload = &record[RECORD_HEADER_LEN..];
            if record_kind == kind::KERNEL
                && decode(payload).is_ok_and(|e| is_unread_control(&e.data))
            {
                continue;
            }
            if record.len() > room {
                continue;
            }
            if body.len() + record.len() > room {
                pieces.push(piece(head, &body, records, span)?);
                body.clear();
                records = 0;
                span = (u64::MAX, 0);
            }
            body.extend_from_slice(record);
            records += 1;
            span = (span.0.min(chunk.t_first_ns), span.1.max(chunk.t_last_ns));
        }
    }
    if !body.is_empty() {
        pieces.push(piece(head, &body, records, span)?);
    }
    Ok(pieces)
}

/// A recording of `head` (the file header and metadata) and one uncompressed chunk.
fn piece(
    head: &[u8],
    body: &[u8],
    records: u32,
    (first, last): (u64, u64),
) -> std::io::Result<Vec<u8>> {
    let chunk = Chunk {
        seq: 0,
        records,
        t_first_ns: first,
        t_last_ns: last,
        end_offset: 0,
        body,
    };
    let mut stored = Vec::new();
    encode_chunk(&chunk, None, &mut stored)?;
    Ok([head, &stored].concat())
}
