//! Batch-index tests: row parsing (every row form, REPEAT, malformed
//! payloads) and batch semantics through `Service::handle`. The helpers are
//! shared with the scan tests.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::config::{NamespaceConfig, ServiceConfig};
use crate::{ManualClock, Service};
use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::msg::Op;
use citrine_wire::msg::{info1, info2, op_type};
use std::sync::Arc;

pub(crate) const START_MS: u64 = 1_700_000_000_000;

pub(crate) fn service() -> (Service, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(START_MS));
    let config = ServiceConfig::local(0xBB9020011AC4202, vec![NamespaceConfig::in_memory("test")]);
    (Service::new(config, clock.clone()), clock)
}

/// One decoded message of a reply stream.
#[derive(Debug, Clone)]
pub(crate) struct Msg {
    pub header: MsgHeader,
    pub fields: Vec<(u8, Vec<u8>)>,
    pub bins: Vec<(Vec<u8>, u8, Vec<u8>)>,
}

impl Msg {
    pub fn field(&self, kind: u8) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(field_type, _)| *field_type == kind)
            .map(|(_, data)| data.as_slice())
    }
    pub fn bin(&self, name: &str) -> Option<&[u8]> {
        self.bins
            .iter()
            .find(|(bin, _, _)| bin == name.as_bytes())
            .map(|(_, _, value)| value.as_slice())
    }
}

/// Splits a reply into frames and each frame into messages. Returns the
/// messages and the number of frames; panics on any framing fault.
pub(crate) fn decode_stream(mut bytes: &[u8]) -> (Vec<Msg>, usize) {
    let mut messages = Vec::new();
    let mut frames = 0;
    while !bytes.is_empty() {
        let mut header_bytes = [0u8; 8];
        header_bytes.copy_from_slice(&bytes[..8]);
        let proto = ProtoHeader::decode(&header_bytes).unwrap();
        assert_eq!(proto.message_type, MessageType::Message);
        let size = proto.size as usize;
        let mut body = &bytes[8..8 + size];
        assert!(!body.is_empty(), "empty frame");
        while !body.is_empty() {
            let (message, used) = Message::decode_prefix(body).unwrap();
            messages.push(Msg {
                header: message.header,
                fields: message
                    .fields()
                    .map(|field| (field.field_type, field.data.to_vec()))
                    .collect(),
                bins: message
                    .ops()
                    .map(|op| (op.name.to_vec(), op.particle_type, op.value.to_vec()))
                    .collect(),
            });
            body = &body[used..];
        }
        bytes = &bytes[8 + size..];
        frames += 1;
    }
    (messages, frames)
}

/// Runs a frame through `Service::handle` and decodes the whole reply.
pub(crate) fn run(service: &Service, frame: &[u8]) -> Vec<Msg> {
    let mut header_bytes = [0u8; 8];
    header_bytes.copy_from_slice(&frame[..8]);
    let header = ProtoHeader::decode(&header_bytes).unwrap();
    let mut out = Vec::new();
    service.handle(header, &frame[8..], &mut out).unwrap();
    decode_stream(&out).0
}

pub(crate) fn digest(set: &str, key: &str) -> Digest {
    of_key(set, &UserKey::String(key.into()))
}

/// Sends one single-record request (namespace `test`, `set`, `key`'s
/// digest, `ops` as (op type, particle type, bin, value)); its reply.
pub(crate) fn single(
    service: &Service,
    header: MsgHeader,
    set: &str,
    key: &str,
    ops: &[(u8, u8, &str, &[u8])],
) -> Msg {
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, set.as_bytes())
        .field(field_type::DIGEST, &digest(set, key).0);
    for (op, particle, bin, value) in ops {
        writer.op(*op, *particle, bin.as_bytes(), value);
    }
    writer.finish();
    let mut reply = run(service, &out);
    assert_eq!(reply.len(), 1);
    reply.remove(0)
}

/// Writes a record with string key `key` in `set`, integer bins, and the
/// key stored when `send_key`.
pub(crate) fn put(service: &Service, set: &str, key: &str, bins: &[(&str, i64)], send_key: bool) {
    let mut out = Vec::new();
    let header = MsgHeader {
        info2: info2::WRITE,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, set.as_bytes())
        .field(field_type::DIGEST, &digest(set, key).0);
    if send_key {
        writer.field(field_type::KEY, &UserKey::String(key.into()).to_field());
    }
    for (name, value) in bins {
        writer.op(op_type::WRITE, 1, name.as_bytes(), &value.to_be_bytes());
    }
    writer.finish();
    let reply = run(service, &out);
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0].header.result_code, 0, "put {set}/{key}");
}

/// Writes a record with one blob bin of `size` bytes.
pub(crate) fn put_blob(service: &Service, set: &str, key: &str, size: usize) {
    let mut out = Vec::new();
    let header = MsgHeader {
        info2: info2::WRITE,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, set.as_bytes())
        .field(field_type::DIGEST, &digest(set, key).0);
    writer.op(op_type::WRITE, 4, b"blob", &vec![7u8; size]);
    writer.finish();
    assert_eq!(run(service, &out)[0].header.result_code, 0);
}

