//! A record's state as another node sends it — a master's replica write,
//! a migrated record, a duplicate-resolution answer — and the rule that
//! decides whether it is stored over this node's copy.
//!
//! [`ReplicaWrite`] is a copy of one record (its version, void time, set
//! and body) or a delete marker (its tombstone's version), with its codec.
//! [`store_copy`] applies one to this node's copy: a copy that loses to (or
//! ties with) the local record or tombstone under the namespace's conflict
//! resolution ([`crate::namespace::compare_versions`]: the record's life
//! first, then generation and last-update time or the reverse) changes
//! nothing, so retries and reordered deliveries are harmless; a copy from
//! before a truncation is acknowledged and not stored; a delete marker
//! leaves a tombstone even where the record is absent.
//!
//! Every copy travels with its sender's truncation threshold for the
//! record's set ([`truncated_before_of`]; the second word of a
//! `REPLICA_WRITE` call, a migration batch's list of sets, the prefix of a
//! `DUPRES` answer): a node that has not learned a truncation yet counts a
//! held copy or tombstone from before it as absent too, and stores no
//! incoming copy from before it, so the generation-1 copy the master wrote
//! after the truncation does not lose to the truncated one. A master
//! captures a write's outcome with [`capture`] (the stored copy, or a
//! delete marker); a duplicate-resolution answer is [`fetch`]'s.
//!
//! Invariants: a copy is stored or refused whole, under the record
//! partition's write lock, through [`crate::record::store`]; a copy that
//! fails [`ReplicaWrite::check`] (malformed input from a peer) is refused
//! before the index is touched; a copy is stored only in the namespace it
//! names (asserted, release builds too: the caller's invariant).

use crate::clock::Now;
use crate::config::ConflictResolutionPolicy;
use crate::namespace::{compare_versions, Namespace, Version};
use crate::record::{self, store};
use citrine_index::{IndexEntry, PartitionIndex, RecordMeta, Tombstone, MAX_LAST_UPDATE_MS};
use citrine_storage::{StoreMeta, MEMORY_BODY_SPARE};
use citrine_types::{Digest, ResultCode, DIGEST_SIZE, SET_NAME_MAX};

/// A record's new state as a replica stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaWrite {
    pub namespace: String,
    pub digest: Digest,
    pub generation: u16,
    /// The copy's life (`citrine_index::RecordMeta::life`), `< LIVES`.
    pub life: u16,
    /// For a delete: whether it was durable (the record written after it
    /// continues its life and generation). False for a record.
    pub durable: bool,
    pub void_time: u32,
    pub last_update_ms: u64,
    pub set_name: Vec<u8>,
    /// The stored body; `None` is a delete.
    pub body: Option<Vec<u8>>,
    /// The copy's record (or delete) arrived at its master by XDR
    /// (`citrine_index::RecordMeta::xdr_write`): the copy keeps the mark,
    /// so that no holder ships it on to a DC that does not forward.
    pub xdr_write: bool,
}

const REPLICA_STORE: u8 = 1;
const REPLICA_DELETE: u8 = 2;
const REPLICA_DURABLE_DELETE: u8 = 3;
/// Or-ed into the kind byte of a copy that carries the XDR mark.
const XDR_MARK: u8 = 0x80;

impl ReplicaWrite {
    /// What conflict resolution compares of this copy.
    pub fn version(&self) -> Version {
        Version {
            life: self.life,
            generation: self.generation,
            last_update_ms: self.last_update_ms,
        }
    }

    /// Whether this copy is one a node can send: its life in range, a
    /// record's generation not 0 (no master writes one: generations wrap to
    /// 1; a delete marker's may be 0, sent by a master that kept no
    /// tombstone), its last-update time within the index's range, no
    /// durable flag on a record, and a set name a client could have given.
    /// [`ReplicaWrite::decode`] checks only the layout: a copy from another
    /// node that fails this is malformed input from that node, refused
    /// ([`ResultCode::Parameter`]) before anything is stored.
    pub fn check(&self) -> Result<(), ResultCode> {
        let well_formed = self.life < citrine_index::LIVES
            && (self.body.is_none() || (self.generation != 0 && !self.durable))
            && self.last_update_ms <= MAX_LAST_UPDATE_MS
            && self.set_name.len() <= SET_NAME_MAX
            && !self.set_name.contains(&0);
        if well_formed {
            Ok(())
        } else {
            Err(ResultCode::Parameter)
        }
    }

