//! Byte layout of a trace file (spec: docs/trace-format.md). Framing integers are
//! little-endian; kernel records keep the byte order the ring buffer delivered them in.

/// First eight bytes of every trace file. The high first byte makes a text-mode transfer or a
/// JSON file fail the check at once.
pub const MAGIC: [u8; 8] = *b"\x89LINGER\n";

/// A reader of major version N reads every N.x file and rejects N+1.
pub const MAJOR: u16 = 1;
pub const MINOR: u16 = 0;

/// Byte-order byte of the file header: the order of the verbatim kernel records.
pub const LITTLE_ENDIAN: u8 = 1;
pub const BIG_ENDIAN: u8 = 2;

/// magic, major, minor, byte order, 3 reserved, metadata length, CRC32C.
pub const FILE_HEADER_LEN: usize = 24;
/// Metadata JSON larger than this is taken for corruption.
pub const MAX_META_LEN: usize = 1 << 20;

/// Starts every chunk; the reader scans for it to resynchronise after damage.
pub const CHUNK_MAGIC: [u8; 4] = *b"LGCK";
pub const CHUNK_HEADER_LEN: usize = 48;
/// Chunk bodies (stored or decompressed) larger than this are taken for corruption.
pub const MAX_CHUNK_LEN: usize = 16 << 20;

/// Chunk codecs.
pub const CODEC_NONE: u8 = 0;
pub const CODEC_ZSTD: u8 = 1;

/// Every record in a chunk body: kind (u16), payload length (u32), payload.
pub const RECORD_HEADER_LEN: usize = 6;

/// Record kinds. 0x0001-0x00ff: kernel; 0x0100-0x01ff: user-space events; 0x0200-: trace
/// metadata. A reader skips kinds it does not know.
pub mod kind {
    /// A ring buffer record, byte for byte (`tracer_common::Header` + payload).
    pub const KERNEL: u16 = 0x0001;
    /// The collector's clock advanced: `ts_ns` (u64).
    pub const TICK: u16 = 0x0100;
    /// The kernel dropped records: `ts_ns` (u64), `count` (u64).
    pub const LOSS: u16 = 0x0101;
    /// Any other user-space event: an `Event` as JSON.
    pub const EVENT: u16 = 0x0102;
    /// Processes alive when recording started: JSON array.
    pub const PROCESSES: u16 = 0x0200;
    /// The recorder closed the file: JSON summary. Absent when the recorder was killed.
    pub const END: u16 = 0x0201;
}
