//! The roll of expired transactions by the node (issue 40 point 2), as the
//! server's `citrine-txn` thread runs it once a second
//! ([`Service::run_txn_recovery`]).
//!
//! A node alone rolls its own copies (`citrine_data::txn::recovery`). In a
//! cluster the transaction's records have other masters and every roll
//! must reach every replica, so the steps run as requests through the
//! request path (routed to the record's master, replicated there before
//! they answer), each on the node that masters the monitor's (or the
//! provisional version's) partition:
//! - an expired monitor is read, each digest it lists is sent a roll
//!   (forward when the monitor was marked, back otherwise: past its
//!   deadline a monitor takes no mark, so the choice cannot change), and
//!   the monitor record is deleted once every roll answered 0;
//! - an expired provisional version is rolled back only when a read of
//!   its transaction's monitor (routed to that monitor's master) answers
//!   not found: with a monitor, the monitor's recovery rolls it.
//!
//! After each view change the records transactions hold on the
//! partitions this node masters are queued for the replicas
//! ([`Service::resend_held`], through the distribution's reconcile queue),
//! so every replica holds them (migrations carry the state with the
//! records as well; the re-send also reaches replicas whose copy needed
//! no fill).
//!
//! Invariants: nothing is rolled on a partition this node does not master
//! in the current view (the replicas' copies of the tables are the
//! master's, and change only by its replica writes); a failed step leaves
//! the rest for the next pass (rolls and deletes are repeatable).

