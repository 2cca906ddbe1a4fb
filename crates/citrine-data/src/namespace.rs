//! A namespace: its configuration, its 4096-partition primary index, its
//! storage engine, its sets and its statistics.
//!
//! Invariants:
//! - `objects` (its exact sum) equals the number of index entries (updated
//!   under the partition lock that changes the index);
//! - `used_bytes()` = index table bytes + engine data bytes (memory), the
//!   device's live bytes (device): the figure evict-used-pct is compared
//!   with; a memory namespace's stop-writes-used-pct is compared with its
//!   cheap approximation, within 1 % of the budget, a device's with its
//!   exact live bytes (one atomic);
//! - nothing every request writes shares a cache line across threads (the
//!   counts are striped, see `citrine_types::stripes`), and the set-name
//!   lookup takes no lock;
//! - a partition a change was cut short in (a panic while it was being
//!   published, see `citrine_index`) serves nothing more until restart:
//!   [`Namespace::serving`] refuses it, and it is logged once.

use crate::config::{ConflictResolutionPolicy, NamespaceConfig, StorageEngineConfig};
use crate::hook::{InstallUpkeep, RecordHook};
use citrine_index::PartitionTable;
use citrine_index::{IndexEntry, RecordMeta};
use citrine_storage::thresholds::Thresholds;
use citrine_storage::{MemoryEngine, StorageEngine};
use citrine_types::stripes::{Counter, Gauge, Padded};
use citrine_types::{Digest, PartitionId};
use parking_lot::Mutex;
use std::cmp::Ordering as Order;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;

/// A memory namespace's `stop-writes-avail-pct` at start (the
/// reference's default): writes stop while less than this share of its
/// budget is unused, whatever `stop-writes-used-pct` says.
pub const MEMORY_STOP_WRITES_AVAIL_PCT: u8 = 5;

/// Largest number of sets in a namespace, the reference's (4095; set ids
/// are u16, 0 = no set).
pub const SETS_MAX: usize = 4095;
// Every set id fits the index entry's set-id bits.
const _: () = assert!(SETS_MAX < citrine_index::SET_IDS as usize);

/// Per-set statistics, alone on their cache lines: writes of one set do
/// not slow down those of another.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct SetStats {
    pub objects: AtomicI64,
    pub data_used_bytes: AtomicI64,
}

/// The sets of a namespace: name ↔ id, with statistics. Statistics live in
/// a fixed array indexed by set id so the hot path reaches them without a
/// lock; the truncation thresholds, which every write reads and almost
/// nothing writes, in an array of their own.
///
/// Every write looks its set's name up, so the lookup takes no lock and
/// writes nothing shared: an open-addressing table of set ids
/// (`slots`, probed linearly from the name's hash) over the names by id
/// (`names`, each set once). Sets are never removed, so a slot once filled
/// keeps its id. Creating a set takes `create`: the name goes in first,
/// then its id in a slot (release), so a reader that finds the id
/// (acquire) finds the name.
///
/// A set comes into being with the first record stored in it (as the
/// reference's sets do: a write that creates a record, even one then
/// refused, a replica's or a migration's copy, a record loaded at start),
/// never by a lookup, a refused request or a truncation: a truncation of a
/// set that does not exist waits by name (`Creation::pending_truncations`)
/// and is the set's threshold from its creation on. Such a threshold is
/// not the set's reported `truncate_lut` (`reported_truncation`): the
/// reference ignores a truncation of a set it does not have ("truncate for
/// nonexistent set") and reports 0 for the set created later; Citrine
/// keeps it only to refuse older copies of the set arriving from peers.
#[derive(Debug)]
pub struct SetRegistry {
    /// Set ids (0 = empty), `SLOTS` of them.
    slots: Box<[AtomicU16]>,
    /// Name of each set id (index 0 unused).
    names: Box<[OnceLock<Box<[u8]>>]>,
    /// Held while a set is created or a threshold set.
    create: Mutex<Creation>,
    stats: Box<[SetStats]>,
    /// Per set id: records of the set last updated before this Unix-ms
    /// time are truncated.
    truncations: Box<[AtomicU64]>,
    /// Per set id: the threshold a truncation gave the set while it
    /// existed here (Unix ms; 0: none), as `truncate_lut` reports it.
    reported: Box<[AtomicU64]>,
}

