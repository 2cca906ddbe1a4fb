//! The primary index: for each of a namespace's 4096 partitions, a hash table
//! from record digest to [`IndexEntry`] (metadata and storage location).
//!
//! Each partition has its own lock, so there is no global lock on the read or
//! write path: two transactions contend only when their records fall in the
//! same partition, and a transaction holds the lock only while it runs to
//! completion on one record. Holding the partition's write lock across a
//! read-modify-write is what makes `operate` atomic on one record.
//!
//! Invariants:
//! - an entry lives in the partition its digest maps to;
//! - `generation` is never 0 for a live entry (0 means "no record" on the wire);
//! - the index never stores two entries for one digest;
//! - a digest has a live entry or a tombstone, never both (inserting an
//!   entry removes the digest's tombstone).
//!
//! A change stopped half-way: a partition's write guard notes when its
//! holder first reached the index mutably (the publish step of a record
//! change: its store, index entry, hook upkeep and counts). If the thread
//! panics before the guard is dropped, the partition is marked failed
//! ([`Partition::is_failed`]) and stays so until the process restarts; the
//! data layer above refuses requests on it, so a half-published change is
//! never served. A panic while the holder only read (deciding a change on
//! its working copy) marks nothing: nothing was changed.
//!
//! Tombstones: a deleted record leaves a [`Tombstone`] (its next
//! generation, its life, whether the delete was durable, and the delete's
//! last-update time) in its partition, so an
//! older copy that arrives later — a replica write, a migrated record, a
//! duplicate-resolution answer — cannot bring the record back, and so the
//! delete itself can be migrated. They are purged by age.
//!
//! Memory: an entry occupies one slot of `SLOT_BYTES` (41: the digest's 19
//! bytes the partition does not imply, the metadata packed into 14 bytes,
//! an 8-byte [`Location`]; no padding) plus one tag byte in its
//! partition's [`DigestTable`], which is 0.8-0.9 full: 46.7-52.5 bytes a
//! record, against the papers' 64.
//! [`PartitionIndex::table_bytes`] reports the real footprint including the
//! table's spare capacity.
//!
//! Prefetching: each [`Partition`] publishes its table's layout (as of the
//! last write-lock release) beside its lock, so a service thread can start
//! the cache misses of a whole batch of lookups before it runs the first
//! ([`PartitionTable::prefetch_partition`], then
//! [`PartitionTable::prefetch_record`]). The published layout is a hint:
//! a stale one costs a wasted prefetch, never a wrong answer.

#![deny(unsafe_code)]

mod prefetch;
pub mod table;

pub use prefetch::prefetch;
pub use table::DigestTable;

use citrine_storage::Location;
use citrine_types::{Digest, PartitionId, PARTITIONS};
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Record metadata kept in DRAM for every record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordMeta {
    /// Write generation, 1..=65535 (wraps to 1).
    pub generation: u16,
    /// The record's life, `0..LIVES`: a write after a non-durable delete
    /// starts the next life at generation 1 (the client sees generation 1,
    /// as after the reference's non-durable deletes), and copies compare
    /// by life before anything else, so a copy from an earlier life (one
    /// that missed the delete) never wins over the new one. A durable
    /// delete keeps the life and its generation continues.
    pub life: u16,
    /// Set id within the namespace (0 = no set).
    pub set_id: u16,
    /// Expiry in citrusleaf-epoch seconds; 0 = never. An entry holds at
    /// most [`MAX_VOID_TIME`].
    pub void_time: u32,
    /// Last-update time, Unix milliseconds.
    pub last_update_ms: u64,
    /// The last write came from another cluster by XDR (a shipped write),
    /// not from a client here: XDR ships it on only to a DC with `forward`
    /// on, so active-active sites do not ship each other's writes back.
    pub xdr_write: bool,
}

impl RecordMeta {
    /// True when the record has a void time that has passed: a record is
    /// live through the whole second of its void time, as the reference's
    /// (asked through the Python client: written at x.1 with TTL 2, it is
    /// read at x+2.95 and gone at x+3.05).
    #[inline]
    pub fn is_expired(&self, now_citrusleaf_seconds: u32) -> bool {
        self.void_time != 0 && self.void_time < now_citrusleaf_seconds
    }

