//! Migrations: after a view change, copying partitions to the nodes of
//! their new replica lists that may not hold them (papers §2.2.1).
//!
//! The service owns the bookkeeping and the record work; the server runs
//! the sending loop on its own thread (`citrine-migrate`), off the client
//! path, through the same [`Fabric`](crate::replication::Fabric) as
//! replica writes.
//!
//! Planning (`Service::plan_migrations`, run when a view is published): for each
//! namespace and partition, with `old` the partition's replica list in this
//! node's **base** map and `new` its list in the published map, the
//! *sender* is the first node of `old` still a member of the new view (the
//! old master, or the first surviving old replica when the master left).
//! When that is this node, the partition holds records here, and
//! `new \ old \ {self}` is not empty, the partition is queued for those
//! targets. Queued partitions run smallest first.
//!
//! The base is the last map under which this node finished every migration
//! it planned (at start, the map of the node alone). A view change in the
//! middle of migrations replaces the plan (the epoch moves on; running
//! partitions stop at their next batch), but keeps the older base, so a
//! node that was to receive a partition under the interrupted plan is still
//! a target in the next one.
//!
//! Sending (`MIGRATE` fabric calls, [`MigrateBatch`]): every record of the
//! partition, read under its partition read lock one batch at a time, as a
//! [`ReplicaWrite`] (full state: meta, set, body); one batch in flight per
//! partition and target, an ack per batch; the last batch carries
//! [`FLAG_LAST`]. The receiver applies each record with the replica-write
//! rule (only when newer than its copy: last-update time, then generation),
//! so migrations and concurrent client writes never regress a record, and
//! resends are harmless.
//!
//! Invariants:
//! - `tx_remaining` counts the partitions of the current plan not finished
//!   yet; it is set when the plan is made (synchronously with the publish),
//!   so `cluster-stable` never sees a view with migrations not counted yet;
//! - `rx_remaining` counts partitions whose first batch arrived under the
//!   current cluster key and whose last has not; a publish clears it;
//! - no lock is held across an await (the sender holds a partition lock
//!   only while it copies one batch).
//!
//! Duplicate resolution: planning also lists the partitions this node
//! masters but did not hold under its base (all it masters when the base
//! is its own single-node map) as *incoming*; a single-record transaction
//! on an incoming partition first fetches the record from every other
//! member (`crate::replication`, `DUPRES`) and applies the newest copy.
//! A partition stops being incoming when its LAST batch arrives, when every
//! member answers that it has nothing left to send of it
//! ([`Migrations::sent_all`]), or when the server's sweep (`PENDING`
//! calls, [`Migrations::incoming_retain`]) finds no member still sending
//! it. The steady-state check is one relaxed load.
//!
//! Not yet: partition versions and delta migration (every record of a
//! partition is sent), acting masters,
//! tombstones (deletes are not migrated: a node holding a stale copy of a
//! record deleted while it was away keeps it), dropping copies a node no
//! longer needs, hottest-first ordering. The base is this node's own
//! notion of "done": a receiver whose sender died in the middle of a
//! partition keeps a partial copy until a later plan lists it as a new
//! replica again (partition versions will tell).

use crate::cluster_state::ClusterState;
use crate::replication::ReplicaWrite;
use crate::Service;
use citrine_types::{Digest, NodeId, PartitionId, ResultCode, PARTITIONS};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// The last batch of a partition.
pub const FLAG_LAST: u8 = 1;
/// The first batch of a partition.
pub const FLAG_FIRST: u8 = 2;
/// Most records in one batch.
pub const BATCH_RECORDS: usize = 512;
/// A batch is closed once its records take this many bytes.
pub const BATCH_BYTES: usize = 1 << 20;
/// Default most partitions migrated at once by one node.
pub const MAX_PARTITIONS_DEFAULT: u32 = 4;

/// One partition to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateTask {
    pub namespace: String,
    pub partition: PartitionId,
    pub targets: Vec<NodeId>,
    /// Records when planned (the order key: smallest first).
    pub records: usize,
}