/// A row as the builder writes it.
#[derive(Clone)]
pub(crate) enum RowSpec {
    /// Full row: type byte, info1..4, generation, ttl, fields, ops.
    Full {
        index: u32,
        digest: Digest,
        row_type: u8,
        info: [u8; 4],
        generation: u16,
        ttl: u32,
        fields: Vec<(u8, Vec<u8>)>,
        ops: Vec<(u8, u8, Vec<u8>, Vec<u8>)>,
    },
    Repeat {
        index: u32,
        digest: Digest,
    },
}

impl RowSpec {
    /// A full row in namespace `ns`, set `set`.
    pub fn full(
        index: u32,
        ns: &str,
        set: &str,
        key: &str,
        row_type: u8,
        info: [u8; 4],
    ) -> RowSpec {
        RowSpec::Full {
            index,
            digest: digest(set, key),
            row_type,
            info,
            generation: 0,
            ttl: 0,
            fields: vec![
                (field_type::NAMESPACE, ns.as_bytes().to_vec()),
                (field_type::SET, set.as_bytes().to_vec()),
            ],
            ops: Vec::new(),
        }
    }
    pub fn op(mut self, op: u8, particle: u8, name: &str, value: &[u8]) -> RowSpec {
        if let RowSpec::Full { ops, .. } = &mut self {
            ops.push((op, particle, name.as_bytes().to_vec(), value.to_vec()));
        }
        self
    }
    pub fn field(mut self, kind: u8, data: &[u8]) -> RowSpec {
        if let RowSpec::Full { fields, .. } = &mut self {
            fields.push((kind, data.to_vec()));
        }
        self
    }
    pub fn gen_ttl(mut self, new_generation: u16, new_ttl: u32) -> RowSpec {
        if let RowSpec::Full {
            generation, ttl, ..
        } = &mut self
        {
            *generation = new_generation;
            *ttl = new_ttl;
        }
        self
    }
}

/// Encodes a BATCH_INDEX payload.
pub(crate) fn payload(rows: &[RowSpec], flags: u8) -> Vec<u8> {
    let mut out = (rows.len() as u32).to_be_bytes().to_vec();
    out.push(flags);
    for row in rows {
        match row {
            RowSpec::Repeat { index, digest } => {
                out.extend_from_slice(&index.to_be_bytes());
                out.extend_from_slice(&digest.0);
                out.push(row_flags::REPEAT);
            }
            RowSpec::Full {
                index,
                digest,
                row_type,
                info,
                generation,
                ttl,
                fields,
                ops,
            } => {
                out.extend_from_slice(&index.to_be_bytes());
                out.extend_from_slice(&digest.0);
                out.push(*row_type);
                out.push(info[0]);
                if row_type & row_flags::INFO != 0 {
                    out.push(info[1]);
                    out.push(info[2]);
                }
                if row_type & row_flags::INFO4 != 0 {
                    out.push(info[3]);
                }
                if row_type & row_flags::GENERATION != 0 {
                    out.extend_from_slice(&generation.to_be_bytes());
                }
                if row_type & row_flags::TTL != 0 {
                    out.extend_from_slice(&ttl.to_be_bytes());
                }
                out.extend_from_slice(&(fields.len() as u16).to_be_bytes());
                out.extend_from_slice(&(ops.len() as u16).to_be_bytes());
                for (kind, data) in fields {
                    out.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
                    out.push(*kind);
                    out.extend_from_slice(data);
                }
                for (op, particle, name, value) in ops {
                    out.extend_from_slice(&((4 + name.len() + value.len()) as u32).to_be_bytes());
                    out.extend_from_slice(&[*op, *particle, 0, name.len() as u8]);
                    out.extend_from_slice(name);
                    out.extend_from_slice(value);
                }
            }
        }
    }
    out
}

/// A batch request frame around `payload`.
pub(crate) fn batch_frame(payload: &[u8], parent_filter: bool) -> Vec<u8> {
    // [EQ, 2, 3]: false for every record.
    let filter: &[u8] = &[0x93, 0x01, 0x02, 0x03];
    batch_frame_filtered(payload, parent_filter.then_some(filter))
}

/// A batch request frame around `payload` with a parent filter expression.
pub(crate) fn batch_frame_filtered(payload: &[u8], filter: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    let header = MsgHeader {
        info1: info1::BATCH | info1::READ,
        transaction_ttl: 1000,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut out, &header);
    if let Some(filter) = filter {
        writer.field(field_type::FILTER_EXPRESSION, filter);
    }
    writer.field(field_type::BATCH_INDEX, payload);
    writer.finish();
    out
}

const READ_ALL: [u8; 4] = [info1::READ | info1::GET_ALL, 0, 0, 0];
const READ_HEADER: [u8; 4] = [info1::READ | info1::GET_NO_BINS, 0, 0, 0];

/// Splits a batch reply into its rows and its LAST message.
fn rows_and_last(messages: Vec<Msg>) -> (Vec<Msg>, Msg) {
    let mut messages = messages;
    let last = messages.pop().unwrap();
    assert_eq!(
        last.header.info3 & info3::LAST,
        info3::LAST,
        "ends with LAST"
    );
    assert!(messages
        .iter()
        .all(|message| message.header.info3 & info3::LAST == 0));
    (messages, last)
}