    /// `u8 kind | u8 ns len | ns | digest | u16 gen | u16 life | u32 void |
    /// u64 lut | u8 set len | set | (store) u32 body len | body`,
    /// big-endian; kind 1 a record, 2 a delete, 3 a durable delete, with
    /// its top bit set for a copy with the XDR mark.
    pub fn encode(&self) -> Vec<u8> {
        let body_len = self.body.as_ref().map_or(0, Vec::len);
        let mut out = Vec::with_capacity(50 + self.namespace.len() + body_len);
        let kind = match (&self.body, self.durable) {
            (Some(_), _) => REPLICA_STORE,
            (None, false) => REPLICA_DELETE,
            (None, true) => REPLICA_DURABLE_DELETE,
        };
        out.push(if self.xdr_write {
            kind | XDR_MARK
        } else {
            kind
        });
        let namespace = self.namespace.as_bytes();
        let namespace = &namespace[..namespace.len().min(255)];
        out.push(namespace.len() as u8);
        out.extend_from_slice(namespace);
        out.extend_from_slice(&self.digest.0);
        out.extend_from_slice(&self.generation.to_be_bytes());
        out.extend_from_slice(&self.life.to_be_bytes());
        out.extend_from_slice(&self.void_time.to_be_bytes());
        out.extend_from_slice(&self.last_update_ms.to_be_bytes());
        let set = &self.set_name[..self.set_name.len().min(255)];
        out.push(set.len() as u8);
        out.extend_from_slice(set);
        if let Some(body) = &self.body {
            out.extend_from_slice(&(body.len() as u32).to_be_bytes());
            out.extend_from_slice(body);
        }
        out
    }

    /// Decodes; `None` for anything malformed (including trailing bytes).
    pub fn decode(bytes: &[u8]) -> Option<ReplicaWrite> {
        let mut reader = Reader { bytes, at: 0 };
        let marked = reader.u8()?;
        let (kind, xdr_write) = (marked & !XDR_MARK, marked & XDR_MARK != 0);
        let namespace_len = usize::from(reader.u8()?);
        let namespace = std::str::from_utf8(reader.take(namespace_len)?)
            .ok()?
            .to_owned();
        let digest: [u8; DIGEST_SIZE] = reader.take(DIGEST_SIZE)?.try_into().ok()?;
        let generation = u16::from_be_bytes(reader.take(2)?.try_into().ok()?);
        let life = u16::from_be_bytes(reader.take(2)?.try_into().ok()?);
        if life >= citrine_index::LIVES {
            return None;
        }
        let void_time = u32::from_be_bytes(reader.take(4)?.try_into().ok()?);
        // Held to the index's range, so that every comparison of this copy
        // with a stored one sees the same value the index would keep.
        let last_update_ms =
            u64::from_be_bytes(reader.take(8)?.try_into().ok()?).min(MAX_LAST_UPDATE_MS);
        let set_len = usize::from(reader.u8()?);
        let set_name = reader.take(set_len)?.to_vec();
        let body = match kind {
            REPLICA_STORE => {
                let length = u32::from_be_bytes(reader.take(4)?.try_into().ok()?) as usize;
                Some(reader.take(length)?.to_vec())
            }
            REPLICA_DELETE | REPLICA_DURABLE_DELETE => None,
            _ => return None,
        };
        if reader.at != bytes.len() {
            return None;
        }
        Some(ReplicaWrite {
            namespace,
            digest: Digest(digest),
            generation,
            life,
            durable: kind == REPLICA_DURABLE_DELETE,
            void_time,
            last_update_ms,
            set_name,
            body,
            xdr_write,
        })
    }
}

/// Clears the XDR mark of an encoded copy ([`ReplicaWrite::encode`]);
/// false when it had none.
pub fn drop_xdr_mark(encoded: &mut [u8]) -> bool {
    match encoded.first_mut() {
        Some(kind) if *kind & XDR_MARK != 0 => {
            *kind &= !XDR_MARK;
            true
        }
        _ => false,
    }
}

/// A cursor over a peer message's bytes: every read is bounds-checked
/// (`None` past the end), so a short or garbled message decodes to `None`.
pub struct Reader<'a> {
    pub bytes: &'a [u8],
    pub at: usize,
}

impl<'a> Reader<'a> {
    /// The next `length` bytes.
    pub fn take(&mut self, length: usize) -> Option<&'a [u8]> {
        let slice = self.bytes.get(self.at..self.at.checked_add(length)?)?;
        self.at += length;
        Some(slice)
    }
    /// The next byte.
    pub fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|bytes| bytes[0])
    }
}