    /// The generation after one more write (wraps past 65535 to 1, never 0).
    #[inline]
    pub fn next_generation(generation: u16) -> u16 {
        match generation.wrapping_add(1) {
            0 => 1,
            next => next,
        }
    }

    /// The life after `life` (wraps past `LIVES - 1` to 0).
    #[inline]
    pub fn next_life(life: u16) -> u16 {
        (life + 1) % LIVES
    }
}

/// How many lives a record's life counter tells apart before it wraps
/// (10 bits: 4 beside the set id, 6 above the last-update time in the
/// packed entry). Lives compare as serial numbers: a life up to
/// `LIVES / 2 - 1` ahead is the later one.
pub const LIVES: u16 = 1 << 10;

/// Set ids an entry can hold: `0..SET_IDS` (12 bits: the reference's
/// 4095 sets a namespace, and 0 for no set).
pub const SET_IDS: u16 = 1 << 12;

/// One primary-index entry: the record's metadata, packed into 14 bytes
/// (see [`IndexEntry::meta`]), and where its body is stored (an 8-byte
/// [`Location`]). Alignment 1, so a table slot (19 digest bytes and the
/// entry) is 41 bytes with no padding.
pub struct IndexEntry {
    meta: PackedMeta,
    pub location: Location,
}

/// The largest last-update time an entry holds: 42 bits of Unix
/// milliseconds (the year 2109). Later times are held as this.
pub const MAX_LAST_UPDATE_MS: u64 = (1 << 42) - 1;

/// The largest void time an entry holds: 31 bits of Citrusleaf-epoch
/// seconds (the year 2078; a write's TTL is at most 10 years, so no write
/// before 2068 reaches it). Later void times are held as this.
pub const MAX_VOID_TIME: u32 = (1 << 31) - 1;

/// [`RecordMeta`] in 14 bytes with no alignment, little-endian:
/// generation (2); set id in the low 12 bits of a u16 with the life's low
/// 4 bits above it (2); void time in the low 31 bits of a u32 with the
/// `xdr_write` flag in the top bit (4); last-update time in the low 42 bits
/// of a 48-bit field with the life's high 6 bits above it (6).
#[derive(Clone, Copy, Default)]
struct PackedMeta([u8; 14]);

impl PackedMeta {
    #[inline]
    fn pack(meta: RecordMeta) -> PackedMeta {
        // In release builds too: a set id or life out of range would be
        // stored as another one.
        assert!(meta.set_id < SET_IDS && meta.life < LIVES, "{meta:?}");
        let life = u64::from(meta.life % LIVES);
        let mut bytes = [0u8; 14];
        bytes[0..2].copy_from_slice(&meta.generation.to_le_bytes());
        let set_and_life = (meta.set_id % SET_IDS) | ((life as u16 & 0xF) << 12);
        bytes[2..4].copy_from_slice(&set_and_life.to_le_bytes());
        let void_time = meta.void_time.min(MAX_VOID_TIME) | (u32::from(meta.xdr_write) << 31);
        bytes[4..8].copy_from_slice(&void_time.to_le_bytes());
        let last_update = meta.last_update_ms.min(MAX_LAST_UPDATE_MS) | ((life >> 4) << 42);
        bytes[8..14].copy_from_slice(&last_update.to_le_bytes()[..6]);
        PackedMeta(bytes)
    }

    #[inline]
    fn unpack(&self) -> RecordMeta {
        let b = &self.0;
        let mut last_update = [0u8; 8];
        last_update[..6].copy_from_slice(&b[8..14]);
        let last_update = u64::from_le_bytes(last_update);
        let set_and_life = u16::from_le_bytes([b[2], b[3]]);
        let void_time = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        RecordMeta {
            generation: u16::from_le_bytes([b[0], b[1]]),
            life: (set_and_life >> 12) | (((last_update >> 42) as u16) << 4),
            set_id: set_and_life % SET_IDS,
            void_time: void_time & MAX_VOID_TIME,
            last_update_ms: last_update & MAX_LAST_UPDATE_MS,
            xdr_write: void_time > MAX_VOID_TIME,
        }
    }
}