// ---- row parsing -------------------------------------------------------

#[test]
fn parses_every_row_form() {
    let rows = vec![
        RowSpec::full(7, "test", "demo", "a", 0x00, READ_ALL),
        RowSpec::Repeat {
            index: 9,
            digest: digest("demo", "b"),
        },
        RowSpec::full(10, "test", "demo", "c", row_flags::INFO, [1, 0x80, 0x40, 0]).op(
            op_type::READ,
            0,
            "x",
            b"",
        ),
        RowSpec::full(
            11,
            "test",
            "demo",
            "d",
            row_flags::INFO | row_flags::GENERATION | row_flags::TTL,
            [0, info2::WRITE | info2::GENERATION, 0, 0],
        )
        .gen_ttl(3, 60)
        .op(op_type::WRITE, 1, "n", &5i64.to_be_bytes()),
        RowSpec::full(
            12,
            "test",
            "demo",
            "e",
            row_flags::INFO | row_flags::INFO4 | row_flags::TTL,
            [1, 0, 0, 0x21],
        )
        .gen_ttl(0, 77),
    ];
    let bytes = payload(&rows, 0x0C);
    let parent = Parent {
        sc_bits: info3::SC_READ_TYPE,
        record_ttl: 55,
        transaction_ttl: 0,
        started: None,
    };
    assert_eq!(payload_header(&bytes), Ok((5, 0x0C)));
    assert_eq!(validate(&bytes, parent, 5000), Ok(5));
    let mut reader = RowReader::new(&bytes, parent);
    let legacy = reader.next_row().unwrap();
    assert_eq!(legacy.index, 7);
    assert_eq!(legacy.digest, digest("demo", "a"));
    assert_eq!(legacy.body.header.info1, READ_ALL[0]);
    assert_eq!(legacy.body.header.info2, 0);
    // Legacy rows inherit the parent's SC bits and record_ttl.
    assert_eq!(legacy.body.header.info3, info3::SC_READ_TYPE);
    assert_eq!(legacy.body.header.record_ttl, 55);
    assert_eq!(legacy.body.field(field_type::NAMESPACE), Some(&b"test"[..]));
    assert_eq!(legacy.body.field(field_type::SET), Some(&b"demo"[..]));
    let repeat = reader.next_row().unwrap();
    assert_eq!(repeat.index, 9);
    assert_eq!(repeat.digest, digest("demo", "b"));
    assert_eq!(repeat.body.header, legacy.body.header);
    assert_eq!(repeat.body.fields, legacy.body.fields);
    let info = reader.next_row().unwrap();
    assert_eq!(
        (
            info.body.header.info1,
            info.body.header.info2,
            info.body.header.info3
        ),
        (1, 0x80, 0x40)
    );
    assert_eq!(info.body.header.n_ops, 1);
    let ops: Vec<Op<'_>> = Ops::Raw(info.body.ops).iter().collect();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].name, b"x");
    let write = reader.next_row().unwrap();
    assert_eq!(write.body.header.generation, 3);
    assert_eq!(write.body.header.record_ttl, 60);
    assert_eq!(write.body.header.info2, info2::WRITE | info2::GENERATION);
    let ops: Vec<Op<'_>> = Ops::Raw(write.body.ops).iter().collect();
    assert_eq!(ops[0].value, &5i64.to_be_bytes());
    let info4 = reader.next_row().unwrap();
    assert_eq!(info4.body.header.info4, 0x21);
    assert_eq!(info4.body.header.record_ttl, 77);
    assert!(reader.at_end());
}

#[test]
fn old_clients_zero_field_count_means_namespace_only() {
    let mut bytes = payload(&[RowSpec::full(0, "test", "", "k", 0, READ_ALL)], 0);
    // Drop the (empty) set field and claim 0 fields.
    let row = RowSpec::full(0, "test", "", "k", 0, READ_ALL);
    if let RowSpec::Full { mut fields, .. } = row {
        fields.truncate(1);
        bytes = payload(
            &[RowSpec::Full {
                index: 0,
                digest: digest("", "k"),
                row_type: 0,
                info: READ_ALL,
                generation: 0,
                ttl: 0,
                fields,
                ops: Vec::new(),
            }],
            0,
        );
    }
    // n_fields sits after index (4), digest (20), type (1), info1 (1).
    bytes[5 + 26..5 + 28].copy_from_slice(&0u16.to_be_bytes());
    let mut reader = RowReader::new(&bytes, Parent::default());
    let row = reader.next_row().unwrap();
    assert_eq!(row.body.header.n_fields, 1);
    assert_eq!(row.body.field(field_type::NAMESPACE), Some(&b"test"[..]));
    assert!(reader.at_end());
}

