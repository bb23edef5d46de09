//! The committed recordings under tests/data: JSON lines are stored zstd-compressed
//! (`NAME.jsonl.zst`) to keep the tree small enough for a GPU machine's call to carry.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// tests/data/h200.
pub fn h200() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/h200")
}

/// Every committed pass of the scenario suite (a folder of tests/data/h200/suite with a truth
/// file), in name order.
pub fn suite_passes() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(h200().join("suite"))
        .expect("suite dir")
        .flatten()
        .map(|e| e.path())
        .filter(|d| d.join("truth.jsonl.zst").exists())
        .collect();
    dirs.sort();
    dirs
}

/// A file's bytes, decompressed when it is a `.zst`.
pub fn decompressed(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if path.extension().is_some_and(|e| e == "zst") {
        zstd::decode_all(bytes.as_slice()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    } else {
        bytes
    }
}

/// The JSON values of a `.jsonl.zst` (or plain `.jsonl`) file, one a line.
pub fn json_lines(path: &Path) -> Vec<Value> {
    String::from_utf8(decompressed(path))
        .expect("UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}
