//! Namespace supervisor (nsup): the background pass that removes expired
//! records and, when a namespace's use (memory, or a device's live bytes)
//! passes evict-used-pct, evicts the records closest to expiring (found by
//! a void-time histogram of `evict-hist-buckets` buckets, not by sorting
//! the records), at most `evict-tenths-pct` tenths of a percent of the
//! records a pass, whole buckets only; also the removal of truncated records,
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
use crate::record::store::{drop_entry, retire_entry, write_eviction_tombstone};
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

/// Evicts the records soonest to expire until the namespace's use (memory,
/// or a device's live bytes) is back under `evict-used-pct`, but at most
/// `evict-tenths-pct` tenths of a percent of its records in one pass (the
/// next passes go on while it stays over). Records that never expire are
/// never evicted.
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
    let target = EvictTarget {
        bytes: used - threshold + namespace.data_size() / 100,
        max_objects: namespace
            .thresholds
            .evict_max_objects(namespace.stats.objects.exact().max(0) as u64),
    };
    let Some(cutoff) = eviction_cutoff(namespace, now, target) else {
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
    tracing::info!(namespace = %namespace.config.name, evicted, cutoff, at = now.citrusleaf_seconds, used, threshold, max_objects = target.max_objects, "evicted records");
    evicted
}

/// What one eviction pass aims at: the bytes to free, and the most
/// records it may remove (`evict-tenths-pct`).
#[derive(Debug, Clone, Copy)]
struct EvictTarget {
    bytes: u64,
    max_objects: u64,
}

/// Records and evictable bytes of one bucket of the void-time histogram.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    objects: u64,
    bytes: u64,
}

/// The void time through which records must go to free `target.bytes`
/// with at most `target.max_objects` records (`None`: no record has a
/// void time, or the first bucket alone holds more records than allowed,
/// as the reference, which never evicts part of a bucket). Two scans under
/// read locks: the latest void time, then a histogram of
/// `evict-hist-buckets` buckets from now to it; the cutoff is the end of
/// the last whole bucket taken, so a pass may free up to one bucket more
/// than the bytes asked.
fn eviction_cutoff(namespace: &Namespace, now: Now, target: EvictTarget) -> Option<u32> {
    let Some(latest) = latest_void_time(namespace) else {
        tracing::warn!(namespace = %namespace.config.name, "over evict-used-pct but no record has a TTL: nothing can be evicted");
        return None;
    };
    let first = now.citrusleaf_seconds.min(latest);
    let buckets = namespace.thresholds.evict_hist_buckets().max(1) as usize;
    let width = (latest - first) / buckets as u32 + 1;
    let histogram = void_time_histogram(namespace, first, width, buckets);
    let (mut freed, mut taken) = (0u64, 0u64);
    let mut end = None;
    for (index, bucket) in histogram.iter().enumerate() {
        if taken + bucket.objects > target.max_objects {
            break;
        }
        taken += bucket.objects;
        freed += bucket.bytes;
        end = Some(first.saturating_add((index as u32 + 1).saturating_mul(width) - 1));
        if freed >= target.bytes {
            break;
        }
    }
    if taken == 0 {
        let first_bucket = histogram.iter().find(|bucket| bucket.objects > 0);
        tracing::warn!(namespace = %namespace.config.name, width, count = first_bucket.map_or(0, |bucket| bucket.objects), max_objects = target.max_objects, "no records below the eviction void time: the first bucket holds more records than evict-tenths-pct allows a pass");
        return None;
    }
    end.map(|end| end.min(latest))
}

/// The latest void time of the namespace's records (`None`: none expires).
fn latest_void_time(namespace: &Namespace) -> Option<u32> {
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
    latest
}

/// Records and evictable bytes by void time: `buckets` buckets of `width`
/// seconds from `first` (later ones in the last).
fn void_time_histogram(
    namespace: &Namespace,
    first: u32,
    width: u32,
    buckets: usize,
) -> Vec<Bucket> {
    let mut histogram = vec![Bucket::default(); buckets];
    for partition_id in PartitionId::all() {
        let partition = namespace.index.partition(partition_id).read();
        for (_, entry) in partition.iter() {
            let void_time = entry.meta().void_time;
            if void_time != 0 {
                let index = (void_time.saturating_sub(first) / width) as usize;
                let bucket = &mut histogram[index.min(buckets - 1)];
                bucket.objects += 1;
                bucket.bytes += namespace.evictable_bytes(entry.location.size() as u64);
            }
        }
    }
    histogram
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
                    && write_eviction_tombstone(namespace, digest, &meta, now).is_ok()
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
