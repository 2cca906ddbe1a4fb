//! The service's side of the device storage engine: rebuilding the index at
//! start (fast restart after a clean stop, else the index checkpoint and
//! the blocks written after it, else a cold start), moving records for
//! defragmentation under their partition lock, writing index checkpoints
//! in the background, and saving the index at a clean shutdown.
//!
//! The engine knows blocks and records; the index knows which copy of a
//! record is current. Everything that needs both lives here, so the engine
//! never depends on the index crate.
//!
//! A record that arrived by XDR keeps its mark across restarts: its void
//! time on the device (record headers, the index image) carries the mark
//! in its top bit ([`device_void_time`]), as the index packs it; the
//! engine never reads void times, and a restart splits them again. A
//! delete's tombstone comes back into the index at a restart with its LUT,
//! durability and mark, read from its header on the device
//! ([`tombstone_void_time`]).
//!
//! Invariants: the index is rebuilt before the service answers anything;
//! defrag moves a record only while holding its partition's write lock and
//! only if the index still points at the copy being moved.

use crate::clock::{Clock, Now};
use crate::config::StorageEngineConfig;
use crate::namespace::Namespace;
use citrine_index::{IndexEntry, RecordMeta, Tombstone, MAX_VOID_TIME};
use citrine_storage::device::{Recovered, RecoveredRecord, Relocator, SavedEntry, ScanProgress};
use citrine_storage::{DeviceEngine, Location, StorageError};
use citrine_types::{Digest, PartitionId};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The void time a record's copy is kept on the device with: held to the
/// index's 31 bits, the XDR mark (`RecordMeta::xdr_write`) in the top bit.
pub fn device_void_time(meta: &RecordMeta) -> u32 {
    meta.void_time.min(MAX_VOID_TIME) | (u32::from(meta.xdr_write) << 31)
}

/// A delete tombstone's void time on the device (a tombstone has no void
/// time of its own): bit 30 says it is to be put back in the index at a
/// restart ([`restore_tombstones`]; an eviction's is 0 and is not), bit 0
/// that the delete was durable, the top bit the XDR mark, as a record's.
pub fn tombstone_void_time(durable: bool, xdr_write: bool) -> u32 {
    TOMBSTONE_KEPT | u32::from(durable) | (u32::from(xdr_write) << 31)
}

const TOMBSTONE_KEPT: u32 = 1 << 30;

/// A void time read from the device, and the XDR mark it carries.
fn split_device_void_time(stored: u32) -> (u32, bool) {
    (stored & MAX_VOID_TIME, stored > MAX_VOID_TIME)
}

/// Puts one recovered record into the index, unless it is expired or
/// truncated.
fn admit(
    namespace: &Namespace,
    digest: &Digest,
    record: &RecoveredRecord<'_>,
    now: Now,
) -> Recovered {
    let Some(set_id) = namespace.sets.id_of(record.set_name) else {
        tracing::warn!(namespace = %namespace.config.name, "too many sets: a recovered record is kept without its set");
        return admit_with_set(namespace, digest, record, 0, now);
    };
    admit_with_set(namespace, digest, record, set_id, now)
}

fn admit_with_set(
    namespace: &Namespace,
    digest: &Digest,
    record: &RecoveredRecord<'_>,
    set_id: u16,
    now: Now,
) -> Recovered {
    let life = if record.life < citrine_index::LIVES {
        record.life
    } else {
        // Under the header's checksum, so written so: a bug, not wear.
        tracing::warn!(namespace = %namespace.config.name, life = record.life, "a recovered record's life is out of range; taken modulo the lives");
        record.life % citrine_index::LIVES
    };
    let (void_time, xdr_write) = split_device_void_time(record.void_time);
    let meta = RecordMeta {
        generation: record.generation.max(1),
        life,
        set_id,
        void_time,
        last_update_ms: record.last_update_ms,
        xdr_write,
    };
    if namespace.is_truncated(set_id, meta.last_update_ms) {
        return Recovered::Truncated;
    }
    if meta.is_expired(now.citrusleaf_seconds) {
        return Recovered::Expired;
    }
    let location = Location::device(record.address);
    let size = location.size() as i64;
    let previous = namespace
        .index
        .partition(digest.partition())
        .write()
        .insert(*digest, IndexEntry::new(meta, location));
    debug_assert!(previous.is_none(), "a digest recovered twice");
    if previous.is_none() {
        let set_stats = namespace.sets.stats(set_id);
        set_stats.objects.fetch_add(1, Ordering::Relaxed);
        set_stats.data_used_bytes.fetch_add(size, Ordering::Relaxed);
        namespace.stats.objects.fetch_add(1, Ordering::Relaxed);
    }
    Recovered::Live
}

