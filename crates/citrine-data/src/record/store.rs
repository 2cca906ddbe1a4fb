//! Changes to a partition's index and storage: installing a record's new
//! version, tombstones and removals, and where a new version starts (its
//! life and generation). The only code that changes the primary index on
//! the request paths; every change calls the namespace's record hook
//! ([`crate::hook`]) under the same lock, and keeps the namespace's and
//! set's counts true (`objects` equals the index's entries).
//!
//! Order: an [`install`] writes the body to the engine before the index
//! points at it, and the version it replaced ([`Replaced`]) is released
//! only after the lock is dropped; an update that keeps a record's set and
//! size changes no shared count (only the difference from the replaced
//! version is counted). A delete first makes its tombstone durable
//! ([`write_tombstone`], device engine), then the entry goes
//! ([`remove_deleted`], with the hook's `unindex` as every removal); an
//! expired copy is kept by the engine as its own tombstone
//! ([`retire_entry`]).

use super::Now;
use crate::namespace::Namespace;
use citrine_index::{IndexEntry, PartitionIndex, RecordMeta, Tombstone};
use citrine_storage::{StorageError, StoreMeta};
use citrine_types::{Digest, ResultCode};
use citrine_wire::msg::{info2, MsgHeader};
use std::sync::atomic::Ordering;

/// Maps a storage failure to the protocol's result code. A device engine
/// in its failed state (a device write or sync failed) refuses writes with
/// 1, SERVER_ERROR: the reference stops the process there instead, and 1
/// is its code for a failure of the server that is neither in doubt nor
/// worth a retry (the choice is explained in `citrine_storage::device`).
pub fn storage_result(error: StorageError) -> ResultCode {
    match error {
        StorageError::OutOfSpace => ResultCode::OutOfSpace,
        StorageError::TooBig => ResultCode::RecordTooBig,
        StorageError::DeviceFailed => ResultCode::ServerError,
        StorageError::Corrupt(_) | StorageError::Io(_) => ResultCode::ServerError,
    }
}

/// Makes the removal of `digest` durable before its entry goes: the device
/// engine writes a tombstone so no older copy returns after a restart (the
/// memory engine has nothing to do). The restart puts it back in the index
/// as a non-durable delete of this moment by a client
/// ([`crate::device::restore_tombstones`]); [`write_delete_tombstone`]
/// says more.
pub fn write_tombstone(
    namespace: &Namespace,
    digest: &Digest,
    meta: &RecordMeta,
    now: Now,
) -> Result<(), ResultCode> {
    let kept = crate::device::tombstone_void_time(false, false);
    store_tombstone(namespace, digest, meta, now.unix_ms, kept)
}

/// [`write_tombstone`] for a delete whose index tombstone has LUT `lut_ms`
/// (a shipped delete keeps its source's), is `durable` or not, and came
/// by XDR or not: all of it comes back at a restart.
pub fn write_delete_tombstone(
    namespace: &Namespace,
    digest: &Digest,
    meta: &RecordMeta,
    lut_ms: u64,
    durable: bool,
    xdr_write: bool,
) -> Result<(), ResultCode> {
    let kept = crate::device::tombstone_void_time(durable, xdr_write);
    store_tombstone(namespace, digest, meta, lut_ms, kept)
}

/// [`write_tombstone`] for an eviction: it keeps older copies out after a
/// restart but leaves no tombstone in the index (an eviction is not a
/// delete to replicate or ship).
pub fn write_eviction_tombstone(
    namespace: &Namespace,
    digest: &Digest,
    meta: &RecordMeta,
    now: Now,
) -> Result<(), ResultCode> {
    store_tombstone(namespace, digest, meta, now.unix_ms, 0)
}

fn store_tombstone(
    namespace: &Namespace,
    digest: &Digest,
    meta: &RecordMeta,
    lut_ms: u64,
    void_time: u32,
) -> Result<(), ResultCode> {
    if namespace.storage.device().is_none() {
        return Ok(());
    }
    let set_name = namespace.sets.name(meta.set_id).unwrap_or_default();
    let store = StoreMeta {
        generation: RecordMeta::next_generation(meta.generation),
        life: meta.life,
        void_time,
        last_update_ms: lut_ms,
        set_name: &set_name,
    };
    namespace
        .storage
        .write_tombstone(digest, &store)
        .map_err(storage_result)
}

/// Removes an expired entry: the engine keeps an expired copy as its own
/// tombstone (its void time proves it dead after a restart too).
pub fn retire_entry(namespace: &Namespace, digest: &Digest, entry: IndexEntry) {
    let size = entry.location.size() as i64;
    let set_stats = namespace.sets.stats(entry.meta().set_id);
    set_stats.objects.fetch_sub(1, Ordering::Relaxed);
    set_stats.data_used_bytes.fetch_sub(size, Ordering::Relaxed);
    namespace.stats.objects.fetch_sub(1, Ordering::Relaxed);
    namespace.storage.retire(digest, entry.location);
}

/// True when a client asked for a durable delete (info2 DURABLE_DELETE):
/// the record written after it continues the deleted copy's life and
/// generation; after any other delete it starts the next life at
/// generation 1, as after the reference's (non-durable) deletes.
pub fn is_durable_delete(header: &MsgHeader) -> bool {
    header.info2 & info2::DURABLE_DELETE != 0
}

/// Removes a deleted record's entry (if any) and leaves its tombstone in
/// the index (see `citrine_index`): generation the deleted copy's next,
/// its life, last-update time `lut_ms`, and whether the delete was
/// durable.
pub fn remove_deleted(
    namespace: &Namespace,
    partition: &mut PartitionIndex,
    digest: &Digest,
    lut_ms: u64,
    durable: bool,
) {
    remove_deleted_by(namespace, partition, digest, lut_ms, durable, false);
}

