//! A record's transaction state as the master sends it to the replicas
//! of a strong-consistency partition, beside the record's committed copy
//! (issue 40, the cluster part): the provisional version a transaction
//! holds on it and, for a monitor record, the monitor's entry.
//!
//! Owns [`TxnCopy`] (captured by [`TxnCopy::capture`] right after the
//! master's write, encoded with [`TxnCopy::encode`] / [`TxnCopy::decode`])
//! and [`apply`], the replica's side: the replica's table entries for the
//! record become exactly the master's.
//!
//! Invariants:
//! - a replica applies a copy's transaction state only when the committed
//!   copy it came with is not older than the one the replica holds (equal
//!   or newer, after the copy itself was stored): a late, repeated
//!   delivery of a provisional write does not bring back a lock that the
//!   roll forward (which always installs a newer committed version)
//!   already took away;
//! - the state is applied under the record partition's write lock, as
//!   every change of the side table is ([`super::table`]);
//! - a provisional version's set travels by name (set ids are per node);
//!   a copy that does not decode is refused whole by the caller.

use super::{Monitor, Provisional, Version};
use crate::clock::Now;
use crate::copy::{Reader, ReplicaWrite};
use crate::namespace::{compare_versions, Namespace};
use crate::record::is_live;
use citrine_index::RecordMeta;
use citrine_types::{Digest, ResultCode};
use std::cmp::Ordering;

const HAS_PROVISIONAL: u8 = 1;
const HAS_MONITOR: u8 = 2;
const VERSION_STORE: u8 = 1;
const VERSION_DELETE: u8 = 2;

/// The transaction state of one record on the master.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnCopy {
    pub provisional: Option<Provisional>,
    pub monitor: Option<Monitor>,
}

impl TxnCopy {
    /// `digest`'s state in `namespace`'s tables now.
    pub fn capture(namespace: &Namespace, digest: &Digest) -> TxnCopy {
        let table = namespace.txn.partition(digest.partition());
        TxnCopy {
            provisional: table.provisionals.get(digest).cloned(),
            monitor: table.monitors.get(digest).copied(),
        }
    }

    /// `u8 flags | (provisional) u64 txn id | u32 deadline | u8 kind |
    /// (store) u16 gen | u16 life | u32 void | u64 lut | u8 set len | set |
    /// u32 body len | body | (monitor) u32 deadline | u8 forward`,
    /// big-endian.
    pub fn encode(&self, namespace: &Namespace) -> Vec<u8> {
        let mut out = Vec::new();
        let flags = u8::from(self.provisional.is_some()) * HAS_PROVISIONAL
            + u8::from(self.monitor.is_some()) * HAS_MONITOR;
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
        out
    }

    /// Decodes a copy for `namespace` (a provisional version's set is
    /// looked up, or added, by name); `None` when malformed or trailed.
    pub fn decode(namespace: &Namespace, bytes: &[u8]) -> Option<TxnCopy> {
        let mut reader = Reader { bytes, at: 0 };
        let flags = reader.u8()?;
        if flags & !(HAS_PROVISIONAL | HAS_MONITOR) != 0 {
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
    let set_id = namespace.sets.id_of(reader.take(set_len)?)?;
    let body_len = u32::from_be_bytes(reader.take(4)?.try_into().ok()?) as usize;
    let body = reader.take(body_len)?.to_vec();
    let meta = RecordMeta {
        generation,
        life,
        set_id,
        void_time,
        last_update_ms,
    };
    Some(Version::Store { meta, body })
}

/// Makes `copy` the replica's transaction state of the record `write` is
/// a copy of (stored, or found not newer, just before), unless the
/// replica holds a newer committed version (see the module doc). A write
/// without a generation (the master holds nothing committed: a
/// transaction creating the record) applies while the replica holds no
/// live copy either.
pub fn apply(
    namespace: &Namespace,
    write: &ReplicaWrite,
    copy: TxnCopy,
    now: Now,
) -> Result<(), ResultCode> {
    let digest = write.digest;
    let partition = namespace.index.partition(digest.partition()).write();
    let held = partition
        .get(&digest)
        .map(|entry| entry.meta())
        .filter(|meta| is_live(namespace, meta, now));
    let stale = match held {
        None => false,
        Some(_) if write.body.is_none() && write.generation == 0 => true,
        Some(meta) => {
            let policy = namespace.config.conflict_resolution_policy;
            let ours = crate::namespace::Version::of(&meta);
            compare_versions(policy, ours, write.version()) == Ordering::Greater
        }
    };
    if stale {
        return Ok(());
    }
    let tables = &namespace.txn;
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
