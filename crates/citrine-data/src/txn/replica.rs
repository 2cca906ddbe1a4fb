//! A record's transaction state as the master sends it to the replicas
//! of a strong-consistency partition, beside the record's committed copy
//! (issue 40, the cluster part): the provisional version a transaction
//! holds on it, for a monitor record the monitor's entry, and the
//! transactions whose lock on it was rolled not long ago (settled).
//!
//! Owns [`TxnCopy`] (captured by [`TxnCopy::capture`] right after the
//! master's write, encoded with [`TxnCopy::encode`] / [`TxnCopy::decode`])
//! and [`apply`], the replica's side: the replica's table entries for the
//! record become exactly the master's; [`fill`], a migrated (or
//! duplicate-resolved) record's side: only the entries the target lacks
//! are taken; [`fetch_with_state`], a record's copy and state read at
//! once for a duplicate-resolution answer.
//!
//! Invariants:
//! - a replica applies a copy's transaction state only when the committed
//!   copy it came with is not older than the one the replica holds (equal
//!   or newer, after the copy itself was stored): a late, repeated
//!   delivery of a provisional write does not bring back a lock that the
//!   roll forward (which always installs a newer committed version)
//!   already took away;
//! - settled entries are only ever added (merged) from a copy, never
//!   cleared by one; a lock of a transaction settled here is never taken
//!   from a copy, and a copy saying a transaction is settled takes away
//!   its lock here (whoever rolled it was that time's master);
//! - the state is applied under the record partition's write lock, as
//!   every change of the side table is ([`super::table`]);
//! - a provisional version's set travels by name (set ids are per node);
//!   a copy that does not decode, or holds a version no master keeps
//!   (generation 0, a life out of range, a set name a client could not
//!   give), is refused whole by the caller.

use super::table::Settled;
use super::{Monitor, Provisional, Version};
use crate::clock::Now;
use crate::copy::{Reader, ReplicaWrite};
use crate::namespace::{compare_versions, Namespace};
use crate::record::is_live;
use citrine_index::{RecordMeta, MAX_LAST_UPDATE_MS};
use citrine_types::{Digest, ResultCode, SET_NAME_MAX};
use std::cmp::Ordering;

const HAS_PROVISIONAL: u8 = 1;
const HAS_MONITOR: u8 = 2;
const HAS_SETTLED: u8 = 4;
const VERSION_STORE: u8 = 1;
const VERSION_DELETE: u8 = 2;

/// The transaction state of one record on the master.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnCopy {
    pub provisional: Option<Provisional>,
    pub monitor: Option<Monitor>,
    /// The transactions whose lock on the record was rolled.
    pub settled: Vec<Settled>,
}

impl TxnCopy {
    /// No provisional version, no monitor, no settled transaction.
    pub fn is_empty(&self) -> bool {
        self.provisional.is_none() && self.monitor.is_none() && self.settled.is_empty()
    }

    /// `digest`'s state in `namespace`'s tables now.
    /// Without a lock when the partition holds no state (the common
    /// case: every SC replicated write captures).
    pub fn capture(namespace: &Namespace, digest: &Digest) -> TxnCopy {
        if namespace.txn.partition_is_empty(digest.partition()) {
            return TxnCopy::default();
        }
        let table = namespace.txn.partition(digest.partition());
        TxnCopy {
            provisional: table.provisionals.get(digest).cloned(),
            monitor: table.monitors.get(digest).copied(),
            settled: table.settled.get(digest).cloned().unwrap_or_default(),
        }
    }

