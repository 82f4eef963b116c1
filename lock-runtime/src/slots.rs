//! Redis Cluster hash slots: which slot a key lands in, and a short hash
//! tag for each slot, so that a name can be made to land beside any lock.
//!
//! Fencing tokens come from one counter per slot (not one per lock name,
//! which would leave a key behind for every name ever locked): the counter
//! must share the lock's slot, since a script touches one slot only.

use std::sync::LazyLock;

/// Slots in a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// CRC16/XMODEM, the checksum Redis Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot of `key`: of the part inside its first `{…}` if that is not
/// empty, else of the whole key (the cluster specification's rule).
pub(crate) fn slot_of(key: &str) -> u16 {
    let b = key.as_bytes();
    let hashed = match b.iter().position(|&c| c == b'{') {
        Some(open) => match b[open + 1..].iter().position(|&c| c == b'}') {
            Some(len) if len > 0 => &b[open + 1..open + 1 + len],
            _ => b,
        },
        None => b,
    };
    crc16(hashed) % SLOTS
}

/// For each slot, the shortest decimal string that hashes into it: found
/// once, on first use (about 150 000 checksums of a few bytes).
static TAGS: LazyLock<Vec<Box<str>>> = LazyLock::new(|| {
    let mut tags: Vec<Option<Box<str>>> = vec![None; usize::from(SLOTS)];
    let mut missing = usize::from(SLOTS);
    let mut n: u64 = 0;
    while missing > 0 {
        let s = n.to_string();
        let slot = usize::from(crc16(s.as_bytes()) % SLOTS);
        if tags[slot].is_none() {
            tags[slot] = Some(s.into());
            missing -= 1;
        }
        n += 1;
    }
    tags.into_iter().map(|t| t.unwrap_or_default()).collect()
});

/// A hash tag (the text between braces) that lands in `slot`.
pub(crate) fn tag_for(slot: u16) -> &'static str {
    &TAGS[usize::from(slot % SLOTS)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_specification() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(
            slot_of("{user1000}.following"),
            slot_of("{user1000}.followers")
        );
        assert_eq!(slot_of("foo{}{bar}"), slot_of("foo{}{bar}"));
        assert_ne!(slot_of("foo{}{bar}"), slot_of("bar"));
        assert_eq!(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    }

    #[test]
    fn every_slot_has_a_tag_that_lands_in_it() {
        for slot in 0..SLOTS {
            let tag = tag_for(slot);
            assert!(!tag.is_empty());
            assert_eq!(slot_of(&format!("lock:fence{{{tag}}}")), slot, "{tag}");
        }
    }
}
