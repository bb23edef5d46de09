//! Hash maps keyed by pids, tids and incident ids, hashed by one multiply per key. The std
//! map's SipHash guards against keys chosen to collide, which the kernel's pids and our own
//! ids are not; in a kill storm its hashing was a tenth of the collector's work.

use std::{
    collections::HashMap,
    hash::{BuildHasherDefault, Hasher},
};

pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Multiply-rotate over 64-bit words: the product's high bits (which the table's control
/// bytes take) depend on every bit of the key, and its low bits (the bucket index) keep
/// consecutive keys apart.
#[derive(Clone, Copy, Default)]
pub struct IdHasher(u64);

/// An odd constant with bits spread over the word (2^64 / golden ratio).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl IdHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_i32(&mut self, n: i32) {
        self.add(n as u32 as u64);
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn consecutive_pids_land_in_distinct_buckets_and_control_bytes_vary() {
        let build = BuildHasherDefault::<IdHasher>::default();
        let hashes: Vec<u64> = (4000u32..4256).map(|p| build.hash_one(p)).collect();
        let buckets: std::collections::BTreeSet<u64> = hashes.iter().map(|h| h & 255).collect();
        let tops: std::collections::BTreeSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert_eq!(buckets.len(), 256);
        assert!(tops.len() > 64, "{} distinct top-7-bit values", tops.len());
    }
}
