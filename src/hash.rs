//! A fast hasher for the maps on the launch path.
//!
//! Why: every kernel launch looks up its pipeline, its bind group and its memory in hash maps
//! whose keys are wgrad's own (ids, handles, `&'static str` names), never an attacker's. The
//! standard library's SipHash resists hash flooding, which these keys do not need, and costs
//! a measurable share of a training step's host time (docs/performance.md, the host path).
//! This is a multiply-rotate hash over 8-byte words, as rustc's own compiler-internal maps use.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A multiply-rotate hasher over words. Not for keys an outsider chooses.
#[derive(Clone, Copy)]
pub(crate) struct FastHasher {
    state: u64,
}

/// An odd constant with well-spread bits (from the golden ratio).
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

impl Default for FastHasher {
    /// Starts away from zero, where a zero word would leave the state unchanged.
    fn default() -> Self {
        FastHasher { state: SEED }
    }
}

impl FastHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        self.state = (self.state.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.mix(i as u64);
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.mix(i as u64);
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.mix(i as u64);
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // The last multiply leaves the low bits weakest; hashbrown takes its bucket from the
        // low bits and its tag from the top seven, so fold the high half down.
        self.state ^ (self.state >> 32)
    }
}

/// A `HashMap` with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;
/// A `HashSet` with [`FastHasher`].
pub(crate) type FastSet<K> = HashSet<K, BuildHasherDefault<FastHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn h<T: Hash>(x: T) -> u64 {
        BuildHasherDefault::<FastHasher>::default().hash_one(x)
    }

    #[test]
    fn equal_keys_equal_hashes_and_neighbours_differ() {
        assert_eq!(h(("matmul", 7u32)), h(("matmul", 7u32)));
        assert_ne!(h(("matmul", 7u32)), h(("matmul", 8u32)));
        assert_ne!(h("ab"), h("ba"));
        // Strings that differ only past the first word, or only in length.
        assert_ne!(h("attention_fwd_a"), h("attention_fwd_b"));
        assert_ne!(h(""), h("\0"));
    }

    #[test]
    fn consecutive_ids_spread_over_buckets() {
        // Ids 0..4096 into 256 buckets by their low bits: no bucket far above the mean of 16.
        let mut counts = [0u32; 256];
        for i in 0u64..4096 {
            counts[(h(i) & 255) as usize] += 1;
        }
        let max = counts.iter().copied().max().unwrap_or(0);
        assert!(max <= 40, "a bucket got {max} of 4096 (mean 16)");
        let mut map: FastMap<u64, u64> = FastMap::default();
        for i in 0..1000 {
            map.insert(i, i * 3);
        }
        assert!((0..1000).all(|i| map.get(&i) == Some(&(i * 3))));
    }
}