#[derive(Debug, Default)]
struct State {
    /// The map under which every planned migration finished.
    base: Option<Arc<ClusterState>>,
    /// The map the current plan was made for.
    current: Option<Arc<ClusterState>>,
    /// Partitions of the current plan not finished: (namespace, partition).
    pending: HashSet<(String, u16)>,
    /// Partitions being received under the current cluster key.
    receiving: HashSet<(String, u16)>,
    /// Partitions this node masters in the current map whose records may
    /// still be elsewhere: duplicate resolution runs for them.
    incoming: HashSet<(String, u16)>,
    cluster_key: u64,
}

/// A node's migration bookkeeping.
#[derive(Debug)]
pub struct Migrations {
    state: Mutex<State>,
    /// Bumped by every plan; a running partition whose epoch is stale stops.
    epoch: AtomicU64,
    tasks: Mutex<Vec<MigrateTask>>,
    tx_remaining: AtomicU64,
    rx_remaining: AtomicU64,
    /// Size of `incoming` (the one check on the steady-state path).
    incoming_count: AtomicU64,
    /// Duplicate resolutions run (a fetch from the other members).
    pub dupres_runs: AtomicU64,
    /// Most partitions sent at once (`migrate-max-partitions`).
    pub max_partitions: AtomicU32,
    /// Pause after each acknowledged batch, microseconds (`migrate-sleep`).
    pub sleep_us: AtomicU32,
    /// Records sent and acknowledged / received and applied.
    pub records_sent: AtomicU64,
    pub records_received: AtomicU64,
    pub partitions_sent: AtomicU64,
}

impl Default for Migrations {
    fn default() -> Self {
        Migrations {
            state: Mutex::new(State::default()),
            epoch: AtomicU64::new(0),
            tasks: Mutex::new(Vec::new()),
            tx_remaining: AtomicU64::new(0),
            rx_remaining: AtomicU64::new(0),
            incoming_count: AtomicU64::new(0),
            dupres_runs: AtomicU64::new(0),
            max_partitions: AtomicU32::new(MAX_PARTITIONS_DEFAULT),
            sleep_us: AtomicU32::new(0),
            records_sent: AtomicU64::new(0),
            records_received: AtomicU64::new(0),
            partitions_sent: AtomicU64::new(0),
        }
    }
}

impl Migrations {
    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Partitions this node still has to send.
    pub fn tx_remaining(&self) -> u64 {
        self.tx_remaining.load(Ordering::Relaxed)
    }

    /// Partitions this node is receiving.
    pub fn rx_remaining(&self) -> u64 {
        self.rx_remaining.load(Ordering::Relaxed)
    }

    /// Partitions of `namespace` still to send / being received.
    pub fn namespace_remaining(&self, namespace: &str) -> (u64, u64) {
        let state = self.state.lock();
        let count = |set: &HashSet<(String, u16)>| {
            set.iter().filter(|(name, _)| name == namespace).count() as u64
        };
        (count(&state.pending), count(&state.receiving))
    }

    /// The tasks of the current plan (taken once by the sender), with its
    /// epoch and cluster key.
    pub fn take_tasks(&self) -> (u64, u64, Vec<MigrateTask>) {
        let state = self.state.lock();
        let epoch = self.epoch();
        let tasks = std::mem::take(&mut *self.tasks.lock());
        (epoch, state.cluster_key, tasks)
    }

    /// Marks a partition of plan `epoch` sent; the base moves on when the
    /// plan is complete.
    pub fn finished(&self, epoch: u64, namespace: &str, partition: PartitionId) {
        let mut state = self.state.lock();
        if self.epoch() != epoch {
            return;
        }
        if state
            .pending
            .remove(&(namespace.to_owned(), partition.index() as u16))
        {
            self.partitions_sent.fetch_add(1, Ordering::Relaxed);
        }
        self.tx_remaining
            .store(state.pending.len() as u64, Ordering::Relaxed);
        if state.pending.is_empty() {
            state.base = state.current.clone();
        }
    }

    /// The cluster key to resolve duplicates under when `partition` of
    /// `namespace` is mastered here with its incoming migration not
    /// finished; `None` otherwise. One relaxed load when no partition is
    /// incoming (the steady state).
    #[inline]
    pub fn dupres_key(&self, namespace: &str, partition: PartitionId) -> Option<u64> {
        if self.incoming_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let state = self.state.lock();
        state
            .incoming
            .contains(&(namespace.to_owned(), partition.index() as u16))
            .then_some(state.cluster_key)
    }