/// Rebuilds a device namespace's index: persisted truncations first, then a
/// fast restart from the clean-shutdown image if there is a valid one,
/// otherwise the index checkpoint and the blocks written after it if there
/// is a valid one, otherwise a cold start. Does nothing for other engines.
/// Times its work with `clock` (the logs give records per second).
pub(crate) fn recover(namespace: &Namespace, clock: &dyn Clock) -> Result<(), String> {
    let Some(engine) = namespace.storage.device() else {
        return Ok(());
    };
    adopt_persisted_truncations(namespace, engine);
    let now = Now::of(clock);
    let started_ms = clock.now_unix_ms();
    if fast_restart(namespace, engine, now, clock, started_ms)
        || checkpoint_restart(namespace, engine, now, clock, started_ms)
    {
        restore_tombstones(namespace, engine);
        return Ok(());
    }
    cold_start(namespace, engine, now, clock, started_ms);
    restore_tombstones(namespace, engine);
    Ok(())
}

/// Puts the delete tombstones the device holds back in the index, as they
/// were before the restart (LUT, generation, life, durability, XDR mark):
/// a delete not yet shipped by XDR is still shipped, one that came by XDR
/// still is not shipped back, and replication still sees the delete. Left
/// out: evictions' tombstones (see [`tombstone_void_time`]), tombstones
/// written before their void time carried this, truncated ones, and those
/// the engine already collected (every older copy gone from the device).
fn restore_tombstones(namespace: &Namespace, engine: &DeviceEngine) {
    let mut restored = 0u64;
    for held in engine.held_tombstones() {
        if held.void_time & TOMBSTONE_KEPT == 0 {
            continue;
        }
        let set_id = namespace.sets.id_of(&held.set_name).unwrap_or(0);
        if namespace.is_truncated(set_id, held.last_update_ms) {
            continue;
        }
        let tombstone = Tombstone {
            generation: held.generation,
            life: held.life % citrine_index::LIVES,
            durable: held.void_time & 1 != 0,
            last_update_ms: held.last_update_ms,
            set_id,
            xdr_write: held.void_time > MAX_VOID_TIME,
        };
        let mut partition = namespace.index.partition(held.digest.partition()).write();
        if partition.get(&held.digest).is_none() {
            partition.set_tombstone(held.digest, tombstone);
            restored += 1;
        }
    }
    if restored > 0 {
        tracing::info!(namespace = %namespace.config.name, tombstones = restored, "delete tombstones back in the index");
    }
}

/// Where a device namespace keeps its index checkpoint: beside the
/// clean-shutdown image (`<namespace>.checkpoint`), so `fast-restart =
/// false` turns both off.
pub fn checkpoint_path(namespace: &Namespace) -> Option<std::path::PathBuf> {
    match &namespace.config.storage_engine {
        StorageEngineConfig::Device {
            index_image: Some(image),
            ..
        } => Some(image.with_extension("checkpoint")),
        _ => None,
    }
}

/// Rebuilds the index from the checkpoint and the blocks written after
/// it; false when there is none or it failed a check (then nothing was
/// admitted and the start must scan).
fn checkpoint_restart(
    namespace: &Namespace,
    engine: &DeviceEngine,
    now: Now,
    clock: &dyn Clock,
    started_ms: u64,
) -> bool {
    let name = &namespace.config.name;
    let Some(path) = checkpoint_path(namespace) else {
        return false;
    };
    let sink =
        |digest: &Digest, record: &RecoveredRecord<'_>| admit(namespace, digest, record, now);
    match engine.checkpoint_restart(&path, &sink) {
        Ok(Some(report)) => {
            let seconds = seconds_since(clock, started_ms);
            tracing::info!(
                namespace = %name,
                records = report.live,
                tombstones = report.tombstones,
                expired = report.expired,
                truncated = report.truncated,
                checkpoint_entries = report.checkpoint_entries,
                blocks_replayed = report.blocks_replayed,
                records_replayed = report.records_read,
                corrupt_records = report.corrupt_records,
                corrupt_blocks = report.corrupt_blocks,
                blocks_in_use = report.blocks_in_use,
                seconds = format!("{seconds:.3}"),
                records_per_second = ((report.live + report.tombstones) as f64 / seconds) as u64,
                "checkpoint restart complete: index from {} and the write blocks written after it",
                path.display()
            );
            true
        }
        Ok(None) => {
            tracing::info!(namespace = %name, "no index checkpoint: cold start");
            false
        }
        Err(why) => {
            tracing::warn!(namespace = %name, "index checkpoint {} rejected ({why}): cold start", path.display());
            false
        }
    }
}

