//! The transaction path on one namespace, driven by the messages the
//! official clients send (Java `Command.setTxn*`, `TxnMonitor`): blocked
//! writers, invisible provisional versions, versions in read replies,
//! verify, rolls, monitors and their deadlines, recovery by deadline, and
//! the reference's answer on a namespace that runs no transactions.
//!
//! The path is enabled here the way a node enables it: by configuring the
//! namespace `strong-consistency` (the service above still answers 11 to
//! every request on such a namespace until strong consistency is wired).

#![allow(clippy::unwrap_used)]

use super::*;
use crate::clock::ManualClock;
use crate::config::NamespaceConfig;
use crate::record::{perform, prepare};
use citrine_cdt::value::{to_bytes, List, Value};
use citrine_types::{Digest, ParticleType};
use citrine_wire::msg::{info1, info3, op_type, Message, MessageWriter};

const NOW_MS: u64 = 1_700_000_000_000;
const X: Digest = Digest([7; 20]);
const Y: Digest = Digest([9; 20]);
const T1: u64 = 0x1111;
const T2: u64 = 0x2222;

fn namespace(sc: bool) -> Namespace {
    let mut config = NamespaceConfig::in_memory("test");
    config.sc.strong_consistency = sc;
    Namespace::open(config, std::sync::Arc::new(ManualClock::new(NOW_MS))).unwrap()
}

/// One command as a client builds it.
#[derive(Clone, Default)]
struct Cmd {
    header: MsgHeader,
    set: &'static [u8],
    digest: Digest,
    txn: Option<u64>,
    version: Option<[u8; 7]>,
    deadline: Option<u32>,
    ops: Vec<(u8, u8, &'static [u8], Vec<u8>)>,
}

/// A reply: result code, generation, fields by type, ops (name, value).
struct Answer {
    code: u8,
    fields: Vec<(u8, Vec<u8>)>,
    ops: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Answer {
    fn field(&self, kind: u8) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, data)| data.as_slice())
    }

    fn bin(&self, name: &[u8]) -> Option<i64> {
        let (_, value) = self.ops.iter().find(|(n, _)| n == name)?;
        Some(i64::from_be_bytes(value.as_slice().try_into().ok()?))
    }
}

impl Cmd {
    fn on(digest: Digest) -> Cmd {
        Cmd {
            set: b"demo",
            digest,
            ..Cmd::default()
        }
    }

    fn put(digest: Digest, value: i64) -> Cmd {
        let mut cmd = Cmd::on(digest);
        cmd.header.info2 = info2::WRITE;
        let value = value.to_be_bytes().to_vec();
        cmd.ops
            .push((op_type::WRITE, ParticleType::Integer as u8, b"v", value));
        cmd
    }

    fn get(digest: Digest) -> Cmd {
        let mut cmd = Cmd::on(digest);
        cmd.header.info1 = info1::READ | info1::GET_ALL;
        cmd
    }

    fn delete(digest: Digest) -> Cmd {
        let mut cmd = Cmd::on(digest);
        cmd.header.info2 = info2::WRITE | info2::DELETE | info2::DURABLE_DELETE;
        cmd
    }

    fn verify(digest: Digest, version: [u8; 7]) -> Cmd {
        let mut cmd = Cmd::on(digest);
        cmd.header.info1 = info1::READ | info1::GET_NO_BINS;
        cmd.header.info3 = info3::SC_READ_TYPE;
        cmd.header.info4 = info4::VERIFY_READ;
        cmd.version = Some(version);
        cmd
    }

    fn roll(digest: Digest, txn: u64, bit: u8) -> Cmd {
        let mut cmd = Cmd::on(digest);
        cmd.header.info2 = info2::WRITE | info2::DURABLE_DELETE;
        cmd.header.info4 = bit;
        cmd.txn = Some(txn);
        cmd
    }

    fn in_txn(mut self, txn: u64) -> Cmd {
        self.txn = Some(txn);
        self
    }