#[test]
fn repeat_rules() {
    let first_repeat = payload(
        &[RowSpec::Repeat {
            index: 0,
            digest: digest("demo", "a"),
        }],
        0,
    );
    assert_eq!(
        validate(&first_repeat, Parent::default(), 5000),
        Err(BatchError::Malformed("REPEAT on the first row"))
    );
    let after_key = payload(
        &[
            RowSpec::full(0, "test", "demo", "a", 0, READ_ALL)
                .field(field_type::KEY, &UserKey::String("a".into()).to_field()),
            RowSpec::Repeat {
                index: 1,
                digest: digest("demo", "b"),
            },
        ],
        0,
    );
    assert!(validate(&after_key, Parent::default(), 5000).is_err());
    let mut mixed_bits = payload(
        &[
            RowSpec::full(0, "test", "demo", "a", 0, READ_ALL),
            RowSpec::Repeat {
                index: 1,
                digest: digest("demo", "b"),
            },
        ],
        0,
    );
    let last = mixed_bits.len() - 1;
    mixed_bits[last] = row_flags::REPEAT | row_flags::INFO;
    assert!(validate(&mixed_bits, Parent::default(), 5000).is_err());
}

#[test]
fn malformed_payloads_are_refused_never_panic() {
    let rows = vec![
        RowSpec::full(0, "test", "demo", "a", 0, READ_ALL).op(op_type::READ, 0, "bin", b""),
        RowSpec::Repeat {
            index: 1,
            digest: digest("demo", "b"),
        },
        RowSpec::full(
            2,
            "test",
            "demo",
            "c",
            row_flags::INFO | row_flags::GENERATION | row_flags::TTL | row_flags::INFO4,
            [0, info2::WRITE, 0, 0],
        )
        .op(op_type::WRITE, 3, "s", b"value"),
    ];
    let bytes = payload(&rows, 0);
    assert_eq!(validate(&bytes, Parent::default(), 5000), Ok(3));
    // Every truncation is refused.
    for cut in 0..bytes.len() {
        assert!(
            validate(&bytes[..cut], Parent::default(), 5000).is_err(),
            "cut at {cut}"
        );
    }
    // Trailing bytes are refused.
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(validate(&longer, Parent::default(), 5000).is_err());
    // Every single-byte corruption is handled without a panic.
    for at in 0..bytes.len() {
        for value in [0x00, 0x01, 0x7F, 0x80, 0xFF] {
            let mut corrupt = bytes.clone();
            corrupt[at] = value;
            let _ = validate(&corrupt, Parent::default(), 5000);
        }
    }
    // Pseudo-random payloads, through the whole service.
    let (service, _) = service();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for round in 0..2000 {
        let length = (round % 97) + 1;
        let mut noise: Vec<u8> = (0..length)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        // Keep the row count small so some payloads get past the header.
        noise[..4.min(length)].fill(0);
        if length > 3 {
            noise[3] = (round % 3) as u8;
        }
        let _ = validate(&noise, Parent::default(), 5000);
        let reply = run(&service, &batch_frame(&noise, false));
        assert_eq!(
            reply.last().unwrap().header.info3 & info3::LAST,
            info3::LAST
        );
    }
    // Corrupted real payloads through the service: always a LAST at the end.
    for at in 0..bytes.len() {
        let mut corrupt = bytes.clone();
        corrupt[at] ^= 0xA5;
        let reply = run(&service, &batch_frame(&corrupt, false));
        assert!(reply.last().unwrap().header.info3 & info3::LAST != 0);
    }
}

#[test]
fn refusals_before_dispatch_are_a_single_last() {
    let (service, _) = service();
    put(&service, "demo", "a", &[("n", 1)], false);
    // Zero rows → 4.
    let reply = run(&service, &batch_frame(&[0, 0, 0, 0, 0], false));
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0].header.info3, info3::LAST);
    assert_eq!(reply[0].header.result_code, ResultCode::Parameter.code());
    // Truncated → 4, no row answered.
    let rows = [RowSpec::full(0, "test", "demo", "a", 0, READ_ALL)];
    let bytes = payload(&rows, 0);
    let reply = run(&service, &batch_frame(&bytes[..bytes.len() - 1], false));
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0].header.result_code, 4);
    // No BATCH_INDEX field → 4.
    let mut frame = Vec::new();
    let header = MsgHeader {
        info1: info1::BATCH,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer.field(field_type::NAMESPACE, b"test");
    writer.finish();
    let reply = run(&service, &frame);
    assert_eq!((reply.len(), reply[0].header.result_code), (1, 4));
    // batch-max-requests is 0 by default, no limit, as the reference's (the
    // Rust client's suite sends 10 000 rows): every row is answered.
    let many: Vec<RowSpec> = (0..10_000)
        .map(|index| RowSpec::full(index, "test", "demo", "a", 0, READ_ALL))
        .collect();
    let reply = run(&service, &batch_frame(&payload(&many, 0), false));
    assert_eq!(reply.len(), 10_001, "a row each and LAST");
    assert_eq!(reply.last().map(|m| m.header.result_code), Some(0));
    // More rows than a set batch-max-requests → 151.
    service.batch_max_requests.store(2, Ordering::Relaxed);
    let three: Vec<RowSpec> = (0..3)
        .map(|index| RowSpec::full(index, "test", "demo", "a", 0, READ_ALL))
        .collect();
    let reply = run(&service, &batch_frame(&payload(&three, 0), false));
    assert_eq!(reply[0].header.result_code, 151);
    // A body that does not decode at all still ends a batch stream.
    let mut broken = batch_frame(&payload(&three[..1], 0), false);
    broken.push(0);
    let size = (broken.len() - 8) as u64;
    broken[..8].copy_from_slice(&ProtoHeader::encode(MessageType::Message, size));
    let reply = run(&service, &broken);
    assert_eq!(
        (reply[0].header.info3, reply[0].header.result_code),
        (info3::LAST, 4)
    );
}

