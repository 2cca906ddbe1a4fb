//! The transaction side tables of one namespace: per partition, the
//! provisional versions transactions wrote and the monitor records that
//! are open, keyed by digest, beside (not inside) the primary index.
//!
//! Invariants:
//! - a partition's table is changed only while its index partition's
//!   write lock is held, and read only while its read or write lock is
//!   held (lock order: a monitor stripe, then the index partition lock,
//!   then this table's mutex, never another way; the table's mutex is
//!   never held across storage I/O or another lock);
//! - a monitor's writes, its close and its recovery each run whole under
//!   the monitor's stripe ([`TxnTables::monitor_guard`]), so a mark to
//!   roll forward and the node's decision to roll back never interleave;
//! - at most one provisional version per digest, owned by one
//!   transaction: it is the record's lock, and only its owner sees it;
//!   the index keeps the last committed version untouched until the roll
//!   forward installs the provisional one;
//! - `provisionals` and `monitors_active` equal the sums of the tables'
//!   sizes (updated with the tables, under the same locks);
//! - a transaction whose lock on a record was rolled (forward or back)
//!   is remembered as *settled* on that record until its deadline plus
//!   [`SETTLED_MARGIN_SECONDS`] ([`TxnTables::settle`]); a settled
//!   transaction's lock is never taken again from another node's copy
//!   (a migration batch or a duplicate-resolution answer built before the
//!   roll, [`super::replica::fill`]). Settled entries survive the copy's
//!   drop (they describe transactions, not records) and go only when
//!   [`TxnTables::prune_settled`] finds them past their time;
//! - each partition's `held` count is never below the number of entries
//!   in its table at any instant (raised before an entry goes in, lowered
//!   after one went out, under the table's mutex): a zero read without
//!   any lock means the table is empty then, so the replicated write path
//!   skips the table for a partition no transaction touches
//!   ([`TxnTables::partition_is_empty`]).
//!
//! Provisional versions live in memory only: a restart loses this node's
//! (in a cluster the replicas of a strong-consistency partition hold
//! copies, [`super::replica`]), which rolls their transactions back.

use citrine_index::RecordMeta;
use citrine_types::{Digest, PartitionId, PARTITIONS};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Stripes of the monitor locks.
const MONITOR_STRIPES: usize = 256;

/// How long past its transaction's deadline a settled entry is kept
/// (seconds): a lock that comes back after that is past its deadline, so
/// the recovery rolls it back within a pass; the margin covers the
/// nodes' clocks disagreeing.
pub const SETTLED_MARGIN_SECONDS: u32 = 60;

/// Most settled transactions remembered per record (the oldest goes).
const SETTLED_PER_RECORD: usize = 4;

/// A transaction whose lock on a record was rolled: its id, and until
/// when (Citrusleaf-epoch seconds) this is remembered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settled {
    pub txn_id: u64,
    pub until: u32,
}

/// What a transaction's write left of a record, until it rolls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Version {
    /// A new version: its metadata and encoded body.
    Store { meta: RecordMeta, body: Vec<u8> },
    /// The record's removal.
    Delete,
}

/// A record locked by a transaction, and the version it will commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provisional {
    pub txn_id: u64,
    /// The transaction's deadline (Citrusleaf-epoch seconds).
    pub deadline: u32,
    pub version: Version,
}

/// An open monitor record: its transaction's deadline, and whether the
/// transaction was marked to roll forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Monitor {
    pub deadline: u32,
    pub roll_forward: bool,
}

/// One partition's table.
#[derive(Default, Debug)]
pub struct PartitionTxns {
    pub provisionals: HashMap<Digest, Provisional>,
    pub monitors: HashMap<Digest, Monitor>,
    /// Per record, the transactions whose lock on it was rolled.
    pub settled: HashMap<Digest, Vec<Settled>>,
}

/// Counters named as the reference's namespace statistics.
#[derive(Default, Debug)]
pub struct TxnStats {
    pub provisionals: AtomicU64,
    pub monitors_active: AtomicU64,
    pub verify_read_success: AtomicU64,
    pub verify_read_error: AtomicU64,
    pub verify_read_timeout: AtomicU64,
    pub roll_forward_success: AtomicU64,
    pub roll_forward_error: AtomicU64,
    pub roll_back_success: AtomicU64,
    pub roll_back_error: AtomicU64,
    pub monitor_roll_forward_success: AtomicU64,
    pub monitor_roll_back_success: AtomicU64,
    /// Monitor-driven rolls that failed (left for the next pass).
    pub monitor_roll_error: AtomicU64,
    /// Durable tombstones the rolls of deletes created.
    pub roll_tombstone_creates: AtomicU64,
    /// What no step counts yet (the `_timeout` statistics).
    pub never: AtomicU64,
    pub fail_mrt_blocked: AtomicU64,
    pub fail_mrt_version_mismatch: AtomicU64,
}