impl IndexEntry {
    /// An entry for a record with `meta` stored at `location` (a
    /// last-update time past [`MAX_LAST_UPDATE_MS`] is held as that, a
    /// void time past [`MAX_VOID_TIME`] as that).
    #[inline]
    pub fn new(meta: RecordMeta, location: Location) -> IndexEntry {
        IndexEntry {
            meta: PackedMeta::pack(meta),
            location,
        }
    }

    /// The record's metadata.
    #[inline]
    pub fn meta(&self) -> RecordMeta {
        self.meta.unpack()
    }

    /// Replaces the record's metadata (the location stays).
    #[inline]
    pub fn set_meta(&mut self, meta: RecordMeta) {
        self.meta = PackedMeta::pack(meta);
    }
}

impl Default for IndexEntry {
    /// The placeholder an empty table slot holds (an empty body: no
    /// allocation). Never a live record: its generation is 0.
    fn default() -> Self {
        IndexEntry::new(RecordMeta::default(), Location::default())
    }
}

impl std::fmt::Debug for IndexEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexEntry")
            .field("meta", &self.meta())
            .field("location", &self.location)
            .finish()
    }
}

/// Bytes of one table slot: the digest key and the entry.
pub const SLOT_BYTES: usize = DigestTable::<IndexEntry>::SLOT_BYTES;

/// Hashes digests for the tombstone map, as [`table::digest_hash`] does.
#[derive(Clone, Copy, Default, Debug)]
pub struct DigestHashBuilder;

/// The hasher built by [`DigestHashBuilder`].
#[derive(Default)]
pub struct DigestHasher {
    state: u64,
}

impl Hasher for DigestHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        if bytes.len() >= 16 {
            self.state ^= table::hash_of_digest_bytes(bytes);
        } else {
            for byte in bytes {
                self.state = self.state.rotate_left(8) ^ u64::from(*byte);
            }
        }
    }

    #[inline]
    fn write_usize(&mut self, _length: usize) {
        // Slice length prefixes carry no information for fixed-size digests.
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.state
    }
}

impl BuildHasher for DigestHashBuilder {
    type Hasher = DigestHasher;
    #[inline]
    fn build_hasher(&self) -> DigestHasher {
        DigestHasher::default()
    }
}

/// What remains of a deleted record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tombstone {
    /// The generation the delete gave the record (the deleted copy's next).
    pub generation: u16,
    /// The deleted copy's life ([`RecordMeta::life`]).
    pub life: u16,
    /// A durable delete: the next write continues this life and
    /// generation. Otherwise the next write starts the next life at
    /// generation 1.
    pub durable: bool,
    /// When it was deleted, Unix milliseconds.
    pub last_update_ms: u64,
    /// The set the record was in.
    pub set_id: u16,
    /// The delete came from another cluster by XDR
    /// ([`RecordMeta::xdr_write`]).
    pub xdr_write: bool,
}

/// Bytes one tombstone slot occupies (slot and control byte).
pub const TOMBSTONE_BYTES: usize = std::mem::size_of::<(Digest, Tombstone)>() + 1;

/// The index of one partition.
#[derive(Debug, Default)]
pub struct PartitionIndex {
    entries: DigestTable<IndexEntry>,
    tombstones: HashMap<Digest, Tombstone, DigestHashBuilder>,
}

impl PartitionIndex {
    pub fn get(&self, digest: &Digest) -> Option<&IndexEntry> {
        self.entries.get(digest)
    }

    pub fn get_mut(&mut self, digest: &Digest) -> Option<&mut IndexEntry> {
        self.entries.get_mut(digest)
    }

    /// Inserts or replaces; returns the previous entry (whose location the
    /// caller must release).
    pub fn insert(&mut self, digest: Digest, entry: IndexEntry) -> Option<IndexEntry> {
        // Checked in release builds too: a generation-0 entry would read
        // as "no record" on the wire and to every peer.
        assert!(
            entry.meta().generation != 0,
            "live entries have a generation"
        );
        if !self.tombstones.is_empty() {
            self.tombstones.remove(&digest);
        }
        self.entries.insert(digest, entry)
    }