/// Measured against the CE 8.1.2 reference (respond-all-keys, as the
/// clients send by default): where no transactions run, a row with a
/// transaction id, or a verify or roll bit, answers 25 and the others run;
/// a version or deadline field alone is ignored.
#[test]
fn transaction_rows_answer_25_where_none_runs() {
    let (service, _) = service();
    put(&service, "demo", "a", &[("n", 1)], false);
    let row = |index: u32, info4: u8, field: (u8, &[u8])| {
        RowSpec::full(
            index,
            "test",
            "demo",
            "a",
            row_flags::INFO | row_flags::INFO4,
            [info1::READ | info1::GET_ALL, 0, 0, info4],
        )
        .field(field.0, field.1)
    };
    let id = 1u64.to_le_bytes();
    let rows = [
        row(0, 0, (field_type::TXN_ID, &id)),
        row(1, 1, (field_type::RECORD_VERSION, &[0; 7])),
        row(2, 4, (field_type::TXN_ID, &id)),
        row(3, 0, (field_type::RECORD_VERSION, &[0; 7])),
        row(4, 0, (field_type::TXN_DEADLINE, &[0; 4])),
    ];
    let reply = run(&service, &batch_frame(&payload(&rows, 0x04), false));
    let (rows_out, last) = rows_and_last(reply);
    assert_eq!(last.header.result_code, 0);
    let codes: Vec<u8> = rows_out.iter().map(|row| row.header.result_code).collect();
    assert_eq!(codes, vec![25, 25, 25, 0, 0]);
    assert_eq!(rows_out[3].bin("n"), Some(&1i64.to_be_bytes()[..]));
}

// ---- batch semantics ---------------------------------------------------

#[test]
fn mixed_batch_answers_every_row_in_order() {
    let (service, _) = service();
    put(&service, "demo", "a", &[("x", 1), ("y", 2)], false);
    put(&service, "demo", "b", &[("x", 10)], false);
    put(&service, "demo", "gone", &[("x", 3)], false);
    let write_flags = row_flags::INFO | row_flags::GENERATION | row_flags::TTL;
    let rows = vec![
        // 0: get all bins.
        RowSpec::full(100, "test", "demo", "a", 0, READ_ALL),
        // 1: repeat → b, all bins.
        RowSpec::Repeat {
            index: 101,
            digest: digest("demo", "b"),
        },
        // 2: repeat → missing record.
        RowSpec::Repeat {
            index: 102,
            digest: digest("demo", "missing"),
        },
        // 3: exists / header.
        RowSpec::full(103, "test", "demo", "a", 0, READ_HEADER),
        // 4: named bin.
        RowSpec::full(
            104,
            "test",
            "demo",
            "a",
            row_flags::INFO,
            [info1::READ, 0, 0, 0],
        )
        .op(op_type::READ, 0, "y", b""),
        // 5: write a new record.
        RowSpec::full(
            105,
            "test",
            "demo",
            "new",
            write_flags,
            [0, info2::WRITE, 0, 0],
        )
        .op(op_type::WRITE, 3, "s", b"hello"),
        // 6: delete.
        RowSpec::full(
            106,
            "test",
            "demo",
            "gone",
            write_flags,
            [0, info2::WRITE | info2::DELETE, 0, 0],
        ),
        // 7: operate: incr then read.
        RowSpec::full(
            107,
            "test",
            "demo",
            "b",
            write_flags,
            [info1::READ, info2::WRITE, 0, 0],
        )
        .op(op_type::INCR, 1, "x", &5i64.to_be_bytes())
        .op(op_type::READ, 0, "x", b""),
        // 8: unknown namespace.
        RowSpec::full(108, "nope", "demo", "a", 0, READ_ALL),
        // 9: UDF row of a module that is not registered: 100.
        RowSpec::full(
            109,
            "test",
            "demo",
            "a",
            write_flags,
            [0, info2::WRITE, 0, 0],
        )
        .field(field_type::UDF_FILENAME, b"m")
        .field(field_type::UDF_FUNCTION, b"f")
        .field(field_type::UDF_ARGLIST, &[0x90]),
        // 10: transaction row.
        RowSpec::full(
            110,
            "test",
            "demo",
            "a",
            row_flags::INFO | row_flags::INFO4,
            [info1::READ | info1::GET_ALL, 0, 0, 1],
        )
        .field(field_type::TXN_ID, &1u64.to_le_bytes()),
        // 11: a row filter the record does not pass ([EQ, 2, 3]).
        RowSpec::full(111, "test", "demo", "a", 0, READ_ALL)
            .field(field_type::FILTER_EXPRESSION, &[0x93, 0x01, 0x02, 0x03]),
        // 12: generation mismatch on a write.
        RowSpec::full(
            112,
            "test",
            "demo",
            "a",
            write_flags,
            [0, info2::WRITE | info2::GENERATION, 0, 0],
        )
        .gen_ttl(9, 0)
        .op(op_type::WRITE, 1, "x", &0i64.to_be_bytes()),
        // 13: the record written by row 5, read back in the same batch.
        RowSpec::full(113, "test", "demo", "new", 0, READ_ALL),
    ];
    let reply = run(&service, &batch_frame(&payload(&rows, 0x0C), false));
    let (rows_out, last) = rows_and_last(reply);
    assert_eq!(last.header.result_code, 0);
    assert_eq!(rows_out.len(), rows.len());
    let indexes: Vec<u32> = rows_out
        .iter()
        .map(|row| row.header.transaction_ttl)
        .collect();
    assert_eq!(indexes, (100..114).collect::<Vec<u32>>());
    let codes: Vec<u8> = rows_out.iter().map(|row| row.header.result_code).collect();
    assert_eq!(codes, vec![0, 0, 2, 0, 0, 0, 0, 0, 20, 100, 25, 27, 3, 0]);
    assert_eq!(rows_out[0].bin("x"), Some(&1i64.to_be_bytes()[..]));
    assert_eq!(rows_out[0].bin("y"), Some(&2i64.to_be_bytes()[..]));
    assert_eq!(rows_out[0].header.generation, 1);
    assert!(rows_out[0].fields.is_empty(), "rows carry no fields");
    assert_eq!(rows_out[1].bin("x"), Some(&10i64.to_be_bytes()[..]));
    assert!(rows_out[2].bins.is_empty());
    assert!(rows_out[3].bins.is_empty());
    assert_eq!(rows_out[3].header.generation, 1);
    assert_eq!(rows_out[4].bins.len(), 1);
    assert_eq!(rows_out[4].bin("y"), Some(&2i64.to_be_bytes()[..]));
    assert_eq!(rows_out[5].header.generation, 1);
    assert!(rows_out[6].bins.is_empty());
    assert_eq!(rows_out[7].bin("x"), Some(&15i64.to_be_bytes()[..]));
    assert_eq!(rows_out[7].header.generation, 2);
    assert_eq!(rows_out[13].bin("s"), Some(&b"hello"[..]));
    // Errors carry no generation or bins, but a UDF's failure carries
    // its message.
    assert!(rows_out[8..13]
        .iter()
        .enumerate()
        .all(|(i, row)| (i == 1 || row.bins.is_empty()) && row.header.generation == 0));
    // A module that is not registered: the reference's words for it.
    let failure = rows_out[9].bin("FAILURE").expect("a FAILURE bin");
    assert_eq!(String::from_utf8_lossy(failure), "UDF: Execution Error 1");
    // The writes and the delete happened.
    let check = vec![
        RowSpec::full(0, "test", "demo", "gone", 0, READ_ALL),
        RowSpec::Repeat {
            index: 1,
            digest: digest("demo", "new"),
        },
    ];
    let (after, _) = rows_and_last(run(&service, &batch_frame(&payload(&check, 0), false)));
    assert_eq!(after[0].header.result_code, 2);
    assert_eq!(after[1].header.result_code, 0);
}