/// A namespace's transaction tables, statistics and dynamic settings.
#[derive(Debug)]
pub struct TxnTables {
    partitions: Box<[Mutex<PartitionTxns>]>,
    /// Per partition, at least its table's entries (see the module doc).
    held: Box<[AtomicU32]>,
    pub stats: TxnStats,
    /// `mrt-duration`: a monitor's deadline when its client asks none.
    pub duration_seconds: AtomicU32,
    /// `disable-mrt-writes`.
    pub writes_disabled: AtomicBool,
    /// Serializes each monitor's writes and recovery (by digest).
    monitor_stripes: Box<[Mutex<()>]>,
    /// Tests only: transactions run here whatever the namespace.
    #[cfg(any(test, feature = "test-hooks"))]
    enabled_for_tests: AtomicBool,
}

impl TxnTables {
    /// Empty tables with the configured `mrt-duration` and
    /// `disable-mrt-writes`.
    pub fn new(duration_seconds: u32, writes_disabled: bool) -> TxnTables {
        TxnTables {
            partitions: (0..PARTITIONS).map(|_| Mutex::default()).collect(),
            held: (0..PARTITIONS).map(|_| AtomicU32::new(0)).collect(),
            stats: TxnStats::default(),
            duration_seconds: AtomicU32::new(duration_seconds),
            writes_disabled: AtomicBool::new(writes_disabled),
            monitor_stripes: (0..MONITOR_STRIPES).map(|_| Mutex::default()).collect(),
            #[cfg(any(test, feature = "test-hooks"))]
            enabled_for_tests: AtomicBool::new(false),
        }
    }