/// What creating a set changes, under its lock.
#[derive(Debug, Default)]
struct Creation {
    /// Sets created so far.
    count: u16,
    /// Truncation thresholds (Unix ms) of sets not created yet, by name.
    pending_truncations: HashMap<Box<[u8]>, u64>,
}

/// Slots of the set-name table: a power of two, at least twice the sets.
const SLOTS: usize = 8192;
const _: () = assert!(SLOTS.is_power_of_two() && SLOTS >= 2 * (SETS_MAX + 1));

impl Default for SetRegistry {
    fn default() -> Self {
        SetRegistry {
            slots: (0..SLOTS).map(|_| AtomicU16::new(0)).collect(),
            names: (0..=SETS_MAX).map(|_| OnceLock::new()).collect(),
            create: Mutex::new(Creation::default()),
            stats: (0..=SETS_MAX).map(|_| SetStats::default()).collect(),
            truncations: (0..=SETS_MAX).map(|_| AtomicU64::new(0)).collect(),
            reported: (0..=SETS_MAX).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

/// Home slot of a set name (FNV-1a: names are short, and no one chooses
/// them to collide with the server's table).
fn home_slot(name: &[u8]) -> usize {
    let hash = name.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash as usize) & (SLOTS - 1)
}

impl SetRegistry {
    /// The id of set `name`, creating it if needed. `None` when the namespace
    /// already has `SETS_MAX` sets.
    pub fn id_of(&self, name: &[u8]) -> Option<u16> {
        if name.is_empty() {
            return Some(0);
        }
        if let Some(id) = self.existing_id(name) {
            return Some(id);
        }
        let mut created = self.create.lock();
        // Created by another thread since the lookup?
        if let Some(id) = self.existing_id(name) {
            return Some(id);
        }
        if usize::from(created.count) >= SETS_MAX {
            return None;
        }
        let id = created.count + 1;
        let mut slot = home_slot(name);
        // Fewer ids than slots: an empty one is always found.
        while self.slots[slot].load(Ordering::Relaxed) != 0 {
            slot = (slot + 1) & (SLOTS - 1);
        }
        let stored = self.names[usize::from(id)].set(name.into());
        debug_assert!(stored.is_ok(), "set id {id} named twice");
        // Its threshold before its id is published: no record of it is
        // ever seen without the truncation that waited for it.
        let threshold = created.pending_truncations.remove(name).unwrap_or(0);
        self.truncations[usize::from(id)].store(threshold, Ordering::Relaxed);
        self.slots[slot].store(id, Ordering::Release);
        created.count = id;
        debug_assert!(usize::from(id) <= SETS_MAX);
        Some(id)
    }

    /// Sets set `name`'s truncation threshold (Unix ms; 0: none) to
    /// `lut_ms`, raised or lowered. Returns the set's id; `None` for a set
    /// not created yet, which then starts with the threshold.
    pub fn set_truncation(&self, name: &[u8], lut_ms: u64) -> Option<u16> {
        let mut created = self.create.lock();
        match self.existing_id(name) {
            Some(id) => {
                self.truncations[usize::from(id)].store(lut_ms, Ordering::Relaxed);
                self.reported[usize::from(id)].store(lut_ms, Ordering::Relaxed);
                Some(id)
            }
            None if lut_ms == 0 => {
                created.pending_truncations.remove(name);
                None
            }
            None => {
                created.pending_truncations.insert(name.into(), lut_ms);
                None
            }
        }
    }

    /// The id of an existing set (no lock, nothing written).
    pub fn existing_id(&self, name: &[u8]) -> Option<u16> {
        if name.is_empty() {
            return Some(0);
        }
        let mut slot = home_slot(name);
        loop {
            let id = self.slots[slot].load(Ordering::Acquire);
            if id == 0 {
                return None;
            }
            if self.names[usize::from(id)].get().map(|stored| &stored[..]) == Some(name) {
                return Some(id);
            }
            slot = (slot + 1) & (SLOTS - 1);
        }
    }

    /// Statistics of set `id` (0 = records without a set).
    #[inline]
    pub fn stats(&self, id: u16) -> &SetStats {
        // Ids are handed out by `id_of`, never above SETS_MAX.
        &self.stats[usize::from(id).min(SETS_MAX)]
    }

    /// The truncation threshold of set `id` (Unix ms): its records last
    /// updated before it are truncated.
    #[inline]
    pub fn truncation(&self, id: u16) -> &AtomicU64 {
        &self.truncations[usize::from(id).min(SETS_MAX)]
    }

    /// The threshold (Unix ms; 0: none) a truncation gave set `id` while
    /// it existed here, as `truncate_lut` reports it; one that waited for
    /// the set's creation is not reported (see [`SetRegistry`]).
    pub fn reported_truncation(&self, id: u16) -> u64 {
        self.reported[usize::from(id).min(SETS_MAX)].load(Ordering::Relaxed)
    }

    /// Name of set `id`.
    pub fn name(&self, id: u16) -> Option<Vec<u8>> {
        if id == 0 {
            return None;
        }
        self.names
            .get(usize::from(id))?
            .get()
            .map(|name| name.to_vec())
    }

    /// All sets: (id, name), in the order they were created.
    pub fn all(&self) -> Vec<(u16, Vec<u8>)> {
        (1..=SETS_MAX as u16)
            .map_while(|id| Some((id, self.names[usize::from(id)].get()?.to_vec())))
            .collect()
    }
}

/// What conflict resolution compares of one copy of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    /// The record's life, `0..LIVES` (see `citrine_index::RecordMeta::life`).
    pub life: u16,
    /// 1..=65535, wrapping to 1.
    pub generation: u16,
    pub last_update_ms: u64,
}

impl Version {
    /// The version of a stored copy.
    pub fn of(meta: &citrine_index::RecordMeta) -> Version {
        Version {
            life: meta.life,
            generation: meta.generation,
            last_update_ms: meta.last_update_ms,
        }
    }