    /// `u8 flags | (provisional) u64 txn id | u32 deadline | u8 kind |
    /// (store) u16 gen | u16 life | u32 void | u64 lut | u8 set len | set |
    /// u32 body len | body | (monitor) u32 deadline | u8 forward |
    /// (settled) u8 count | count × (u64 txn id | u32 until)`, big-endian.
    pub fn encode(&self, namespace: &Namespace) -> Vec<u8> {
        let mut out = Vec::new();
        let flags = u8::from(self.provisional.is_some()) * HAS_PROVISIONAL
            + u8::from(self.monitor.is_some()) * HAS_MONITOR
            + u8::from(!self.settled.is_empty()) * HAS_SETTLED;
        out.push(flags);
        if let Some(held) = &self.provisional {
            out.extend_from_slice(&held.txn_id.to_be_bytes());
            out.extend_from_slice(&held.deadline.to_be_bytes());
            encode_version(namespace, &held.version, &mut out);
        }
        if let Some(monitor) = &self.monitor {
            out.extend_from_slice(&monitor.deadline.to_be_bytes());
            out.push(u8::from(monitor.roll_forward));
        }
        if !self.settled.is_empty() {
            let settled = &self.settled[..self.settled.len().min(255)];
            out.push(settled.len() as u8);
            for entry in settled {
                out.extend_from_slice(&entry.txn_id.to_be_bytes());
                out.extend_from_slice(&entry.until.to_be_bytes());
            }
        }
        out
    }

    /// Decodes a copy for `namespace` (a provisional version's set is
    /// looked up, or added, by name); `None` when malformed or trailed.
    pub fn decode(namespace: &Namespace, bytes: &[u8]) -> Option<TxnCopy> {
        let mut reader = Reader { bytes, at: 0 };
        let flags = reader.u8()?;
        if flags & !(HAS_PROVISIONAL | HAS_MONITOR | HAS_SETTLED) != 0 {
            return None;
        }
        let mut copy = TxnCopy::default();
        if flags & HAS_PROVISIONAL != 0 {
            let txn_id = u64::from_be_bytes(reader.take(8)?.try_into().ok()?);
            let deadline = u32::from_be_bytes(reader.take(4)?.try_into().ok()?);
            let version = decode_version(namespace, &mut reader)?;
            copy.provisional = Some(Provisional {
                txn_id,
                deadline,
                version,
            });
        }
        if flags & HAS_MONITOR != 0 {
            let deadline = u32::from_be_bytes(reader.take(4)?.try_into().ok()?);
            let roll_forward = match reader.u8()? {
                0 => false,
                1 => true,
                _ => return None,
            };
            copy.monitor = Some(Monitor {
                deadline,
                roll_forward,
            });
        }
        if flags & HAS_SETTLED != 0 {
            for _ in 0..reader.u8()? {
                let txn_id = u64::from_be_bytes(reader.take(8)?.try_into().ok()?);
                let until = u32::from_be_bytes(reader.take(4)?.try_into().ok()?);
                copy.settled.push(Settled { txn_id, until });
            }
        }
        (reader.at == bytes.len()).then_some(copy)
    }
}

fn encode_version(namespace: &Namespace, version: &Version, out: &mut Vec<u8>) {
    let Version::Store { meta, body } = version else {
        out.push(VERSION_DELETE);
        return;
    };
    out.push(VERSION_STORE);
    out.extend_from_slice(&meta.generation.to_be_bytes());
    out.extend_from_slice(&meta.life.to_be_bytes());
    out.extend_from_slice(&meta.void_time.to_be_bytes());
    out.extend_from_slice(&meta.last_update_ms.to_be_bytes());
    let set = namespace.sets.name(meta.set_id).unwrap_or_default();
    let set = &set[..set.len().min(255)];
    out.push(set.len() as u8);
    out.extend_from_slice(set);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
}