#[test]
fn parent_filter_expression_applies_to_every_row() {
    let (service, _) = service();
    put(&service, "demo", "a", &[("x", 1)], false);
    let rows = vec![
        RowSpec::full(0, "test", "demo", "a", 0, READ_ALL),
        RowSpec::Repeat {
            index: 1,
            digest: digest("demo", "a"),
        },
    ];
    let (rows_out, last) = rows_and_last(run(&service, &batch_frame(&payload(&rows, 0), true)));
    assert_eq!(last.header.result_code, 0);
    assert!(rows_out.iter().all(|row| row.header.result_code == 27));
    // [EQ, [BIN, INT, "x"], 1] passes both rows; a row's own filter
    // ([EQ, 1, 2]) replaces the parent's.
    let passes: &[u8] = &[0x93, 0x01, 0x93, 0x51, 0x02, 0xA1, b'x', 0x01];
    let mut rows = rows;
    rows.push(
        RowSpec::full(2, "test", "demo", "a", 0, READ_ALL)
            .field(field_type::FILTER_EXPRESSION, &[0x93, 0x01, 0x01, 0x02]),
    );
    let (rows_out, _) = rows_and_last(run(
        &service,
        &batch_frame_filtered(&payload(&rows, 0), Some(passes)),
    ));
    let codes: Vec<u8> = rows_out.iter().map(|row| row.header.result_code).collect();
    assert_eq!(codes, vec![0, 0, 27]);
    // A parent filter that does not parse fails the whole batch (4).
    let reply = run(
        &service,
        &batch_frame_filtered(&payload(&rows, 0), Some(&[0x91, 0x01])),
    );
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0].header.result_code, 4);
}

#[test]
fn stored_keys_are_checked_but_not_returned() {
    let (service, _) = service();
    put(&service, "demo", "a", &[("x", 1)], true);
    let good = RowSpec::full(0, "test", "demo", "a", 0, READ_ALL)
        .field(field_type::KEY, &UserKey::String("a".into()).to_field());
    let mut bad = RowSpec::full(1, "test", "demo", "a", 0, READ_ALL)
        .field(field_type::KEY, &UserKey::String("zzz".into()).to_field());
    if let RowSpec::Full {
        digest: row_digest, ..
    } = &mut bad
    {
        *row_digest = digest("demo", "a");
    }
    let (rows_out, _) = rows_and_last(run(
        &service,
        &batch_frame(&payload(&[good, bad], 0), false),
    ));
    assert_eq!(rows_out[0].header.result_code, 0);
    assert!(rows_out[0].fields.is_empty());
    assert_eq!(
        rows_out[1].header.result_code,
        ResultCode::KeyMismatch.code()
    );
}

