//! A hasher for keys this client makes itself: owner ids and runtime ids.
//!
//! Nobody outside picks them (an owner id is the client's random id and a
//! counter), so maps keyed by them need no defence against chosen
//! collisions, and std's SipHash, paid on every lock, release and send,
//! buys nothing there. It has no seed: never use it for anything from
//! outside. Maps keyed by lock names, which callers choose, keep SipHash.

use std::hash::{BuildHasherDefault, Hasher};

/// `HashMap`'s hasher state for keys the client makes.
pub(crate) type OwnKeys = BuildHasherDefault<OwnHasher>;

/// A word-at-a-time hash: each word folded in with a 64 × 64 → 128-bit
/// multiply whose halves are XORed (as `foldhash` and `rustc-hash` 2 do),
/// so that a difference anywhere in a word reaches every bit.
#[derive(Default, Clone, Copy)]
pub(crate) struct OwnHasher(u64);

const K: u64 = 0xf135_7aea_2e62_a9c5;

impl OwnHasher {
    fn add(&mut self, word: u64) {
        let product = u128::from(self.0 ^ word) * u128::from(K);
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

impl Hasher for OwnHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    use super::*;

    /// Owner ids that differ only in their counter spread over a table's
    /// low bits (which pick the bucket) and its top seven (which tag it).
    #[test]
    fn owner_ids_that_differ_in_their_counter_spread() {
        let ids: Vec<String> = (0..4096)
            // (A client id is a UUID's 32 hex digits.)
            .map(|n| format!("7f9c2ba4e88f4d3c9a1b2c3d4e5f6a7b:{n}"))
            .collect();
        let hashes: Vec<u64> = ids.iter().map(|s| OwnKeys::default().hash_one(s)).collect();
        let low: HashSet<u64> = hashes.iter().map(|h| h & 4095).collect();
        let top: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(
            low.len() > 2400,
            "{} of 4096 low-bit buckets used",
            low.len()
        );
        assert_eq!(top.len(), 128, "top seven bits: {} values", top.len());
    }
}