/// This node's truncation threshold for records of set `set_name`
/// (`Namespace::truncated_before`; 0 for none, or a set it does not know).
pub fn truncated_before_of(namespace: &Namespace, set_name: &[u8]) -> u64 {
    namespace
        .sets
        .existing_id(set_name)
        .map_or(0, |set_id| namespace.truncated_before(set_id))
}

/// The version of this node's copy of a record — generation, last-update
/// time and void time — (None when absent): what a change, a read-touch
/// included (it keeps the generation), moves.
pub fn version_of(namespace: &Namespace, digest: &Digest) -> Option<(u16, u64, u32)> {
    let partition = namespace.index.partition(digest.partition()).read();
    partition.get(digest).map(|entry| {
        let meta = entry.meta();
        (meta.generation, meta.last_update_ms, meta.void_time)
    })
}

/// The record's current state (after the write that just finished) as a
/// replica write: the stored copy, or a delete marker when it is gone.
pub fn capture(namespace: &Namespace, digest: &Digest, now: Now) -> ReplicaWrite {
    let partition = namespace.index.partition(digest.partition()).read();
    let stored = partition.get(digest).and_then(|entry| {
        let body = namespace.storage.read(&entry.location).ok()?.into_owned();
        Some((entry.meta(), body))
    });
    drop(partition);
    match stored {
        Some((meta, body)) => ReplicaWrite {
            namespace: namespace.config.name.clone(),
            digest: *digest,
            generation: meta.generation,
            life: meta.life,
            durable: false,
            void_time: meta.void_time,
            last_update_ms: meta.last_update_ms,
            set_name: namespace.sets.name(meta.set_id).unwrap_or_default(),
            body: Some(body),
            xdr_write: meta.xdr_write,
        },
        None => {
            let tombstone = namespace
                .index
                .partition(digest.partition())
                .read()
                .tombstone(digest);
            match tombstone {
                Some(tombstone) => delete_marker(namespace, digest, &tombstone),
                // No tombstone kept: a marker without a generation.
                None => ReplicaWrite {
                    namespace: namespace.config.name.clone(),
                    digest: *digest,
                    generation: 0,
                    life: 0,
                    durable: false,
                    void_time: 0,
                    last_update_ms: now.unix_ms,
                    set_name: Vec::new(),
                    body: None,
                    xdr_write: false,
                },
            }
        }
    }
}

/// The delete marker of a record this node keeps the tombstone of.
pub fn delete_marker(
    namespace: &Namespace,
    digest: &Digest,
    tombstone: &Tombstone,
) -> ReplicaWrite {
    ReplicaWrite {
        namespace: namespace.config.name.clone(),
        digest: *digest,
        generation: tombstone.generation,
        life: tombstone.life,
        durable: tombstone.durable,
        void_time: 0,
        last_update_ms: tombstone.last_update_ms,
        set_name: namespace.sets.name(tombstone.set_id).unwrap_or_default(),
        body: None,
        xdr_write: tombstone.xdr_write,
    }
}

/// This node's live copy of a record as a replica write, or a delete
/// marker when it keeps the record's tombstone.
pub fn fetch(namespace: &Namespace, digest: &Digest, now: Now) -> Option<ReplicaWrite> {
    let partition = namespace.index.partition(digest.partition()).read();
    fetch_in(namespace, &partition, digest, now)
}

/// [`fetch`] from `partition`, the record's index partition, which the
/// caller holds locked.
pub fn fetch_in(
    namespace: &Namespace,
    partition: &citrine_index::PartitionIndex,
    digest: &Digest,
    now: Now,
) -> Option<ReplicaWrite> {
    let Some(entry) = partition.get(digest) else {
        // A delete this node knows of travels as a delete marker.
        let tombstone = partition.tombstone(digest)?;
        return Some(delete_marker(namespace, digest, &tombstone));
    };
    if !record::is_live(namespace, &entry.meta(), now) {
        return None;
    }
    let body = namespace.storage.read(&entry.location).ok()?.into_owned();
    let meta = entry.meta();
    Some(ReplicaWrite {
        namespace: namespace.config.name.clone(),
        digest: *digest,
        generation: meta.generation,
        life: meta.life,
        durable: false,
        void_time: meta.void_time,
        last_update_ms: meta.last_update_ms,
        set_name: namespace.sets.name(meta.set_id).unwrap_or_default(),
        body: Some(body),
        xdr_write: meta.xdr_write,
    })
}