    fn run(&self, namespace: &Namespace, now_ms: u64) -> Answer {
        let mut frame = Vec::new();
        let mut writer = MessageWriter::begin(&mut frame, &self.header);
        writer
            .field(field_type::NAMESPACE, b"test")
            .field(field_type::SET, self.set)
            .field(field_type::DIGEST, &self.digest.0);
        if let Some(txn) = self.txn {
            writer.field(field_type::TXN_ID, &txn.to_le_bytes());
        }
        if let Some(version) = self.version {
            writer.field(field_type::RECORD_VERSION, &version);
        }
        if let Some(deadline) = self.deadline {
            writer.field(field_type::TXN_DEADLINE, &deadline.to_le_bytes());
        }
        for (kind, particle, name, value) in &self.ops {
            writer.op(*kind, *particle, name, value);
        }
        writer.finish();
        let message = Message::decode(&frame[8..]).unwrap();
        let request = prepare(&message, &self.digest.0, None).unwrap();
        let mut out = Vec::new();
        perform(namespace, &request, Now::from_unix_ms(now_ms), &mut out);
        let reply = Message::decode(&out[8..]).unwrap();
        Answer {
            code: reply.header.result_code,
            fields: reply
                .fields()
                .map(|field| (field.field_type, field.data.to_vec()))
                .collect(),
            ops: reply
                .ops()
                .map(|op| (op.name.to_vec(), op.value.to_vec()))
                .collect(),
        }
    }
}

fn stat(namespace: &Namespace, name: &str) -> String {
    stat_pairs(namespace)
        .into_iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value)
        .unwrap()
}

/// The version field a transaction's read of `digest` answers.
fn read_version(namespace: &Namespace, digest: Digest, txn: u64) -> [u8; 7] {
    let read = Cmd::get(digest).in_txn(txn).run(namespace, NOW_MS);
    assert_eq!(read.code, 0);
    read.field(field_type::RECORD_VERSION)
        .unwrap()
        .try_into()
        .unwrap()
}

#[test]
fn a_provisional_version_is_its_transactions_alone_and_blocks_other_writers() {
    let ns = namespace(true);
    assert_eq!(Cmd::put(X, 1).run(&ns, NOW_MS).code, 0);
    assert_eq!(Cmd::put(X, 2).in_txn(T1).run(&ns, NOW_MS).code, 0);
    assert_eq!(stat(&ns, "mrt_provisionals"), "1");

    let outside = Cmd::get(X).run(&ns, NOW_MS);
    assert_eq!(
        (outside.code, outside.bin(b"v")),
        (0, Some(1)),
        "last committed"
    );
    assert!(outside.field(field_type::RECORD_VERSION).is_none());
    let own = Cmd::get(X).in_txn(T1).run(&ns, NOW_MS);
    assert_eq!((own.code, own.bin(b"v")), (0, Some(2)), "its own write");
    assert!(own.field(field_type::RECORD_VERSION).is_none());

    assert_eq!(Cmd::put(X, 3).run(&ns, NOW_MS).code, 120, "plain writer");
    assert_eq!(Cmd::put(X, 3).in_txn(T2).run(&ns, NOW_MS).code, 120);
    assert_eq!(Cmd::delete(X).run(&ns, NOW_MS).code, 120, "plain delete");
    assert_eq!(
        Cmd::get(X).in_txn(T2).run(&ns, NOW_MS).code,
        120,
        "other txn reads"
    );
    assert_eq!(stat(&ns, "fail_mrt_blocked"), "4");
    assert_eq!(Cmd::get(X).run(&ns, NOW_MS).bin(b"v"), Some(1));

    // Its own writes build on its provisional version.
    let mut incr = Cmd::on(X).in_txn(T1);
    incr.header.info2 = info2::WRITE;
    incr.ops
        .push((op_type::INCR, 1, b"v", 5i64.to_be_bytes().to_vec()));
    assert_eq!(incr.run(&ns, NOW_MS).code, 0);
    assert_eq!(Cmd::get(X).in_txn(T1).run(&ns, NOW_MS).bin(b"v"), Some(7));
    assert_eq!(stat(&ns, "mrt_provisionals"), "1");
    // A write that must lock the record finds it locked by itself.
    let mut locking = Cmd::put(X, 9).in_txn(T1);
    locking.header.info4 = info4::ON_LOCKING_ONLY;
    assert_eq!(locking.run(&ns, NOW_MS).code, 126);
}

