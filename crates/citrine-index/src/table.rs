//! [`DigestTable`]: the open-addressing hash table one partition's records
//! live in, keyed by record digest.
//!
//! Why our own table rather than `std`'s: a lookup on the hot path costs a
//! few cache misses (the partition's lock word, the table's tag bytes, the
//! slot), and the service thread overlaps those misses across the requests
//! of one wake-up by prefetching them ([`crate::PartitionTable::prefetch_record`]).
//! That needs the address of a digest's first tag and slot *before* the
//! lookup, which `std`'s table does not expose. This table computes both
//! from the digest alone ([`DigestTable::probe_start`]).
//!
//! Layout: `tags[i]` is 0 for an empty slot, else `0x80 | hash >> 57`
//! (seven more bits of the hash, so most mismatches are rejected without
//! touching the slot); `slots[i]` holds the digest and the value (an empty
//! slot holds defaults, so a slot needs no discriminant of its own). The
//! tags are dense (64 to a cache line), so a probe sequence usually reads
//! one tag line and one slot line.
//!
//! Probing is linear from the digest's home slot (`hash & mask`); removal
//! shifts the rest of the probe run back (no deletion markers), so a probe
//! stops at the first empty tag.
//!
//! Invariants (checked by `check` in the tests, `debug_assert!` in place):
//! - `tags.len() == slots.len()`, a power of two or zero;
//! - `tags[i] == 0` exactly when slot `i` is empty, and an empty slot holds
//!   `(Digest::default(), V::default())`;
//! - at most 7/8 of the slots are full, so every probe run ends;
//! - every entry is reachable: no empty slot lies between its home and its
//!   slot;
//! - `len` is the number of full slots.

use citrine_types::Digest;

/// The largest fill, as a fraction: past it the table doubles.
const MAX_LOAD_NUMERATOR: usize = 7;
const MAX_LOAD_DENOMINATOR: usize = 8;
/// Slots of the first allocation.
const MIN_SLOTS: usize = 8;

/// The hash of a digest: its bytes 8..16. Digests are RIPEMD-160 output,
/// already uniform; bytes 0..2 carry the partition id (constant within a
/// partition), so they must not be used.
#[inline]
pub fn digest_hash(digest: &Digest) -> u64 {
    hash_of_digest_bytes(&digest.0)
}

/// [`digest_hash`] of a digest's bytes (also what the tombstone map's
/// hasher uses); `bytes` must hold at least 16.
#[inline]
pub(crate) fn hash_of_digest_bytes(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[8..16]);
    u64::from_le_bytes(word)
}

#[inline]
fn tag_of(hash: u64) -> u8 {
    0x80 | (hash >> 57) as u8
}

/// An open-addressing table from digest to `V` (see the module doc).
#[derive(Debug)]
pub struct DigestTable<V> {
    tags: Vec<u8>,
    slots: Vec<(Digest, V)>,
    len: usize,
}

impl<V: Default> Default for DigestTable<V> {
    fn default() -> Self {
        DigestTable {
            tags: Vec::new(),
            slots: Vec::new(),
            len: 0,
        }
    }
}

/// Where a digest's probe sequence starts, as addresses (for prefetching
/// only: they are never dereferenced).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeStart {
    pub tag: usize,
    pub slot: usize,
}

impl<V: Default> DigestTable<V> {
    /// Bytes of one slot.
    pub const SLOT_BYTES: usize = std::mem::size_of::<(Digest, V)>();

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots allocated (a power of two, or 0).
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Bytes the table occupies: each slot and its tag byte.
    pub fn table_bytes(&self) -> usize {
        self.slots.len() * (Self::SLOT_BYTES + 1)
    }

    /// The base addresses and mask from which [`DigestTable::probe_start`]
    /// computes a digest's first tag and slot: `(tags, slots, mask)`.
    pub fn layout(&self) -> (usize, usize, usize) {
        (
            self.tags.as_ptr() as usize,
            self.slots.as_ptr() as usize,
            self.slots.len().wrapping_sub(1),
        )
    }