/// Writes an index checkpoint when one is due (see
/// [`DeviceEngine::checkpoint_due`]); the checkpoint thread calls it about
/// every second. Returns whether one was written.
pub fn checkpoint_tick(namespace: &Namespace, clock: &dyn Clock) -> bool {
    let (Some(engine), Some(path)) = (namespace.storage.device(), checkpoint_path(namespace))
    else {
        return false;
    };
    let period = Duration::from_secs(u64::from(engine.config().checkpoint_period_s));
    if engine.config().checkpoint_period_s == 0 || !engine.checkpoint_due(period) {
        return false;
    }
    let started_ms = clock.now_unix_ms();
    match engine.write_checkpoint(&path) {
        Ok(report) => {
            tracing::info!(
                namespace = %namespace.config.name,
                entries = report.entries,
                blocks_covered = report.blocks_covered,
                blocks_read = report.blocks_read,
                bytes = report.bytes,
                rebuilt = report.rebuilt,
                seconds = format!("{:.3}", seconds_since(clock, started_ms)),
                "index checkpoint written to {}",
                path.display()
            );
            true
        }
        Err(why) => {
            tracing::warn!(namespace = %namespace.config.name, "index checkpoint not written: {why}");
            false
        }
    }
}

/// The truncations the device keeps become the namespace's thresholds.
fn adopt_persisted_truncations(namespace: &Namespace, engine: &DeviceEngine) {
    let (namespace_lut, set_luts) = engine.truncations();
    namespace
        .stats
        .truncate_lut_ms
        .fetch_max(namespace_lut, Ordering::Relaxed);
    for (set, lut) in set_luts {
        // A set none of whose records is loaded waits by name.
        namespace.sets.set_truncation(&set, lut);
    }
}

/// Seconds since `started_ms` on `clock`, never 0 (a rate divides by it).
fn seconds_since(clock: &dyn Clock, started_ms: u64) -> f64 {
    (clock.now_unix_ms().saturating_sub(started_ms) as f64 / 1000.0).max(1e-3)
}

/// Reattaches the index from the clean-shutdown image when there is a
/// valid one; false when the start must scan.
fn fast_restart(
    namespace: &Namespace,
    engine: &DeviceEngine,
    now: Now,
    clock: &dyn Clock,
    started_ms: u64,
) -> bool {
    let name = &namespace.config.name;
    let StorageEngineConfig::Device {
        index_image: Some(path),
        ..
    } = &namespace.config.storage_engine
    else {
        return false;
    };
    match engine.fast_restart(path, &mut |digest, record| {
        admit(namespace, digest, record, now)
    }) {
        Ok(Some(report)) => {
            let seconds = seconds_since(clock, started_ms);
            tracing::info!(
                namespace = %name,
                records = report.live,
                tombstones = report.tombstones,
                expired = report.expired,
                seconds = format!("{seconds:.3}"),
                records_per_second = (report.records_read as f64 / seconds) as u64,
                "fast restart: index reattached from {}",
                path.display()
            );
            true
        }
        Ok(None) => {
            tracing::info!(namespace = %name, "no clean-shutdown index image: cold start");
            false
        }
        Err(why) => {
            tracing::warn!(namespace = %name, "index image rejected ({why}): cold start");
            false
        }
    }
}

/// Rebuilds the index by scanning every device (the engine's threads),
/// logging progress about every second.
fn cold_start(
    namespace: &Namespace,
    engine: &DeviceEngine,
    now: Now,
    clock: &dyn Clock,
    started_ms: u64,
) {
    let name = &namespace.config.name;
    let last_log_ms = AtomicU64::new(started_ms);
    let records = AtomicU64::new(0);
    let per_device: parking_lot::Mutex<Vec<u64>> = parking_lot::Mutex::new(Vec::new());
    let progress = |progress: ScanProgress| {
        {
            let mut counts = per_device.lock();
            if counts.len() <= progress.device {
                counts.resize(progress.device + 1, 0);
            }
            counts[progress.device] = progress.records_read;
            records.store(counts.iter().sum(), Ordering::Relaxed);
        }
        let now_ms = clock.now_unix_ms();
        let last = last_log_ms.load(Ordering::Relaxed);
        let due = now_ms.saturating_sub(last) >= 1_000;
        if due
            && last_log_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let read = records.load(Ordering::Relaxed);
            tracing::info!(
                namespace = %name,
                device = progress.device,
                blocks = format!("{}/{}", progress.blocks_scanned, progress.block_count),
                records_read = read,
                records_per_second = (read as f64 / seconds_since(clock, started_ms)) as u64,
                "cold start: scanning"
            );
        }
    };
    let sink =
        |digest: &Digest, record: &RecoveredRecord<'_>| admit(namespace, digest, record, now);
    let report = engine.cold_start(&sink, &progress);
    let seconds = seconds_since(clock, started_ms);
    tracing::info!(
        namespace = %name,
        records = report.live,
        records_read = report.records_read,
        tombstones = report.tombstones,
        expired = report.expired,
        truncated = report.truncated,
        corrupt_records = report.corrupt_records,
        corrupt_blocks = report.corrupt_blocks,
        blocks_in_use = report.blocks_in_use,
        seconds = format!("{seconds:.3}"),
        records_per_second = (report.records_read as f64 / seconds) as u64,
        "cold start complete"
    );
}

