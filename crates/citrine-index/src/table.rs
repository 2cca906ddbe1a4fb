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
//! Layout: `tags[i]` is 0 for an empty slot, else `0x80 | hash & 0x7F`
//! (seven bits of the hash that the home slot does not depend on, so most
//! mismatches are rejected without touching the slot); `slots[i]` holds
//! the digest's bytes 1..20 and the value (an empty slot holds defaults,
//! so a slot needs no discriminant of its own). Byte 0 is the low byte of
//! the partition id, the same for every digest of one partition's table,
//! so the table holds it once (`low`) rather than in every slot. The tags
//! are dense (64 to a cache line), so a probe sequence usually reads one
//! tag line and one slot line.
//!
//! Probing is linear from the digest's home slot, `hash × n / 2⁶⁴` for a
//! table of `n` slots (the high bits of the hash scaled to the table, so
//! `n` need not be a power of two), wrapping at the end; removal shifts
//! the rest of the probe run back (no deletion markers), so a probe stops
//! at the first empty tag.
//!
//! Growth: a full table (9/10 of its slots) grows to the next size of the
//! form `m × 2^k` with `m` in 8..=15 (8, 9, 10, ..., 15, 16, 18, 20, ...:
//! steps of 1.07-1.125×), not to twice its size. Doubling would leave a
//! table between 0.45 and 0.9 full, and the per-partition tables of a
//! namespace all hold about the same count, so they would all sit near the
//! same point of that range: with 500 K to 4 M records, just past the
//! limit of a power of two, at half full. These steps keep every table
//! between 0.8 and 0.9 full (`bench/RESULTS.md`); the spare tenth keeps
//! linear probing short (a hit reads 5.5 tags on average at 0.9 full, a
//! miss 50: under a cache line).
//!
//! Invariants (checked by `check` in the tests, `debug_assert!` in place):
//! - `tags.len() == slots.len()`, zero or `m × 2^k` with `8 <= m <= 15`;
//! - `tags[i] == 0` exactly when slot `i` is empty, and an empty slot holds
//!   `([0; 19], V::default())`;
//! - every digest held has byte 0 equal to `low` (inserting another one
//!   panics; looking one up finds nothing);
//! - at most 9/10 of the slots are full, so every probe run ends;
//! - every entry is reachable: no empty slot lies between its home and its
//!   slot;
//! - `len` is the number of full slots.

use citrine_types::Digest;

/// The largest fill, as a fraction: past it the table grows.
const MAX_LOAD_NUMERATOR: usize = 9;
const MAX_LOAD_DENOMINATOR: usize = 10;
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

/// A digest as a slot holds it: bytes 1..20 (byte 0 is the table's `low`).
type Key = [u8; 19];

#[inline]
fn key_of(digest: &Digest) -> Key {
    let mut key = [0u8; 19];
    key.copy_from_slice(&digest.0[1..]);
    key
}

/// [`digest_hash`] of the digest a slot's key belongs to.
#[inline]
fn key_hash(key: &Key) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&key[7..15]);
    u64::from_le_bytes(word)
}

#[inline]
fn tag_of(hash: u64) -> u8 {
    0x80 | (hash & 0x7F) as u8
}

/// The home slot of `hash` in a table of `slots` slots: the hash's high
/// bits scaled to the table (`hash × slots / 2⁶⁴`).
#[inline]
fn home_of(hash: u64, slots: usize) -> usize {
    ((u128::from(hash) * slots as u128) >> 64) as usize
}

/// `slots` as `(m, k)` with `slots == m × 2^k` and `m` in 8..=15, if it
/// is a size tables have (see the module doc); `None` for 0 and any other.
fn size_parts(slots: usize) -> Option<(usize, u32)> {
    if slots < MIN_SLOTS {
        return None;
    }
    let shift = slots.ilog2() - 3;
    let m = slots >> shift;
    debug_assert!((8..=15).contains(&m));
    (m << shift == slots).then_some((m, shift))
}

/// The size a table of `slots` slots grows to: the next `m × 2^k` with
/// `m` in 8..=15.
fn grown(slots: usize) -> usize {
    match size_parts(slots) {
        Some((m, shift)) => (m + 1) << shift,
        None => {
            debug_assert_eq!(slots, 0, "not a table size");
            MIN_SLOTS
        }
    }
}

/// An open-addressing table from digest to `V` (see the module doc).
#[derive(Debug)]
pub struct DigestTable<V> {
    /// A boxed slice (no capacity word): with `low`, the table stays 56
    /// bytes, so a [`crate::Partition`] stays two cache lines.
    tags: Box<[u8]>,
    slots: Vec<(Key, V)>,
    len: usize,
    /// Byte 0 of every digest held (meaningful while `len > 0`).
    low: u8,
}