/// True when the local copy (`meta`) wins over `write` or ties with it
/// under the namespace's conflict-resolution policy, so `write` is not
/// applied. A delete marker carries its tombstone's generation (the
/// deleted copy's next) and competes like a record; one without a
/// generation (no tombstone known) wins only with a later last-update
/// time, whatever the policy.
fn holds_newer(policy: ConflictResolutionPolicy, meta: &RecordMeta, write: &ReplicaWrite) -> bool {
    if write.body.is_none() && write.generation == 0 {
        // A marker from a master that kept no tombstone.
        return meta.last_update_ms >= write.last_update_ms;
    }
    copy_holds(policy, Version::of(meta), write.version())
}

/// True when a copy of version `held` wins over or ties with one of
/// version `other` under `policy`: it need not be replaced (the delta of
/// a migration leaves such records out).
pub fn copy_holds(policy: ConflictResolutionPolicy, held: Version, other: Version) -> bool {
    compare_versions(policy, held, other) != std::cmp::Ordering::Less
}

/// Whether a copy may be stored in a partition this node is not a replica
/// of. The check for [`Admit::IfHeld`] runs under the partition's write
/// lock, the lock a migration's drop of the copy takes too
/// (the distribution layer's `Distribution::drop_copy`): a drop comes wholly before the check (the
/// copy is refused) or wholly after the store (the copy goes with the
/// rest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Stored whatever this node holds of the partition.
    Always,
    /// Stored only while this node still holds a record or tombstone of
    /// the partition; otherwise refused with [`ResultCode::Unavailable`].
    IfHeld,
}

/// Applies a copy of a record from another node to this node's copy, by
/// the replica-write rule: stored when it wins, as a record or as a
/// tombstone (see the module doc). `truncated_before` is the sender's
/// truncation threshold for the record's set (0: none known): a copy, held
/// or incoming, from before it counts as absent. With [`Admit::IfHeld`] the
/// copy is refused (11) unless this node still holds something of the
/// partition, checked under the lock a migration's drop takes too.
pub fn store_copy(
    namespace: &Namespace,
    write: &ReplicaWrite,
    now: Now,
    truncated_before: u64,
    admit: Admit,
) -> Result<(), ResultCode> {
    // The caller found the namespace by the copy's name: storing it in
    // another one would be this node's bug, not the sender's.
    assert_eq!(
        write.namespace, namespace.config.name,
        "a copy is stored in the namespace it names"
    );
    // A malformed copy from a peer is refused rather than indexed.
    write.check()?;
    let set_id = namespace
        .sets
        .id_of(&write.set_name)
        .ok_or(ResultCode::Parameter)?;
    if write.body.is_some()
        && (namespace.is_truncated(set_id, write.last_update_ms)
            || write.last_update_ms < truncated_before)
    {
        // A copy from before a truncation (a node that missed it, or a
        // write that crossed it, here or at the sender): acknowledged and
        // not stored.
        return Ok(());
    }
    namespace.serving(write.digest.partition())?;
    let mut partition = namespace.index.partition(write.digest.partition()).write();
    if admit == Admit::IfHeld && partition.len() + partition.tombstone_count() == 0 {
        return Err(ResultCode::Unavailable);
    }
    if held_wins(namespace, &partition, write, now, truncated_before) {
        return Ok(());
    }
    match &write.body {
        Some(body) => {
            let meta = RecordMeta {
                generation: write.generation,
                life: write.life,
                set_id,
                void_time: write.void_time,
                last_update_ms: write.last_update_ms,
                xdr_write: write.xdr_write,
            };
            // With room for the memory engine's length prefix: kept, not
            // copied again.
            let mut stored = Vec::with_capacity(body.len() + MEMORY_BODY_SPARE);
            stored.extend_from_slice(body);
            let previous = store::install(namespace, &mut partition, write.digest, meta, stored)?;
            drop(partition);
            if let Some(old) = previous {
                old.release(namespace);
            }
            Ok(())
        }
        None => store_delete(namespace, partition, write, set_id),
    }
}