impl Relocator for Namespace {
    fn relocate(
        &self,
        digest: &Digest,
        from: &Location,
        copy: &mut dyn FnMut() -> Result<Location, StorageError>,
    ) -> bool {
        let mut partition = self.index.partition(digest.partition()).write();
        let Some(entry) = partition.get_mut(digest) else {
            return false;
        };
        if entry.location != *from {
            return false;
        }
        match copy() {
            Ok(location) => {
                debug_assert_eq!(
                    location.size(),
                    from.size(),
                    "a moved record keeps its size"
                );
                // The engine accounts for the old copy itself.
                entry.location = location;
                true
            }
            Err(_) => false,
        }
    }
}

/// One defragmentation step of a device namespace; returns how long the
/// defrag thread should pause (`None`: not a device namespace).
pub fn defrag_step(namespace: &Namespace) -> Option<Duration> {
    let engine = namespace.storage.device()?;
    let step = engine.defrag_step(namespace);
    Some(engine.defrag_pause(step))
}

/// The flusher's tick: writes out buffered records and frees emptied blocks.
/// A failed engine does nothing (it logged its failure once).
pub fn flush_tick(namespace: &Namespace) {
    if let Some(engine) = namespace.storage.device() {
        match engine.flush_tick() {
            Ok(()) | Err(StorageError::DeviceFailed) => {}
            Err(error) => {
                tracing::error!(namespace = %namespace.config.name, "flush failed: {error}")
            }
        }
    }
}

/// Drops tombstones that can no longer hide an older copy.
pub fn collect_tombstones(namespace: &Namespace) -> usize {
    namespace
        .storage
        .device()
        .map_or(0, |engine| engine.collect_tombstones())
}

/// The flush period of a device namespace.
pub fn flush_period(namespace: &Namespace) -> Option<Duration> {
    match &namespace.config.storage_engine {
        StorageEngineConfig::Device { flush_max_ms, .. } => {
            Some(Duration::from_millis(u64::from(*flush_max_ms).max(1)))
        }
        StorageEngineConfig::Memory { .. } => None,
    }
}

/// Clean shutdown of a device namespace: closes it to record writes (any
/// later write is refused, so none is acknowledged after this), writes
/// every buffer out and syncs and, when an image path is configured, saves
/// the index for a fast restart. Call only after client transactions have
/// stopped.
pub fn shutdown(namespace: &Namespace, clock: &dyn Clock) -> Result<(), String> {
    let Some(engine) = namespace.storage.device() else {
        return Ok(());
    };
    engine.close_writes();
    let StorageEngineConfig::Device { index_image, .. } = &namespace.config.storage_engine else {
        return Ok(());
    };
    let Some(path) = index_image else {
        return engine.flush_all().map_err(|error| error.to_string());
    };
    let started_ms = clock.now_unix_ms();
    let sets: Vec<Vec<u8>> = std::iter::once(Vec::new())
        .chain(namespace.sets.all().into_iter().map(|(_, name)| name))
        .collect();
    let mut entries =
        Vec::with_capacity(namespace.stats.objects.load(Ordering::Relaxed).max(0) as usize);
    for partition_id in PartitionId::all() {
        let partition = namespace.index.partition(partition_id).read();
        for (digest, entry) in partition.iter() {
            let Some(address) = entry.location.device_address() else {
                continue;
            };
            let meta = entry.meta();
            // Set ids are 1-based positions in `sets.all()`, 0 = no set.
            entries.push(SavedEntry {
                digest,
                generation: meta.generation,
                life: meta.life,
                void_time: device_void_time(&meta),
                last_update_ms: meta.last_update_ms,
                set: meta.set_id,
                address,
            });
        }
    }
    engine.save_index(path, &sets, &entries)?;
    tracing::info!(namespace = %namespace.config.name, records = entries.len(), seconds = format!("{:.3}", seconds_since(clock, started_ms)), "index saved for fast restart to {}", path.display());
    Ok(())
}