fn decode_version(namespace: &Namespace, reader: &mut Reader<'_>) -> Option<Version> {
    match reader.u8()? {
        VERSION_DELETE => return Some(Version::Delete),
        VERSION_STORE => {}
        _ => return None,
    }
    let generation = u16::from_be_bytes(reader.take(2)?.try_into().ok()?);
    let life = u16::from_be_bytes(reader.take(2)?.try_into().ok()?);
    let void_time = u32::from_be_bytes(reader.take(4)?.try_into().ok()?);
    let last_update_ms = u64::from_be_bytes(reader.take(8)?.try_into().ok()?);
    let set_len = usize::from(reader.u8()?);
    let set_name = reader.take(set_len)?;
    // What no master keeps: refused before a set is made for it.
    let well_formed = generation != 0
        && life < citrine_index::LIVES
        && last_update_ms <= MAX_LAST_UPDATE_MS
        && set_name.len() <= SET_NAME_MAX
        && !set_name.contains(&0);
    if !well_formed {
        return None;
    }
    let set_id = namespace.sets.id_of(set_name)?;
    let body_len = u32::from_be_bytes(reader.take(4)?.try_into().ok()?) as usize;
    let body = reader.take(body_len)?.to_vec();
    let meta = RecordMeta {
        generation,
        life,
        set_id,
        void_time,
        last_update_ms,
        // A transaction's write comes from a client of this cluster.
        xdr_write: false,
    };
    Some(Version::Store { meta, body })
}

/// `digest`'s copy as [`crate::copy::fetch`] reads it and its transaction
/// state, read under one hold of the record's index partition lock (so
/// the state is the one of that copy).
pub fn fetch_with_state(
    namespace: &Namespace,
    digest: &Digest,
    now: Now,
) -> (Option<ReplicaWrite>, TxnCopy) {
    let partition = namespace.index.partition(digest.partition()).read();
    let record = crate::copy::fetch_in(namespace, &partition, digest, now);
    (record, TxnCopy::capture(namespace, digest))
}

/// Makes `copy` the replica's transaction state of the record `write` is
/// a copy of (stored, or found not newer, just before), unless the
/// replica holds a newer committed version (see the module doc). A write
/// without a generation (the master holds nothing committed: a
/// transaction creating the record) applies while the replica holds no
/// live copy either.
///
/// A copy without state ("clear") for a partition holding none here is a
/// no-op, done without taking the index lock: the write path's common
/// case (its record copy was stored just before, under that lock, which
/// orders this check after every earlier state change of the record).
pub fn apply(
    namespace: &Namespace,
    write: &ReplicaWrite,
    copy: TxnCopy,
    now: Now,
) -> Result<(), ResultCode> {
    let digest = write.digest;
    if copy.is_empty() && namespace.txn.partition_is_empty(digest.partition()) {
        return Ok(());
    }
    let partition = namespace.index.partition(digest.partition()).write();
    if is_stale(namespace, &partition, write, now) {
        return Ok(());
    }
    let tables = &namespace.txn;
    for entry in &copy.settled {
        tables.settle(digest, entry.txn_id, entry.until);
    }
    let current = tables.provisional(&digest);
    match (current, copy.provisional) {
        (_, Some(provisional)) => tables.keep(digest, provisional),
        (Some(old), None) => {
            tables.take(&digest, old.txn_id);
        }
        (None, None) => {}
    }
    match copy.monitor {
        Some(monitor) => tables.set_monitor(digest, monitor),
        None => {
            tables.close_monitor(&digest);
        }
    }
    drop(partition);
    Ok(())
}

/// A migrated (or duplicate-resolved) record's transaction state (the
/// source's, as it built the batch or answered): fills in only what the
/// target lacks — a provisional version where it holds none, a monitor
/// entry where it holds none — and never clears, except a lock of a
/// transaction the copy says is settled. The target's own entries came
/// from the current master's replica writes (or its own writes as
/// master) and are not older than the source's snapshot. A state the
/// master ended after the snapshot does not come back: a roll forward
/// installs a newer committed version (the copy is then stale), and a
/// roll of either kind left its transaction settled here (by the roll,
/// or by the master's replica write of it), so its lock is not taken.
/// Same staleness rule as [`apply`].
pub fn fill(namespace: &Namespace, write: &ReplicaWrite, copy: TxnCopy, now: Now) {
    let digest = write.digest;
    let partition = namespace.index.partition(digest.partition()).write();
    let tables = &namespace.txn;
    for entry in &copy.settled {
        tables.settle(digest, entry.txn_id, entry.until);
        tables.take(&digest, entry.txn_id);
    }
    if is_stale(namespace, &partition, write, now) {
        return;
    }
    if let Some(provisional) = copy.provisional {
        let settled = tables.is_settled(&digest, provisional.txn_id);
        if !settled && tables.provisional(&digest).is_none() {
            tables.keep(digest, provisional);
        }
    }
    if let Some(monitor) = copy.monitor {
        if tables.monitor(&digest).is_none() {
            tables.set_monitor(digest, monitor);
        }
    }
    drop(partition);
}