/// Whether this node's copy — its live record, else its tombstone — wins
/// over (or ties with) the incoming one, so it is kept. A held copy that is
/// dead (expired or truncated here, or expired before the incoming copy was
/// written, whatever this node's clock says, or truncated by the sender's
/// threshold, which this node may not know yet) counts as absent: it wins
/// over nothing, as in the manifests a migration compares against. (The
/// master writes a record afresh at generation 1 over its own expired or
/// truncated copy.) A tombstone keeps out a stored copy that does not win
/// over it: deleted here later than that copy was written.
fn held_wins(
    namespace: &Namespace,
    partition: &PartitionIndex,
    write: &ReplicaWrite,
    now: Now,
    truncated_before: u64,
) -> bool {
    let policy = namespace.config.conflict_resolution_policy;
    let written_at = Now::from_unix_ms(write.last_update_ms).citrusleaf_seconds;
    let held = partition
        .get(&write.digest)
        .map(IndexEntry::meta)
        .filter(|meta| {
            record::is_live(namespace, meta, now)
                && !meta.is_expired(written_at)
                && meta.last_update_ms >= truncated_before
        });
    if let Some(meta) = held {
        return holds_newer(policy, &meta, write);
    }
    partition
        .tombstone(&write.digest)
        .filter(|tombstone| tombstone.last_update_ms >= truncated_before)
        .is_some_and(|tombstone| {
            write.body.is_some()
                && copy_holds(policy, Version::of_tombstone(&tombstone), write.version())
        })
}