    /// The addresses of `digest`'s first tag and slot in a table whose
    /// [`DigestTable::layout`] was `layout`; `None` for an empty table.
    #[inline]
    pub fn probe_start(layout: (usize, usize, usize), digest: &Digest) -> Option<ProbeStart> {
        let (tags, slots, mask) = layout;
        if mask == usize::MAX {
            return None;
        }
        let home = digest_hash(digest) as usize & mask;
        Some(ProbeStart {
            tag: tags.wrapping_add(home),
            slot: slots.wrapping_add(home.wrapping_mul(Self::SLOT_BYTES)),
        })
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot holding `digest`, if any.
    #[inline]
    fn find(&self, digest: &Digest) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let hash = digest_hash(digest);
        let tag = tag_of(hash);
        let mask = self.mask();
        let mut at = hash as usize & mask;
        loop {
            match self.tags[at] {
                0 => return None,
                found if found == tag && self.slots[at].0 == *digest => return Some(at),
                _ => {}
            }
            at = (at + 1) & mask;
        }
    }

    #[inline]
    pub fn get(&self, digest: &Digest) -> Option<&V> {
        let at = self.find(digest)?;
        Some(&self.slots[at].1)
    }

    #[inline]
    pub fn get_mut(&mut self, digest: &Digest) -> Option<&mut V> {
        let at = self.find(digest)?;
        Some(&mut self.slots[at].1)
    }

    pub fn contains_key(&self, digest: &Digest) -> bool {
        self.find(digest).is_some()
    }

    /// Inserts or replaces; returns the previous value.
    pub fn insert(&mut self, digest: Digest, value: V) -> Option<V> {
        if let Some(at) = self.find(&digest) {
            return Some(std::mem::replace(&mut self.slots[at].1, value));
        }
        if (self.len + 1) * MAX_LOAD_DENOMINATOR > self.slots.len() * MAX_LOAD_NUMERATOR {
            self.grow();
        }
        self.place(digest, value);
        self.len += 1;
        None
    }

    /// Puts a digest known to be absent into the first empty slot of its
    /// probe run (there is one: the load is below 7/8).
    fn place(&mut self, digest: Digest, value: V) {
        let hash = digest_hash(&digest);
        let mask = self.mask();
        let mut at = hash as usize & mask;
        while self.tags[at] != 0 {
            at = (at + 1) & mask;
        }
        self.tags[at] = tag_of(hash);
        self.slots[at] = (digest, value);
    }

    fn grow(&mut self) {
        let slots = (self.slots.len() * 2).max(MIN_SLOTS);
        let old_tags = std::mem::replace(&mut self.tags, vec![0; slots]);
        let old_slots = std::mem::take(&mut self.slots);
        self.slots.resize_with(slots, Default::default);
        for (tag, (digest, value)) in old_tags.into_iter().zip(old_slots) {
            if tag != 0 {
                self.place(digest, value);
            }
        }
    }