#[test]
fn a_transactions_write_refused_for_what_it_found_answers_the_version() {
    let ns = namespace(true);
    Cmd::put(X, 1).run(&ns, NOW_MS);
    let mut create = Cmd::put(X, 2).in_txn(T1);
    create.header.info2 |= info2::CREATE_ONLY;
    let refused = create.run(&ns, NOW_MS);
    assert_eq!(refused.code, 5);
    let version = refused.field(field_type::RECORD_VERSION).unwrap();
    assert_eq!(version, &read_version(&ns, X, T1)[..], "the record it read");
    assert_eq!(stat(&ns, "mrt_provisionals"), "0");
    let mut outside = Cmd::put(X, 2);
    outside.header.info2 |= info2::CREATE_ONLY;
    assert!(outside
        .run(&ns, NOW_MS)
        .field(field_type::RECORD_VERSION)
        .is_none());
}

#[test]
fn reads_in_a_transaction_answer_the_committed_version() {
    let ns = namespace(true);
    assert_eq!(Cmd::put(X, 1).run(&ns, NOW_MS).code, 0);
    assert_eq!(Cmd::put(X, 2).run(&ns, NOW_MS + 5).code, 0);
    let version = read_version(&ns, X, T1);
    let lut = NOW_MS + 5 - CITRUSLEAF_EPOCH_UNIX_MS;
    assert_eq!(version, RecordVersion::new(lut, 2).encode());
    assert_eq!(Cmd::get(Y).in_txn(T1).run(&ns, NOW_MS).code, 2);
}

#[test]
fn verify_answers_121_once_the_record_changed_and_120_while_held() {
    let ns = namespace(true);
    Cmd::put(X, 1).run(&ns, NOW_MS);
    let version = read_version(&ns, X, T1);
    assert_eq!(Cmd::verify(X, version).run(&ns, NOW_MS).code, 0);
    assert_eq!(stat(&ns, "mrt_verify_read_success"), "1");

    assert_eq!(Cmd::put(X, 2).in_txn(T2).run(&ns, NOW_MS).code, 0);
    assert_eq!(
        Cmd::verify(X, version).run(&ns, NOW_MS).code,
        120,
        "held by T2"
    );
    assert_eq!(Cmd::roll(X, T2, info4::ROLL_BACK).run(&ns, NOW_MS).code, 0);
    assert_eq!(
        Cmd::verify(X, version).run(&ns, NOW_MS).code,
        0,
        "T2 rolled back"
    );

    assert_eq!(Cmd::put(X, 3).run(&ns, NOW_MS + 1).code, 0);
    assert_eq!(Cmd::verify(X, version).run(&ns, NOW_MS).code, 121);
    assert_eq!(
        stat(&ns, "mrt_verify_read_error"),
        "2",
        "blocked, then changed"
    );
    assert_eq!(stat(&ns, "fail_mrt_version_mismatch"), "1");
    Cmd::delete(X).run(&ns, NOW_MS + 2);
    assert_eq!(Cmd::verify(X, version).run(&ns, NOW_MS).code, 121, "gone");
    let mut unversioned = Cmd::verify(X, version);
    unversioned.version = None;
    assert_eq!(unversioned.run(&ns, NOW_MS).code, 4);
}