/// Stores a delete marker that won: the record held here goes (its
/// tombstone made durable first on a device), or, where there is none, the
/// marker's tombstone is kept so an older copy arriving later stays out.
fn store_delete(
    namespace: &Namespace,
    mut partition: citrine_index::PartitionWriteGuard<'_>,
    write: &ReplicaWrite,
    set_id: u16,
) -> Result<(), ResultCode> {
    let Some(entry) = partition.get(&write.digest) else {
        if write.generation != 0 {
            let tombstone = Tombstone {
                generation: write.generation,
                life: write.life,
                durable: write.durable,
                last_update_ms: write.last_update_ms,
                set_id,
                xdr_write: write.xdr_write,
            };
            partition.set_tombstone(write.digest, tombstone);
        }
        return Ok(());
    };
    // A marker without a generation (its sender kept no tombstone)
    // deletes the copy held here in its life.
    let held = entry.meta();
    let (generation, life) = match write.generation {
        0 => (RecordMeta::next_generation(held.generation), held.life),
        generation => (generation, write.life),
    };
    if namespace.storage.device().is_some() {
        let set_name = namespace.sets.name(held.set_id).unwrap_or_default();
        let meta = StoreMeta {
            generation,
            life,
            void_time: crate::device::tombstone_void_time(write.durable, write.xdr_write),
            last_update_ms: write.last_update_ms,
            set_name: &set_name,
        };
        namespace
            .storage
            .write_tombstone(&write.digest, &meta)
            .map_err(store::storage_result)?;
    }
    if let Some(entry) = partition.remove(&write.digest) {
        namespace.unindex(&write.digest, &entry);
        let tombstone = Tombstone {
            generation,
            life,
            durable: write.durable,
            last_update_ms: write.last_update_ms,
            set_id: entry.meta().set_id,
            xdr_write: write.xdr_write,
        };
        partition.set_tombstone(write.digest, tombstone);
        drop(partition);
        store::drop_entry(namespace, entry);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn sample(body: Option<Vec<u8>>) -> ReplicaWrite {
        ReplicaWrite {
            namespace: "test".into(),
            digest: Digest([7; DIGEST_SIZE]),
            generation: 3,
            life: 0,
            durable: false,
            void_time: 1_000_000_000, // live: expires after the test clock's now
            last_update_ms: 99_000,
            set_name: b"demo".to_vec(),
            body,
            xdr_write: false,
        }
    }

    #[test]
    fn replica_write_round_trip_and_garbage() {
        let durable_delete = ReplicaWrite {
            life: 17,
            durable: true,
            ..sample(None)
        };
        let later_life = ReplicaWrite {
            life: citrine_index::LIVES - 1,
            ..sample(Some(vec![4]))
        };
        let marked = |write: ReplicaWrite| ReplicaWrite {
            xdr_write: true,
            ..write
        };
        for write in [
            sample(Some(vec![1, 2, 3])),
            sample(None),
            marked(sample(Some(vec![5]))),
            marked(durable_delete.clone()),
            durable_delete,
            later_life,
        ] {
            let bytes = write.encode();
            assert_eq!(ReplicaWrite::decode(&bytes), Some(write));
            for cut in 0..bytes.len() {
                assert_eq!(ReplicaWrite::decode(&bytes[..cut]), None, "cut {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(ReplicaWrite::decode(&longer), None);
            let mut bad_kind = bytes;
            bad_kind[0] = 9;
            assert_eq!(ReplicaWrite::decode(&bad_kind), None);
        }
        // A life out of range is malformed.
        let mut bad_life = sample(None).encode();
        let at = 2 + "test".len() + DIGEST_SIZE + 2;
        bad_life[at..at + 2].copy_from_slice(&citrine_index::LIVES.to_be_bytes());
        assert_eq!(ReplicaWrite::decode(&bad_life), None);
        // A last-update time past the index's 42 bits arrives as the
        // index would hold it, so stored and incoming copies compare alike.
        let mut late = sample(None);
        late.last_update_ms = u64::MAX;
        let decoded = ReplicaWrite::decode(&late.encode()).expect("decodes");
        assert_eq!(decoded.last_update_ms, MAX_LAST_UPDATE_MS);
    }

    #[test]
    fn check_refuses_copies_no_node_sends() {
        let record = || sample(Some(vec![1]));
        let fine = [
            record(),
            sample(None),
            // A delete marker from a master that kept no tombstone.
            ReplicaWrite {
                generation: 0,
                ..sample(None)
            },
            ReplicaWrite {
                durable: true,
                ..sample(None)
            },
            ReplicaWrite {
                set_name: vec![b's'; SET_NAME_MAX],
                last_update_ms: MAX_LAST_UPDATE_MS,
                life: citrine_index::LIVES - 1,
                ..record()
            },
        ];
        for write in fine {
            assert_eq!(write.check(), Ok(()), "{write:?}");
        }
        let malformed = [
            ReplicaWrite {
                generation: 0,
                ..record()
            },
            ReplicaWrite {
                durable: true,
                ..record()
            },
            ReplicaWrite {
                life: citrine_index::LIVES,
                ..sample(None)
            },
            ReplicaWrite {
                last_update_ms: MAX_LAST_UPDATE_MS + 1,
                ..sample(None)
            },
            ReplicaWrite {
                set_name: vec![b's'; SET_NAME_MAX + 1],
                ..record()
            },
            ReplicaWrite {
                set_name: b"a\0".to_vec(),
                ..sample(None)
            },
        ];
        for write in malformed {
            assert_eq!(write.check(), Err(ResultCode::Parameter), "{write:?}");
        }
    }

    #[test]
    fn newer_copies_win_under_each_policy() {
        use ConflictResolutionPolicy::{Generation, LastUpdateTime};
        // The incoming copy: generation 3, last update 99 000.
        let write = sample(Some(vec![1]));
        let meta = |last_update_ms, generation| RecordMeta {
            life: 0,
            generation,
            set_id: 0,
            void_time: 0,
            last_update_ms,
            xdr_write: false,
        };
        // (local last update, local generation, kept under generation,
        // kept under last-update-time)
        let cases = [
            (99_000, 3, true, true),   // identical: keep ours
            (99_000, 4, true, true),   // same time, more writes
            (99_000, 2, false, false), // same time, fewer writes
            (99_001, 3, true, true),   // same writes, later
            (98_999, 3, false, false), // same writes, earlier
            (99_001, 1, false, true),  // later but fewer writes
            (98_999, 9, true, false),  // more writes but earlier
        ];
        for (last_update_ms, generation, by_generation, by_time) in cases {
            let local = meta(last_update_ms, generation);
            assert_eq!(
                holds_newer(Generation, &local, &write),
                by_generation,
                "generation policy, local {local:?}"
            );
            assert_eq!(
                holds_newer(LastUpdateTime, &local, &write),
                by_time,
                "last-update-time policy, local {local:?}"
            );
        }
        // A delete marker without a generation (no tombstone known at its
        // master) goes by time under both.
        let delete = ReplicaWrite {
            generation: 0,
            life: 0,
            durable: false,
            ..sample(None)
        };
        for policy in ConflictResolutionPolicy::ALL {
            assert!(holds_newer(policy, &meta(99_000, 1), &delete));
            assert!(holds_newer(policy, &meta(99_001, 1), &delete));
            assert!(!holds_newer(policy, &meta(98_999, 9), &delete));
        }
        // One with its tombstone's generation competes like a record.
        let delete = sample(None);
        assert!(holds_newer(Generation, &meta(98_999, 9), &delete));
        assert!(!holds_newer(LastUpdateTime, &meta(98_999, 9), &delete));
        assert!(!holds_newer(Generation, &meta(99_500, 2), &delete));
    }
}