use crate::Service;
use citrine_data::txn::recovery::{self, monitor_digest, read_monitor};
use citrine_data::txn::{allowed, MONITOR_SET};
use citrine_data::{Namespace, Now};
use citrine_distribution::sc::data_path;
use citrine_types::{Digest, PartitionId, ResultCode};
use citrine_wire::frame::{ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::msg::{field_type, info1, info2, MessageWriter, MsgHeader};
use citrine_wire::txn::info4;
use std::sync::atomic::{AtomicBool, Ordering};

/// How long one recovery step may take (ms), as a client's timeout.
const STEP_TIMEOUT_MS: u32 = 1_000;

impl Service {
    /// Rolls expired transactions once a second until `stopping` (the
    /// server's `citrine-txn` thread).
    pub fn run_txn_recovery(&self, stopping: &AtomicBool) {
        let mut last = 0u64;
        let mut resent_in = 0u64;
        while !stopping.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(200));
            if self.routes() && self.cluster().cluster_key != resent_in {
                resent_in = self.resend_held(resent_in);
            }
            let now = self.now();
            if now.unix_ms.saturating_sub(last) < 1_000 {
                continue;
            }
            last = now.unix_ms;
            for namespace in self.namespaces() {
                self.recover_transactions(namespace, now);
            }
        }
    }

    /// After a view change, once every strong-consistency namespace's map
    /// is decided: queues the state of each record a transaction holds on
    /// a partition this node masters for the replicas (a replica a fill
    /// brought in gets the state from the fill too; this repeats it).
    /// Returns the view it did that for (`done` while undecided).
    fn resend_held(&self, done: u64) -> u64 {
        let cluster = self.cluster();
        let namespaces = self.namespaces().filter(|namespace| allowed(namespace));
        let mut held = Vec::new();
        for namespace in namespaces {
            if data_path::regime_of(&cluster, &namespace.config.name).is_none() {
                return done;
            }
            if !namespace.txn.is_empty() {
                held.push(namespace);
            }
        }
        for namespace in held {
            for partition in PartitionId::all() {
                if !self.masters(namespace, partition) {
                    continue;
                }
                for digest in namespace.txn.held_digests(partition) {
                    let name = &namespace.config.name;
                    self.dist.queue_reconcile_record(name, partition, digest);
                }
            }
        }
        cluster.cluster_key
    }

    /// One recovery pass over `namespace` (see the module doc).
    pub fn recover_transactions(&self, namespace: &Namespace, now: Now) {
        if !self.routes() {
            recovery::recover(namespace, now);
            return;
        }
        if !allowed(namespace) {
            return;
        }
        namespace.txn.prune_settled(now.citrusleaf_seconds);
        let (monitors, provisionals) = namespace.txn.expired(now.citrusleaf_seconds);
        for digest in monitors {
            if self.masters(namespace, digest.partition()) {
                self.recover_monitor(namespace, &digest, now);
            }
        }
        for (digest, txn_id) in provisionals {
            if self.masters(namespace, digest.partition()) {
                self.recover_orphan(namespace, &digest, txn_id);
            }
        }
    }

    /// Whether this node masters `partition` of `namespace` now.
    fn masters(&self, namespace: &Namespace, partition: PartitionId) -> bool {
        let cluster = self.cluster();
        data_path::replicas_for(&cluster, namespace, partition).first() == Some(&self.dist.node_id)
    }

    /// Rolls the transaction of the expired monitor on `digest` on each of
    /// its records, then deletes the monitor.
    fn recover_monitor(&self, namespace: &Namespace, digest: &Digest, now: Now) {
        let stats = &namespace.txn.stats;
        let held = match read_monitor(namespace, digest, now) {
            Ok(Some(held)) => held,
            Ok(None) => {
                namespace.txn.close_monitor(digest);
                return;
            }
            Err(_) => {
                stats.monitor_roll_error.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let marked = namespace
            .txn
            .monitor(digest)
            .is_some_and(|m| m.roll_forward);
        let forward = held.forward || marked;
        let bit = if forward {
            info4::ROLL_FORWARD
        } else {
            info4::ROLL_BACK
        };
        for written in &held.digests {
            let code = self.run_step(namespace, written, None, bit, Some(held.txn_id));
            if code != ResultCode::Ok {
                stats.monitor_roll_error.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let closed = self.run_step(namespace, digest, Some(MONITOR_SET), 0, None);
        if !matches!(closed, ResultCode::Ok | ResultCode::NotFound) {
            stats.monitor_roll_error.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let counter = if forward {
            &stats.monitor_roll_forward_success
        } else {
            &stats.monitor_roll_back_success
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Rolls back the expired provisional version on `digest` when its
    /// transaction's monitor is gone (asked of that monitor's master).
    fn recover_orphan(&self, namespace: &Namespace, digest: &Digest, txn_id: u64) {
        let monitor = monitor_digest(txn_id);
        let read = self.run_read(namespace, &monitor);
        if read == ResultCode::NotFound {
            self.run_step(namespace, digest, None, info4::ROLL_BACK, Some(txn_id));
        }
    }

    /// A roll (`roll_bit`, with `txn_id`) of `digest`, or with no bit the
    /// durable delete of the monitor record on `digest` (set `set`), run
    /// through the request path; its result code.
    fn run_step(
        &self,
        namespace: &Namespace,
        digest: &Digest,
        set: Option<&[u8]>,
        roll_bit: u8,
        txn_id: Option<u64>,
    ) -> ResultCode {
        let mut header = step_header(0, info2::WRITE | info2::DURABLE_DELETE);
        header.info4 = roll_bit;
        if roll_bit == 0 {
            header.info2 |= info2::DELETE;
        }
        let id = txn_id.map(u64::to_le_bytes);
        self.run_request(namespace, digest, set, &header, id.as_ref())
    }

    /// A read of the monitor record on `digest` without its bins.
    fn run_read(&self, namespace: &Namespace, digest: &Digest) -> ResultCode {
        let header = step_header(info1::READ | info1::GET_NO_BINS, 0);
        self.run_request(namespace, digest, Some(MONITOR_SET), &header, None)
    }

    /// Runs one single-record request as a client's; its result code when
    /// 0 or 2, else 9 (not done, whatever the cause).
    fn run_request(
        &self,
        namespace: &Namespace,
        digest: &Digest,
        set: Option<&[u8]>,
        header: &MsgHeader,
        txn_id: Option<&[u8; 8]>,
    ) -> ResultCode {
        let mut frame = Vec::new();
        let mut writer = MessageWriter::begin(&mut frame, header);
        writer.field(field_type::NAMESPACE, namespace.config.name.as_bytes());
        if let Some(set) = set {
            writer.field(field_type::SET, set);
        }
        writer.field(field_type::DIGEST, &digest.0);
        if let Some(id) = txn_id {
            writer.field(field_type::TXN_ID, id);
        }
        writer.finish();
        let Some((proto, body)) = frame.split_first_chunk::<PROTO_HEADER_SIZE>() else {
            return ResultCode::Timeout;
        };
        let Ok(proto) = ProtoHeader::decode(proto) else {
            return ResultCode::Timeout;
        };
        let mut out = Vec::new();
        if self.handle(proto, body, &mut out).is_err() {
            return ResultCode::Timeout;
        }
        let code = out.get(PROTO_HEADER_SIZE + 5).copied();
        match code {
            Some(0) => ResultCode::Ok,
            Some(2) => ResultCode::NotFound,
            // Any other answer only means "not done": the next pass retries.
            _ => ResultCode::Timeout,
        }
    }
}

/// A step's message header: `info1`, `info2`, the step's timeout.
fn step_header(info1: u8, info2: u8) -> MsgHeader {
    MsgHeader {
        info1,
        info2,
        transaction_ttl: STEP_TIMEOUT_MS,
        ..MsgHeader::default()
    }
}