impl<V: Default> Default for DigestTable<V> {
    fn default() -> Self {
        DigestTable {
            tags: Box::default(),
            slots: Vec::new(),
            len: 0,
            low: 0,
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
    pub const SLOT_BYTES: usize = std::mem::size_of::<(Key, V)>();

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots allocated (0, or `m × 2^k` with `m` in 4..=7).
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Bytes the table occupies: each slot and its tag byte.
    pub fn table_bytes(&self) -> usize {
        self.slots.len() * (Self::SLOT_BYTES + 1)
    }

    /// The base addresses and size from which [`DigestTable::probe_start`]
    /// computes a digest's first tag and slot: `(tags, slots, slot count)`.
    pub fn layout(&self) -> (usize, usize, usize) {
        (
            self.tags.as_ptr() as usize,
            self.slots.as_ptr() as usize,
            self.slots.len(),
        )
    }

    /// The addresses of `digest`'s first tag and slot in a table whose
    /// [`DigestTable::layout`] was `layout`; `None` for an empty table.
    #[inline]
    pub fn probe_start(layout: (usize, usize, usize), digest: &Digest) -> Option<ProbeStart> {
        let (tags, slots, count) = layout;
        if count == 0 {
            return None;
        }
        let home = home_of(digest_hash(digest), count);
        Some(ProbeStart {
            tag: tags.wrapping_add(home),
            slot: slots.wrapping_add(home.wrapping_mul(Self::SLOT_BYTES)),
        })
    }

    /// The slot after `at`, wrapping at the end.
    #[inline]
    fn next(&self, at: usize) -> usize {
        if at + 1 == self.slots.len() {
            0
        } else {
            at + 1
        }
    }

    /// How many steps a probe takes from slot `from` forward to slot `to`.
    #[inline]
    fn distance(&self, from: usize, to: usize) -> usize {
        if to >= from {
            to - from
        } else {
            to + self.slots.len() - from
        }
    }

    /// The slot holding `digest`, if any.
    #[inline]
    fn find(&self, digest: &Digest) -> Option<usize> {
        if self.slots.is_empty() || digest.0[0] != self.low {
            return None;
        }
        let hash = digest_hash(digest);
        let tag = tag_of(hash);
        let mut at = home_of(hash, self.slots.len());
        loop {
            match self.tags[at] {
                0 => return None,
                found if found == tag && self.slots[at].0[..] == digest.0[1..] => return Some(at),
                _ => {}
            }
            at = self.next(at);
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

    /// Inserts or replaces; returns the previous value. Panics on a digest
    /// whose byte 0 differs from those held (another partition's: see the
    /// module's invariants).
    pub fn insert(&mut self, digest: Digest, value: V) -> Option<V> {
        if let Some(at) = self.find(&digest) {
            return Some(std::mem::replace(&mut self.slots[at].1, value));
        }
        if self.len == 0 {
            self.low = digest.0[0];
        }
        assert_eq!(digest.0[0], self.low, "a digest of another partition");
        // A small table may need two steps (10 in 11 slots is past 9/10).
        while (self.len + 1) * MAX_LOAD_DENOMINATOR > self.slots.len() * MAX_LOAD_NUMERATOR {
            self.grow();
        }
        self.place(key_of(&digest), value);
        self.len += 1;
        None
    }

    /// Puts a digest known to be absent into the first empty slot of its
    /// probe run (there is one: the load is at most 9/10).
    fn place(&mut self, key: Key, value: V) {
        let hash = key_hash(&key);
        let mut at = home_of(hash, self.slots.len());
        while self.tags[at] != 0 {
            at = self.next(at);
        }
        self.tags[at] = tag_of(hash);
        self.slots[at] = (key, value);
    }

    fn grow(&mut self) {
        let slots = grown(self.slots.len());
        let old_tags = std::mem::replace(&mut self.tags, vec![0; slots].into_boxed_slice());
        let old_slots = std::mem::take(&mut self.slots);
        self.slots.resize_with(slots, Default::default);
        for (tag, (key, value)) in old_tags.iter().zip(old_slots) {
            if *tag != 0 {
                self.place(key, value);
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
        let mut at = hole;
        loop {
            at = self.next(at);
            if self.tags[at] == 0 {
                break;
            }
            let home = home_of(key_hash(&self.slots[at].0), self.slots.len());
            let reachable = self.distance(home, at) < self.distance(hole, at);
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

    /// Every entry, with its digest rebuilt from the slot's key.
    pub fn iter(&self) -> impl Iterator<Item = (Digest, &V)> {
        let low = self.low;
        self.tags
            .iter()
            .zip(&self.slots)
            .filter(|(tag, _)| **tag != 0)
            .map(move |(_, (key, value))| {
                let mut digest = Digest([low; 20]);
                digest.0[1..].copy_from_slice(key);
                (digest, value)
            })
    }

    /// Checks every invariant of the module doc (tests only: O(n)).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        assert_eq!(self.tags.len(), self.slots.len());
        assert!(
            self.slots.is_empty() || size_parts(self.slots.len()).is_some(),
            "table size {}",
            self.slots.len()
        );
        let full = self.tags.iter().filter(|tag| **tag != 0).count();
        assert_eq!(full, self.len);
        assert!(full * MAX_LOAD_DENOMINATOR <= self.slots.len() * MAX_LOAD_NUMERATOR);
        for (at, (key, _)) in self.slots.iter().enumerate() {
            if self.tags[at] == 0 {
                assert!(*key == [0; 19], "empty slot {at} holds a digest");
            } else {
                let hash = key_hash(key);
                assert_eq!(self.tags[at], tag_of(hash));
                let mut probe = home_of(hash, self.slots.len());
                while probe != at {
                    assert_ne!(self.tags[probe], 0, "a hole before slot {at}");
                    probe = self.next(probe);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Digests with only `spread` distinct hash values (`u64::MAX`: all
    /// distinct), spread over the whole 64-bit range as real digests are.
    /// Hash value 0 is `u64::MAX`, whose home is the table's last slot, so
    /// with a small spread probe runs are long and wrap around the end.
    fn digest(seed: u64, spread: u64) -> Digest {
        let value = seed % spread;
        let hash = if value == 0 {
            u64::MAX
        } else {
            // splitmix64's finaliser: a bijection that scatters small values.
            let mut z = value.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let mut bytes = [0u8; 20];
        bytes[8..16].copy_from_slice(&hash.to_le_bytes());
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
        let listed: HashMap<Digest, u64> = table.iter().map(|(key, value)| (key, *value)).collect();
        assert_eq!(listed, model, "iteration rebuilds every digest");
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
    fn tables_grow_in_steps_of_at_most_an_eighth() {
        let mut sizes = vec![0];
        while *sizes.last().expect("one") < 1 << 20 {
            let size = grown(*sizes.last().expect("one"));
            assert!(size_parts(size).is_some(), "{size}");
            sizes.push(size);
        }
        assert_eq!(
            &sizes[..13],
            &[0, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22]
        );
        for pair in sizes[1..].windows(2) {
            let step = pair[1] as f64 / pair[0] as f64;
            assert!((16.0 / 15.0..=1.125).contains(&step), "{pair:?}");
        }
        // A table filled to its limit and one past it is at least 0.8 full.
        let mut table: DigestTable<u64> = DigestTable::default();
        for seed in 0..20_000 {
            table.insert(digest(seed, u64::MAX), seed);
            if table.len() > 8 {
                let fill = table.len() as f64 / table.slot_count() as f64;
                assert!(
                    (0.8..=0.9).contains(&fill),
                    "{} in {}",
                    table.len(),
                    table.slot_count()
                );
            }
        }
        table.check();
    }

    /// A slot holds bytes 1..20 of its digest: a digest that differs only
    /// in byte 0 (another partition's) is not found, and inserting one
    /// panics rather than shadowing the held one; once the table empties,
    /// it takes any partition's digests.
    #[test]
    fn byte_zero_is_held_once_and_never_mistaken() {
        let mut table: DigestTable<u64> = DigestTable::default();
        let mut key = digest(5, u64::MAX);
        key.0[0] = 0x21;
        table.insert(key, 1);
        let mut other = key;
        other.0[0] = 0x22;
        assert_eq!(table.get(&other), None);
        assert!(!table.contains_key(&other));
        assert_eq!(table.remove(&other), None);
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut copy: DigestTable<u64> = DigestTable::default();
            copy.insert(key, 1);
            copy.insert(other, 2);
        }));
        assert!(refused.is_err());
        assert_eq!(table.iter().next(), Some((key, &1)));
        assert_eq!(table.remove(&key), Some(1));
        table.insert(other, 2);
        assert_eq!(table.get(&other), Some(&2));
        assert_eq!(table.get(&key), None);
        table.check();
    }

    #[test]
    fn the_last_slot_wraps_to_the_first() {
        let mut table: DigestTable<u64> = DigestTable::default();
        // Hash u64::MAX: every one of these has the last slot as its home.
        let keys: Vec<Digest> = (0..5).map(|seed| digest(seed * 4, 4)).collect();
        for (value, key) in keys.iter().enumerate() {
            table.insert(*key, value as u64);
        }
        table.check();
        assert_eq!(table.slot_count(), 8);
        assert_eq!(table.tags.iter().filter(|tag| **tag != 0).count(), 5);
        assert_ne!(table.tags[0], 0, "the run wrapped to slot 0");
        assert_eq!(table.remove(&keys[0]), Some(0));
        table.check();
        for (value, key) in keys.iter().enumerate().skip(1) {
            assert_eq!(table.get(key), Some(&(value as u64)));
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
        let (tags, slots, count) = table.layout();
        assert_eq!(count, table.slot_count());
        let home = home_of(digest_hash(&key), count);
        assert_eq!(start.tag, tags + home);
        assert_eq!(start.slot, slots + home * DigestTable::<u64>::SLOT_BYTES);
        assert_eq!(table.slot_count(), 112);
        for seed in 0..100 {
            assert_eq!(table.remove(&digest(seed, u64::MAX)), Some(seed));
        }
        assert_eq!(table.slot_count(), 0);
        assert_eq!(table.table_bytes(), 0);
    }
}
