//! Small, fast hashers for the tokenizer's lookup tables.
//!
//! The tables are built once from the model file and then only read, so hash
//! flooding (the reason for the standard library's SipHash) cannot happen
//! through encoding; what matters is that the encoder's per-pair and
//! per-substring lookups are cheap.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const K: u64 = 0x517c_c1b7_2722_0a95;

/// A multiply-rotate hasher over 8-byte words; good enough for short strings
/// and packed integer keys.
#[derive(Default)]
pub(crate) struct FastHasher(u64);

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // The high bits are the well-mixed ones; fold them into the low bits,
        // which is where the table takes its bucket index from.
        self.0 ^ (self.0 >> 29)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        // The length first, so that zero padding of the last word is unambiguous.
        self.add(bytes.len() as u64);
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8-byte chunk")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(buf));
        }
    }

    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.add(v as u64);
    }

    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.add(v as u64);
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
}

/// A hash map using [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_that_differ_hash_differently() {
        let h = |s: &str| {
            let mut x = FastHasher::default();
            std::hash::Hash::hash(s, &mut x);
            x.finish()
        };
        // Same 8-byte prefix, length differences, zero padding ambiguity.
        assert_ne!(h("abcdefgh1"), h("abcdefgh2"));
        assert_ne!(h("a"), h("a\0"));
        assert_ne!(h(""), h("\0"));
        let mut m: FastMap<String, u32> = FastMap::default();
        for i in 0..1000u32 {
            m.insert(format!("tok{i}"), i);
        }
        assert!((0..1000u32).all(|i| m[&format!("tok{i}")] == i));
    }
}
