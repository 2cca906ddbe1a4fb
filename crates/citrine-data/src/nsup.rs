//! Namespace supervisor (nsup): the background pass that removes expired
//! records and, when a namespace's memory use passes evict-used-pct, evicts
//! the records closest to expiring; also the removal of truncated records,
//! and the purge of the index's tombstones older than
//! `tomb-raider-eligible-age` (the replicated deletes' markers, see
//! `citrine_index`). An evicted record goes only once its tombstone is
//! written (device engine); an expired copy stays as its own.
//!
//! Reads never depend on this pass: a record past its void time is treated
//! as absent by the transaction path even before nsup removes it.
//!
//! Invariant: each pass takes one partition lock at a time, briefly, so it
//! never stalls client transactions on other partitions.

use crate::clock::Now;
use crate::namespace::Namespace;
use crate::record::store::{drop_entry, retire_entry, write_tombstone};
use citrine_types::PartitionId;
use std::sync::atomic::Ordering;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    pub expired: u64,
    pub evicted: u64,
    /// Tombstones older than `tomb-raider-eligible-age` dropped.
    pub tombstones_purged: u64,
}

/// Removes every expired record of `namespace`, then evicts if over budget.
pub fn run_pass(namespace: &Namespace, now: Now) -> PassReport {
    let mut report = PassReport::default();
    let tombs_before_ms = now
        .unix_ms
        .saturating_sub(u64::from(namespace.config.tomb_raider_eligible_age).saturating_mul(1000));
    for partition_id in PartitionId::all() {
        let mut partition = namespace.index.partition(partition_id).write();
        report.tombstones_purged += partition.purge_tombstones(tombs_before_ms) as u64;
        partition.remove_where(
            |_, entry| entry.meta().is_expired(now.citrusleaf_seconds),
            |digest, entry| {
                namespace.unindex(&digest, &entry);
                // Expiry is durable by the stored void time: the device
                // engine keeps the expired copy as the record's tombstone.
                retire_entry(namespace, &digest, entry);
                report.expired += 1;
            },
        );
    }
    namespace
        .stats
        .expired_objects
        .fetch_add(report.expired, Ordering::Relaxed);
    namespace
        .stats
        .index_used_bytes
        .store(namespace.index.table_bytes() as u64, Ordering::Relaxed);
    report.evicted = evict(namespace, now);
    report
}

/// Evicts the records soonest to expire until memory use is back under the
/// eviction threshold. Records that never expire are never evicted.
fn evict(namespace: &Namespace, now: Now) -> u64 {
    let Some(threshold) = namespace.evict_threshold_bytes() else {
        return 0;
    };
    let used = namespace.used_bytes();
    if used <= threshold {
        return 0;
    }
    // Free down to 1% of the budget below the threshold, so that eviction
    // does not run on every pass by a hair.
    let target_free = used - threshold + namespace.data_size() / 100;
    let slot_bytes = citrine_index::SLOT_BYTES as u64 + 1;
    // Histogram of bytes by void time, to find the cutoff without sorting
    // every record.
    let mut candidates: Vec<(u32, u64)> = Vec::new();
    for partition_id in PartitionId::all() {
        let partition = namespace.index.partition(partition_id).read();
        for (_, entry) in partition.iter() {
            let void_time = entry.meta().void_time;
            if void_time != 0 {
                candidates.push((void_time, entry.location.size() as u64 + slot_bytes));
            }
        }
    }
    candidates.sort_unstable_by_key(|(void_time, _)| *void_time);
    let mut freed = 0u64;
    let mut cutoff = None;
    for (void_time, bytes) in &candidates {
        freed += bytes;
        cutoff = Some(*void_time);
        if freed >= target_free {
            break;
        }
    }
    let Some(cutoff) = cutoff else {
        tracing::warn!(namespace = %namespace.config.name, "over evict-used-pct but no record has a TTL: nothing can be evicted");
        return 0;
    };
    let mut evicted = 0u64;
    for partition_id in PartitionId::all() {
        let mut partition = namespace.index.partition(partition_id).write();
        partition.remove_where(
            // An eviction must survive a restart like a delete: the record
            // goes only once its tombstone is written (device engine).
            |digest, entry| {
                let meta = entry.meta();
                meta.void_time != 0
                    && meta.void_time <= cutoff
                    && write_tombstone(namespace, digest, &meta, now).is_ok()
            },
            |digest, entry| {
                namespace.unindex(&digest, &entry);
                drop_entry(namespace, entry);
                evicted += 1;
            },
        );
    }
    namespace
        .stats
        .evicted_objects
        .fetch_add(evicted, Ordering::Relaxed);
    namespace
        .stats
        .evict_void_time
        .store(u64::from(cutoff), Ordering::Relaxed);
    tracing::info!(namespace = %namespace.config.name, evicted, cutoff, at = now.citrusleaf_seconds, "evicted records");
    evicted
}

/// Removes records truncated by a `truncate` command: those of set `set_id`
/// (or of every set) last updated before `lut_ms` and still truncated when
/// their partition's turn comes (a truncation undone meanwhile leaves the
/// rest live).
pub fn remove_truncated(namespace: &Namespace, set_id: Option<u16>, lut_ms: u64) -> u64 {
    let mut removed = 0u64;
    for partition_id in PartitionId::all() {
        let mut partition = namespace.index.partition(partition_id).write();
        partition.remove_where(
            |_, entry| {
                let meta = entry.meta();
                set_id.is_none_or(|id| id == meta.set_id)
                    && meta.last_update_ms < lut_ms
                    && namespace.is_truncated(meta.set_id, meta.last_update_ms)
            },
            |digest, entry| {
                namespace.unindex(&digest, &entry);
                drop_entry(namespace, entry);
                removed += 1;
            },
        );
    }
    namespace
        .stats
        .truncated_objects
        .fetch_add(removed, Ordering::Relaxed);
    removed
}