#[test]
fn big_batches_stream_in_frames() {
    let (service, _) = service();
    for key in 0..40 {
        put_blob(&service, "demo", &format!("k{key}"), 100_000);
    }
    let rows: Vec<RowSpec> = (0..40)
        .map(|key| RowSpec::full(key, "test", "demo", &format!("k{key}"), 0, READ_ALL))
        .collect();
    let frame = batch_frame(&payload(&rows, 0), false);
    let mut header_bytes = [0u8; 8];
    header_bytes.copy_from_slice(&frame[..8]);
    let header = ProtoHeader::decode(&header_bytes).unwrap();
    let mut chunks = Vec::new();
    let mut out = Vec::new();
    let mut pending = service
        .handle_streaming(header, &frame[8..], &mut out)
        .unwrap();
    chunks.push(std::mem::take(&mut out));
    while let Some(continuation) = pending {
        pending = service.resume(continuation, &mut out);
        chunks.push(std::mem::take(&mut out));
    }
    assert!(chunks.len() >= 4, "{} chunks", chunks.len());
    let mut all = Vec::new();
    for chunk in &chunks {
        let (_, frames) = decode_stream(chunk);
        assert_eq!(frames, 1, "one frame per chunk");
        assert!(chunk.len() < FRAME_TARGET_BYTES + 200_000);
        all.extend_from_slice(chunk);
    }
    let (rows_out, last) = rows_and_last(decode_stream(&all).0);
    assert_eq!(last.header.result_code, 0);
    assert_eq!(rows_out.len(), 40);
    for (position, row) in rows_out.iter().enumerate() {
        assert_eq!(row.header.transaction_ttl, position as u32);
        assert_eq!(row.header.result_code, 0);
        assert_eq!(row.bin("blob").map(<[u8]>::len), Some(100_000));
    }
}

#[test]
fn repeat_survives_a_frame_boundary() {
    let (service, _) = service();
    for key in 0..30 {
        put_blob(&service, "demo", &format!("k{key}"), 200_000);
    }
    // One full row, then only repeats: resuming must restore the template.
    let mut rows = vec![RowSpec::full(0, "test", "demo", "k0", 0, READ_ALL)];
    rows.extend((1..30).map(|key| RowSpec::Repeat {
        index: key,
        digest: digest("demo", &format!("k{key}")),
    }));
    let mut header_bytes = [0u8; 8];
    let frame = batch_frame(&payload(&rows, 0), false);
    header_bytes.copy_from_slice(&frame[..8]);
    let header = ProtoHeader::decode(&header_bytes).unwrap();
    let mut out = Vec::new();
    let mut pending = service
        .handle_streaming(header, &frame[8..], &mut out)
        .unwrap();
    let mut steps = 1;
    while let Some(continuation) = pending {
        pending = service.resume(continuation, &mut out);
        steps += 1;
    }
    assert!(steps > 2);
    let (rows_out, _) = rows_and_last(decode_stream(&out).0);
    assert_eq!(rows_out.len(), 30);
    assert!(rows_out
        .iter()
        .all(|row| row.header.result_code == 0 && row.bin("blob").is_some()));
}

#[test]
fn a_row_with_the_most_fields_is_refused_not_overflowed_when_routed() {
    // A row may carry 65 535 fields (a u16 count); in a cluster the row is
    // re-encoded as a single-record request with the digest (and the
    // parent's filter) added, which no longer fits the u16 field count.
    let mut row = RowSpec::full(0, "test", "demo", "a", 0, READ_ALL);
    if let RowSpec::Full { fields, .. } = &mut row {
        while fields.len() < usize::from(u16::MAX) {
            fields.push((200, Vec::new()));
        }
    }
    let bytes = payload(&[row], 0);
    let parent = Parent::default();
    let parsed = RowReader::new(&bytes, parent).next_row().unwrap();
    assert_eq!(parsed.body.fields().count(), usize::from(u16::MAX));
    assert!(single_body(&parsed, parent, None).is_none());
    assert!(single_body(&parsed, parent, Some(&[0xc3])).is_none());
    // One field fewer fits without a parent filter, not with one.
    let mut row = RowSpec::full(0, "test", "demo", "a", 0, READ_ALL);
    if let RowSpec::Full { fields, .. } = &mut row {
        while fields.len() < usize::from(u16::MAX) - 1 {
            fields.push((200, Vec::new()));
        }
    }
    let bytes = payload(&[row], 0);
    let parsed = RowReader::new(&bytes, parent).next_row().unwrap();
    let body = single_body(&parsed, parent, None).unwrap();
    let (message, _) = Message::decode_prefix(&body).unwrap();
    assert_eq!(message.header.n_fields, u16::MAX);
    assert_eq!(
        message.field(field_type::DIGEST),
        Some(&digest("demo", "a").0[..])
    );
    assert!(single_body(&parsed, parent, Some(&[0xc3])).is_none());
}

