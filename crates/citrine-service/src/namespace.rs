//! A namespace: its configuration, its 4096-partition primary index, its
//! storage engine, its sets and its statistics.
//!
//! Invariants:
//! - `objects` equals the number of index entries (updated under the
//!   partition lock that changes the index);
//! - `used_bytes()` = index table bytes + engine data bytes, the figure the
//!   memory budget (evict-used-pct, stop-writes-used-pct) is compared with.

use crate::config::{ConflictResolutionPolicy, NamespaceConfig, StorageEngineConfig};
use citrine_index::PartitionTable;
use citrine_storage::{MemoryEngine, StorageEngine};
use parking_lot::RwLock;
use std::cmp::Ordering as Order;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Largest number of sets in a namespace (set ids are u16, 0 = no set).
pub const SETS_MAX: usize = 1023;

/// Per-set statistics.
#[derive(Debug, Default)]
pub struct SetStats {
    pub objects: AtomicI64,
    pub data_used_bytes: AtomicI64,
    /// Records of this set last updated before this Unix-ms time are truncated.
    pub truncate_lut_ms: AtomicU64,
}

/// The sets of a namespace: name ↔ id, with statistics. Statistics live in
/// a fixed array indexed by set id so the hot path reaches them without a lock.
#[derive(Debug)]
pub struct SetRegistry {
    names: RwLock<SetNames>,
    stats: Box<[SetStats]>,
}

#[derive(Debug, Default)]
struct SetNames {
    by_name: HashMap<Vec<u8>, u16>,
    /// Index = set id − 1.
    names: Vec<Vec<u8>>,
}

impl Default for SetRegistry {
    fn default() -> Self {
        SetRegistry {
            names: RwLock::default(),
            stats: (0..=SETS_MAX).map(|_| SetStats::default()).collect(),
        }
    }
}

impl SetRegistry {
    /// The id of set `name`, creating it if needed. `None` when the namespace
    /// already has `SETS_MAX` sets.
    pub fn id_of(&self, name: &[u8]) -> Option<u16> {
        if name.is_empty() {
            return Some(0);
        }
        if let Some(id) = self.names.read().by_name.get(name) {
            return Some(*id);
        }
        let mut inner = self.names.write();
        if let Some(id) = inner.by_name.get(name) {
            return Some(*id);
        }
        if inner.names.len() >= SETS_MAX {
            return None;
        }
        inner.names.push(name.to_vec());
        let id = inner.names.len() as u16;
        inner.by_name.insert(name.to_vec(), id);
        debug_assert!(usize::from(id) <= SETS_MAX);
        Some(id)
    }

    /// The id of an existing set.
    pub fn existing_id(&self, name: &[u8]) -> Option<u16> {
        if name.is_empty() {
            return Some(0);
        }
        self.names.read().by_name.get(name).copied()
    }

    /// Statistics of set `id` (0 = records without a set).
    #[inline]
    pub fn stats(&self, id: u16) -> &SetStats {
        // Ids are handed out by `id_of`, never above SETS_MAX.
        &self.stats[usize::from(id).min(SETS_MAX)]
    }

    /// Name of set `id`.
    pub fn name(&self, id: u16) -> Option<Vec<u8>> {
        if id == 0 {
            return None;
        }
        self.names.read().names.get(usize::from(id) - 1).cloned()
    }

    /// All sets: (id, name).
    pub fn all(&self) -> Vec<(u16, Vec<u8>)> {
        self.names
            .read()
            .names
            .iter()
            .enumerate()
            .map(|(index, name)| (index as u16 + 1, name.clone()))
            .collect()
    }
}

/// What conflict resolution compares of one copy of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    /// 1..=65535, wrapping to 1.
    pub generation: u16,
    pub last_update_ms: u64,
}