    /// The incoming migration of a partition is over under `cluster_key`
    /// (its last batch arrived, or every other member has nothing more to
    /// send): no more duplicate resolution for it.
    pub fn incoming_done(&self, cluster_key: u64, namespace: &str, partition: u16) {
        let mut state = self.state.lock();
        if state.cluster_key != cluster_key {
            return;
        }
        state.incoming.remove(&(namespace.to_owned(), partition));
        self.incoming_count
            .store(state.incoming.len() as u64, Ordering::Relaxed);
    }

    /// True when this node has nothing (more) to send of `partition` under
    /// `cluster_key`: it made its plan for that key and the partition is not
    /// pending in it.
    pub fn sent_all(&self, cluster_key: u64, namespace: &str, partition: u16) -> bool {
        let state = self.state.lock();
        state.cluster_key == cluster_key
            && !state.pending.contains(&(namespace.to_owned(), partition))
    }

    /// When some partition is incoming: the cluster key and the namespaces
    /// with incoming partitions.
    pub fn incoming_namespaces(&self) -> Option<(u64, Vec<String>)> {
        if self.incoming_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let state = self.state.lock();
        let mut names: Vec<String> = state
            .incoming
            .iter()
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names.dedup();
        Some((state.cluster_key, names))
    }

    /// The partitions of `namespace` this node still has to send under
    /// `cluster_key`; `None` when its plan is not for that key.
    pub fn pending_for(&self, cluster_key: u64, namespace: &str) -> Option<Vec<u16>> {
        let state = self.state.lock();
        (state.cluster_key == cluster_key).then(|| {
            state
                .pending
                .iter()
                .filter(|(name, _)| name == namespace)
                .map(|(_, partition)| *partition)
                .collect()
        })
    }

    /// Every other member answered its pending partitions of `namespace`
    /// under `cluster_key`: incoming partitions none of them still has to
    /// send are complete here.
    pub fn incoming_retain(&self, cluster_key: u64, namespace: &str, still: &HashSet<u16>) {
        let mut state = self.state.lock();
        if state.cluster_key != cluster_key {
            return;
        }
        state
            .incoming
            .retain(|(name, partition)| name != namespace || still.contains(partition));
        self.incoming_count
            .store(state.incoming.len() as u64, Ordering::Relaxed);
    }

    /// A batch arrived: tracks the partitions being received.
    fn received(&self, cluster_key: u64, namespace: &str, partition: u16, flags: u8) {
        let mut state = self.state.lock();
        if state.cluster_key != cluster_key {
            return;
        }
        let key = (namespace.to_owned(), partition);
        if flags & FLAG_LAST != 0 {
            state.receiving.remove(&key);
            state.incoming.remove(&key);
            self.incoming_count
                .store(state.incoming.len() as u64, Ordering::Relaxed);
        } else if flags & FLAG_FIRST != 0 {
            state.receiving.insert(key);
        }
        self.rx_remaining
            .store(state.receiving.len() as u64, Ordering::Relaxed);
    }
}