#[test]
fn roll_forward_commits_and_roll_back_restores() {
    let ns = namespace(true);
    Cmd::put(X, 1).run(&ns, NOW_MS);
    Cmd::put(Y, 1).run(&ns, NOW_MS);
    assert_eq!(Cmd::put(X, 2).in_txn(T1).run(&ns, NOW_MS).code, 0);
    assert_eq!(Cmd::delete(Y).in_txn(T1).run(&ns, NOW_MS).code, 0);
    assert_eq!(
        Cmd::get(Y).in_txn(T1).run(&ns, NOW_MS).code,
        2,
        "deleted for T1"
    );
    assert_eq!(
        Cmd::get(Y).run(&ns, NOW_MS).bin(b"v"),
        Some(1),
        "not for others"
    );
    for digest in [X, Y] {
        let roll = Cmd::roll(digest, T1, info4::ROLL_FORWARD);
        assert_eq!(roll.run(&ns, NOW_MS + 10).code, 0);
        assert_eq!(roll.run(&ns, NOW_MS + 11).code, 0, "a repeated roll");
    }
    assert_eq!(Cmd::get(X).run(&ns, NOW_MS).bin(b"v"), Some(2));
    assert_eq!(Cmd::get(Y).run(&ns, NOW_MS).code, 2);
    assert_eq!(stat(&ns, "mrt_provisionals"), "0");
    assert_eq!(stat(&ns, "mrt_roll_forward_success"), "4");
    assert_eq!(Cmd::put(X, 5).run(&ns, NOW_MS + 20).code, 0, "unlocked");
    let committed = read_version(&ns, X, T2);
    let lut = NOW_MS + 20 - CITRUSLEAF_EPOCH_UNIX_MS;
    assert_eq!(
        committed,
        RecordVersion::new(lut, 3).encode(),
        "1, 2 (rolled), 3"
    );

    assert_eq!(Cmd::put(X, 6).in_txn(T2).run(&ns, NOW_MS + 30).code, 0);
    assert_eq!(Cmd::put(Y, 6).in_txn(T2).run(&ns, NOW_MS + 30).code, 0);
    for digest in [X, Y] {
        let roll = Cmd::roll(digest, T2, info4::ROLL_BACK);
        assert_eq!(roll.run(&ns, NOW_MS + 40).code, 0);
    }
    assert_eq!(Cmd::get(X).run(&ns, NOW_MS).bin(b"v"), Some(5));
    assert_eq!(Cmd::get(Y).run(&ns, NOW_MS).code, 2);
    assert_eq!(
        read_version(&ns, X, T1),
        committed,
        "untouched by the abort"
    );
    assert_eq!(stat(&ns, "mrt_roll_back_success"), "2");
    let both = Cmd::roll(X, T2, info4::ROLL_BACK | info4::ROLL_FORWARD);
    assert_eq!(both.run(&ns, NOW_MS).code, 4);
    let mut anonymous = Cmd::roll(X, T2, info4::ROLL_BACK);
    anonymous.txn = None;
    assert_eq!(anonymous.run(&ns, NOW_MS).code, 4);
}

/// The monitor record's digest and the client's write adding `keys`.
fn monitor_add(txn: u64, keys: &[Digest], first: bool) -> Cmd {
    let mut cmd = Cmd::on(recovery::monitor_digest(txn));
    cmd.set = MONITOR_SET;
    cmd.header.info2 = info2::WRITE | info2::RESPOND_ALL_OPS;
    if first {
        cmd.ops
            .push((op_type::WRITE, 1, b"id", txn.to_be_bytes().to_vec()));
    }
    let items = keys
        .iter()
        .map(|digest| Value::Blob(4, digest.0.to_vec()))
        .collect();
    let list = to_bytes(&Value::List(List { flags: 1, items }));
    cmd.ops
        .push((op_type::WRITE, ParticleType::List as u8, b"keyds", list));
    cmd
}

fn mark_forward(txn: u64) -> Cmd {
    let mut cmd = Cmd::on(recovery::monitor_digest(txn));
    cmd.set = MONITOR_SET;
    cmd.header.info2 = info2::WRITE;
    cmd.ops
        .push((op_type::WRITE, ParticleType::Bool as u8, b"fwd", vec![1]));
    cmd
}

fn close(txn: u64) -> Cmd {
    let mut cmd = Cmd::delete(recovery::monitor_digest(txn));
    cmd.set = MONITOR_SET;
    cmd
}

#[test]
fn the_monitor_fixes_the_deadline_and_takes_no_write_past_it_or_after_the_mark() {
    let ns = namespace(true);
    let now_s = Now::from_unix_ms(NOW_MS).citrusleaf_seconds;
    let created = monitor_add(T1, &[X], true).run(&ns, NOW_MS);
    assert_eq!(created.code, 0);
    let deadline = (now_s + DURATION_DEFAULT).to_le_bytes();
    assert_eq!(created.field(field_type::TXN_DEADLINE), Some(&deadline[..]));
    assert_eq!(stat(&ns, "mrt_monitors_active"), "1");
    let mut timed = monitor_add(T2, &[Y], true);
    timed.header.record_ttl = 3;
    let three = (now_s + 3).to_le_bytes();
    assert_eq!(
        timed.run(&ns, NOW_MS).field(field_type::TXN_DEADLINE),
        Some(&three[..])
    );

    let added = monitor_add(T1, &[X, Y], false).run(&ns, NOW_MS + 1000);
    assert_eq!(
        added.field(field_type::TXN_DEADLINE),
        Some(&deadline[..]),
        "kept"
    );
    let late = NOW_MS + 4_000;
    assert_eq!(monitor_add(T2, &[X], false).run(&ns, late).code, 122);
    let mut expired_write = Cmd::put(Y, 1).in_txn(T2);
    expired_write.deadline = Some(now_s + 3);
    assert_eq!(expired_write.run(&ns, late).code, 122);

    assert_eq!(mark_forward(T1).run(&ns, NOW_MS).code, 0);
    assert_eq!(
        mark_forward(T1).run(&ns, NOW_MS).code,
        124,
        "marked already"
    );
    assert_eq!(monitor_add(T1, &[Y], false).run(&ns, NOW_MS).code, 124);
    assert_eq!(close(T1).run(&ns, NOW_MS).code, 0);
    assert_eq!(
        close(T1).run(&ns, NOW_MS).code,
        2,
        "the client takes 2 as closed"
    );
    assert_eq!(mark_forward(T1).run(&ns, NOW_MS).code, 125, "gone: aborted");
    assert_eq!(stat(&ns, "mrt_monitors_active"), "1");
}