/// Registers `spin.lua`, whose `spin` never returns.
fn register_spin(service: &Service) {
    use base64::Engine as _;
    let source = b"function spin(rec) while true do end end";
    let content = base64::engine::general_purpose::STANDARD.encode(source);
    assert_eq!(
        crate::sindex::tests::info(
            service,
            &format!(
                "udf-put:filename=spin.lua;content={content};content-len={};",
                content.len()
            )
        ),
        "ok"
    );
}

/// A UDF row runs under the batch request's timeout (three quarters of
/// it), as a single-record call does: rows carry no timeout of their own.
/// An endless function under a 2 s request stops after 1.5 s, not after
/// the 1 s of a request without one. (Only the lower bound is checked: a
/// time limit cannot fire early, a loaded machine can make it late.)
#[test]
fn a_udf_row_runs_under_the_requests_timeout() {
    let (service, _) = service();
    register_spin(&service);
    let rows = [RowSpec::full(
        0,
        "test",
        "demo",
        "a",
        row_flags::INFO | row_flags::GENERATION | row_flags::TTL,
        [0, info2::WRITE, 0, 0],
    )
    .field(field_type::UDF_FILENAME, b"spin")
    .field(field_type::UDF_FUNCTION, b"spin")
    .field(field_type::UDF_ARGLIST, &[0x90])];
    let mut frame = Vec::new();
    let header = MsgHeader {
        info1: info1::BATCH,
        info2: info2::WRITE,
        transaction_ttl: 2000,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer.field(field_type::BATCH_INDEX, &payload(&rows, 0));
    writer.finish();
    let started = std::time::Instant::now();
    let (rows_out, last) = rows_and_last(run(&service, &frame));
    let took = started.elapsed();
    assert_eq!(last.header.result_code, 0);
    assert_eq!(rows_out[0].header.result_code, 100);
    let failure =
        String::from_utf8_lossy(rows_out[0].bin("FAILURE").expect("FAILURE bin")).into_owned();
    assert!(failure.contains("time"), "{failure}");
    assert!(
        took >= std::time::Duration::from_millis(1450),
        "stopped after {took:?}: not the request's 1.5 s"
    );
}

/// A batch's UDF rows share one time limit, counted from the batch's
/// start: three endless rows under an 800 ms request stop after its
/// 600 ms together, the rows left answering TIMEOUT (9) without running —
/// not after 600 ms each (at least 1.8 s) holding the service thread.
#[test]
fn a_batchs_udf_rows_share_one_time_limit() {
    let (service, _) = service();
    register_spin(&service);
    let rows: Vec<RowSpec> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(index, key)| {
            RowSpec::full(
                index as u32,
                "test",
                "demo",
                key,
                row_flags::INFO | row_flags::GENERATION | row_flags::TTL,
                [0, info2::WRITE, 0, 0],
            )
            .field(field_type::UDF_FILENAME, b"spin")
            .field(field_type::UDF_FUNCTION, b"spin")
            .field(field_type::UDF_ARGLIST, &[0x90])
        })
        .collect();
    let mut frame = Vec::new();
    let header = MsgHeader {
        info1: info1::BATCH,
        info2: info2::WRITE,
        transaction_ttl: 800,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer.field(field_type::BATCH_INDEX, &payload(&rows, 0));
    writer.finish();
    let started = std::time::Instant::now();
    let (rows_out, last) = rows_and_last(run(&service, &frame));
    let took = started.elapsed();
    assert_eq!(last.header.result_code, 0);
    let codes: Vec<u8> = rows_out.iter().map(|row| row.header.result_code).collect();
    assert_eq!(codes[0], 100, "{codes:?}");
    assert_eq!(codes[2], 9, "{codes:?}");
    assert!(matches!(codes[1], 9 | 100), "{codes:?}");
    assert!(
        took < std::time::Duration::from_millis(1500),
        "the rows ran {took:?}: each had the whole limit"
    );
}

/// A batch counts once in `batch-index`, and each row it ran in its
/// namespace's batch-sub histogram (a row of an unknown namespace in none).
#[test]
fn a_batch_counts_itself_and_its_rows_in_the_latency_histograms() {
    let (service, _) = service();
    put(&service, "demo", "a", &[("x", 1)], false);
    let rows = vec![
        RowSpec::full(0, "test", "demo", "a", 0, READ_ALL),
        RowSpec::full(
            1,
            "test",
            "demo",
            "b",
            row_flags::INFO,
            [0, info2::WRITE, 0, 0],
        )
        .op(op_type::WRITE, 1, "x", &2i64.to_be_bytes()),
        RowSpec::full(2, "nope", "demo", "a", 0, READ_ALL),
    ];
    run(&service, &batch_frame(&payload(&rows, 0), false));
    let totals = crate::latency::totals(service.latencies());
    let expected = [
        ("batch-index", 1),
        ("{test}-write", 1),
        ("{test}-batch-sub-read", 1),
        ("{test}-batch-sub-write", 1),
    ];
    assert_eq!(
        totals,
        expected.map(|(name, count)| (name.to_owned(), count))
    );
}