    /// The version of a kept delete.
    pub fn of_tombstone(tombstone: &citrine_index::Tombstone) -> Version {
        Version {
            life: tombstone.life,
            generation: tombstone.generation,
            last_update_ms: tombstone.last_update_ms,
        }
    }
}

/// Orders two copies of one record under `policy`: `Greater` when `ours`
/// wins over `theirs`, `Less` when `theirs` does, `Equal` when the policy
/// cannot tell them apart (the caller keeps the copy it holds).
///
/// The later life wins first, whatever the policy: a copy from before a
/// non-durable delete never wins over the record written after it (see
/// `citrine_index::RecordMeta::life`). Lives and generations are compared
/// as serial numbers: generations wrap from 65535 to 1, so a generation up
/// to 32767 writes ahead of another is the newer one (65535 < 1 < 2); lives
/// wrap from `LIVES - 1` to 0 likewise. At exactly half the range apart the
/// numerically larger wins, so the order stays antisymmetric.
pub fn compare_versions(policy: ConflictResolutionPolicy, ours: Version, theirs: Version) -> Order {
    let life = compare_lives(ours.life, theirs.life);
    let generation = compare_generations(ours.generation, theirs.generation);
    let last_update = ours.last_update_ms.cmp(&theirs.last_update_ms);
    life.then(match policy {
        ConflictResolutionPolicy::Generation => generation.then(last_update),
        ConflictResolutionPolicy::LastUpdateTime => last_update.then(generation),
    })
}

/// Serial-number order of two wrapping lives.
fn compare_lives(ours: u16, theirs: u16) -> Order {
    let lives = citrine_index::LIVES;
    let ahead = (ours % lives + lives - theirs % lives) % lives;
    match ahead {
        0 => Order::Equal,
        ahead if ahead < lives / 2 => Order::Greater,
        ahead if ahead == lives / 2 => ours.cmp(&theirs),
        _ => Order::Less,
    }
}

/// Serial-number order of two wrapping generations.
fn compare_generations(ours: u16, theirs: u16) -> Order {
    let ahead = ours.wrapping_sub(theirs);
    match ahead {
        0 => Order::Equal,
        1..=0x7FFF => Order::Greater,
        0x8000 => ours.cmp(&theirs),
        _ => Order::Less,
    }
}

/// Namespace statistics. The counts requests add to are striped
/// ([`Counter`]): service threads on different cores do not share their
/// cache lines.
#[derive(Debug, Default)]
pub struct NamespaceStats {
    /// Index entries (records and expired copies not yet removed).
    pub objects: Gauge,
    pub expired_objects: AtomicU64,
    pub evicted_objects: AtomicU64,
    pub truncated_objects: AtomicU64,
    pub client_read_success: Counter,
    pub client_read_not_found: Counter,
    pub client_read_error: Counter,
    pub client_write_success: Counter,
    pub client_write_error: Counter,
    pub client_delete_success: Counter,
    pub client_delete_not_found: Counter,
    /// Commands a filter expression turned away (FILTERED_OUT, 27).
    pub client_read_filtered_out: Counter,
    pub client_write_filtered_out: Counter,
    pub client_delete_filtered_out: Counter,
    /// Read-touches (a read with a TTL percentage) that reset the TTL,
    /// that found it need not, and that failed after the read answered.
    pub read_touch_success: Counter,
    pub read_touch_skip: Counter,
    pub read_touch_error: Counter,
    pub client_udf_complete: Counter,
    pub client_udf_error: Counter,
    /// A client's record UDFs that completed, by what they did, and whose
    /// function failed (see [`crate::tally`]).
    pub client_lang_read_success: Counter,
    pub client_lang_write_success: Counter,
    pub client_lang_delete_success: Counter,
    pub client_lang_error: Counter,
    /// Background jobs' sub-transactions ([`crate::tally`]).
    pub sub: crate::tally::SubStats,
    pub fail_generation: Counter,
    pub fail_key_busy: Counter,
    pub fail_record_too_big: Counter,
    pub stop_writes_count: Counter,
    /// Highest void time seen that eviction removed (citrusleaf seconds).
    pub evict_void_time: AtomicU64,
    /// Index table bytes as of the last nsup pass (refreshed by nsup).
    pub index_used_bytes: Padded<AtomicU64>,
    /// Namespace-wide truncation: records last updated before this Unix-ms
    /// time are gone. Every write reads it: on a line of its own.
    pub truncate_lut_ms: Padded<AtomicU64>,
    /// Partitions that stopped serving after a change to them was cut
    /// short by a panic ([`Namespace::serving`]).
    pub partitions_failed: AtomicU64,
}

/// A namespace.
pub struct Namespace {
    pub config: NamespaceConfig,
    pub index: PartitionTable,
    pub storage: Box<dyn StorageEngine>,
    /// Stop-writes and eviction thresholds in force (a device engine's
    /// own, shared): `set-config` changes them at run time.
    pub thresholds: Arc<Thresholds>,
    pub sets: SetRegistry,
    pub stats: NamespaceStats,
    /// Transactions' provisional versions and monitors ([`crate::txn`]).
    pub txn: crate::txn::TxnTables,
    /// Where writes shipped here by XDR landed ([`crate::xdr_arrivals`]).
    pub xdr_arrivals: crate::xdr_arrivals::XdrArrivals,
    /// The upkeep every change of its records runs (the secondary indexes,
    /// installed by the node above this layer; see [`crate::hook`]).
    hook: std::sync::OnceLock<Arc<dyn RecordHook>>,
    /// The failed partitions already logged and counted.
    failed_reported: Mutex<std::collections::BTreeSet<u16>>,
    /// The node's clock, read again under a partition's write lock
    /// ([`Namespace::now_under_lock`]).
    clock: Arc<dyn crate::Clock>,
}

impl Namespace {
    /// Opens a namespace. A device namespace opens its devices and rebuilds
    /// its index (fast restart from a clean shutdown's image, otherwise a
    /// cold start scanning the devices).
    pub fn open(
        config: NamespaceConfig,
        clock: Arc<dyn crate::Clock>,
    ) -> Result<Namespace, String> {
        let storage: Box<dyn StorageEngine> = match &config.storage_engine {
            StorageEngineConfig::Memory { data_size, .. } => {
                Box::new(MemoryEngine::with_budget(*data_size))
            }
            StorageEngineConfig::Device { engine, .. } => Box::new(
                citrine_storage::DeviceEngine::open(engine.clone())
                    .map_err(|error| format!("namespace {}: {error}", config.name))?,
            ),
        };
        let thresholds = Self::thresholds_of(&config, storage.as_ref())?;
        let txn =
            crate::txn::TxnTables::new(config.mrt.duration_seconds, config.mrt.writes_disabled);
        let namespace = Namespace {
            config,
            index: PartitionTable::new(),
            storage,
            thresholds,
            sets: SetRegistry::default(),
            stats: NamespaceStats::default(),
            txn,
            xdr_arrivals: Default::default(),
            hook: std::sync::OnceLock::new(),
            failed_reported: Mutex::default(),
            clock,
        };
        crate::device::recover(&namespace, namespace.clock.as_ref())?;
        Ok(namespace)
    }