#[test]
fn a_monitor_record_past_90_kib_answers_too_many_writes() {
    let ns = namespace(true);
    // 20-byte digests, 22 bytes each in the list: about 4 180 fit.
    let digests: Vec<Digest> = (0..4300u32)
        .map(|n| {
            let mut bytes = [0u8; 20];
            bytes[..4].copy_from_slice(&n.to_be_bytes());
            Digest(bytes)
        })
        .collect();
    assert_eq!(
        monitor_add(T1, &digests[..4000], true)
            .run(&ns, NOW_MS)
            .code,
        0
    );
    assert_eq!(monitor_add(T1, &digests, false).run(&ns, NOW_MS).code, 123);
    assert_eq!(
        monitor_add(T1, &digests[..4150], false)
            .run(&ns, NOW_MS)
            .code,
        0
    );
    // Outside the monitor set, the namespace's own limit applies.
    let mut plain = monitor_add(T2, &digests, true);
    plain.set = b"demo";
    assert_eq!(plain.run(&ns, NOW_MS).code, 0);
}

#[test]
fn an_expired_transaction_is_rolled_by_the_node_from_its_monitor() {
    let ns = namespace(true);
    Cmd::put(X, 1).run(&ns, NOW_MS);
    Cmd::put(Y, 1).run(&ns, NOW_MS);
    let now_s = Now::from_unix_ms(NOW_MS).citrusleaf_seconds;
    for (txn, forward) in [(T1, false), (T2, true)] {
        let digest = if forward { Y } else { X };
        assert_eq!(monitor_add(txn, &[digest], true).run(&ns, NOW_MS).code, 0);
        let mut write = Cmd::put(digest, 9).in_txn(txn);
        write.deadline = Some(now_s + DURATION_DEFAULT);
        assert_eq!(write.run(&ns, NOW_MS).code, 0);
        if forward {
            assert_eq!(mark_forward(txn).run(&ns, NOW_MS).code, 0);
        }
    }
    let before = recovery::recover(&ns, Now::from_unix_ms(NOW_MS + 5_000));
    assert_eq!(before, recovery::Recovered::default(), "not expired yet");
    let after = Now::from_unix_ms(NOW_MS + 12_000);
    assert_eq!(recovery::recover(&ns, after).monitors, 2);
    assert_eq!(
        Cmd::get(X).run(&ns, NOW_MS).bin(b"v"),
        Some(1),
        "rolled back"
    );
    assert_eq!(
        Cmd::get(Y).run(&ns, NOW_MS).bin(b"v"),
        Some(9),
        "rolled forward"
    );
    assert_eq!(stat(&ns, "mrt_provisionals"), "0");
    assert_eq!(stat(&ns, "mrt_monitors_active"), "0");
    assert_eq!(stat(&ns, "mrt_monitor_roll_back_success"), "1");
    assert_eq!(stat(&ns, "mrt_monitor_roll_forward_success"), "1");
    let monitor = Cmd::get(recovery::monitor_digest(T1)).run(&ns, after.unix_ms);
    assert_eq!(monitor.code, 2, "the monitor record is removed");
    let late_add = monitor_add(T1, &[Y], false).run(&ns, after.unix_ms);
    assert_eq!(late_add.code, 122, "as before the roll: expired");
    assert_eq!(stat(&ns, "mrt_monitors_active"), "0", "not created again");
    assert_eq!(Cmd::put(X, 3).run(&ns, after.unix_ms).code, 0, "unlocked");

    // A provisional version whose transaction has no monitor here.
    let mut orphan = Cmd::put(X, 4).in_txn(0x3333);
    orphan.deadline = Some(now_s + 20);
    assert_eq!(orphan.run(&ns, after.unix_ms).code, 0);
    assert_eq!(recovery::recover(&ns, after).orphans, 0);
    let later = Now::from_unix_ms(NOW_MS + 21_000);
    assert_eq!(recovery::recover(&ns, later).orphans, 1);
    assert_eq!(Cmd::get(X).run(&ns, later.unix_ms).bin(b"v"), Some(3));
}