/// Whether the replica (its index `partition`, write-locked) holds a
/// live committed version newer than `write`'s, or any live one where
/// `write` carries no generation.
fn is_stale(
    namespace: &Namespace,
    partition: &citrine_index::PartitionIndex,
    write: &ReplicaWrite,
    now: Now,
) -> bool {
    let held = partition
        .get(&write.digest)
        .map(|entry| entry.meta())
        .filter(|meta| is_live(namespace, meta, now));
    match held {
        None => false,
        Some(_) if write.body.is_none() && write.generation == 0 => true,
        Some(meta) => {
            let policy = namespace.config.conflict_resolution_policy;
            let ours = crate::namespace::Version::of(&meta);
            compare_versions(policy, ours, write.version()) == Ordering::Greater
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::clock::ManualClock;
    use crate::config::NamespaceConfig;
    use crate::copy::{capture, store_copy, Admit};
    use std::sync::atomic::Ordering::Relaxed;

    const NOW_MS: u64 = 1_700_000_000_000;
    const D: Digest = Digest([5; 20]);

    fn namespace() -> Namespace {
        let mut config = NamespaceConfig::in_memory("test");
        config.sc.strong_consistency = true;
        Namespace::open(config, std::sync::Arc::new(ManualClock::new(NOW_MS))).unwrap()
    }

    fn now() -> Now {
        Now::from_unix_ms(NOW_MS)
    }

    /// A committed copy of `D` at `generation`, set "demo".
    fn committed(generation: u16) -> ReplicaWrite {
        ReplicaWrite {
            namespace: "test".to_owned(),
            digest: D,
            generation,
            life: 0,
            durable: false,
            void_time: 0,
            last_update_ms: NOW_MS - 1_000 + u64::from(generation),
            set_name: b"demo".to_vec(),
            body: Some(vec![0, 0]),
            xdr_write: false,
        }
    }

    fn provisional(namespace: &Namespace, txn_id: u64) -> Provisional {
        let set_id = namespace.sets.id_of(b"demo").unwrap();
        let meta = RecordMeta {
            generation: 2,
            life: 0,
            set_id,
            void_time: 0,
            last_update_ms: NOW_MS,
            xdr_write: false,
        };
        Provisional {
            txn_id,
            deadline: 99,
            version: Version::Store {
                meta,
                body: vec![1, 2, 3],
            },
        }
    }

    #[test]
    fn a_copy_round_trips_and_garbage_is_refused() {
        let master = namespace();
        let copy = TxnCopy {
            provisional: Some(provisional(&master, 7)),
            monitor: Some(Monitor {
                deadline: 12,
                roll_forward: true,
            }),
            settled: vec![Settled {
                txn_id: 3,
                until: 40,
            }],
        };
        let bytes = copy.encode(&master);
        // The replica knows no set yet: it is added by name.
        let replica = namespace();
        let decoded = TxnCopy::decode(&replica, &bytes).unwrap();
        assert_eq!(decoded.monitor, copy.monitor);
        assert_eq!(decoded.settled, copy.settled);
        let held = decoded.provisional.unwrap();
        let Version::Store { meta, body } = held.version else {
            panic!("a stored version")
        };
        assert_eq!(replica.sets.name(meta.set_id).unwrap(), b"demo");
        assert_eq!((held.txn_id, held.deadline, body), (7, 99, vec![1, 2, 3]));
        let empty = TxnCopy::default().encode(&master);
        assert_eq!(TxnCopy::decode(&replica, &empty), Some(TxnCopy::default()));
        let mut trailed = bytes.clone();
        trailed.push(0);
        assert_eq!(TxnCopy::decode(&replica, &trailed), None);
        assert_eq!(TxnCopy::decode(&replica, &bytes[..bytes.len() - 1]), None);
        assert_eq!(TxnCopy::decode(&replica, &[8]), None, "unknown flag");
        let mut generation_0 = copy.clone();
        if let Some(Provisional {
            version: Version::Store { meta, .. },
            ..
        }) = &mut generation_0.provisional
        {
            meta.generation = 0;
        }
        let refused = generation_0.encode(&master);
        assert_eq!(TxnCopy::decode(&replica, &refused), None, "generation 0");
    }

    #[test]
    fn a_replica_takes_the_masters_state_unless_it_holds_newer() {
        let replica = namespace();
        let held = provisional(&replica, 7);
        let with_lock = TxnCopy {
            provisional: Some(held.clone()),
            ..TxnCopy::default()
        };
        store_copy(&replica, &committed(1), now(), 0, Admit::Always).unwrap();
        apply(&replica, &committed(1), with_lock.clone(), now()).unwrap();
        assert_eq!(replica.txn.provisional(&D), Some(held.clone()));
        // The roll forward: a newer committed copy, no lock.
        let rolled = committed(2);
        store_copy(&replica, &rolled, now(), 0, Admit::Always).unwrap();
        apply(&replica, &rolled, TxnCopy::default(), now()).unwrap();
        assert_eq!(replica.txn.provisional(&D), None);
        // The provisional write delivered again, late: not brought back.
        apply(&replica, &committed(1), with_lock.clone(), now()).unwrap();
        assert_eq!(replica.txn.provisional(&D), None);
        assert_eq!(replica.txn.stats.provisionals.load(Relaxed), 0);
        // A lock on the same committed version, then its roll back.
        let current = capture(&replica, &D, now());
        apply(&replica, &current, with_lock, now()).unwrap();
        assert_eq!(replica.txn.stats.provisionals.load(Relaxed), 1);
        apply(&replica, &current, TxnCopy::default(), now()).unwrap();
        assert_eq!(replica.txn.provisional(&D), None);
    }

    /// The per-partition count that lets the write path skip the table:
    /// zero exactly when the partition holds nothing, through replacing,
    /// taking, closing and clearing.
    #[test]
    fn a_partition_is_empty_only_while_it_holds_no_state() {
        let namespace = namespace();
        let tables = &namespace.txn;
        let p = D.partition();
        assert!(tables.partition_is_empty(p));
        assert_eq!(TxnCopy::capture(&namespace, &D), TxnCopy::default());
        tables.keep(D, provisional(&namespace, 7));
        tables.keep(D, provisional(&namespace, 7));
        assert!(!tables.partition_is_empty(p));
        assert!(TxnCopy::capture(&namespace, &D).provisional.is_some());
        let open = Monitor {
            deadline: 5,
            roll_forward: false,
        };
        tables.set_monitor(D, open);
        tables.set_monitor(D, open);
        assert!(tables.take(&D, 8).is_none(), "another transaction's");
        assert!(tables.take(&D, 7).is_some());
        assert!(!tables.partition_is_empty(p), "the monitor is left");
        assert!(tables.close_monitor(&D).is_some());
        assert!(tables.close_monitor(&D).is_none());
        assert!(tables.partition_is_empty(p));
        tables.keep(D, provisional(&namespace, 9));
        tables.set_monitor(D, open);
        assert_eq!(tables.clear_partition(p), 2);
        assert!(tables.partition_is_empty(p));
        assert!(tables.is_empty());
        // A clear where nothing is held leaves nothing to do.
        store_copy(&namespace, &committed(1), now(), 0, Admit::Always).unwrap();
        apply(&namespace, &committed(1), TxnCopy::default(), now()).unwrap();
        assert!(tables.partition_is_empty(p));
    }

    /// What the transaction state costs each SC replicated write when the
    /// partition holds none (the fast path) against when it holds another
    /// record's (the full path, which every write took before): the
    /// master's capture and encoding, the replica's decoding and apply.
    /// On demand, in release: `cargo test --release -p citrine-data --lib
    /// txn_state_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn txn_state_cost() {
        const CALLS: u32 = 400_000;
        let namespace = namespace();
        let write = committed(1);
        store_copy(&namespace, &write, now(), 0, Admit::Always).unwrap();
        let mut other = D;
        other.0[10] ^= 1;
        assert_eq!(other.partition(), D.partition());
        let round = |namespace: &Namespace| {
            let started = std::time::Instant::now();
            for _ in 0..CALLS {
                let bytes = TxnCopy::capture(namespace, &D).encode(namespace);
                let copy = TxnCopy::decode(namespace, std::hint::black_box(&bytes)).unwrap();
                apply(namespace, &write, copy, now()).unwrap();
            }
            started.elapsed().as_nanos() as f64 / f64::from(CALLS)
        };
        for _ in 0..5 {
            let fast = round(&namespace);
            namespace.txn.keep(other, provisional(&namespace, 3));
            let full = round(&namespace);
            namespace.txn.take(&other, 3).unwrap();
            println!("ns per write: fast path {fast:.1}, full path {full:.1}");
        }
    }

    #[test]
    fn a_monitor_entry_follows_the_master() {
        let replica = namespace();
        let open = Monitor {
            deadline: 50,
            roll_forward: false,
        };
        let copy = TxnCopy {
            monitor: Some(open),
            ..TxnCopy::default()
        };
        store_copy(&replica, &committed(1), now(), 0, Admit::Always).unwrap();
        apply(&replica, &committed(1), copy, now()).unwrap();
        assert_eq!(replica.txn.monitor(&D), Some(open));
        assert_eq!(replica.txn.stats.monitors_active.load(Relaxed), 1);
        apply(&replica, &committed(1), TxnCopy::default(), now()).unwrap();
        assert_eq!(replica.txn.monitor(&D), None);
        assert_eq!(replica.txn.stats.monitors_active.load(Relaxed), 0);
    }

    /// A rolled transaction stays settled on the record: a copy built
    /// before the roll (same committed version) does not bring its lock
    /// back, a copy saying it is settled takes its lock away, and the
    /// entry goes once past its time.
    #[test]
    fn a_settled_transactions_lock_is_not_filled_again() {
        let node = namespace();
        store_copy(&node, &committed(1), now(), 0, Admit::Always).unwrap();
        let before_roll = TxnCopy {
            provisional: Some(provisional(&node, 7)),
            ..TxnCopy::default()
        };
        fill(&node, &committed(1), before_roll.clone(), now());
        assert!(node.txn.provisional(&D).is_some());
        crate::txn::roll_record(&node, &D, 7, false, now()).unwrap();
        assert!(node.txn.is_settled(&D, 7));
        fill(&node, &committed(1), before_roll.clone(), now());
        assert_eq!(node.txn.provisional(&D), None, "settled here");
        // Another node that never saw the roll learns it from a copy.
        let other = namespace();
        store_copy(&other, &committed(1), now(), 0, Admit::Always).unwrap();
        fill(&other, &committed(1), before_roll.clone(), now());
        let told = TxnCopy::capture(&node, &D);
        assert_eq!(told.settled.len(), 1);
        fill(&other, &committed(1), told, now());
        assert_eq!(other.txn.provisional(&D), None, "taken away");
        fill(&other, &committed(1), before_roll.clone(), now());
        assert_eq!(other.txn.provisional(&D), None);
        let until = node.txn.partition(D.partition()).settled[&D][0].until;
        assert_eq!(node.txn.prune_settled(until), 0, "kept through its time");
        assert_eq!(node.txn.prune_settled(until + 1), 1);
        assert!(node.txn.partition_is_empty(D.partition()));
        fill(&node, &committed(1), before_roll, now());
        assert!(node.txn.provisional(&D).is_some(), "forgotten");
    }
}