    /// The tombstone of a deleted record, if it is kept.
    pub fn tombstone(&self, digest: &Digest) -> Option<Tombstone> {
        if self.tombstones.is_empty() {
            return None;
        }
        self.tombstones.get(digest).copied()
    }

    /// Records that `digest` was deleted (it must have no live entry); an
    /// existing tombstone is replaced only by a later delete.
    pub fn set_tombstone(&mut self, digest: Digest, tombstone: Tombstone) {
        debug_assert!(!self.entries.contains_key(&digest), "entry and tombstone");
        let slot = self.tombstones.entry(digest).or_insert(tombstone);
        if tombstone.last_update_ms > slot.last_update_ms {
            *slot = tombstone;
        }
    }

    /// Every tombstone.
    pub fn tombstones(&self) -> impl Iterator<Item = (&Digest, &Tombstone)> {
        self.tombstones.iter()
    }

    pub fn tombstone_count(&self) -> usize {
        self.tombstones.len()
    }

    /// Drops the tombstones of deletes older than `before_ms`; returns how
    /// many.
    pub fn purge_tombstones(&mut self, before_ms: u64) -> usize {
        let before = self.tombstones.len();
        self.tombstones
            .retain(|_, tombstone| tombstone.last_update_ms >= before_ms);
        if self.tombstones.is_empty() {
            self.tombstones.shrink_to_fit();
        }
        before - self.tombstones.len()
    }

    /// Drops every tombstone (the partition's copy is dropped).
    pub fn clear_tombstones(&mut self) {
        self.tombstones = HashMap::default();
    }

    pub fn remove(&mut self, digest: &Digest) -> Option<IndexEntry> {
        self.entries.remove(digest)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry with its digest.
    pub fn iter(&self) -> impl Iterator<Item = (Digest, &IndexEntry)> {
        self.entries.iter()
    }

    /// Removes every entry for which `remove` answers true, handing each
    /// removed entry to `on_removed`.
    pub fn remove_where(
        &mut self,
        mut remove: impl FnMut(&Digest, &IndexEntry) -> bool,
        mut on_removed: impl FnMut(Digest, IndexEntry),
    ) {
        let doomed: Vec<Digest> = self
            .entries
            .iter()
            .filter(|(digest, entry)| remove(digest, entry))
            .map(|(digest, _)| digest)
            .collect();
        for digest in doomed {
            if let Some(entry) = self.entries.remove(&digest) {
                on_removed(digest, entry);
            }
        }
    }

    /// Bytes the tables occupy: every slot of the entry table (full or
    /// not: filled at most 9/10) with its tag byte, and the tombstone map's
    /// buckets.
    pub fn table_bytes(&self) -> usize {
        self.entries.table_bytes() + buckets(self.tombstones.capacity()) * TOMBSTONE_BYTES
    }
}

/// Buckets of a `std` hash table with `capacity` (a power of two at least
/// capacity × 8/7; 0 when nothing was ever allocated).
fn buckets(capacity: usize) -> usize {
    match capacity {
        0 => 0,
        1..8 => (capacity + 1).next_power_of_two(),
        _ => (capacity * 8 / 7).next_power_of_two(),
    }
}

/// One partition's index behind its lock, with the table layout published
/// for prefetching. The layout words come first and the struct is aligned
/// to a cache line, so the layout and the lock word share one line.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Partition {
    /// `DigestTable::layout` of the entry table at the last write-lock
    /// release: (tags, slots, slot count). Read without the lock, as a hint.
    layout: [AtomicUsize; 3],
    lock: RwLock<PartitionIndex>,
    /// Set (never cleared) when a thread panicked holding the write lock
    /// after it reached the index mutably: see the module doc.
    failed: AtomicBool,
}

impl Default for Partition {
    fn default() -> Self {
        let partition = Partition {
            layout: Default::default(),
            lock: RwLock::default(),
            failed: AtomicBool::new(false),
        };
        partition.publish(partition.lock.read().entries.layout());
        partition
    }
}