    /// The thresholds at open: a device engine's (built from its
    /// configuration), or a memory namespace's own; eviction's pace from
    /// the namespace's configuration.
    fn thresholds_of(
        config: &NamespaceConfig,
        storage: &dyn StorageEngine,
    ) -> Result<Arc<Thresholds>, String> {
        let thresholds = match (&config.storage_engine, storage.device()) {
            (_, Some(device)) => device.thresholds().clone(),
            (
                StorageEngineConfig::Memory {
                    evict_used_pct,
                    stop_writes_used_pct,
                    ..
                },
                None,
            ) => Arc::new(Thresholds::new(
                *evict_used_pct,
                *stop_writes_used_pct,
                MEMORY_STOP_WRITES_AVAIL_PCT,
            )),
            (StorageEngineConfig::Device { .. }, None) => {
                return Err(format!(
                    "namespace {}: internal: a device namespace without its device engine",
                    config.name
                ))
            }
        };
        thresholds.set_evict_tenths_pct(config.evict_tenths_pct);
        thresholds
            .set_evict_hist_buckets(config.evict_hist_buckets)
            .ok_or_else(|| {
                format!(
                    "namespace {}: evict-hist-buckets = {} is impossible",
                    config.name, config.evict_hist_buckets
                )
            })?;
        Ok(thresholds)
    }