impl Service {
    /// Plans the migrations of a newly published view (see the module doc).
    pub(crate) fn plan_migrations(&self, published: Arc<ClusterState>) {
        let migrations = &self.migrations;
        let mut state = migrations.state.lock();
        let base = state
            .base
            .get_or_insert_with(|| {
                Arc::new(ClusterState::single(
                    self.node_id,
                    self.config.access_address.clone(),
                    &Service::namespace_factors(&self.config),
                ))
            })
            .clone();
        let mut tasks = Vec::new();
        let mut incoming = HashSet::new();
        // A node whose base is its own single-node map (it just started or
        // came back) holds nothing the cluster wrote meanwhile: every
        // partition it masters in a view with others is incoming.
        let joining = base.members.len() <= 1 && published.members.len() > 1;
        for namespace in self.namespaces() {
            let name = &namespace.config.name;
            let (Some(old), Some(new)) = (base.namespace(name), published.namespace(name)) else {
                continue;
            };
            for pid in 0..PARTITIONS as u16 {
                let Some(partition) = PartitionId::new(pid) else {
                    continue;
                };
                let old_list = old.map.replicas(partition);
                if published.members.len() > 1
                    && new.map.replicas(partition).first() == Some(&self.node_id)
                    && (joining || !old_list.contains(&self.node_id))
                {
                    incoming.insert((name.clone(), pid));
                }
                let sender = old_list.iter().find(|node| {
                    published
                        .members
                        .iter()
                        .any(|member| member.node_id == **node)
                });
                if sender != Some(&self.node_id) {
                    continue;
                }
                let targets: Vec<NodeId> = new
                    .map
                    .replicas(partition)
                    .iter()
                    .copied()
                    .filter(|node| *node != self.node_id && !old_list.contains(node))
                    .collect();
                if targets.is_empty() {
                    continue;
                }
                let records = namespace.index.partition(partition).read().len();
                if records == 0 {
                    continue;
                }
                tasks.push(MigrateTask {
                    namespace: name.clone(),
                    partition,
                    targets,
                    records,
                });
            }
        }
        // Smallest first (§2.2.1.4.1); ties by partition id.
        tasks.sort_by_key(|task| (task.records, task.partition.index()));
        state.pending = tasks
            .iter()
            .map(|task| (task.namespace.clone(), task.partition.index() as u16))
            .collect();
        state.receiving.clear();
        migrations
            .incoming_count
            .store(incoming.len() as u64, Ordering::Relaxed);
        state.incoming = incoming;
        state.cluster_key = published.cluster_key;
        if tasks.is_empty() {
            state.base = Some(published.clone());
        }
        state.current = Some(published);
        migrations
            .tx_remaining
            .store(tasks.len() as u64, Ordering::Relaxed);
        migrations.rx_remaining.store(0, Ordering::Relaxed);
        if !tasks.is_empty() {
            tracing::info!(partitions = tasks.len(), "migrations planned");
        }
        *migrations.tasks.lock() = tasks;
        migrations.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The digests of a partition's records, in no particular order.
    pub fn migration_digests(&self, namespace: &str, partition: PartitionId) -> Vec<Digest> {
        self.namespace(namespace.as_bytes())
            .map(|namespace| {
                let index = namespace.index.partition(partition).read();
                index.iter().map(|(digest, _)| *digest).collect()
            })
            .unwrap_or_default()
    }

    /// Encodes the records of `digests` still live as one batch of
    /// partition `partition`; returns the batch and how many digests it
    /// consumed (at most [`BATCH_RECORDS`], fewer once [`BATCH_BYTES`] is
    /// reached).
    pub fn migration_batch(
        &self,
        cluster_key: u64,
        namespace_name: &str,
        partition: PartitionId,
        digests: &[Digest],
        flags: u8,
    ) -> (MigrateBatch, usize) {
        let mut batch = MigrateBatch {
            cluster_key,
            flags,
            namespace: namespace_name.to_owned(),
            partition: partition.index() as u16,
            records: Vec::new(),
        };
        let Some(namespace) = self.namespace(namespace_name.as_bytes()) else {
            return (batch, digests.len());
        };
        let now = self.now();
        let index = namespace.index.partition(partition).read();
        let mut bytes = 0;
        let mut consumed = 0;
        for digest in digests.iter().take(BATCH_RECORDS) {
            consumed += 1;
            let Some(entry) = index.get(digest) else {
                continue;
            };
            if !crate::transaction::is_live(namespace, &entry.meta, now) {
                continue;
            }
            let Ok(body) = namespace.storage.read(&entry.location) else {
                continue;
            };
            let write = ReplicaWrite {
                namespace: namespace_name.to_owned(),
                digest: *digest,
                generation: entry.meta.generation,
                void_time: entry.meta.void_time,
                last_update_ms: entry.meta.last_update_ms,
                set_name: namespace.sets.name(entry.meta.set_id).unwrap_or_default(),
                body: Some(body.into_owned()),
            }
            .encode();
            bytes += write.len();
            batch.records.push(write);
            if bytes >= BATCH_BYTES {
                break;
            }
        }
        drop(index);
        if consumed == digests.len() {
            batch.flags |= FLAG_LAST;
        }
        (batch, consumed)
    }

    /// Applies a received batch; the answer is one result-code byte.
    pub(crate) fn apply_migrate_batch(&self, payload: &[u8]) -> ResultCode {
        let Some(batch) = MigrateBatch::decode(payload) else {
            return ResultCode::Parameter;
        };
        if self.namespace(batch.namespace.as_bytes()).is_none() {
            return ResultCode::Namespace;
        }
        self.migrations.received(
            batch.cluster_key,
            &batch.namespace,
            batch.partition,
            batch.flags & FLAG_FIRST,
        );
        for record in &batch.records {
            let Some(write) = ReplicaWrite::decode(record) else {
                return ResultCode::Parameter;
            };
            if write.namespace != batch.namespace
                || write.digest.partition().index() != usize::from(batch.partition)
            {
                return ResultCode::Parameter;
            }
            let code = crate::replication::apply_replica_write(self, &write);
            if code != ResultCode::Ok {
                return code;
            }
        }
        self.migrations
            .records_received
            .fetch_add(batch.records.len() as u64, Ordering::Relaxed);
        if batch.flags & FLAG_LAST != 0 {
            self.migrations.received(
                batch.cluster_key,
                &batch.namespace,
                batch.partition,
                FLAG_LAST,
            );
        }
        ResultCode::Ok
    }
}

/// One batch of a partition's records: `u64 cluster key | u8 flags | u8 ns
/// len | ns | u16 partition | u32 count | count × (u32 len | replica
/// write)`, big-endian.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateBatch {
    pub cluster_key: u64,
    pub flags: u8,
    pub namespace: String,
    pub partition: u16,
    /// Encoded [`ReplicaWrite`]s.
    pub records: Vec<Vec<u8>>,
}