impl Partition {
    fn publish(&self, (tags, slots, count): (usize, usize, usize)) {
        self.layout[0].store(tags, Ordering::Relaxed);
        self.layout[1].store(slots, Ordering::Relaxed);
        self.layout[2].store(count, Ordering::Relaxed);
    }

    /// The layout published at the last write-lock release (a hint).
    #[inline]
    fn published(&self) -> (usize, usize, usize) {
        (
            self.layout[0].load(Ordering::Relaxed),
            self.layout[1].load(Ordering::Relaxed),
            self.layout[2].load(Ordering::Relaxed),
        )
    }

    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, PartitionIndex> {
        self.lock.read()
    }

    /// The write lock; releasing it publishes the table's layout.
    #[inline]
    pub fn write(&self) -> PartitionWriteGuard<'_> {
        PartitionWriteGuard {
            guard: self.lock.write(),
            partition: self,
            changing: false,
        }
    }

    /// True once a change to this partition was cut short by a panic (see
    /// the module doc): its index, storage and counts may disagree.
    #[inline]
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

/// A partition's write lock. Dropping it publishes the (possibly grown or
/// released) table's layout before the lock itself is released.
pub struct PartitionWriteGuard<'a> {
    guard: RwLockWriteGuard<'a, PartitionIndex>,
    partition: &'a Partition,
    /// The holder reached the index mutably: a change has begun.
    changing: bool,
}

impl Deref for PartitionWriteGuard<'_> {
    type Target = PartitionIndex;
    #[inline]
    fn deref(&self) -> &PartitionIndex {
        &self.guard
    }
}

impl DerefMut for PartitionWriteGuard<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut PartitionIndex {
        self.changing = true;
        &mut self.guard
    }
}

impl Drop for PartitionWriteGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.changing && std::thread::panicking() {
            // Unwinding out of a change: it may be half-published.
            self.partition.failed.store(true, Ordering::Release);
        }
        self.partition.publish(self.guard.entries.layout());
    }
}

/// The index of one namespace: its 4096 partitions.
#[derive(Debug)]
pub struct PartitionTable {
    partitions: Vec<Partition>,
}

impl Default for PartitionTable {
    fn default() -> Self {
        PartitionTable::new()
    }
}

impl PartitionTable {
    pub fn new() -> PartitionTable {
        let partitions = (0..PARTITIONS).map(|_| Partition::default()).collect();
        PartitionTable { partitions }
    }

    /// One partition (its lock).
    #[inline]
    pub fn partition(&self, partition: PartitionId) -> &Partition {
        // PartitionId guarantees index < PARTITIONS == partitions.len().
        &self.partitions[partition.index()]
    }

    /// Starts loading the cache line of a partition's lock and layout.
    #[inline]
    pub fn prefetch_partition(&self, partition: PartitionId) {
        prefetch(self.partition(partition) as *const Partition as usize);
    }

    /// Starts loading the cache lines where a lookup of `digest` begins:
    /// its first tag and its home slot. Best after
    /// [`PartitionTable::prefetch_partition`] had time to land, since the
    /// layout is read from the partition's line.
    #[inline]
    pub fn prefetch_record(&self, digest: &Digest) {
        let layout = self.partition(digest.partition()).published();
        if let Some(start) = DigestTable::<IndexEntry>::probe_start(layout, digest) {
            prefetch(start.tag);
            prefetch(start.slot);
            prefetch(start.slot.wrapping_add(SLOT_BYTES - 1));
        }
    }

    /// Starts loading the first line of an in-memory record's body. It
    /// looks the record up under the partition's read lock, so it is best
    /// after [`PartitionTable::prefetch_record`] had time to land; it never
    /// waits for the lock (a partition being written is skipped).
    #[inline]
    pub fn prefetch_body(&self, digest: &Digest) {
        let Some(partition) = self.partition(digest.partition()).lock.try_read() else {
            return;
        };
        if let Some(address) = partition
            .get(digest)
            .and_then(|entry| entry.location.memory_address())
        {
            prefetch(address);
        }
    }