    /// The time a change decided under its partition's write lock runs
    /// at: the clock read under that lock, never before `taken` (when the
    /// request was taken up). A version's LUT is taken from it, so it is at
    /// or past every clock reading made before the lock was free: XDR's
    /// scan reads the clock, then the partition under its lock, and a
    /// write the scan did not see gets a LUT past the scan's window however
    /// long the write waited for the lock.
    pub fn now_under_lock(&self, taken: crate::Now) -> crate::Now {
        let fresh = crate::Now::of(self.clock.as_ref());
        if fresh.unix_ms > taken.unix_ms {
            fresh
        } else {
            taken
        }
    }

    /// Whether `partition` still serves requests. It does not once a change
    /// to it was cut short by a panic while being published: its index,
    /// storage, secondary indexes and counts may disagree, so every request
    /// on it is refused with 1 (SERVER_ERROR) until the node restarts (the
    /// devices, or the replicas, hold the last whole state). The other
    /// partitions keep serving. One atomic load on the line of the
    /// partition's lock, which the request takes next anyway.
    #[inline]
    pub fn serving(&self, partition: PartitionId) -> Result<(), citrine_types::ResultCode> {
        if !self.index.partition(partition).is_failed() {
            return Ok(());
        }
        self.report_failed(partition);
        Err(citrine_types::ResultCode::ServerError)
    }

    /// Logs and counts the failed partitions not reported yet (the service
    /// calls it right after a request panicked; [`Namespace::serving`]
    /// reports the one it refuses). Returns how many are failed in all.
    pub fn report_failed_partitions(&self) -> usize {
        let failed: Vec<PartitionId> = PartitionId::all()
            .filter(|&id| self.index.partition(id).is_failed())
            .collect();
        for &partition in &failed {
            self.report_failed(partition);
        }
        failed.len()
    }

    #[cold]
    fn report_failed(&self, partition: PartitionId) {
        let mut reported = self.failed_reported.lock();
        if reported.insert(partition.index() as u16) {
            self.stats.partitions_failed.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                namespace = %self.config.name,
                partition = partition.index(),
                "a change to this partition was cut short by a panic: the partition \
                 stops serving (requests answer 1) until the node restarts"
            );
        }
    }

    /// Memory budget in bytes.
    pub fn data_size(&self) -> u64 {
        match self.config.storage_engine {
            StorageEngineConfig::Memory { data_size, .. } => data_size,
            StorageEngineConfig::Device { .. } => self
                .storage
                .device()
                .map_or(0, |device| device.total_bytes()),
        }
    }

    /// Bytes counted against the budget: for a memory namespace its index
    /// tables (as of the last nsup pass, plus a per-object estimate since)
    /// and record data; for a device namespace the live bytes of its write
    /// blocks (the index is not on the device).
    pub fn used_bytes(&self) -> u64 {
        match self.config.storage_engine {
            StorageEngineConfig::Memory { .. } => {
                let objects = self.stats.objects.exact().max(0) as u64;
                self.index_bytes(objects) + self.storage.used_bytes()
            }
            StorageEngineConfig::Device { .. } => self.storage.used_bytes(),
        }
    }