/// Orders two copies of one record under `policy`: `Greater` when `ours`
/// wins over `theirs`, `Less` when `theirs` does, `Equal` when the policy
/// cannot tell them apart (the caller keeps the copy it holds).
///
/// Generations are compared as serial numbers: they wrap from 65535 to 1,
/// so a generation up to 32767 writes ahead of another is the newer one
/// (65535 < 1 < 2). At exactly 32768 apart the numerically larger wins, so
/// the order stays antisymmetric.
pub fn compare_versions(policy: ConflictResolutionPolicy, ours: Version, theirs: Version) -> Order {
    let generation = compare_generations(ours.generation, theirs.generation);
    let last_update = ours.last_update_ms.cmp(&theirs.last_update_ms);
    match policy {
        ConflictResolutionPolicy::Generation => generation.then(last_update),
        ConflictResolutionPolicy::LastUpdateTime => last_update.then(generation),
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

/// Namespace statistics.
#[derive(Debug, Default)]
pub struct NamespaceStats {
    pub objects: AtomicI64,
    pub expired_objects: AtomicU64,
    pub evicted_objects: AtomicU64,
    pub truncated_objects: AtomicU64,
    pub client_read_success: AtomicU64,
    pub client_read_not_found: AtomicU64,
    pub client_read_error: AtomicU64,
    pub client_write_success: AtomicU64,
    pub client_write_error: AtomicU64,
    pub client_delete_success: AtomicU64,
    pub client_delete_not_found: AtomicU64,
    /// Commands a filter expression turned away (FILTERED_OUT, 27).
    pub client_read_filtered_out: AtomicU64,
    pub client_write_filtered_out: AtomicU64,
    pub client_delete_filtered_out: AtomicU64,
    /// Read-touches (a read with a TTL percentage) that reset the TTL,
    /// that found it need not, and that failed after the read answered.
    pub read_touch_success: AtomicU64,
    pub read_touch_skip: AtomicU64,
    pub read_touch_error: AtomicU64,
    pub client_udf_complete: AtomicU64,
    pub client_udf_error: AtomicU64,
    pub fail_generation: AtomicU64,
    pub fail_key_busy: AtomicU64,
    pub fail_record_too_big: AtomicU64,
    pub stop_writes_count: AtomicU64,
    /// Highest void time seen that eviction removed (citrusleaf seconds).
    pub evict_void_time: AtomicU64,
    /// Index table bytes as of the last nsup pass (refreshed by nsup).
    pub index_used_bytes: AtomicU64,
    /// Namespace-wide truncation: records last updated before this Unix-ms time are gone.
    pub truncate_lut_ms: AtomicU64,
}

/// A namespace.
pub struct Namespace {
    pub config: NamespaceConfig,
    pub index: PartitionTable,
    pub storage: Box<dyn StorageEngine>,
    pub sets: SetRegistry,
    pub stats: NamespaceStats,
    /// The namespace's secondary indexes (see [`crate::sindex`]).
    pub sindexes: citrine_sindex::Registry,
}

impl Namespace {
    /// A namespace; a device namespace that cannot be opened panics (the
    /// server uses [`Namespace::open`]).
    pub fn new(config: NamespaceConfig) -> Namespace {
        let now =
            crate::transaction::Now::from_unix_ms(crate::Clock::now_unix_ms(&crate::SystemClock));
        Namespace::open(config, now).unwrap_or_else(|error| panic!("{error}"))
    }

    /// Opens a namespace. A device namespace opens its devices and rebuilds
    /// its index (fast restart from a clean shutdown's image, otherwise a
    /// cold start scanning the devices).
    pub fn open(
        config: NamespaceConfig,
        now: crate::transaction::Now,
    ) -> Result<Namespace, String> {
        let storage: Box<dyn StorageEngine> = match &config.storage_engine {
            StorageEngineConfig::Memory { .. } => Box::new(MemoryEngine::new()),
            StorageEngineConfig::Device { engine, .. } => Box::new(
                citrine_storage::DeviceEngine::open(engine.clone())
                    .map_err(|error| format!("namespace {}: {error}", config.name))?,
            ),
        };
        let namespace = Namespace {
            config,
            index: PartitionTable::new(),
            storage,
            sets: SetRegistry::default(),
            stats: NamespaceStats::default(),
            sindexes: citrine_sindex::Registry::default(),
        };
        crate::device::recover(&namespace, now)?;
        Ok(namespace)
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

    /// Bytes counted against the budget: index tables (as of the last
    /// nsup pass, plus a per-object estimate since) and record data.
    pub fn used_bytes(&self) -> u64 {
        let objects = self.stats.objects.load(Ordering::Relaxed).max(0) as u64;
        let index_bytes = self
            .stats
            .index_used_bytes
            .load(Ordering::Relaxed)
            .max(objects * (citrine_index::SLOT_BYTES as u64 + 1));
        index_bytes + self.storage.used_bytes()
    }

    /// Percentage of the budget in use.
    pub fn used_pct(&self) -> u64 {
        let budget = self.data_size().max(1);
        self.used_bytes().saturating_mul(100) / budget
    }

    /// True when writes must be refused (stop-writes).
    pub fn stop_writes(&self) -> bool {
        match self.config.storage_engine {
            StorageEngineConfig::Memory {
                stop_writes_used_pct,
                ..
            } => stop_writes_used_pct > 0 && self.used_pct() >= u64::from(stop_writes_used_pct),
            // Free write blocks below min-avail-pct; writes resume by
            // themselves once defragmentation frees blocks again.
            StorageEngineConfig::Device { .. } => self
                .storage
                .device()
                .is_some_and(|device| device.stop_writes()),
        }
    }

    /// The eviction threshold in bytes, if eviction is enabled.
    pub fn evict_threshold_bytes(&self) -> Option<u64> {
        match self.config.storage_engine {
            StorageEngineConfig::Memory { evict_used_pct, .. } => {
                (evict_used_pct > 0).then(|| self.data_size() / 100 * u64::from(evict_used_pct))
            }
            // Device namespaces do not evict (the device bounds them, see
            // min-avail-pct).
            StorageEngineConfig::Device { .. } => None,
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
            .map(|(id, _)| self.sets.stats(id).truncate_lut_ms.load(Ordering::Relaxed))
            .fold(own, u64::max)
    }

    /// The truncation threshold of the set's records (the later of the
    /// namespace's and the set's; 0 when neither was truncated): a copy
    /// last updated before it is truncated.
    #[inline]
    pub fn truncated_before(&self, set_id: u16) -> u64 {
        let namespace_lut = self.stats.truncate_lut_ms.load(Ordering::Relaxed);
        let set_lut = self
            .sets
            .stats(set_id)
            .truncate_lut_ms
            .load(Ordering::Relaxed);
        namespace_lut.max(set_lut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(generation: u16, last_update_ms: u64) -> Version {
        Version {
            generation,
            last_update_ms,
        }
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