    /// Removes `digest`; returns its value.
    pub fn remove(&mut self, digest: &Digest) -> Option<V> {
        let mut hole = self.find(digest)?;
        let (_, removed) = std::mem::take(&mut self.slots[hole]);
        self.tags[hole] = 0;
        self.len -= 1;
        // Close the hole (Knuth's algorithm R): walk the rest of the probe
        // run; an entry whose home is not cyclically in (hole, at] would be
        // cut off from its home by the hole, so it moves into the hole,
        // which moves to where it was.
        let mask = self.mask();
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            if self.tags[at] == 0 {
                break;
            }
            let home = digest_hash(&self.slots[at].0) as usize & mask;
            let reachable = (at.wrapping_sub(home) & mask) < (at.wrapping_sub(hole) & mask);
            if !reachable {
                self.tags[hole] = self.tags[at];
                self.tags[at] = 0;
                self.slots[hole] = std::mem::take(&mut self.slots[at]);
                hole = at;
            }
        }
        if self.len == 0 {
            *self = DigestTable::default();
        }
        Some(removed)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Digest, &V)> {
        self.tags
            .iter()
            .zip(&self.slots)
            .filter(|(tag, _)| **tag != 0)
            .map(|(_, (digest, value))| (digest, value))
    }

    /// Checks every invariant of the module doc (tests only: O(n)).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        assert_eq!(self.tags.len(), self.slots.len());
        assert!(self.slots.is_empty() || self.slots.len().is_power_of_two());
        let full = self.tags.iter().filter(|tag| **tag != 0).count();
        assert_eq!(full, self.len);
        assert!(full * MAX_LOAD_DENOMINATOR <= self.slots.len() * MAX_LOAD_NUMERATOR);
        for (at, (digest, _)) in self.slots.iter().enumerate() {
            if self.tags[at] == 0 {
                assert!(
                    *digest == Digest::default(),
                    "empty slot {at} holds a digest"
                );
            } else {
                let hash = digest_hash(digest);
                assert_eq!(self.tags[at], tag_of(hash));
                let mut probe = hash as usize & self.mask();
                while probe != at {
                    assert_ne!(self.tags[probe], 0, "a hole before slot {at}");
                    probe = (probe + 1) & self.mask();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Digests whose home slots collide often: only `spread` distinct
    /// hash values, so probe runs are long and wrap around.
    fn digest(seed: u64, spread: u64) -> Digest {
        let mut bytes = [0u8; 20];
        bytes[8..16].copy_from_slice(&(seed % spread).wrapping_mul(0x9E37_79B9).to_le_bytes());
        bytes[16..20].copy_from_slice(&(seed as u32).to_le_bytes());
        Digest(bytes)
    }

    /// A seeded random walk of inserts, replaces and removes, checked
    /// against `std`'s map after every step.
    fn walk(seed: u64, spread: u64, steps: usize) {
        let mut table: DigestTable<u64> = DigestTable::default();
        let mut model: HashMap<Digest, u64> = HashMap::new();
        let mut state = seed | 1;
        for step in 0..steps {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let key = digest(state % 300, spread);
            match state >> 60 {
                0..=8 => assert_eq!(
                    table.insert(key, step as u64),
                    model.insert(key, step as u64)
                ),
                9..=13 => assert_eq!(table.remove(&key), model.remove(&key)),
                _ => assert_eq!(table.get(&key), model.get(&key)),
            }
            table.check();
            assert_eq!(table.len(), model.len());
        }
        for (key, value) in &model {
            assert_eq!(table.get(key), Some(value));
        }
        assert_eq!(table.iter().count(), model.len());
    }

    #[test]
    fn matches_a_map_under_random_inserts_and_removes() {
        for seed in 1..20 {
            walk(seed, u64::MAX, 3000);
        }
    }

    #[test]
    fn matches_a_map_when_home_slots_collide() {
        // Four hash values for 300 keys: every run is long, wraps the
        // table's end, and removal shifts across the wrap.
        for seed in 1..10 {
            walk(seed, 4, 2000);
            walk(seed, 37, 2000);
        }
    }

    #[test]
    fn empties_release_memory_and_probe_start_names_the_home_slot() {
        let mut table: DigestTable<u64> = DigestTable::default();
        assert_eq!(
            DigestTable::<u64>::probe_start(table.layout(), &digest(1, 9)),
            None
        );
        for seed in 0..100 {
            table.insert(digest(seed, u64::MAX), seed);
        }
        let key = digest(7, u64::MAX);
        let start = DigestTable::<u64>::probe_start(table.layout(), &key).expect("allocated");
        let (tags, slots, mask) = table.layout();
        let home = digest_hash(&key) as usize & mask;
        assert_eq!(start.tag, tags + home);
        assert_eq!(start.slot, slots + home * DigestTable::<u64>::SLOT_BYTES);
        assert_eq!(table.slot_count(), 128);
        for seed in 0..100 {
            assert_eq!(table.remove(&digest(seed, u64::MAX)), Some(seed));
        }
        assert_eq!(table.slot_count(), 0);
        assert_eq!(table.table_bytes(), 0);
    }
}