    /// What evicting a record with `data_bytes` of data frees of
    /// [`Namespace::used_bytes`]: its index slot too in memory.
    pub fn evictable_bytes(&self, data_bytes: u64) -> u64 {
        match self.config.storage_engine {
            StorageEngineConfig::Memory { .. } => data_bytes + citrine_index::SLOT_BYTES as u64 + 1,
            StorageEngineConfig::Device { .. } => data_bytes,
        }
    }

    /// Percentage of the budget free (`data_avail_pct`): a device
    /// namespace's free write blocks (the lowest over its devices), a
    /// memory namespace's unused budget.
    pub fn available_pct(&self) -> u64 {
        match self.storage.device() {
            Some(device) => u64::from(device.available_pct()),
            None => 100u64.saturating_sub(self.used_pct()),
        }
    }

    /// [`Namespace::used_bytes`] from the striped counts' cheap totals (a
    /// few loads of lines that writes rarely change), as every write reads
    /// it: off by less than 1 % of the budget and 1 024 index slots.
    fn used_bytes_approx(&self) -> u64 {
        let objects = self.stats.objects.approx().max(0) as u64;
        self.index_bytes(objects) + self.storage.used_bytes_approx()
    }

    /// Index table bytes for `objects` records: as of the last nsup pass,
    /// or the per-object estimate when that is more.
    fn index_bytes(&self, objects: u64) -> u64 {
        self.stats
            .index_used_bytes
            .load(Ordering::Relaxed)
            .max(objects * (citrine_index::SLOT_BYTES as u64 + 1))
    }

    /// Percentage of the budget in use.
    pub fn used_pct(&self) -> u64 {
        self.pct_of_budget(self.used_bytes())
    }

    /// `bytes` as a percentage of the budget.
    fn pct_of_budget(&self, bytes: u64) -> u64 {
        bytes.saturating_mul(100) / self.data_size().max(1)
    }

    /// True when writes must be refused (stop-writes). Every write asks, so
    /// an in-memory namespace compares the cheap figure
    /// ([`Namespace::used_bytes_approx`]): stop-writes engages within 1 %
    /// of the budget of its threshold.
    pub fn stop_writes(&self) -> bool {
        match self.config.storage_engine {
            StorageEngineConfig::Memory { .. } => {
                let used_pct = self.pct_of_budget(self.used_bytes_approx());
                let stop_used = u64::from(self.thresholds.stop_writes_used_pct());
                let stop_avail = u64::from(self.thresholds.stop_writes_avail_pct());
                (stop_used > 0 && used_pct >= stop_used)
                    || 100u64.saturating_sub(used_pct) < stop_avail
            }
            // Free write blocks below stop-writes-avail-pct (writes resume
            // by themselves once defragmentation frees blocks again), or
            // live bytes at stop-writes-used-pct.
            StorageEngineConfig::Device { .. } => self
                .storage
                .device()
                .is_some_and(|device| device.stop_writes()),
        }
    }

    /// The eviction threshold in bytes, if eviction is enabled.
    pub fn evict_threshold_bytes(&self) -> Option<u64> {
        match self.config.storage_engine {
            StorageEngineConfig::Memory { .. } => {
                let evict_used_pct = u64::from(self.thresholds.evict_used_pct());
                (evict_used_pct > 0).then(|| self.data_size() / 100 * evict_used_pct)
            }
            // Live bytes over evict-used-pct of the write blocks.
            StorageEngineConfig::Device { .. } => self
                .storage
                .device()
                .and_then(|device| device.evict_threshold_bytes()),
        }
    }

    /// True when a record last updated at `last_update_ms` in set `set_id`
    /// has been truncated.
    #[inline]
    pub fn is_truncated(&self, set_id: u16, last_update_ms: u64) -> bool {
        last_update_ms < self.truncated_before(set_id)
    }

    /// The last-update time a new version of a record of set `set_id`
    /// written at `now_ms` gets: now, but never before the set's
    /// truncation threshold. A truncation without a lut covers the
    /// millisecond it was taken in, so a write acknowledged after it in
    /// that same millisecond must land past the threshold, not under it.
    #[inline]
    pub fn version_lut_ms(&self, set_id: u16, now_ms: u64) -> u64 {
        now_ms.max(self.truncated_before(set_id))
    }

    /// The latest truncation threshold this namespace knows, its own or
    /// any set's (0 when none): no version here was last updated past it
    /// or past now.
    pub fn latest_truncation_ms(&self) -> u64 {
        let own = self.stats.truncate_lut_ms.load(Ordering::Relaxed);
        self.sets
            .all()
            .into_iter()
            .map(|(id, _)| self.sets.truncation(id).load(Ordering::Relaxed))
            .fold(own, u64::max)
    }