    /// Tests only: runs transactions on this namespace even though it is
    /// not strong-consistency (the service refuses those with 11 until
    /// strong consistency is wired).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn enable_for_tests(&self) {
        self.enabled_for_tests.store(true, Ordering::Relaxed);
    }

    /// Whether [`TxnTables::enable_for_tests`] was called.
    #[inline]
    pub fn enabled_for_tests(&self) -> bool {
        #[cfg(any(test, feature = "test-hooks"))]
        return self.enabled_for_tests.load(Ordering::Relaxed);
        #[cfg(not(any(test, feature = "test-hooks")))]
        false
    }

    /// The stripe serializing the monitor on `digest`: held across a
    /// monitor write (its checks, the record's write, the table's entry)
    /// and across a recovery of it. Taken before any index lock.
    pub fn monitor_guard(&self, digest: &Digest) -> MutexGuard<'_, ()> {
        let stripe = usize::from(u16::from_le_bytes([digest.0[2], digest.0[3]]));
        let slot = &self.monitor_stripes[stripe % self.monitor_stripes.len()];
        slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The table of `partition`; the caller holds its index lock.
    pub fn partition(&self, partition: PartitionId) -> MutexGuard<'_, PartitionTxns> {
        let slot = &self.partitions[partition.index() % self.partitions.len()];
        slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The provisional version on `digest`, if one is held.
    pub fn provisional(&self, digest: &Digest) -> Option<Provisional> {
        self.partition(digest.partition())
            .provisionals
            .get(digest)
            .cloned()
    }

    /// Keeps `provisional` as `digest`'s (replacing its own earlier one).
    pub fn keep(&self, digest: Digest, provisional: Provisional) {
        let mut table = self.partition(digest.partition());
        let held = self.held(digest.partition());
        held.fetch_add(1, Ordering::AcqRel);
        let added = table.provisionals.insert(digest, provisional).is_none();
        if added {
            self.stats.provisionals.fetch_add(1, Ordering::Relaxed);
        } else {
            held.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Takes `digest`'s provisional version if transaction `txn_id` holds it.
    pub fn take(&self, digest: &Digest, txn_id: u64) -> Option<Provisional> {
        let mut table = self.partition(digest.partition());
        if table.provisionals.get(digest)?.txn_id != txn_id {
            return None;
        }
        let taken = table.provisionals.remove(digest);
        self.stats.provisionals.fetch_sub(1, Ordering::Relaxed);
        self.held(digest.partition()).fetch_sub(1, Ordering::AcqRel);
        taken
    }

    /// The open monitor on `digest`.
    pub fn monitor(&self, digest: &Digest) -> Option<Monitor> {
        self.partition(digest.partition())
            .monitors
            .get(digest)
            .copied()
    }

    /// Records `digest`'s monitor as `monitor`.
    pub fn set_monitor(&self, digest: Digest, monitor: Monitor) {
        let mut table = self.partition(digest.partition());
        let held = self.held(digest.partition());
        held.fetch_add(1, Ordering::AcqRel);
        let added = table.monitors.insert(digest, monitor).is_none();
        if added {
            self.stats.monitors_active.fetch_add(1, Ordering::Relaxed);
        } else {
            held.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Forgets `digest`'s monitor (closed or recovered).
    pub fn close_monitor(&self, digest: &Digest) -> Option<Monitor> {
        let mut table = self.partition(digest.partition());
        let removed = table.monitors.remove(digest);
        if removed.is_some() {
            self.stats.monitors_active.fetch_sub(1, Ordering::Relaxed);
            self.held(digest.partition()).fetch_sub(1, Ordering::AcqRel);
        }
        removed
    }

    /// Remembers that transaction `txn_id`'s lock on `digest` was rolled,
    /// until `until` (a later time for the same transaction wins); the
    /// caller holds the record's index partition write lock.
    pub fn settle(&self, digest: Digest, txn_id: u64, until: u32) {
        let mut table = self.partition(digest.partition());
        let held = self.held(digest.partition());
        held.fetch_add(1, Ordering::AcqRel);
        let added = !table.settled.contains_key(&digest);
        let entries = table.settled.entry(digest).or_default();
        match entries.iter_mut().find(|entry| entry.txn_id == txn_id) {
            Some(entry) => entry.until = entry.until.max(until),
            None => {
                if entries.len() == SETTLED_PER_RECORD {
                    entries.remove(0);
                }
                entries.push(Settled { txn_id, until });
            }
        }
        if !added {
            held.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether transaction `txn_id`'s lock on `digest` was rolled.
    pub fn is_settled(&self, digest: &Digest, txn_id: u64) -> bool {
        let table = self.partition(digest.partition());
        table
            .settled
            .get(digest)
            .is_some_and(|entries| entries.iter().any(|entry| entry.txn_id == txn_id))
    }

    /// Forgets the settled entries whose time is before `now_seconds`;
    /// returns how many records lost their last one.
    pub fn prune_settled(&self, now_seconds: u32) -> usize {
        let mut emptied = 0;
        for (index, slot) in self.partitions.iter().enumerate() {
            let mut table = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if table.settled.is_empty() {
                continue;
            }
            let before = table.settled.len();
            table.settled.retain(|_, entries| {
                entries.retain(|entry| entry.until >= now_seconds);
                !entries.is_empty()
            });
            let gone = before - table.settled.len();
            self.held[index].fetch_sub(gone as u32, Ordering::AcqRel);
            emptied += gone;
        }
        emptied
    }

    /// Forgets every provisional version and monitor of `partition` (its
    /// copy was dropped or emptied: the state goes with the records; the
    /// settled entries stay). Returns how many entries went.
    pub fn clear_partition(&self, partition: PartitionId) -> usize {
        let mut table = self.partition(partition);
        let provisionals = std::mem::take(&mut table.provisionals).len();
        let monitors = std::mem::take(&mut table.monitors).len();
        let stats = &self.stats;
        stats
            .provisionals
            .fetch_sub(provisionals as u64, Ordering::Relaxed);
        stats
            .monitors_active
            .fetch_sub(monitors as u64, Ordering::Relaxed);
        let held = (provisionals + monitors) as u32;
        self.held(partition).fetch_sub(held, Ordering::AcqRel);
        drop(table);
        provisionals + monitors
    }

    /// Whether `partition` holds no provisional version and no monitor
    /// now: one atomic load, no lock (see the module doc).
    #[inline]
    pub fn partition_is_empty(&self, partition: PartitionId) -> bool {
        self.held(partition).load(Ordering::Acquire) == 0
    }

    fn held(&self, partition: PartitionId) -> &AtomicU32 {
        &self.held[partition.index() % self.held.len()]
    }

    /// Every digest of `partition` with a provisional version or an open
    /// monitor.
    pub fn held_digests(&self, partition: PartitionId) -> Vec<Digest> {
        let table = self.partition(partition);
        let provisionals = table.provisionals.keys();
        provisionals.chain(table.monitors.keys()).copied().collect()
    }

    /// Whether no provisional version and no monitor is held.
    pub fn is_empty(&self) -> bool {
        self.stats.provisionals.load(Ordering::Relaxed) == 0
            && self.stats.monitors_active.load(Ordering::Relaxed) == 0
    }

    /// The monitors whose deadline is before `now_seconds`, and the
    /// provisional versions (digest, transaction) whose deadline is.
    pub fn expired(&self, now_seconds: u32) -> (Vec<Digest>, Vec<(Digest, u64)>) {
        let mut monitors = Vec::new();
        let mut provisionals = Vec::new();
        for slot in self.partitions.iter() {
            let table = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            monitors.extend(
                table
                    .monitors
                    .iter()
                    .filter(|(_, monitor)| monitor.deadline < now_seconds)
                    .map(|(digest, _)| *digest),
            );
            provisionals.extend(
                table
                    .provisionals
                    .iter()
                    .filter(|(_, held)| held.deadline < now_seconds)
                    .map(|(digest, held)| (*digest, held.txn_id)),
            );
        }
        (monitors, provisionals)
    }
}