    /// Total records (takes each partition's read lock briefly).
    pub fn record_count(&self) -> usize {
        self.partitions
            .iter()
            .map(|partition| partition.read().len())
            .sum()
    }

    /// Tombstones kept in every partition.
    pub fn tombstone_count(&self) -> usize {
        self.partitions
            .iter()
            .map(|partition| partition.read().tombstone_count())
            .sum()
    }

    /// Tombstones of durable deletes kept, per set id: the tombstones the
    /// reference keeps and reports. A non-durable delete's tombstone only
    /// orders this node's copies (see [`Tombstone::durable`]); the
    /// reference keeps none, so none is reported.
    pub fn durable_tombstones_by_set(&self) -> HashMap<u16, u64> {
        let mut counts = HashMap::new();
        for partition in &self.partitions {
            let partition = partition.read();
            for (_, tombstone) in partition.tombstones().filter(|(_, t)| t.durable) {
                *counts.entry(tombstone.set_id).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Tombstones of durable deletes kept in every partition (see
    /// [`PartitionTable::durable_tombstones_by_set`]).
    pub fn durable_tombstone_count(&self) -> u64 {
        self.durable_tombstones_by_set().values().sum()
    }

    pub fn table_bytes(&self) -> usize {
        self.partitions
            .iter()
            .map(|partition| partition.read().table_bytes())
            .sum()
    }

    /// Slots the entry tables hold, full and empty (for the fill:
    /// `record_count / slot_count`).
    pub fn slot_count(&self) -> usize {
        self.partitions
            .iter()
            .map(|partition| partition.read().entries.slot_count())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(seed: u64) -> Digest {
        Digest(citrine_testsupport::digest_bytes(seed))
    }

    // The papers' index entry is 64 bytes. One slot of ours and its tag
    // byte, in a table at its emptiest (0.8 full, see `table`), take
    // (41 + 1) / 0.8 = 52.5 bytes a record (checked at compile time).
    const _: () = assert!(SLOT_BYTES == 41);
    const _: () = assert!((SLOT_BYTES + 1) * 10 <= 53 * 8);

    fn meta(generation: u16) -> RecordMeta {
        RecordMeta {
            generation,
            ..RecordMeta::default()
        }
    }

    #[test]
    fn a_panic_after_a_change_began_marks_the_partition_failed() {
        let partition = Partition::default();
        let key = digest(1);
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut index = partition.write();
            index.insert(key, IndexEntry::new(meta(1), Location::default()));
            panic!("a record change cut short");
        }));
        assert!(unwound.is_err());
        assert!(partition.is_failed());
        // The lock is free again (not poisoned): the failure is the flag.
        assert!(partition.read().get(&key).is_some());
    }

    #[test]
    fn a_panic_while_only_reading_leaves_the_partition_serving() {
        let partition = Partition::default();
        partition
            .write()
            .insert(digest(2), IndexEntry::new(meta(1), Location::default()));
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let index = partition.write();
            let _ = index.get(&digest(2));
            panic!("a working copy's op failed");
        }));
        assert!(unwound.is_err());
        assert!(!partition.is_failed());
        // A change that completes never marks it either.
        partition.write().remove(&digest(2));
        assert!(!partition.is_failed());
    }

    /// A partition's lock, layout hint and table headers fit two cache
    /// lines: 4096 of them are 512 KiB a namespace, whatever it holds.
    #[test]
    fn a_partition_is_two_cache_lines() {
        assert_eq!(std::mem::size_of::<Partition>(), 128);
    }

    #[test]
    fn metadata_packs_into_fourteen_bytes_and_back() {
        assert_eq!(std::mem::size_of::<IndexEntry>(), 22);
        assert_eq!(std::mem::align_of::<IndexEntry>(), 1);
        let samples = [
            RecordMeta::default(),
            RecordMeta {
                generation: u16::MAX,
                life: LIVES - 1,
                set_id: SET_IDS - 1,
                void_time: MAX_VOID_TIME,
                last_update_ms: MAX_LAST_UPDATE_MS,
                xdr_write: true,
            },
            RecordMeta {
                generation: 0x1234,
                life: 0x2A5,
                set_id: 0x0102,
                void_time: 0x5ead_beef,
                last_update_ms: 1_795_000_000_123,
                xdr_write: true,
            },
            RecordMeta {
                generation: 1,
                life: 0x3C0,
                set_id: 0,
                void_time: 0,
                last_update_ms: 0,
                xdr_write: false,
            },
            RecordMeta {
                generation: 2,
                life: 0x03F,
                set_id: 1,
                void_time: 1,
                last_update_ms: MAX_LAST_UPDATE_MS - 1,
                xdr_write: false,
            },
        ];
        for meta in samples {
            let mut entry = IndexEntry::new(meta, Location::default());
            assert_eq!(entry.meta(), meta);
            entry.set_meta(RecordMeta::default());
            assert_eq!(entry.meta(), RecordMeta::default());
        }
        let late = RecordMeta {
            last_update_ms: u64::MAX,
            ..RecordMeta::default()
        };
        assert_eq!(
            IndexEntry::new(late, Location::default())
                .meta()
                .last_update_ms,
            MAX_LAST_UPDATE_MS
        );
    }

    /// The `xdr_write` flag is the void time's top bit: it survives the
    /// round trip beside any void time, changes no other field, and a
    /// void time too large for 31 bits is held as the largest one (never
    /// read back as the flag).
    #[test]
    fn the_xdr_write_flag_rides_above_the_void_time() {
        for void_time in [0, 1, 0x3fff_ffff, MAX_VOID_TIME] {
            for xdr_write in [false, true] {
                let meta = RecordMeta {
                    generation: 7,
                    life: 5,
                    set_id: 3,
                    void_time,
                    last_update_ms: 1_795_000_000_123,
                    xdr_write,
                };
                assert_eq!(IndexEntry::new(meta, Location::default()).meta(), meta);
            }
        }
        let far = RecordMeta {
            void_time: u32::MAX,
            ..RecordMeta::default()
        };
        let held = IndexEntry::new(far, Location::default()).meta();
        assert_eq!((held.void_time, held.xdr_write), (MAX_VOID_TIME, false));
    }

    #[test]
    fn lives_wrap_within_their_bits() {
        assert_eq!(RecordMeta::next_life(0), 1);
        assert_eq!(RecordMeta::next_life(LIVES - 1), 0);
    }

    fn entry(generation: u16) -> IndexEntry {
        IndexEntry::new(
            RecordMeta {
                generation,
                ..RecordMeta::default()
            },
            Location::memory(&[1, 2, 3]).expect("fits"),
        )
    }

    /// Releasing a write lock publishes the table's layout, through growth
    /// and back to empty; prefetching any digest, with or without a
    /// record, on a stale or empty layout, never disturbs a lookup.
    #[test]
    fn write_lock_release_publishes_the_layout_for_prefetch() {
        let table = PartitionTable::new();
        let key = digest(1);
        let partition = table.partition(key.partition());
        let published = Partition::published;
        assert_eq!(published(partition), partition.read().entries.layout());
        table.prefetch_record(&key);
        table.prefetch_body(&key);
        let mut same_partition = Vec::new();
        for seed in 0..200_000 {
            let other = digest(seed);
            if other.partition() == key.partition() {
                same_partition.push(other);
            }
        }
        assert!(same_partition.len() > 20);
        for (n, other) in same_partition.iter().enumerate() {
            let mut guard = partition.write();
            guard.insert(*other, entry(n as u16 + 1));
            drop(guard);
            assert_eq!(published(partition), partition.read().entries.layout());
            table.prefetch_partition(other.partition());
            table.prefetch_record(other);
            table.prefetch_body(other);
            assert!(partition.read().get(other).is_some());
        }
        for other in &same_partition {
            partition.write().remove(other);
        }
        assert_eq!(partition.read().entries.slot_count(), 0);
        assert_eq!(published(partition), partition.read().entries.layout());
        table.prefetch_record(&same_partition[0]);
    }

    #[test]
    fn tombstones_keep_the_latest_delete_and_give_way_to_a_new_record() {
        let table = PartitionTable::new();
        let key = digest(9);
        let mut partition = table.partition(key.partition()).write();
        assert_eq!(partition.tombstone(&key), None);
        let first = Tombstone {
            generation: 3,
            life: 0,
            durable: false,
            last_update_ms: 100,
            set_id: 0,
            xdr_write: false,
        };
        partition.set_tombstone(key, first);
        partition.set_tombstone(
            key,
            Tombstone {
                generation: 2,
                life: 0,
                durable: true,
                last_update_ms: 50,
                set_id: 0,
                xdr_write: true,
            },
        );
        assert_eq!(partition.tombstone(&key), Some(first));
        let later = Tombstone {
            generation: 5,
            life: 1,
            durable: false,
            last_update_ms: 200,
            set_id: 0,
            xdr_write: false,
        };
        partition.set_tombstone(key, later);
        assert_eq!(partition.tombstone(&key), Some(later));
        assert_eq!(partition.tombstone_count(), 1);
        assert_eq!(partition.purge_tombstones(200), 0);
        assert_eq!(partition.purge_tombstones(201), 1);
        partition.set_tombstone(key, later);
        let entry = IndexEntry::new(
            RecordMeta {
                generation: 6,
                ..RecordMeta::default()
            },
            Location::memory(&[1]).expect("fits"),
        );
        partition.insert(key, entry);
        assert_eq!(partition.tombstone(&key), None, "a new record replaces it");
        assert_eq!(partition.tombstone_count(), 0);
    }

    #[test]
    fn insert_get_remove() {
        let table = PartitionTable::new();
        let key = digest(1);
        let mut partition = table.partition(key.partition()).write();
        let entry = IndexEntry::new(
            RecordMeta {
                generation: 1,
                ..RecordMeta::default()
            },
            Location::memory(&[1]).expect("fits"),
        );
        assert!(partition.insert(key, entry).is_none());
        assert_eq!(
            partition.get(&key).map(|entry| entry.meta().generation),
            Some(1)
        );
        assert!(partition.remove(&key).is_some());
        assert!(partition.get(&key).is_none());
    }

    #[test]
    fn generation_wraps_to_one() {
        assert_eq!(RecordMeta::next_generation(1), 2);
        assert_eq!(RecordMeta::next_generation(u16::MAX), 1);
    }

    #[test]
    fn expiry() {
        let meta = RecordMeta {
            void_time: 100,
            ..RecordMeta::default()
        };
        assert!(!meta.is_expired(99));
        assert!(!meta.is_expired(100));
        assert!(meta.is_expired(101));
        assert!(!RecordMeta::default().is_expired(u32::MAX));
    }

    /// Measures index bytes per record at a realistic scale, prints it, and
    /// holds it to the table's fill range (at least 0.8 full, so at most
    /// (slot + tag) / 0.8 bytes a record). At 300 000 records (73 per
    /// partition) doubling tables were 0.57 full: 99.6 bytes a record with
    /// the old 56-byte slot; 43-byte slots in tables 0.7-0.875 full, 57.5.
    #[test]
    fn index_bytes_per_record() {
        let table = PartitionTable::new();
        // INDEX_RECORDS measures another count (bench/RESULTS.md's table).
        let records = std::env::var("INDEX_RECORDS")
            .ok()
            .and_then(|count| count.parse().ok())
            .unwrap_or(300_000u64);
        for seed in 0..records {
            let key = digest(seed);
            let entry = IndexEntry::new(
                RecordMeta {
                    generation: 1,
                    ..RecordMeta::default()
                },
                Location::default(),
            );
            table.partition(key.partition()).write().insert(key, entry);
        }
        assert_eq!(table.record_count() as u64, records);
        let per_record = table.table_bytes() as f64 / records as f64;
        println!(
            "slot {} B + 1 tag byte; {per_record:.1} B per record at {records} records",
            SLOT_BYTES
        );
        assert!(per_record >= (SLOT_BYTES + 1) as f64);
        assert!(per_record <= 52.5, "{per_record:.1} B per record");
        assert!(
            per_record <= (SLOT_BYTES + 1) as f64 / 0.8,
            "{per_record:.1} B per record: the tables are less than 0.8 full"
        );
    }
}