#[test]
fn writes_are_refused_with_disable_mrt_writes() {
    let ns = namespace(true);
    ns.txn.writes_disabled.store(true, Ordering::Relaxed);
    assert_eq!(Cmd::put(X, 1).in_txn(T1).run(&ns, NOW_MS).code, 22);
    assert_eq!(monitor_add(T1, &[X], true).run(&ns, NOW_MS).code, 22);
    assert_eq!(
        Cmd::put(X, 1).run(&ns, NOW_MS).code,
        0,
        "outside a transaction"
    );
}

#[test]
fn a_namespace_without_transactions_answers_as_the_reference() {
    // Measured against the CE 8.1.2 reference: 25 to a read or write with
    // a transaction id, to verify and roll bits with or without one; a
    // delete with one runs as a plain delete; a version alone is ignored.
    let ns = namespace(false);
    assert_eq!(Cmd::put(X, 1).run(&ns, NOW_MS).code, 0);
    assert_eq!(Cmd::get(X).in_txn(T1).run(&ns, NOW_MS).code, 25);
    assert_eq!(Cmd::put(X, 2).in_txn(T1).run(&ns, NOW_MS).code, 25);
    assert_eq!(Cmd::verify(X, [0; 7]).run(&ns, NOW_MS).code, 25);
    assert_eq!(
        Cmd::roll(X, T1, info4::ROLL_FORWARD).run(&ns, NOW_MS).code,
        25
    );
    let mut roll_alone = Cmd::roll(X, T1, info4::ROLL_BACK);
    roll_alone.txn = None;
    assert_eq!(roll_alone.run(&ns, NOW_MS).code, 25);
    let mut versioned = Cmd::get(X);
    versioned.version = Some([1; 7]);
    assert_eq!(versioned.run(&ns, NOW_MS).code, 0);
    let mut plain_delete = Cmd::delete(X).in_txn(T1);
    plain_delete.header.info2 = info2::WRITE | info2::DELETE;
    assert_eq!(plain_delete.run(&ns, NOW_MS).code, 0);
    assert_eq!(Cmd::get(X).run(&ns, NOW_MS).code, 2);
    assert_eq!(stat(&ns, "mrt_provisionals"), "0");
}

#[test]
fn statistics_and_settings_carry_the_references_names() {
    // The order and names of the CE 8.1.2 reference's `namespace/test`.
    let names: Vec<String> = stat_pairs(&namespace(true))
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let reference = "mrt_provisionals mrt_monitors mrt_monitors_active \
        mrt_verify_read_success mrt_verify_read_error mrt_verify_read_timeout \
        mrt_roll_forward_success mrt_roll_forward_error mrt_roll_forward_timeout \
        mrt_monitor_roll_forward_success mrt_monitor_roll_forward_error \
        mrt_monitor_roll_forward_timeout mrt_roll_back_success mrt_roll_back_error \
        mrt_roll_back_timeout mrt_monitor_roll_back_success mrt_monitor_roll_back_error \
        mrt_monitor_roll_back_timeout fail_mrt_blocked fail_mrt_version_mismatch \
        mrt_monitor_roll_tombstone_creates";
    assert_eq!(names, reference.split_whitespace().collect::<Vec<_>>());
    let settings = |sc: bool| config_pairs(&namespace(sc)).map(|(_, value)| value);
    assert_eq!(
        settings(false),
        ["false".to_owned(), "0".to_owned()],
        "as CE"
    );
    assert_eq!(settings(true), ["false".to_owned(), "10".to_owned()]);
}

