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
//!   a copy that does not decode, or holds a version no master keeps
//!   (generation 0, a life out of range, a set name a client could not
//!   give), is refused whole by the caller.

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
        };
        let bytes = copy.encode(&master);
        // The replica knows no set yet: it is added by name.
        let replica = namespace();
        let decoded = TxnCopy::decode(&replica, &bytes).unwrap();
        assert_eq!(decoded.monitor, copy.monitor);
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
        assert_eq!(TxnCopy::decode(&replica, &[4]), None, "unknown flag");
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
            monitor: None,
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

    #[test]
    fn a_monitor_entry_follows_the_master() {
        let replica = namespace();
        let open = Monitor {
            deadline: 50,
            roll_forward: false,
        };
        let copy = TxnCopy {
            provisional: None,
            monitor: Some(open),
        };
        store_copy(&replica, &committed(1), now(), 0, Admit::Always).unwrap();
        apply(&replica, &committed(1), copy, now()).unwrap();
        assert_eq!(replica.txn.monitor(&D), Some(open));
        assert_eq!(replica.txn.stats.monitors_active.load(Relaxed), 1);
        apply(&replica, &committed(1), TxnCopy::default(), now()).unwrap();
        assert_eq!(replica.txn.monitor(&D), None);
        assert_eq!(replica.txn.stats.monitors_active.load(Relaxed), 0);
    }
}
