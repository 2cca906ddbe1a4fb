//! A record change cut short by a panic while it is published stops its
//! partition (and only it); one that completes, or fails with a result
//! code, changes nothing of the kind.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::config::NamespaceConfig;
use crate::copy::{store_copy, Admit, ReplicaWrite};
use crate::hook::{InstallUpkeep, RecordHook};
use crate::ManualClock;
use citrine_index::{IndexEntry, RecordMeta};
use citrine_types::PartitionId;
use citrine_wire::msg::{info1, info2, op_type, MsgHeader};
use std::sync::atomic::Ordering;

const START_MS: u64 = 1_800_000_000_000;

/// Upkeep that panics after the index points at `victim`'s new version:
/// the publish step of its change is cut short.
struct PanicsAfterInstall {
    victim: Digest,
}

impl RecordHook for PanicsAfterInstall {
    fn before_install(
        &self,
        _: &Namespace,
        digest: &Digest,
        _: RecordMeta,
        _: &[u8],
    ) -> Option<InstallUpkeep> {
        (*digest == self.victim).then(|| Box::new(()) as InstallUpkeep)
    }

    fn after_install(&self, _: &Namespace, _: InstallUpkeep, _: &Digest, _: Option<&IndexEntry>) {
        panic!("secondary-index upkeep cut short");
    }

    fn unindex(&self, _: &Namespace, _: &Digest, _: &IndexEntry) {}

    fn clear_partition(&self, _: &Namespace, _: PartitionId) {}
}

/// A digest whose partition is `partition`.
fn digest_in(partition: u16, tag: u8) -> Digest {
    let mut bytes = [tag; 20];
    // The partition is the low 12 bits of the first two bytes.
    bytes[0] = (partition & 0xFF) as u8;
    bytes[1] = (bytes[1] & 0xF0) | (partition >> 8) as u8;
    let digest = Digest(bytes);
    assert_eq!(digest.partition().index(), usize::from(partition));
    digest
}

/// One raw op: size, op type, particle type, flags, name length, name, value.
fn raw_op(op: u8, particle: u8, name: &[u8], value: &[u8]) -> Vec<u8> {
    let size = (4 + name.len() + value.len()) as u32;
    let mut bytes = size.to_be_bytes().to_vec();
    bytes.extend_from_slice(&[op, particle, 0, name.len() as u8]);
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(value);
    bytes
}

/// The result code of `digest`'s write (`ops` given) or read (`None`).
fn perform_on(namespace: &Namespace, digest: Digest, ops: Option<&[u8]>) -> u8 {
    let header = match ops {
        Some(_) => MsgHeader {
            info2: info2::WRITE,
            n_ops: 1,
            ..MsgHeader::default()
        },
        None => MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            ..MsgHeader::default()
        },
    };
    let request = Request {
        header,
        digest,
        set: b"",
        key: None,
        ops: Ops::Raw(ops.unwrap_or_default()),
        reply: Reply::Frame,
        filter: None,
        txn: Default::default(),
        tally: Default::default(),
    };
    let mut out = Vec::new();
    perform(namespace, &request, Now::from_unix_ms(START_MS), &mut out);
    MsgHeader::decode(&out[8..]).unwrap().result_code
}

#[test]
fn a_panic_while_a_change_is_published_stops_that_partition_only() {
    let clock = std::sync::Arc::new(ManualClock::new(START_MS));
    let namespace = Namespace::open(NamespaceConfig::in_memory("test"), clock).unwrap();
    let victim = digest_in(7, 0xA1);
    let bystander = digest_in(8, 0xB2);
    namespace
        .set_hook(std::sync::Arc::new(PanicsAfterInstall { victim }))
        .unwrap();
    let write = raw_op(op_type::WRITE, 1, b"n", &5i64.to_be_bytes());
    assert_eq!(perform_on(&namespace, bystander, Some(&write)), 0);
    assert!(namespace.serving(victim.partition()).is_ok());

    let cut_short = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        perform_on(&namespace, victim, Some(&write))
    }));
    assert!(cut_short.is_err());

    // Its partition refuses everything with 1, reads included; it is
    // reported (logged and counted) once however often it is asked.
    let server_error = ResultCode::ServerError.code();
    assert_eq!(perform_on(&namespace, victim, None), server_error);
    assert_eq!(perform_on(&namespace, victim, Some(&write)), server_error);
    assert_eq!(
        perform_on(&namespace, digest_in(7, 0xC3), None),
        server_error
    );
    assert_eq!(namespace.report_failed_partitions(), 1);
    assert_eq!(namespace.stats.partitions_failed.load(Ordering::Relaxed), 1);
    let copy = ReplicaWrite {
        namespace: "test".into(),
        digest: digest_in(7, 0xD4),
        set_name: Vec::new(),
        generation: 1,
        life: 0,
        void_time: 0,
        last_update_ms: START_MS,
        durable: false,
        body: Some(Vec::new()),
        xdr_write: false,
    };
    let now = Now::from_unix_ms(START_MS);
    assert_eq!(
        store_copy(&namespace, &copy, now, 0, Admit::Always),
        Err(ResultCode::ServerError)
    );

    // Every other partition serves as before.
    assert_eq!(perform_on(&namespace, bystander, None), 0);
    assert_eq!(perform_on(&namespace, bystander, Some(&write)), 0);
}

#[test]
fn a_write_that_fails_with_a_code_leaves_its_partition_serving() {
    let clock = std::sync::Arc::new(ManualClock::new(START_MS));
    let namespace = Namespace::open(NamespaceConfig::in_memory("test"), clock).unwrap();
    let digest = digest_in(9, 0xE5);
    let write = raw_op(op_type::WRITE, 1, b"n", &5i64.to_be_bytes());
    assert_eq!(perform_on(&namespace, digest, Some(&write)), 0);
    // Appending a string to an integer bin: the working copy is refused.
    let append = raw_op(op_type::APPEND, 3, b"n", b"x");
    assert_eq!(
        perform_on(&namespace, digest, Some(&append)),
        ResultCode::IncompatibleType.code()
    );
    assert!(namespace.serving(digest.partition()).is_ok());
    assert_eq!(namespace.report_failed_partitions(), 0);
    assert_eq!(perform_on(&namespace, digest, None), 0);
}