/// [`remove_deleted`], telling whether the delete came by XDR
/// (`Tombstone::xdr_write`).
pub fn remove_deleted_by(
    namespace: &Namespace,
    partition: &mut PartitionIndex,
    digest: &Digest,
    lut_ms: u64,
    durable: bool,
    xdr_write: bool,
) {
    if let Some(entry) = partition.remove(digest) {
        namespace.unindex(digest, &entry);
        let meta = entry.meta();
        partition.set_tombstone(
            *digest,
            Tombstone {
                generation: RecordMeta::next_generation(meta.generation),
                life: meta.life,
                durable,
                last_update_ms: lut_ms,
                set_id: meta.set_id,
                xdr_write,
            },
        );
        drop_entry(namespace, entry);
    }
}

/// Releases a removed entry's storage and updates the counters.
pub fn drop_entry(namespace: &Namespace, entry: IndexEntry) {
    let size = entry.location.size() as i64;
    let set_stats = namespace.sets.stats(entry.meta().set_id);
    set_stats.objects.fetch_sub(1, Ordering::Relaxed);
    set_stats.data_used_bytes.fetch_sub(size, Ordering::Relaxed);
    namespace.stats.objects.fetch_sub(1, Ordering::Relaxed);
    namespace.storage.release(entry.location);
}

/// The life and generation of a record written where none is live, so
/// that the new copy wins over the delete's tombstone on every replica
/// still holding it, and over every copy from before the delete, in every
/// merge:
/// - after a durable delete (its tombstone kept here), the deleted copy's
///   life, the generation past the tombstone's (as after the reference's
///   durable deletes);
/// - after any other delete, the deleted copy's next life at generation 1
///   (the client sees 1, as after the reference's non-durable deletes);
/// - else generation 1 in the life of the expired or truncated copy held
///   (as the reference's "rescue" of a doomed record; replicas count such
///   a copy as absent), or in life 0.
pub fn start_after(dead: Option<RecordMeta>, tombstone: Option<Tombstone>) -> (u16, u16) {
    match tombstone {
        Some(tombstone) if tombstone.durable => (
            tombstone.life,
            RecordMeta::next_generation(tombstone.generation),
        ),
        Some(tombstone) => (RecordMeta::next_life(tombstone.life), 1),
        None => (dead.map_or(0, |meta| meta.life), 1),
    }
}

/// Stores a new body for `digest` (copy-on-write) and points the index at it,
/// under the partition lock the caller holds. Returns the replaced entry,
/// whose storage the caller releases after dropping the lock
/// ([`Replaced::release`]); the counts already take the replacement into
/// account.
pub fn install(
    namespace: &Namespace,
    partition: &mut PartitionIndex,
    digest: Digest,
    meta: RecordMeta,
    body: Vec<u8>,
) -> Result<Option<Replaced>, ResultCode> {
    // The device engine stores the set name with the record (set ids are
    // per process); the memory engine needs none.
    let set_name = match namespace.storage.device() {
        Some(_) => namespace.sets.name(meta.set_id).unwrap_or_default(),
        None => Vec::new(),
    };
    let store = StoreMeta {
        generation: meta.generation,
        life: meta.life,
        void_time: crate::device::device_void_time(&meta),
        last_update_ms: meta.last_update_ms,
        set_name: &set_name,
    };
    // What the record hook needs from the new body, while it is still here.
    let upkeep = namespace.before_install(&digest, meta, &body);
    let location = namespace
        .storage
        .write(&digest, &store, body)
        .map_err(storage_result)?;
    let size = location.size() as i64;
    let previous = partition.insert(digest, IndexEntry::new(meta, location));
    if let Some(upkeep) = upkeep {
        namespace.after_install(upkeep, &digest, previous.as_ref());
    }
    // One version replaces another: only what changed is counted (an
    // update of the same size touches no shared count).
    match &previous {
        Some(old) if old.meta().set_id == meta.set_id => {
            account(namespace, meta.set_id, 0, size - old.location.size() as i64);
        }
        Some(old) => {
            account(
                namespace,
                old.meta().set_id,
                -1,
                -(old.location.size() as i64),
            );
            account(namespace, meta.set_id, 1, size);
        }
        None => account(namespace, meta.set_id, 1, size),
    }
    Ok(previous.map(Replaced))
}

/// An index entry a new version replaced ([`install`]): no longer counted,
/// its storage still held until [`Replaced::release`].
#[must_use = "the replaced version's storage must be released"]
pub struct Replaced(IndexEntry);

impl Replaced {
    /// Releases the replaced version's storage (after the partition lock is
    /// dropped: the device engine may take its own locks).
    pub fn release(self, namespace: &Namespace) {
        namespace.storage.release(self.0.location);
    }
}

/// Adds `objects` records and `bytes` of data to set `set_id`'s and the
/// namespace's counts, skipping the counts that do not change.
#[inline]
fn account(namespace: &Namespace, set_id: u16, objects: i64, bytes: i64) {
    let set_stats = namespace.sets.stats(set_id);
    if objects != 0 {
        set_stats.objects.fetch_add(objects, Ordering::Relaxed);
        namespace
            .stats
            .objects
            .fetch_add(objects, Ordering::Relaxed);
    }
    if bytes != 0 {
        set_stats
            .data_used_bytes
            .fetch_add(bytes, Ordering::Relaxed);
    }
}