#[test]
fn a_command_on_a_record_read_before_needs_the_version_it_read() {
    let ns = namespace(true);
    Cmd::put(X, 1).run(&ns, NOW_MS);
    let read = read_version(&ns, X, T1);
    let mut reread = Cmd::get(X).in_txn(T1);
    reread.version = Some(read);
    assert_eq!(reread.run(&ns, NOW_MS).code, 0, "unchanged");
    Cmd::put(X, 2).run(&ns, NOW_MS + 1);
    assert_eq!(
        reread.run(&ns, NOW_MS).code,
        121,
        "a second version: refused"
    );
    let mut write = Cmd::put(X, 3).in_txn(T1);
    write.version = Some(read);
    assert_eq!(
        write.run(&ns, NOW_MS).code,
        121,
        "no write over an unread version"
    );
    assert_eq!(stat(&ns, "mrt_provisionals"), "0");
    write.version = Some(read_version(&ns, X, T1));
    assert_eq!(write.run(&ns, NOW_MS).code, 0);
    // Once held, its own version is what it reads and writes.
    assert_eq!(write.run(&ns, NOW_MS).code, 0);
}

/// One transfer of `amount` from `from` to `to` as the Java client runs a
/// transaction: reads with versions, monitor, writes carrying the read
/// versions and the deadline, mark, rolls, close; rolled back on any
/// refusal. Whether it committed.
fn transfer(ns: &Namespace, txn: u64, from: Digest, to: Digest, amount: i64) -> bool {
    let read = |digest: Digest| {
        let answer = Cmd::get(digest).in_txn(txn).run(ns, NOW_MS);
        let version: Option<[u8; 7]> = answer
            .field(field_type::RECORD_VERSION)
            .and_then(|bytes| bytes.try_into().ok());
        (answer.code, answer.bin(b"v"), version)
    };
    let ((code_a, Some(a), version_a), (code_b, Some(b), version_b)) = (read(from), read(to))
    else {
        return false;
    };
    if code_a != 0 || code_b != 0 || a < amount {
        return false;
    }
    let created = monitor_add(txn, &[from, to], true).run(ns, NOW_MS);
    if created.code != 0 {
        return false;
    }
    let deadline = created
        .field(field_type::TXN_DEADLINE)
        .map(|bytes| u32::from_le_bytes(bytes.try_into().unwrap()));
    let mut written = Vec::new();
    for (digest, value, version) in [(from, a - amount, version_a), (to, b + amount, version_b)] {
        let mut write = Cmd::put(digest, value).in_txn(txn);
        write.version = version;
        write.deadline = deadline;
        if write.run(ns, NOW_MS).code != 0 {
            for digest in written {
                Cmd::roll(digest, txn, info4::ROLL_BACK).run(ns, NOW_MS);
            }
            assert_eq!(close(txn).run(ns, NOW_MS).code, 0);
            return false;
        }
        written.push(digest);
    }
    assert_eq!(mark_forward(txn).run(ns, NOW_MS).code, 0);
    for digest in written {
        assert_eq!(
            Cmd::roll(digest, txn, info4::ROLL_FORWARD)
                .run(ns, NOW_MS)
                .code,
            0
        );
    }
    assert_eq!(close(txn).run(ns, NOW_MS).code, 0);
    true
}

#[test]
fn concurrent_transfers_keep_the_total() {
    let ns = namespace(true);
    let accounts: Vec<Digest> = (0..10u8).map(|n| Digest([n + 1; 20])).collect();
    for account in &accounts {
        assert_eq!(Cmd::put(*account, 100).run(&ns, NOW_MS).code, 0);
    }
    let committed = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for thread in 0..8u64 {
            let (ns, accounts, committed) = (&ns, &accounts, &committed);
            scope.spawn(move || {
                let mut state = thread * 7919 + 1;
                for round in 0..150u64 {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let from = accounts[(state >> 33) as usize % 10];
                    let to = accounts[(state >> 45) as usize % 10];
                    let txn = (thread << 32) | (round + 1);
                    if from != to && transfer(ns, txn, from, to, (state >> 20) as i64 % 30) {
                        committed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let balances: Vec<i64> = accounts
        .iter()
        .map(|account| Cmd::get(*account).run(&ns, NOW_MS).bin(b"v").unwrap())
        .collect();
    assert_eq!(balances.iter().sum::<i64>(), 1000, "{balances:?}");
    assert!(balances.iter().all(|&balance| balance >= 0), "{balances:?}");
    assert!(committed.load(Ordering::Relaxed) > 50, "transfers commit");
    assert_eq!(stat(&ns, "mrt_provisionals"), "0");
    assert_eq!(stat(&ns, "mrt_monitors_active"), "0");
}
