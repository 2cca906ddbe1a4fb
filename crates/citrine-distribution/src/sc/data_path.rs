//! Strong-consistency namespaces on the request path (paper 000 §4.3,
//! issue 39 points 4 and 5): which nodes a request of an SC partition
//! involves, the regime its replica writes carry, the read modes the
//! clients ask for, and the records whose replication is not known
//! complete.
//!
//! Owns: [`replicas_for`] (the SC map's working replicas, master first, or
//! the AP map's), [`sc_payload`] / [`split_sc_payload`] (the
//! [`SC_REPLICA_WRITE`](crate::replication::call_kind::SC_REPLICA_WRITE)
//! payload: `u32 regime | u32 length | transaction state | REPLICA_WRITE
//! payload`), [`regime_admits`] (the
//! replica's check), [`ReadMode`] (info3 bits) and [`Unreplicated`].
//!
//! Invariants:
//! - an SC partition's requests involve only the replicas the view's SC
//!   map lists for it; an unavailable or undecided one has none, and its
//!   requests answer 11;
//! - a replica stores an SC replica write only when the regime it carries
//!   is the regime of the replica's own decided SC map and the replica is
//!   in that map's replica list for the partition (never as an acting
//!   master or a leftover holder): a write from an older (or newer)
//!   regime is refused (7);
//! - a record the master wrote but could not replicate to every replica is
//!   in [`Unreplicated`]; the master serves no read of it before its state
//!   was replicated again to every replica of the current regime (the
//!   read re-replicates first; if that fails the read answers 9).

use crate::cluster_state::ClusterState;
use citrine_data::copy::ReplicaWrite;
use citrine_data::namespace::Namespace;
use citrine_types::{Digest, NodeId, PartitionId};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Whether `namespace` is a strong-consistency namespace.
pub fn is_sc(namespace: &Namespace) -> bool {
    namespace.config.sc.strong_consistency
}

/// The nodes a request of `partition` involves, master first: for an SC
/// namespace the view's SC map's working replicas (none while the
/// partition is unavailable or the view undecided), else the AP map's.
pub fn replicas_for<'c>(
    cluster: &'c ClusterState,
    namespace: &Namespace,
    partition: PartitionId,
) -> &'c [NodeId] {
    let Some(map) = cluster.namespace(&namespace.config.name) else {
        return &[];
    };
    if !is_sc(namespace) {
        return map.map.replicas(partition);
    }
    map.sc.get().map_or(&[][..], |sc| sc.replicas(partition))
}

/// The regime of `namespace`'s decided SC map in `cluster` (`None` while
/// undecided).
pub fn regime_of(cluster: &ClusterState, namespace: &str) -> Option<u32> {
    cluster
        .namespace(namespace)
        .and_then(|map| map.sc.get())
        .map(|sc| sc.regime)
        .filter(|regime| *regime != 0)
}

/// An SC replica write: the master's regime, the record's transaction
/// state (`u32 length | state`, length 0 when the write leaves the
/// replica's as it is; `citrine_data::txn::replica`), then the
/// `REPLICA_WRITE` payload (`crate::replication::replica_payload`).
pub fn sc_payload(regime: u32, txn: &[u8], replica_payload: &[u8]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(8 + txn.len() + replica_payload.len());
    payload.extend_from_slice(&regime.to_be_bytes());
    payload.extend_from_slice(&(txn.len() as u32).to_be_bytes());
    payload.extend_from_slice(txn);
    payload.extend_from_slice(replica_payload);
    payload
}

/// Splits an SC replica write into its regime, transaction state and
/// `REPLICA_WRITE` payload.
pub fn split_sc_payload(payload: &[u8]) -> Option<(u32, &[u8], &[u8])> {
    let (regime, rest) = payload.split_first_chunk::<4>()?;
    let (length, rest) = rest.split_first_chunk::<4>()?;
    let length = usize::try_from(u32::from_be_bytes(*length)).ok()?;
    let txn = rest.get(..length)?;
    Some((u32::from_be_bytes(*regime), txn, &rest[length..]))
}

/// The marker a LINEARIZE read sends to confirm the regime: a record of
/// generation 0 without a body, which a replica acknowledges (after its
/// regime check) without storing anything.
pub fn regime_marker(namespace: &str, digest: &Digest, now_ms: u64) -> ReplicaWrite {
    ReplicaWrite {
        namespace: namespace.to_owned(),
        digest: *digest,
        generation: 0,
        life: 0,
        durable: false,
        void_time: 0,
        last_update_ms: now_ms,
        set_name: Vec::new(),
        body: None,
        xdr_write: false,
    }
}