impl MigrateBatch {
    pub fn encode(&self) -> Vec<u8> {
        let size: usize = self.records.iter().map(|record| record.len() + 4).sum();
        let mut out = Vec::with_capacity(20 + self.namespace.len() + size);
        out.extend_from_slice(&self.cluster_key.to_be_bytes());
        out.push(self.flags);
        let namespace = &self.namespace.as_bytes()[..self.namespace.len().min(255)];
        out.push(namespace.len() as u8);
        out.extend_from_slice(namespace);
        out.extend_from_slice(&self.partition.to_be_bytes());
        out.extend_from_slice(&(self.records.len() as u32).to_be_bytes());
        for record in &self.records {
            out.extend_from_slice(&(record.len() as u32).to_be_bytes());
            out.extend_from_slice(record);
        }
        out
    }

    /// Decodes; `None` for anything malformed (including trailing bytes).
    pub fn decode(bytes: &[u8]) -> Option<MigrateBatch> {
        let mut at = 0usize;
        let mut take = |length: usize| -> Option<&[u8]> {
            let slice = bytes.get(at..at.checked_add(length)?)?;
            at += length;
            Some(slice)
        };
        let cluster_key = u64::from_be_bytes(take(8)?.try_into().ok()?);
        let flags = take(1)?[0];
        let namespace_len = usize::from(take(1)?[0]);
        let namespace = std::str::from_utf8(take(namespace_len)?).ok()?.to_owned();
        let partition = u16::from_be_bytes(take(2)?.try_into().ok()?);
        if usize::from(partition) >= PARTITIONS {
            return None;
        }
        let count = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
        let mut records = Vec::with_capacity(count.min(BATCH_RECORDS));
        for _ in 0..count {
            let length = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
            records.push(take(length)?.to_vec());
        }
        if at != bytes.len() {
            return None;
        }
        Some(MigrateBatch {
            cluster_key,
            flags,
            namespace,
            partition,
            records,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster_state::ClusterMember;

    fn service(node_id: u64) -> Service {
        let config = crate::config::ServiceConfig {
            node_id,
            cluster_name: "citrine".into(),
            access_address: "127.0.0.1:3000".into(),
            port: 3000,
            namespaces: vec![crate::config::NamespaceConfig::in_memory("test")],
        };
        Service::new(config, Arc::new(crate::ManualClock::new(1_700_000_000_000)))
    }

    fn state(self_id: u64, key: u64, members: &[u64]) -> ClusterState {
        let members = members
            .iter()
            .map(|id| ClusterMember {
                node_id: NodeId(*id),
                rack_id: 0,
                service_address: String::new(),
            })
            .collect();
        ClusterState::new(NodeId(self_id), key, members, &[("test".into(), 2)], 2, 2)
    }

    fn record(partition: u16, seed: u8, generation: u16) -> ReplicaWrite {
        let mut digest = [seed; 20];
        digest[0] = (partition & 0xFF) as u8;
        digest[1] = (partition >> 8) as u8;
        ReplicaWrite {
            namespace: "test".into(),
            digest: Digest(digest),
            generation,
            void_time: 0,
            last_update_ms: 1_700_000_000_000 - 1000 + u64::from(generation),
            set_name: b"demo".to_vec(),
            body: Some(vec![seed, 1, 2]),
        }
    }

    #[test]
    fn batch_round_trip_and_garbage() {
        let batch = MigrateBatch {
            cluster_key: 0xABCD,
            flags: FLAG_FIRST | FLAG_LAST,
            namespace: "test".into(),
            partition: 4095,
            records: vec![record(4095, 1, 1).encode(), vec![]],
        };
        let bytes = batch.encode();
        assert_eq!(MigrateBatch::decode(&bytes), Some(batch.clone()));
        for cut in 0..bytes.len() {
            assert_eq!(MigrateBatch::decode(&bytes[..cut]), None, "cut {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(MigrateBatch::decode(&longer), None);
        let bad_partition = MigrateBatch {
            partition: 4096,
            ..batch
        };
        assert_eq!(MigrateBatch::decode(&bad_partition.encode()), None);
    }

    #[test]
    fn the_old_master_plans_sends_and_the_receiver_applies_newer_copies() {
        let sender = service(1);
        let receiver = service(2);
        // Node 1 alone holds records in partitions 5 and 9 (more in 9).
        for write in [record(5, 1, 1), record(9, 2, 1), record(9, 3, 1)] {
            assert_eq!(
                crate::replication::apply_replica_write(&sender, &write),
                ResultCode::Ok
            );
        }
        sender.publish_cluster(state(1, 7, &[1]));
        assert_eq!(sender.migrations.tx_remaining(), 0);
        // Node 2 joins: node 1 was the only copy, so it sends every
        // partition with records whose new list has node 2; smallest first.
        let joined = state(1, 8, &[1, 2]);
        let targets = |pid: u16| {
            joined.namespaces[0]
                .map
                .replicas(PartitionId::new(pid).expect("pid"))
                .to_vec()
        };
        assert!(targets(5).contains(&NodeId(2)) && targets(9).contains(&NodeId(2)));
        sender.publish_cluster(joined);
        receiver.publish_cluster(state(2, 8, &[1, 2]));
        assert_eq!(sender.migrations.tx_remaining(), 2);
        assert_eq!(sender.migrations.namespace_remaining("test"), (2, 0));
        let (epoch, key, tasks) = sender.migrations.take_tasks();
        assert_eq!(key, 8);
        let order: Vec<(usize, usize)> = tasks
            .iter()
            .map(|task| (task.partition.index(), task.records))
            .collect();
        assert_eq!(order, vec![(5, 1), (9, 2)]);
        assert!(sender.migrations.take_tasks().2.is_empty());
        // The receiver holds a newer copy of one record: it stays.
        let mut newer = record(9, 3, 5);
        newer.body = Some(vec![9]);
        crate::replication::apply_replica_write(&receiver, &newer);
        for task in &tasks {
            let digests = sender.migration_digests(&task.namespace, task.partition);
            let (batch, consumed) =
                sender.migration_batch(key, &task.namespace, task.partition, &digests, FLAG_FIRST);
            assert_eq!(consumed, digests.len());
            assert_eq!(batch.flags, FLAG_FIRST | FLAG_LAST);
            assert_eq!(
                receiver.apply_migrate_batch(&batch.encode()),
                ResultCode::Ok
            );
            sender
                .migrations
                .finished(epoch, &task.namespace, task.partition);
        }
        assert_eq!(sender.migrations.tx_remaining(), 0);
        assert_eq!(receiver.migrations.rx_remaining(), 0);
        let stored = |service: &Service, write: &ReplicaWrite| {
            let namespace = service.namespace(b"test")?;
            let index = namespace.index.partition(write.digest.partition()).read();
            let entry = index.get(&write.digest)?;
            Some((
                entry.meta.generation,
                namespace.storage.read(&entry.location).ok()?.into_owned(),
            ))
        };
        assert_eq!(
            stored(&receiver, &record(5, 1, 1)),
            Some((1, vec![1, 1, 2]))
        );
        assert_eq!(
            stored(&receiver, &record(9, 2, 1)),
            Some((1, vec![2, 1, 2]))
        );
        assert_eq!(stored(&receiver, &newer), Some((5, vec![9])));
        // The plan finished: the base moved on, the same view plans nothing.
        sender.publish_cluster(state(1, 8, &[1, 2]));
        assert_eq!(sender.migrations.tx_remaining(), 0);
    }

    #[test]
    fn a_view_change_keeps_the_unfinished_base_and_tracks_receiving() {
        let sender = service(1);
        crate::replication::apply_replica_write(&sender, &record(5, 1, 1));
        sender.publish_cluster(state(1, 7, &[1]));
        sender.publish_cluster(state(1, 8, &[1, 2]));
        let (first_epoch, _, tasks) = sender.migrations.take_tasks();
        assert_eq!(tasks.len(), 1);
        // Interrupted: the next view (same members, new key) plans it again.
        sender.publish_cluster(state(1, 9, &[1, 2]));
        sender
            .migrations
            .finished(first_epoch, "test", tasks[0].partition);
        assert_eq!(sender.migrations.tx_remaining(), 1);
        assert_eq!(sender.migrations.take_tasks().2, tasks);
        // A receiver counts a partition from its first batch to its last,
        // under the current cluster key only.
        let receiver = service(2);
        receiver.publish_cluster(state(2, 9, &[1, 2]));
        let batch = |key, flags| {
            MigrateBatch {
                cluster_key: key,
                flags,
                namespace: "test".into(),
                partition: 5,
                records: vec![record(5, 1, 1).encode()],
            }
            .encode()
        };
        assert_eq!(
            receiver.apply_migrate_batch(&batch(8, FLAG_FIRST)),
            ResultCode::Ok
        );
        assert_eq!(receiver.migrations.rx_remaining(), 0);
        receiver.apply_migrate_batch(&batch(9, FLAG_FIRST));
        assert_eq!(receiver.migrations.rx_remaining(), 1);
        assert_eq!(receiver.migrations.namespace_remaining("test"), (0, 1));
        receiver.apply_migrate_batch(&batch(9, 0));
        assert_eq!(receiver.migrations.rx_remaining(), 1);
        receiver.apply_migrate_batch(&batch(9, FLAG_LAST));
        assert_eq!(receiver.migrations.rx_remaining(), 0);
        // Records of another partition than the batch's are refused.
        let mut wrong = MigrateBatch::decode(&batch(9, 0)).expect("batch");
        wrong.partition = 6;
        assert_eq!(
            receiver.apply_migrate_batch(&wrong.encode()),
            ResultCode::Parameter
        );
        assert_eq!(receiver.apply_migrate_batch(&[1, 2]), ResultCode::Parameter);
    }

    #[test]
    fn cluster_stable_waits_for_migrations() {
        let sender = service(1);
        crate::replication::apply_replica_write(&sender, &record(5, 1, 1));
        sender.publish_cluster(state(1, 7, &[1]));
        sender.publish_cluster(state(1, 8, &[1, 2]));
        let ask = |command: &str| {
            let mut out = Vec::new();
            crate::info::handle(&sender, format!("{command}\n").as_bytes(), &mut out);
            String::from_utf8_lossy(&out).into_owned()
        };
        assert!(ask("cluster-stable:size=2").contains("ERROR::unstable-cluster"));
        assert!(ask("statistics").contains("migrate_tx_partitions_remaining=1"));
        assert!(ask("namespace/test").contains("migrate_tx_partitions_remaining=1"));
        assert!(!ask("cluster-stable:size=2;ignore-migrations=true").contains("ERROR"));
        assert!(ask("cluster-stable:size=3").contains("ERROR::cluster not specified size"));
        let (epoch, _, tasks) = sender.migrations.take_tasks();
        sender
            .migrations
            .finished(epoch, "test", tasks[0].partition);
        assert!(!ask("cluster-stable:size=2").contains("ERROR"));
        assert!(ask("statistics").contains("migrate_partitions_remaining=0"));
    }
}
