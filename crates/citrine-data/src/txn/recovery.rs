//! The roll of transactions whose deadline passed, by the node, from
//! their monitor records (the client died, or gave up).
//!
//! [`recover`] takes every open monitor whose deadline is before now and
//! reads its record: each digest of bin `keyds` is rolled forward when bin
//! `fwd` is true (the client had marked the commit; its rolls must
//! finish), back otherwise; then the monitor record is removed (a durable
//! delete) and its entry closed. A provisional version whose deadline
//! passed and whose transaction has no open monitor here is rolled back.
//!
//! Invariants: a monitor is removed only after every digest it lists was
//! rolled (a failed roll leaves it for the next pass); a roll takes one
//! record's partition lock at a time.
//!
//! [`recover`] rolls this node's copies only: it is the recovery of a node
//! alone. In a cluster the service's `txn_recovery` drives the same steps
//! ([`read_monitor`], [`monitor_digest`]) through the request path, on
//! the partitions' masters, so every roll reaches every replica.

use super::monitor::{DIGESTS_BIN, FORWARD_BIN, ID_BIN};
use super::{roll_record, MONITOR_SET};
use crate::namespace::Namespace;
use crate::record::{self, is_live, Now};
use citrine_cdt::value::{decode_stored, Value};
use citrine_record::BodyView;
use citrine_types::{Digest, ParticleType, ResultCode, DIGEST_SIZE};
use std::sync::atomic::Ordering;

/// What one pass rolled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    pub monitors: usize,
    pub orphans: usize,
}

/// Rolls every expired transaction of `namespace` (see the module doc).
pub fn recover(namespace: &Namespace, now: Now) -> Recovered {
    if !super::allowed(namespace) {
        return Recovered::default();
    }
    namespace.txn.prune_settled(now.citrusleaf_seconds);
    let (monitors, provisionals) = namespace.txn.expired(now.citrusleaf_seconds);
    let mut recovered = Recovered::default();
    for digest in monitors {
        match recover_monitor(namespace, &digest, now) {
            Ok(()) => recovered.monitors += 1,
            Err(_) => {
                let stats = &namespace.txn.stats;
                stats.monitor_roll_error.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    for (digest, txn_id) in provisionals {
        let monitor = monitor_digest(txn_id);
        if namespace.txn.monitor(&monitor).is_some() {
            continue;
        }
        if roll_record(namespace, &digest, txn_id, false, now).is_ok() {
            recovered.orphans += 1;
        }
    }
    recovered
}

/// The digest of transaction `txn_id`'s monitor record.
pub fn monitor_digest(txn_id: u64) -> Digest {
    let key = (txn_id as i64).to_be_bytes();
    citrine_wire::digest::compute(MONITOR_SET, ParticleType::Integer as u8, &key)
}

/// The transaction a monitor record names: its id, whether it was marked
/// to roll forward, and the digests it writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MonitorRecord {
    pub txn_id: u64,
    pub forward: bool,
    pub digests: Vec<Digest>,
}

/// Rolls the transaction of the monitor on `digest`, then removes it.
fn recover_monitor(namespace: &Namespace, digest: &Digest, now: Now) -> Result<(), ResultCode> {
    let _serialized = namespace.txn.monitor_guard(digest);
    let still_expired = namespace
        .txn
        .monitor(digest)
        .is_some_and(|open| open.deadline < now.citrusleaf_seconds);
    if !still_expired {
        // Closed by its client since the pass listed it.
        return Ok(());
    }
    let Some(held) = read_monitor(namespace, digest, now)? else {
        namespace.txn.close_monitor(digest);
        return Ok(());
    };
    let forward = held.forward
        || namespace
            .txn
            .monitor(digest)
            .is_some_and(|m| m.roll_forward);
    for written in &held.digests {
        roll_record(namespace, written, held.txn_id, forward, now)?;
    }
    let stats = &namespace.txn.stats;
    let counter = if forward {
        &stats.monitor_roll_forward_success
    } else {
        &stats.monitor_roll_back_success
    };
    counter.fetch_add(1, Ordering::Relaxed);
    remove_monitor(namespace, digest, now)?;
    namespace.txn.close_monitor(digest);
    Ok(())
}

/// The monitor record on `digest` as stored, `None` when it is gone.
pub fn read_monitor(
    namespace: &Namespace,
    digest: &Digest,
    now: Now,
) -> Result<Option<MonitorRecord>, ResultCode> {
    let partition = namespace.index.partition(digest.partition()).read();
    let Some(entry) = partition
        .get(digest)
        .filter(|entry| is_live(namespace, &entry.meta(), now))
    else {
        return Ok(None);
    };
    let body = namespace
        .storage
        .read(&entry.location)
        .map_err(|_| ResultCode::ServerError)?;
    let view = BodyView::parse(&body).map_err(|_| ResultCode::ServerError)?;
    let mut held = MonitorRecord {
        txn_id: 0,
        forward: false,
        digests: Vec::new(),
    };
    for bin in view.bins() {
        match bin.name.as_ref() {
            name if name == ID_BIN && bin.value.len() == 8 => {
                let mut word = [0u8; 8];
                word.copy_from_slice(&bin.value);
                held.txn_id = u64::from_be_bytes(word);
            }
            name if name == FORWARD_BIN => {
                held.forward = bin.particle_type == ParticleType::Bool as u8
                    && bin.value.first().is_some_and(|&flag| flag != 0);
            }
            name if name == DIGESTS_BIN => held.digests = digests_of(&bin.value)?,
            _ => {}
        }
    }
    Ok(Some(held))
}

/// The 20-byte digests of a `keyds` list bin.
fn digests_of(value: &[u8]) -> Result<Vec<Digest>, ResultCode> {
    let Ok(Value::List(list)) = decode_stored(value) else {
        return Err(ResultCode::ServerError);
    };
    let digest = |item: &Value| match item {
        Value::Blob(_, bytes) => <[u8; DIGEST_SIZE]>::try_from(bytes.as_slice()).ok(),
        _ => None,
    };
    Ok(list.items.iter().filter_map(digest).map(Digest).collect())
}

/// Removes a rolled monitor record, leaving a durable tombstone.
fn remove_monitor(namespace: &Namespace, digest: &Digest, now: Now) -> Result<(), ResultCode> {
    let mut partition = namespace.index.partition(digest.partition()).write();
    let live = partition
        .get(digest)
        .map(|entry| entry.meta())
        .filter(|meta| is_live(namespace, meta, now));
    if let Some(meta) = live {
        record::write_tombstone(namespace, digest, &meta, now)?;
        record::remove_deleted(namespace, &mut partition, digest, now.unix_ms, true);
    }
    Ok(())
}