    /// The truncation threshold of the set's records (the later of the
    /// namespace's and the set's; 0 when neither was truncated): a copy
    /// last updated before it is truncated.
    #[inline]
    pub fn truncated_before(&self, set_id: u16) -> u64 {
        let namespace_lut = self.stats.truncate_lut_ms.load(Ordering::Relaxed);
        let set_lut = self.sets.truncation(set_id).load(Ordering::Relaxed);
        namespace_lut.max(set_lut)
    }

    /// Installs the upkeep every change of this namespace's records runs
    /// (once, before the node serves; a second hook is refused).
    pub fn set_hook(&self, hook: Arc<dyn RecordHook>) -> Result<(), String> {
        self.hook.set(hook).map_err(|_| {
            format!(
                "namespace {}: a record hook is set already",
                self.config.name
            )
        })
    }

    /// The hook's [`RecordHook::before_install`], when there is a hook.
    #[inline]
    pub fn before_install(
        &self,
        digest: &Digest,
        meta: RecordMeta,
        body: &[u8],
    ) -> Option<InstallUpkeep> {
        self.hook.get()?.before_install(self, digest, meta, body)
    }

    /// The hook's [`RecordHook::after_install`].
    #[inline]
    pub fn after_install(
        &self,
        upkeep: InstallUpkeep,
        digest: &Digest,
        previous: Option<&IndexEntry>,
    ) {
        if let Some(hook) = self.hook.get() {
            hook.after_install(self, upkeep, digest, previous);
        }
    }

    /// The hook's [`RecordHook::unindex`]: a record leaves the index.
    #[inline]
    pub fn unindex(&self, digest: &Digest, entry: &IndexEntry) {
        if let Some(hook) = self.hook.get() {
            hook.unindex(self, digest, entry);
        }
    }

