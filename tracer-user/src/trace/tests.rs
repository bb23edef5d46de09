//! Round trips and damage, as properties over generated record streams.

use proptest::prelude::*;

use super::{
    format,
    reader::{TraceError, TraceReader},
    record::Record,
    TraceMeta, TraceWriter, WriterOptions,
};
use crate::event::{Event, EventData, LossKind};

/// A record as the writer is given it and the reader gives it back.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Item {
    Kernel(Vec<u8>),
    Tick(u64),
    Loss(u64, u64, u64),
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..120).prop_map(Item::Kernel),
        any::<u64>().prop_map(Item::Tick),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(t, c, p)| Item::Loss(t, c, p)),
    ]
}

fn write(items: &[Item], options: WriterOptions) -> Vec<u8> {
    let meta = TraceMeta {
        host: "test".into(),
        ..Default::default()
    };
    let mut w = TraceWriter::new(Vec::new(), &meta, options).expect("in memory");
    for item in items {
        match item {
            Item::Kernel(raw) => w.kernel(raw),
            Item::Tick(t) => w.event(&Event::collector(*t, EventData::Tick)),
            Item::Loss(t, c, p) => w.event(&Event::collector(
                *t,
                EventData::Loss {
                    count: *c,
                    what: LossKind::Ring,
                    period_ns: *p,
                },
            )),
        }
    }
    w.finish(&"end").expect("in memory").0
}

/// Everything a reader gets from `bytes`, and whether it reported damage.
fn read(bytes: &[u8]) -> Result<(Vec<Item>, bool), TraceError> {
    let mut r = TraceReader::new(bytes)?;
    let mut out = Vec::new();
    while let Some(chunk) = r.next_chunk()? {
        for rec in chunk.records() {
            match rec.expect("a chunk whose checksum holds is well formed") {
                Record::Kernel(raw) => out.push(Item::Kernel(raw.to_vec())),
                Record::Tick { ts_ns } => out.push(Item::Tick(ts_ns)),
                Record::Loss {
                    ts_ns,
                    count,
                    period_ns: Some(p),
                } => out.push(Item::Loss(ts_ns, count, p)),
                Record::End(_) | Record::Processes(_) => {}
                other => panic!("unexpected record {other:?}"),
            }
        }
    }
    Ok((out, !r.stats().damage.is_empty()))
}

fn options() -> impl Strategy<Value = WriterOptions> {
    (
        prop_oneof![Just(None), Just(Some(1)), Just(Some(3))],
        1usize..2000,
    )
        .prop_map(|(zstd_level, chunk_bytes)| WriterOptions {
            zstd_level,
            chunk_bytes,
            flush_interval_ns: u64::MAX,
        })
}

/// `sub` is `all` with whole runs left out, order kept.
fn is_subsequence(sub: &[Item], all: &[Item]) -> bool {
    let mut it = all.iter();
    sub.iter().all(|s| it.any(|a| a == s))
}

proptest! {
    #[test]
    fn records_round_trip(items in proptest::collection::vec(item(), 0..300), opts in options()) {
        let bytes = write(&items, opts);
        let (got, damaged) = read(&bytes).expect("a whole file reads");
        prop_assert_eq!(got, items);
        prop_assert!(!damaged);
    }

    #[test]
    fn a_truncated_file_gives_a_prefix(
        items in proptest::collection::vec(item(), 1..200),
        opts in options(),
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = write(&items, opts);
        let cut = cut.index(bytes.len());
        match read(&bytes[..cut]) {
            Ok((got, _)) => prop_assert!(items.starts_with(&got)),
            Err(TraceError::Empty | TraceError::TruncatedHeader(_)) => {}
            Err(e) => prop_assert!(false, "cut at {}: {}", cut, e),
        }
    }

    #[test]
    fn flipped_bytes_lose_whole_chunks_only(
        items in proptest::collection::vec(item(), 1..200),
        opts in options(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
    ) {
        let mut bytes = write(&items, opts);
        for (at, mask) in &flips {
            let at = at.index(bytes.len());
            bytes[at] ^= mask;
        }
        // Damage in the magic or the version makes the file unusable; anywhere else it costs
        // the chunks it hits, and the reader says so.
        if let Ok((got, damaged)) = read(&bytes) {
            prop_assert!(is_subsequence(&got, &items));
            prop_assert!(damaged || got == items);
        }
    }
}

#[test]
fn bad_files_are_named() {
    let good = write(&[Item::Tick(1)], WriterOptions::default());
    assert!(matches!(read(b""), Err(TraceError::Empty)));
    assert!(matches!(
        read(b"{\"json\": 1}"),
        Err(TraceError::NotATrace(_))
    ));
    assert!(matches!(
        read(&good[..5]),
        Err(TraceError::TruncatedHeader(5))
    ));
    let mut newer = good.clone();
    newer[8..10].copy_from_slice(&(format::MAJOR + 1).to_le_bytes());
    let err = read(&newer).expect_err("newer major");
    assert!(err.to_string().contains("newer"), "{err}");
    let mut minor = good.clone();
    minor[10] = 9;
    // A newer minor fails only the header checksum: read on, with a warning.
    let (got, damaged) = read(&minor).expect("same major");
    assert_eq!((got, damaged), (vec![Item::Tick(1)], true));
}

#[test]
fn a_damaged_chunk_is_skipped_and_the_next_one_read() {
    let items: Vec<Item> = (0..3000).map(Item::Tick).collect();
    let opts = WriterOptions {
        zstd_level: None,
        chunk_bytes: 4096,
        flush_interval_ns: u64::MAX,
    };
    let mut bytes = write(&items, opts);
    // A byte in the body of the second chunk.
    let first_chunk = bytes
        .windows(4)
        .position(|w| w == format::CHUNK_MAGIC)
        .expect("a chunk");
    let second = first_chunk
        + 1
        + bytes[first_chunk + 1..]
            .windows(4)
            .position(|w| w == format::CHUNK_MAGIC)
            .expect("two chunks");
    bytes[second + format::CHUNK_HEADER_LEN + 10] ^= 0x40;
    let mut r = TraceReader::new(bytes.as_slice()).expect("header intact");
    let mut got = 0;
    while let Some(chunk) = r.next_chunk().expect("in memory") {
        got += chunk.records().count();
    }
    let stats = r.stats();
    assert_eq!(stats.damage.len(), 1, "{:?}", stats.damage);
    assert!(stats.damage[0].reason.contains("checksum"));
    assert_eq!(got as u64 + stats.records_lost, items.len() as u64 + 1);
    assert!(stats.records_lost > 0 && got > 0);
}
