//! Single-record semantics run against an in-memory namespace: each test pins
//! what the reference server (Aerospike CE 8.1.2) answers where the
//! differential tester (`tests/differential/`) found Citrine answering
//! otherwise. Requests are built with the wire codec and run through
//! [`perform`], as a node runs them.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::clock::ManualClock;
use crate::config::NamespaceConfig;
use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::msg::{field_type, info1, info2, info3, op_type, Message, MessageWriter};

const NOW_MS: u64 = 1_700_000_000_000;
const INTEGER: u8 = ParticleType::Integer as u8;
const STRING: u8 = ParticleType::String as u8;
const BOOL: u8 = ParticleType::Bool as u8;

fn namespace() -> Namespace {
    Namespace::open(
        NamespaceConfig::in_memory("test"),
        std::sync::Arc::new(ManualClock::new(NOW_MS)),
    )
    .unwrap()
}

/// One op of a test request: type, particle type, bin name, value.
type TestOp = (u8, u8, &'static str, Vec<u8>);

fn int(op: u8, name: &'static str, value: i64) -> TestOp {
    (op, INTEGER, name, value.to_be_bytes().to_vec())
}

/// An op whose value is msgpack (CDT and expression ops).
fn packed(op: u8, name: &'static str, value: &[u8]) -> TestOp {
    (op, ParticleType::Blob as u8, name, value.to_vec())
}

fn bare(op: u8) -> TestOp {
    (op, 0, "", Vec::new())
}

/// What a request answered.
struct Answer {
    code: u8,
    generation: u32,
    bins: Vec<(Vec<u8>, u8, Vec<u8>)>,
}

impl Answer {
    fn bin(&self, name: &str) -> Option<(u8, &[u8])> {
        self.bins
            .iter()
            .find(|(bin, _, _)| bin == name.as_bytes())
            .map(|(_, particle_type, value)| (*particle_type, value.as_slice()))
    }
}

/// Runs one request on record `key` of set "demo" (sending the key when
/// `send_key`) and decodes its reply.
fn run(
    namespace: &Namespace,
    key: &str,
    header: MsgHeader,
    send_key: bool,
    ops: &[TestOp],
) -> Answer {
    run_filtered(namespace, key, header, send_key, ops, None)
}

/// [`run`] with a filter expression (msgpack) when `filter` is given.
fn run_filtered(
    namespace: &Namespace,
    key: &str,
    header: MsgHeader,
    send_key: bool,
    ops: &[TestOp],
    filter: Option<&[u8]>,
) -> Answer {
    let filter = filter.map(|bytes| crate::filter::parse(bytes).unwrap());
    let user_key = UserKey::String(key.into());
    let digest = of_key("demo", &user_key);
    let mut frame = Vec::new();
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(field_type::DIGEST, &digest.0);
    if send_key {
        writer.field(field_type::KEY, &user_key.to_field());
    }
    for (op, particle_type, name, value) in ops {
        writer.op(*op, *particle_type, name.as_bytes(), value);
    }
    writer.finish();
    let message = Message::decode(&frame[8..]).unwrap();
    let request = prepare(&message, &digest.0, filter.as_ref()).unwrap();
    let mut out = Vec::new();
    perform(namespace, &request, Now::from_unix_ms(NOW_MS), &mut out);
    let reply = Message::decode(&out[8..]).unwrap();
    Answer {
        code: reply.header.result_code,
        generation: reply.header.generation,
        bins: reply
            .ops()
            .map(|op| (op.name.to_vec(), op.particle_type, op.value.to_vec()))
            .collect(),
    }
}

fn write_header(info2_bits: u8, info3_bits: u8, generation: u32) -> MsgHeader {
    MsgHeader {
        info1: info1::READ,
        info2: info2::WRITE | info2_bits,
        info3: info3_bits,
        generation,
        ..MsgHeader::default()
    }
}

fn write(namespace: &Namespace, key: &str, ops: &[TestOp]) -> Answer {
    run(namespace, key, write_header(0, 0, 0), false, ops)
}

fn get(namespace: &Namespace, key: &str) -> Answer {
    let header = MsgHeader {
        info1: info1::READ | info1::GET_ALL,
        ..MsgHeader::default()
    };
    run(namespace, key, header, false, &[])
}

/// A missing record has generation 0: GENERATION_GT with 0 fails with 3
/// before any op runs, whatever the ops would have done (a write creating
/// the record, a bin removal answering 2, an op failing on its own).
#[test]
fn generation_gt_fails_on_a_missing_record_before_any_op() {
    let namespace = namespace();
    let gt = |generation| write_header(info2::GENERATION_GT, 0, generation);
    let shapes: [&[TestOp]; 3] = [
        &[int(op_type::WRITE, "a", 1)],
        &[(op_type::WRITE, 0, "a", Vec::new())],
        // [unknown, flags 0]: 26 were it evaluated.
        &[packed(op_type::EXP_MODIFY, "w", &[0x92, 0x91, 0x00, 0x00])],
    ];
    for ops in shapes {
        let answer = run(&namespace, "k", gt(0), false, ops);
        assert_eq!(answer.code, ResultCode::Generation.code());
    }
    assert_eq!(get(&namespace, "k").code, ResultCode::NotFound.code());
    // 1 > 0: the write creates the record.
    let answer = run(
        &namespace,
        "k",
        gt(1),
        false,
        &[int(op_type::WRITE, "a", 1)],
    );
    assert_eq!((answer.code, answer.generation), (0, 1));
    // GENERATION (equal) with 0 creates a missing record, as before.
    let eq = write_header(info2::GENERATION, 0, 0);
    let answer = run(&namespace, "k2", eq, false, &[int(op_type::WRITE, "a", 1)]);
    assert_eq!(answer.code, 0);
}

/// A replace refuses only the ops that need the old record (here a list
/// append); CDT reads and expression writes run on the replaced (empty)
/// record. A replace that leaves no bin answers 2 and keeps the record.
#[test]
fn replace_runs_reads_and_expression_writes() {
    let namespace = namespace();
    let list_size = [0x91, 0x10];
    let list_append = [0x92, 0x01, 0x01];
    write(
        &namespace,
        "k",
        &[(op_type::WRITE, STRING, "s", b"x".to_vec())],
    );
    let replace = write_header(0, info3::REPLACE_ONLY, 0);
    let answer = run(
        &namespace,
        "k",
        replace,
        false,
        &[
            int(op_type::WRITE, "l", 7),
            packed(op_type::CDT_READ, "s", &list_size),
        ],
    );
    assert_eq!((answer.code, answer.generation), (0, 2));
    assert_eq!(
        get(&namespace, "k").bins.len(),
        1,
        "the replace kept only l"
    );
    // [3, flags 0]: the literal 3.
    let three = [0x92, 0x03, 0x00];
    let expression_write = packed(op_type::EXP_MODIFY, "w", &three);
    let answer = run(&namespace, "k", replace, false, &[expression_write]);
    assert_eq!(answer.code, 0);
    let stored = get(&namespace, "k");
    assert_eq!(stored.bins.len(), 1);
    assert_eq!(stored.bin("w"), Some((INTEGER, &3i64.to_be_bytes()[..])));
    let cdt_modify = packed(op_type::CDT_MODIFY, "l", &list_append);
    let answer = run(&namespace, "k", replace, false, &[cdt_modify]);
    assert_eq!(answer.code, ResultCode::Parameter.code());
    // [unknown, EVAL_NO_FAIL]: writes nothing, so the replace leaves no bin.
    let nothing = packed(op_type::EXP_MODIFY, "w", &[0x92, 0x91, 0x00, 0x10]);
    let answer = run(&namespace, "k", replace, false, &[nothing]);
    assert_eq!(answer.code, ResultCode::NotFound.code());
    let kept = get(&namespace, "k");
    assert_eq!((kept.code, kept.generation), (0, 3));
    assert!(kept.bin("w").is_some());
}

/// Expressions in a write see the record's set even while the write
/// creates it, and after a delete op of the same operate.
#[test]
fn expressions_in_a_write_see_the_set() {
    let namespace = namespace();
    // [[70], 0]: SetName.
    let set_name = packed(op_type::EXP_READ, "n", &[0x92, 0x91, 70, 0x00]);
    let ops = [int(op_type::WRITE, "a", 1), set_name.clone()];
    let created = run(&namespace, "k", write_header(0, 0, 0), false, &ops);
    assert_eq!(created.code, 0);
    assert_eq!(created.bin("n"), Some((STRING, &b"demo"[..])));
    let after_delete = [
        bare(op_type::DELETE_ALL),
        set_name,
        int(op_type::WRITE, "a", 2),
    ];
    let answer = run(&namespace, "k", write_header(0, 0, 0), false, &after_delete);
    assert_eq!(answer.bin("n"), Some((STRING, &b"demo"[..])));
}

/// KeyExists in a write sees only a key already stored: a key sent with
/// the write creating the record is not stored yet.
#[test]
fn key_exists_in_a_write_sees_only_a_stored_key() {
    let namespace = namespace();
    // [[71], 0]: KeyExists.
    let key_exists = packed(op_type::EXP_READ, "e", &[0x92, 0x91, 71, 0x00]);
    let ops = [int(op_type::WRITE, "a", 1), key_exists];
    let created = run(&namespace, "k", write_header(0, 0, 0), true, &ops);
    assert_eq!(created.code, 0);
    assert_eq!(created.bin("e"), Some((BOOL, &[0u8][..])));
    // Now the key is stored.
    let again = run(&namespace, "k", write_header(0, 0, 0), false, &ops);
    assert_eq!(again.bin("e"), Some((BOOL, &[1u8][..])));
}

/// A touch after a delete op touches nothing: the record is deleted (or
/// rewritten by the ops after it, its generation going on).
#[test]
fn delete_then_touch_deletes_the_record() {
    let namespace = namespace();
    write(&namespace, "k", &[int(op_type::WRITE, "a", 1)]);
    let answer = write(
        &namespace,
        "k",
        &[bare(op_type::DELETE_ALL), bare(op_type::TOUCH)],
    );
    assert_eq!(answer.code, 0);
    assert_eq!(get(&namespace, "k").code, ResultCode::NotFound.code());
    write(&namespace, "j", &[int(op_type::WRITE, "a", 1)]);
    let ops = [
        bare(op_type::DELETE_ALL),
        bare(op_type::TOUCH),
        int(op_type::WRITE, "b", 5),
    ];
    let answer = write(&namespace, "j", &ops);
    assert_eq!((answer.code, answer.generation), (0, 2));
    let stored = get(&namespace, "j");
    assert_eq!(stored.bins.len(), 1);
    assert!(stored.bin("b").is_some());
    // A touch of a missing record is still 2.
    let touch = write(&namespace, "missing", &[bare(op_type::TOUCH)]);
    assert_eq!(touch.code, ResultCode::NotFound.code());
}

/// A read of no bins (a select of none) is 4 once the record is found and
/// has passed the filter: a filter that fails answers 27 first.
#[test]
fn a_select_of_no_bins_is_filtered_before_it_is_refused() {
    let namespace = namespace();
    write(&namespace, "k", &[int(op_type::WRITE, "a", 1)]);
    let read = MsgHeader {
        info1: info1::READ,
        ..MsgHeader::default()
    };
    // msgpack false / true: filters that fail and pass.
    let filtered = run_filtered(&namespace, "k", read, false, &[], Some(&[0xc2]));
    assert_eq!(filtered.code, ResultCode::FilteredOut.code());
    let passed = run_filtered(&namespace, "k", read, false, &[], Some(&[0xc3]));
    assert_eq!(passed.code, ResultCode::Parameter.code());
    let missing = run_filtered(&namespace, "m", read, false, &[], Some(&[0xc2]));
    assert_eq!(missing.code, ResultCode::NotFound.code());
}