    /// The hook's [`RecordHook::clear_partition`]: this node dropped its
    /// copy of `partition`.
    pub fn clear_partition(&self, partition: PartitionId) {
        if let Some(hook) = self.hook.get() {
            hook.clear_partition(self, partition);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(generation: u16, last_update_ms: u64) -> Version {
        Version {
            life: 0,
            generation,
            last_update_ms,
        }
    }

    #[test]
    fn sets_are_named_once_and_found_without_a_lock() {
        let sets = SetRegistry::default();
        assert_eq!(sets.id_of(b""), Some(0));
        assert_eq!(sets.existing_id(b"demo"), None);
        assert_eq!(sets.id_of(b"demo"), Some(1));
        assert_eq!(sets.id_of(b"other"), Some(2));
        assert_eq!(sets.id_of(b"demo"), Some(1));
        assert_eq!(sets.existing_id(b"other"), Some(2));
        assert_eq!(sets.name(2), Some(b"other".to_vec()));
        assert_eq!(sets.name(0), None);
        assert_eq!(sets.name(3), None);
        // Threads creating the same sets at once get one id per name.
        let sets = std::sync::Arc::new(SetRegistry::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let sets = sets.clone();
                std::thread::spawn(move || {
                    (0..600)
                        .map(|n| {
                            let name = format!("set-{}", (n * 7 + t * 13) % 600);
                            (name.clone(), sets.id_of(name.as_bytes()).expect("room"))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut by_name = std::collections::BTreeMap::new();
        for thread in threads {
            for (name, id) in thread.join().expect("a naming thread") {
                assert_eq!(*by_name.entry(name).or_insert(id), id);
            }
        }
        assert_eq!(by_name.len(), 600);
        let ids: std::collections::BTreeSet<u16> = by_name.values().copied().collect();
        assert_eq!(ids, (1..=600).collect());
        let all = sets.all();
        assert_eq!(all.len(), 600);
        for (id, name) in all {
            assert_eq!(by_name[&String::from_utf8(name).expect("utf-8")], id);
        }
        // Up to SETS_MAX sets, then no more; the existing ones still found.
        for n in 600..SETS_MAX {
            assert!(
                sets.id_of(format!("set-{n}").as_bytes()).is_some(),
                "set {n}"
            );
        }
        assert_eq!(sets.id_of(b"one too many"), None);
        assert_eq!(sets.existing_id(b"one too many"), None);
        assert_eq!(sets.id_of(b"set-0"), Some(by_name["set-0"]));
        assert_eq!(
            sets.existing_id(format!("set-{}", SETS_MAX - 1).as_bytes()),
            Some(SETS_MAX as u16)
        );
    }

    #[test]
    fn generation_policy_prefers_more_writes_then_the_later_update() {
        let policy = ConflictResolutionPolicy::Generation;
        // More writes win even when older.
        assert_eq!(
            compare_versions(policy, version(5, 1_000), version(3, 9_000)),
            Order::Greater
        );
        assert_eq!(
            compare_versions(policy, version(3, 9_000), version(5, 1_000)),
            Order::Less
        );
        // Tie on generation: the later last-update time.
        assert_eq!(
            compare_versions(policy, version(4, 2_000), version(4, 1_999)),
            Order::Greater
        );
        assert_eq!(
            compare_versions(policy, version(4, 1_999), version(4, 2_000)),
            Order::Less
        );
        // Full tie: the caller keeps its copy.
        assert_eq!(
            compare_versions(policy, version(4, 2_000), version(4, 2_000)),
            Order::Equal
        );
    }

    #[test]
    fn last_update_time_policy_prefers_the_later_update_then_more_writes() {
        let policy = ConflictResolutionPolicy::LastUpdateTime;
        assert_eq!(
            compare_versions(policy, version(5, 1_000), version(3, 9_000)),
            Order::Less
        );
        assert_eq!(
            compare_versions(policy, version(3, 9_000), version(5, 1_000)),
            Order::Greater
        );
        // Tie on last-update time: the higher generation.
        assert_eq!(
            compare_versions(policy, version(6, 5_000), version(2, 5_000)),
            Order::Greater
        );
        assert_eq!(
            compare_versions(policy, version(2, 5_000), version(6, 5_000)),
            Order::Less
        );
        assert_eq!(
            compare_versions(policy, version(2, 5_000), version(2, 5_000)),
            Order::Equal
        );
    }

    #[test]
    fn generations_compare_across_the_wrap() {
        for policy in ConflictResolutionPolicy::ALL {
            // 65535 then 1: the wrapped generation is the newer one.
            let before = version(u16::MAX, 7_000);
            let after = version(1, 7_000);
            assert_eq!(compare_versions(policy, after, before), Order::Greater);
            assert_eq!(compare_versions(policy, before, after), Order::Less);
        }
        let policy = ConflictResolutionPolicy::Generation;
        assert_eq!(
            compare_versions(policy, version(2, 0), version(65_000, 9)),
            Order::Greater
        );
        assert_eq!(
            compare_versions(policy, version(40_000, 0), version(2, 9)),
            Order::Less
        );
        // Exactly half the cycle apart: still antisymmetric.
        assert_eq!(
            compare_versions(policy, version(0x8001, 0), version(1, 0)),
            Order::Greater
        );
        assert_eq!(
            compare_versions(policy, version(1, 0), version(0x8001, 0)),
            Order::Less
        );
    }

    /// A later life wins over anything of an earlier one, under either
    /// policy (a copy that missed a non-durable delete never wins over the
    /// record written after it), across the lives' wrap too.
    #[test]
    fn a_later_life_wins_whatever_the_policy() {
        let lives = citrine_index::LIVES;
        for policy in ConflictResolutionPolicy::ALL {
            let stale = version(40, 9_000);
            let reborn = Version {
                life: 1,
                ..version(1, 8_000)
            };
            assert_eq!(compare_versions(policy, reborn, stale), Order::Greater);
            assert_eq!(compare_versions(policy, stale, reborn), Order::Less);
            let before_wrap = Version {
                life: lives - 1,
                ..version(9, 9_000)
            };
            let after_wrap = version(1, 1_000);
            assert_eq!(
                compare_versions(policy, after_wrap, before_wrap),
                Order::Greater
            );
            // Half the lives apart: still antisymmetric.
            let far = Version {
                life: lives / 2,
                ..version(1, 0)
            };
            assert_eq!(
                compare_versions(policy, far, version(1, 0)),
                compare_versions(policy, version(1, 0), far).reverse()
            );
        }
    }

    #[test]
    fn policy_names_round_trip() {
        for policy in ConflictResolutionPolicy::ALL {
            assert_eq!(
                ConflictResolutionPolicy::from_name(policy.name()),
                Some(policy)
            );
        }
        assert_eq!(
            ConflictResolutionPolicy::default(),
            ConflictResolutionPolicy::Generation
        );
        assert_eq!(ConflictResolutionPolicy::from_name("lut"), None);
    }
}
