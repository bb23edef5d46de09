//! Records inside a chunk body: `kind: u16, len: u32, payload[len]`, back to back.

use bytes::{Buf, BufMut};

use super::format::{kind, RECORD_HEADER_LEN};

/// One record, borrowing the chunk body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// A ring buffer record as the kernel wrote it.
    Kernel(&'a [u8]),
    Tick {
        ts_ns: u64,
    },
    Loss {
        ts_ns: u64,
        count: u64,
        /// How long a report covers; `None` in recordings made before it was written.
        period_ns: Option<u64>,
    },
    /// An `Event` as JSON.
    Event(&'a [u8]),
    /// The process snapshot as JSON.
    Processes(&'a [u8]),
    /// The recorder's closing summary as JSON.
    End(&'a [u8]),
    /// A kind this reader does not know (written by a newer minor version), or a known fixed
    /// kind too short to hold its fields.
    Unknown {
        kind: u16,
        len: usize,
    },
}

/// Appends one record to a chunk body.
pub fn put(body: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    body.put_u16_le(kind);
    body.put_u32_le(payload.len() as u32);
    body.extend_from_slice(payload);
}

pub fn put_tick(body: &mut Vec<u8>, ts_ns: u64) {
    put(body, kind::TICK, &ts_ns.to_le_bytes());
}

pub fn put_loss(body: &mut Vec<u8>, ts_ns: u64, count: u64, period_ns: u64) {
    let mut p = [0u8; 24];
    p[..8].copy_from_slice(&ts_ns.to_le_bytes());
    p[8..16].copy_from_slice(&count.to_le_bytes());
    p[16..].copy_from_slice(&period_ns.to_le_bytes());
    put(body, kind::LOSS, &p);
}

/// The records of a chunk body. Yields `Err(offset)` once, and then nothing, if a record runs
/// past the end of the body.
pub struct Records<'a> {
    body: &'a [u8],
    offset: usize,
}

impl<'a> Records<'a> {
    pub fn new(body: &'a [u8]) -> Self {
        Self { body, offset: 0 }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, usize>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = &self.body[self.offset..];
        if rest.is_empty() {
            return None;
        }
        let mut head = rest;
        if head.len() < RECORD_HEADER_LEN {
            return Some(Err(self.stop()));
        }
        let kind_id = head.get_u16_le();
        let len = head.get_u32_le() as usize;
        if head.len() < len {
            return Some(Err(self.stop()));
        }
        let payload = &head[..len];
        self.offset += RECORD_HEADER_LEN + len;
        Some(Ok(parse(kind_id, payload)))
    }
}

impl Records<'_> {
    fn stop(&mut self) -> usize {
        let at = self.offset;
        self.offset = self.body.len();
        at
    }
}

fn parse(kind_id: u16, mut p: &[u8]) -> Record<'_> {
    let unknown = Record::Unknown {
        kind: kind_id,
        len: p.len(),
    };
    match kind_id {
        kind::KERNEL => Record::Kernel(p),
        kind::EVENT => Record::Event(p),
        kind::PROCESSES => Record::Processes(p),
        kind::END => Record::End(p),
        // Fixed kinds may grow at their end: extra bytes are a newer writer's fields.
        kind::TICK if p.len() >= 8 => Record::Tick {
            ts_ns: p.get_u64_le(),
        },
        kind::LOSS if p.len() >= 16 => Record::Loss {
            ts_ns: p.get_u64_le(),
            count: p.get_u64_le(),
            period_ns: (p.len() >= 8).then(|| p.get_u64_le()),
        },
        _ => unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_unknown_kinds_are_skipped() {
        let mut body = Vec::new();
        put(&mut body, kind::KERNEL, b"raw");
        put_tick(&mut body, 7);
        put(&mut body, 0x7777, b"from the future");
        put_loss(&mut body, 8, 3, 1000);
        // A loss as writers before the period wrote it.
        let mut old = [0u8; 16];
        old[..8].copy_from_slice(&9u64.to_le_bytes());
        old[8..].copy_from_slice(&4u64.to_le_bytes());
        put(&mut body, kind::LOSS, &old);
        let got: Vec<_> = Records::new(&body).collect();
        assert_eq!(
            got,
            vec![
                Ok(Record::Kernel(b"raw")),
                Ok(Record::Tick { ts_ns: 7 }),
                Ok(Record::Unknown {
                    kind: 0x7777,
                    len: 15
                }),
                Ok(Record::Loss {
                    ts_ns: 8,
                    count: 3,
                    period_ns: Some(1000)
                }),
                Ok(Record::Loss {
                    ts_ns: 9,
                    count: 4,
                    period_ns: None
                }),
            ]
        );
    }

    #[test]
    fn a_record_past_the_end_stops_the_body() {
        let mut body = Vec::new();
        put_tick(&mut body, 1);
        put(&mut body, kind::KERNEL, b"0123456789");
        body.truncate(body.len() - 3);
        let got: Vec<_> = Records::new(&body).collect();
        assert_eq!(got, vec![Ok(Record::Tick { ts_ns: 1 }), Err(14)]);
    }
}