/// Whether a replica with view `cluster` takes an SC replica write of
/// `partition` of `namespace` sent in `regime`: its SC map is decided in
/// that same regime and lists it among the partition's replicas.
pub fn regime_admits(
    cluster: &ClusterState,
    me: NodeId,
    namespace: &str,
    partition: PartitionId,
    regime: u32,
) -> bool {
    cluster
        .namespace(namespace)
        .and_then(|map| map.sc.get())
        .is_some_and(|sc| {
            sc.regime != 0 && sc.regime == regime && sc.replicas(partition).contains(&me)
        })
}

/// A strong-consistency read mode, from a request's info3 bits (protocol
/// notes 02 §2.3: `SC_READ_TYPE` 0x40, `SC_READ_RELAX` 0x80).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// The master in its regime (the default).
    Session,
    /// The master, after its replicas confirmed its regime.
    Linearize,
    /// Any replica (served here by the master, which is stricter).
    AllowReplica,
    /// Any copy, even of an unavailable partition (served here as
    /// [`ReadMode::AllowReplica`]: unavailable partitions still answer 11).
    AllowUnavailable,
}

impl ReadMode {
    /// The mode info3 asks for.
    pub fn of_info3(info3: u8) -> ReadMode {
        match (info3 & 0x80 != 0, info3 & 0x40 != 0) {
            (false, false) => ReadMode::Session,
            (false, true) => ReadMode::Linearize,
            (true, false) => ReadMode::AllowReplica,
            (true, true) => ReadMode::AllowUnavailable,
        }
    }
}

/// Records whose last write the master could not replicate to every
/// replica (the client was answered 9, in doubt): no read serves them
/// before their state was replicated again.
///
/// Every SC read asks [`Unreplicated::contains`] and every replicated SC
/// write [`Unreplicated::clear`]s, so both answer from one relaxed load of
/// the count while nothing is marked (the usual case), and never allocate;
/// the lock is taken only while some record is marked. The count changes
/// under the lock and equals the marked records.
#[derive(Default)]
pub struct Unreplicated {
    marked: AtomicUsize,
    records: Mutex<HashMap<String, HashSet<Digest>>>,
}

impl Unreplicated {
    /// Marks a record unreplicated.
    pub fn mark(&self, namespace: &str, digest: Digest) {
        let mut records = self.records.lock();
        let inserted = match records.get_mut(namespace) {
            Some(digests) => digests.insert(digest),
            None => records
                .entry(namespace.to_owned())
                .or_default()
                .insert(digest),
        };
        if inserted {
            self.marked.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The record's state reached every replica of the current regime.
    pub fn clear(&self, namespace: &str, digest: &Digest) {
        if self.marked.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut records = self.records.lock();
        let removed = records
            .get_mut(namespace)
            .is_some_and(|digests| digests.remove(digest));
        if removed {
            self.marked.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether a record is marked unreplicated.
    pub fn contains(&self, namespace: &str, digest: &Digest) -> bool {
        self.marked.load(Ordering::Relaxed) != 0
            && self
                .records
                .lock()
                .get(namespace)
                .is_some_and(|digests| digests.contains(digest))
    }

    /// How many records are marked.
    pub fn count(&self) -> usize {
        self.marked.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_modes_follow_the_info3_bits() {
        assert_eq!(ReadMode::of_info3(0), ReadMode::Session);
        assert_eq!(ReadMode::of_info3(0x40), ReadMode::Linearize);
        assert_eq!(ReadMode::of_info3(0x80), ReadMode::AllowReplica);
        assert_eq!(ReadMode::of_info3(0xc0), ReadMode::AllowUnavailable);
        assert_eq!(ReadMode::of_info3(0x41), ReadMode::Linearize);
    }

    #[test]
    fn sc_payload_round_trips() {
        let payload = sc_payload(7, b"", b"rest");
        assert_eq!(
            split_sc_payload(&payload),
            Some((7, &b""[..], &b"rest"[..]))
        );
        let payload = sc_payload(7, b"tx", b"rest");
        assert_eq!(
            split_sc_payload(&payload),
            Some((7, &b"tx"[..], &b"rest"[..]))
        );
        assert_eq!(split_sc_payload(b"abc"), None);
        assert_eq!(split_sc_payload(&[0, 0, 0, 7, 0, 0, 0, 9, 1]), None);
    }

    #[test]
    fn unreplicated_marks_and_clears() {
        let set = Unreplicated::default();
        let digest = Digest([3; 20]);
        set.mark("test", digest);
        assert!(set.contains("test", &digest));
        assert!(!set.contains("bar", &digest));
        set.mark("test", digest);
        assert_eq!(set.count(), 1, "marked once");
        set.clear("bar", &digest);
        assert_eq!(set.count(), 1, "another namespace's record");
        set.clear("test", &digest);
        assert_eq!(set.count(), 0);
        assert!(!set.contains("test", &digest));
    }
}
