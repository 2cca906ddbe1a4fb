//! Namespace supervisor (nsup): the background pass that removes expired
//! records and, when a namespace's use (memory, or a device's live bytes)
//! passes evict-used-pct, evicts the records closest to expiring (found by
//! a void-time histogram of fixed size, not by sorting the records); also the removal of truncated records,
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

/// Buckets of the void-time histogram an eviction pass builds (the
/// reference's default `evict-hist-buckets`): its memory, whatever the
/// number of records.
const EVICT_HIST_BUCKETS: usize = 10_000;

/// Evicts the records soonest to expire until the namespace's use (memory,
/// or a device's live bytes) is back under `evict-used-pct`. Records that
/// never expire are never evicted.
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
    let Some(cutoff) = eviction_cutoff(namespace, now, target_free) else {
        tracing::warn!(namespace = %namespace.config.name, "over evict-used-pct but no record has a TTL: nothing can be evicted");
        return 0;
    };
    let evicted = evict_through(namespace, cutoff, now);
    namespace
        .stats
        .evicted_objects
        .fetch_add(evicted, Ordering::Relaxed);
    namespace
        .stats
        .evict_void_time
        .store(u64::from(cutoff), Ordering::Relaxed);
    tracing::info!(namespace = %namespace.config.name, evicted, cutoff, at = now.citrusleaf_seconds, used, threshold, "evicted records");
    evicted
}

/// The void time through which records must go to free `target_free`
/// bytes (`None`: no record has one). Two scans under read locks: the
/// latest void time, then the bytes per bucket of a fixed histogram from
/// now to it; the cutoff is the end of the bucket where the running sum
/// reaches the target, so a pass may free up to one bucket more.
fn eviction_cutoff(namespace: &Namespace, now: Now, target_free: u64) -> Option<u32> {
    let mut latest = None;
    for partition_id in PartitionId::all() {
        let partition = namespace.index.partition(partition_id).read();
        for (_, entry) in partition.iter() {
            let void_time = entry.meta().void_time;
            if void_time != 0 {
                latest = latest.max(Some(void_time));
            }
        }
    }
    let latest = latest?;
    let first = now.citrusleaf_seconds.min(latest);
    let width = (latest - first) / EVICT_HIST_BUCKETS as u32 + 1;
    let mut histogram = vec![0u64; EVICT_HIST_BUCKETS];
    for partition_id in PartitionId::all() {
        let partition = namespace.index.partition(partition_id).read();
        for (_, entry) in partition.iter() {
            let void_time = entry.meta().void_time;
            if void_time != 0 {
                let bucket = (void_time.saturating_sub(first) / width) as usize;
                histogram[bucket.min(EVICT_HIST_BUCKETS - 1)] +=
                    namespace.evictable_bytes(entry.location.size() as u64);
            }
        }
    }
    let mut freed = 0u64;
    let mut end = latest;
    for (bucket, bytes) in histogram.iter().enumerate() {
        freed += bytes;
        end = first.saturating_add((bucket as u32 + 1).saturating_mul(width) - 1);
        if freed >= target_free {
            break;
        }
    }
    Some(end.min(latest))
}

/// Evicts every record with a void time at or before `cutoff`, each once
/// its tombstone is written (device engine), so that an eviction survives
/// a restart like a delete.
fn evict_through(namespace: &Namespace, cutoff: u32, now: Now) -> u64 {
    let mut evicted = 0u64;
    for partition_id in PartitionId::all() {
        let mut partition = namespace.index.partition(partition_id).write();
        partition.remove_where(
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
