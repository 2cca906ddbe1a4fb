//! Service tests: requests built with the wire codec, run through
//! `Service::handle`, replies decoded and checked.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::config::{NamespaceConfig, StorageEngineConfig};
use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::msg::{field_type, info1, info2, info3, op_type, MessageWriter, MsgHeader};

const START_MS: u64 = 1_700_000_000_000;

fn service_with(namespace: NamespaceConfig) -> (Service, Arc<ManualClock>) {
    service_with_all(vec![namespace])
}

fn service_with_all(namespaces: Vec<NamespaceConfig>) -> (Service, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(START_MS));
    let config = ServiceConfig::local(0xBB9020011AC4202, namespaces);
    (Service::new(config, clock.clone()), clock)
}

fn service() -> (Service, Arc<ManualClock>) {
    service_with(NamespaceConfig::in_memory("test"))
}

struct Reply {
    header: MsgHeader,
    bins: Vec<(Vec<u8>, u8, Vec<u8>)>,
    fields: Vec<(u8, Vec<u8>)>,
}

fn send(service: &Service, frame: &[u8]) -> Reply {
    let mut header_bytes = [0u8; 8];
    header_bytes.copy_from_slice(&frame[..8]);
    let header = ProtoHeader::decode(&header_bytes).unwrap();
    let mut out = Vec::new();
    service.handle(header, &frame[8..], &mut out).unwrap();
    let message = Message::decode(&out[8..]).unwrap();
    Reply {
        header: message.header,
        bins: message
            .ops()
            .map(|op| (op.name.to_vec(), op.particle_type, op.value.to_vec()))
            .collect(),
        fields: message
            .fields()
            .map(|field| (field.field_type, field.data.to_vec()))
            .collect(),
    }
}

struct Ops(Vec<(u8, u8, Vec<u8>, Vec<u8>)>);

impl Ops {
    fn new() -> Ops {
        Ops(Vec::new())
    }
    fn op(mut self, op: u8, particle: u8, name: &str, value: &[u8]) -> Ops {
        self.0
            .push((op, particle, name.as_bytes().to_vec(), value.to_vec()));
        self
    }
    fn int(self, op: u8, name: &str, value: i64) -> Ops {
        self.op(op, 1, name, &value.to_be_bytes())
    }
}

fn request(key: &str, header: MsgHeader, ops: &Ops, send_key: bool) -> Vec<u8> {
    request_filtered(key, header, ops, send_key, None)
}

/// A request with a filter expression (field 43) when `filter` is given.
fn request_filtered(
    key: &str,
    header: MsgHeader,
    ops: &Ops,
    send_key: bool,
    filter: Option<&[u8]>,
) -> Vec<u8> {
    let user_key = UserKey::String(key.into());
    let digest = of_key("demo", &user_key);
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(field_type::DIGEST, &digest.0);
    if send_key {
        writer.field(field_type::KEY, &user_key.to_field());
    }
    if let Some(filter) = filter {
        writer.field(field_type::FILTER_EXPRESSION, filter);
    }
    for (op, particle, name, value) in &ops.0 {
        writer.op(*op, *particle, name, value);
    }
    writer.finish();
    out
}

fn put(key: &str, ops: Ops) -> Vec<u8> {
    request(
        key,
        MsgHeader {
            info2: info2::WRITE,
            ..MsgHeader::default()
        },
        &ops,
        false,
    )
}

fn get(key: &str) -> Vec<u8> {
    request(
        key,
        MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            ..MsgHeader::default()
        },
        &Ops::new(),
        false,
    )
}

#[test]
fn put_then_get_all_bins() {
    let (service, _) = service();
    let reply = send(
        &service,
        &put(
            "k",
            Ops::new()
                .int(op_type::WRITE, "a", 1)
                .op(op_type::WRITE, 3, "s", b"x"),
        ),
    );
    assert_eq!(reply.header.result_code, 0);
    assert_eq!(reply.header.generation, 1);
    let reply = send(&service, &get("k"));
    assert_eq!(reply.header.result_code, 0);
    assert_eq!(reply.header.generation, 1);
    assert_eq!(reply.header.record_ttl, 0, "default-ttl 0 never expires");
    assert_eq!(reply.bins.len(), 2);
    assert_eq!(
        reply.bins[0],
        (b"a".to_vec(), 1, 1i64.to_be_bytes().to_vec())
    );
    let missing = send(&service, &get("nope"));
    assert_eq!(missing.header.result_code, ResultCode::NotFound.code());
}

#[test]
fn named_bins_and_header_only() {
    let (service, _) = service();
    send(
        &service,
        &put(
            "k",
            Ops::new()
                .int(op_type::WRITE, "a", 1)
                .int(op_type::WRITE, "b", 2),
        ),
    );
    let named = request(
        "k",
        MsgHeader {
            info1: info1::READ,
            ..MsgHeader::default()
        },
        &Ops::new()
            .op(op_type::READ, 0, "b", b"")
            .op(op_type::READ, 0, "zz", b""),
        false,
    );
    let reply = send(&service, &named);
    assert_eq!(reply.bins.len(), 1);
    assert_eq!(reply.bins[0].0, b"b");
    let exists = request(
        "k",
        MsgHeader {
            info1: info1::READ | info1::GET_NO_BINS,
            ..MsgHeader::default()
        },
        &Ops::new(),
        false,
    );
    let reply = send(&service, &exists);
    assert_eq!(reply.header.result_code, 0);
    assert!(reply.bins.is_empty());
}

#[test]
fn generation_policies() {
    let (service, _) = service();
    send(&service, &put("k", Ops::new().int(op_type::WRITE, "a", 1)));
    let eq_wrong = request(
        "k",
        MsgHeader {
            info2: info2::WRITE | info2::GENERATION,
            generation: 5,
            ..MsgHeader::default()
        },
        &Ops::new().int(op_type::WRITE, "a", 2),
        false,
    );
    assert_eq!(
        send(&service, &eq_wrong).header.result_code,
        ResultCode::Generation.code()
    );
    let eq_right = request(
        "k",
        MsgHeader {
            info2: info2::WRITE | info2::GENERATION,
            generation: 1,
            ..MsgHeader::default()
        },
        &Ops::new().int(op_type::WRITE, "a", 2),
        false,
    );
    assert_eq!(send(&service, &eq_right).header.generation, 2);
    let gt_wrong = request(
        "k",
        MsgHeader {
            info2: info2::WRITE | info2::GENERATION_GT,
            generation: 2,
            ..MsgHeader::default()
        },
        &Ops::new().int(op_type::WRITE, "a", 3),
        false,
    );
    assert_eq!(
        send(&service, &gt_wrong).header.result_code,
        ResultCode::Generation.code()
    );
    let gt_right = request(
        "k",
        MsgHeader {
            info2: info2::WRITE | info2::GENERATION_GT,
            generation: 9,
            ..MsgHeader::default()
        },
        &Ops::new().int(op_type::WRITE, "a", 3),
        false,
    );
    assert_eq!(send(&service, &gt_right).header.result_code, 0);
}

#[test]
fn record_exists_actions() {
    let (service, _) = service();
    let create_only = |value| {
        request(
            "k",
            MsgHeader {
                info2: info2::WRITE | info2::CREATE_ONLY,
                ..MsgHeader::default()
            },
            &Ops::new().int(op_type::WRITE, "a", value),
            false,
        )
    };
    assert_eq!(send(&service, &create_only(1)).header.result_code, 0);
    assert_eq!(
        send(&service, &create_only(2)).header.result_code,
        ResultCode::RecordExists.code()
    );
    let update_only = request(
        "missing",
        MsgHeader {
            info2: info2::WRITE,
            info3: info3::UPDATE_ONLY,
            ..MsgHeader::default()
        },
        &Ops::new().int(op_type::WRITE, "a", 1),
        false,
    );
    assert_eq!(
        send(&service, &update_only).header.result_code,
        ResultCode::NotFound.code()
    );
    send(&service, &put("k", Ops::new().int(op_type::WRITE, "b", 2)));
    let replace = request(
        "k",
        MsgHeader {
            info2: info2::WRITE,
            info3: info3::CREATE_OR_REPLACE,
            ..MsgHeader::default()
        },
        &Ops::new().int(op_type::WRITE, "c", 3),
        false,
    );
    assert_eq!(send(&service, &replace).header.result_code, 0);
    let reply = send(&service, &get("k"));
    assert_eq!(reply.bins.len(), 1, "replace removes bins not written");
    assert_eq!(reply.bins[0].0, b"c");
    let replace_incr = request(
        "k",
        MsgHeader {
            info2: info2::WRITE,
            info3: info3::REPLACE_ONLY,
            ..MsgHeader::default()
        },
        &Ops::new().int(op_type::INCR, "c", 3),
        false,
    );
    assert_eq!(
        send(&service, &replace_incr).header.result_code,
        ResultCode::Parameter.code()
    );
}

#[test]
fn ttl_semantics_and_expiry() {
    let (service, clock) = service();
    let with_ttl = |key: &str, ttl: u32| {
        request(
            key,
            MsgHeader {
                info2: info2::WRITE,
                record_ttl: ttl,
                ..MsgHeader::default()
            },
            &Ops::new().int(op_type::WRITE, "a", 1),
            false,
        )
    };
    let reply = send(&service, &with_ttl("k", 10));
    let now = citrine_types::citrusleaf_epoch_seconds(START_MS);
    assert_eq!(reply.header.record_ttl, now + 10);
    // -2 keeps the current void time.
    let reply = send(&service, &with_ttl("k", 0xFFFF_FFFE));
    assert_eq!(reply.header.record_ttl, now + 10);
    // -1 never expires.
    assert_eq!(
        send(&service, &with_ttl("k", 0xFFFF_FFFF))
            .header
            .record_ttl,
        0
    );
    // Over ten years is a parameter error.
    assert_eq!(
        send(&service, &with_ttl("k", 315_360_001))
            .header
            .result_code,
        ResultCode::Parameter.code()
    );
    // A record lives through its void time's second (the reference's
    // rule); once past it, it is invisible before nsup runs.
    send(&service, &with_ttl("short", 1));
    clock.advance_ms(1_500);
    assert_eq!(send(&service, &get("short")).header.result_code, 0);
    clock.advance_ms(1_000);
    assert_eq!(
        send(&service, &get("short")).header.result_code,
        ResultCode::NotFound.code()
    );
    let namespace = service.namespace(b"test").unwrap();
    assert_eq!(namespace.stats.objects.load(Ordering::Relaxed), 2);
    let report = nsup::run_pass(namespace, service.now());
    assert_eq!(report.expired, 1);
    assert_eq!(namespace.stats.objects.load(Ordering::Relaxed), 1);
}

#[test]
fn ttl_forbidden_without_nsup() {
    let mut config = NamespaceConfig::in_memory("test");
    config.nsup_period = 0;
    let (service, _) = service_with(config);
    let with_ttl = request(
        "k",
        MsgHeader {
            info2: info2::WRITE,
            record_ttl: 100,
            ..MsgHeader::default()
        },
        &Ops::new().int(op_type::WRITE, "a", 1),
        false,
    );
    assert_eq!(
        send(&service, &with_ttl).header.result_code,
        ResultCode::Forbidden.code()
    );
}

#[test]
fn operate_modifies_and_reads_atomically() {
    let (service, _) = service();
    send(
        &service,
        &put(
            "k",
            Ops::new()
                .int(op_type::WRITE, "n", 10)
                .op(op_type::WRITE, 3, "s", b"b"),
        ),
    );
    let ops = Ops::new()
        .int(op_type::INCR, "n", 5)
        .op(op_type::APPEND, 3, "s", b"c")
        .op(op_type::PREPEND, 3, "s", b"a")
        .op(op_type::READ, 0, "n", b"")
        .op(op_type::READ, 0, "s", b"");
    let operate = request(
        "k",
        MsgHeader {
            info1: info1::READ,
            info2: info2::WRITE,
            ..MsgHeader::default()
        },
        &ops,
        false,
    );
    let reply = send(&service, &operate);
    assert_eq!(reply.header.result_code, 0);
    assert_eq!(reply.header.generation, 2);
    assert_eq!(
        reply.bins,
        vec![
            (b"n".to_vec(), 1, 15i64.to_be_bytes().to_vec()),
            (b"s".to_vec(), 3, b"abc".to_vec())
        ]
    );
    // Type errors fail the whole operate and change nothing.
    let bad = request(
        "k",
        MsgHeader {
            info2: info2::WRITE,
            ..MsgHeader::default()
        },
        &Ops::new()
            .int(op_type::INCR, "n", 1)
            .int(op_type::INCR, "s", 1),
        false,
    );
    assert_eq!(
        send(&service, &bad).header.result_code,
        ResultCode::IncompatibleType.code()
    );
    let reply = send(&service, &get("k"));
    assert_eq!(reply.header.generation, 2);
}

#[test]
fn cdt_ops_write_read_and_fail_as_one_transaction() {
    let (service, _) = service();
    // [1 (APPEND), 5] and [1, "x"]: the first creates the list bin.
    let append_5 = b"\x92\x01\x05";
    let append_x = b"\x92\x01\xa2\x03x";
    let size = b"\x91\x10"; // [16 (SIZE)]
    let reply = send(
        &service,
        &put(
            "k",
            Ops::new()
                .op(op_type::CDT_MODIFY, 4, "l", append_5)
                .op(op_type::CDT_MODIFY, 4, "l", append_x)
                .op(op_type::WRITE, 3, "s", b"text"),
        ),
    );
    assert_eq!(reply.header.result_code, 0);
    // Each modify answers the list's size.
    assert_eq!(
        reply.bins,
        vec![
            (b"l".to_vec(), 1, 1i64.to_be_bytes().to_vec()),
            (b"l".to_vec(), 1, 2i64.to_be_bytes().to_vec())
        ]
    );
    let read = request(
        "k",
        MsgHeader {
            info1: info1::READ,
            ..MsgHeader::default()
        },
        &Ops::new()
            .op(op_type::CDT_READ, 4, "l", size)
            .op(op_type::CDT_READ, 4, "missing", size),
        false,
    );
    let reply = send(&service, &read);
    assert_eq!(reply.header.result_code, 0);
    assert_eq!(
        reply.bins,
        vec![(b"l".to_vec(), 1, 2i64.to_be_bytes().to_vec())]
    );
    // The stored bin is the list [5, "x"].
    let reply = send(&service, &get("k"));
    assert!(reply
        .bins
        .contains(&(b"l".to_vec(), 20, b"\x92\x05\xa2\x03x".to_vec())));
    // A list op on the string bin fails the whole operate: the append to
    // "l" before it is not stored, the generation stays.
    let bad = put(
        "k",
        Ops::new().op(op_type::CDT_MODIFY, 4, "l", append_5).op(
            op_type::CDT_MODIFY,
            4,
            "s",
            append_5,
        ),
    );
    assert_eq!(
        send(&service, &bad).header.result_code,
        ResultCode::IncompatibleType.code()
    );
    // A modify code under CDT_READ, and a malformed payload, are 4.
    for (op, payload) in [
        (op_type::CDT_READ, &append_5[..]),
        (op_type::CDT_MODIFY, &b"\x92\x01"[..]),
    ] {
        let frame = put("k", Ops::new().op(op, 4, "l", payload));
        assert_eq!(
            send(&service, &frame).header.result_code,
            ResultCode::Parameter.code()
        );
    }
    let reply = send(&service, &read);
    assert_eq!(reply.header.generation, 1);
    assert_eq!(
        reply.bins,
        vec![(b"l".to_vec(), 1, 2i64.to_be_bytes().to_vec())]
    );
}

#[test]
fn filter_expressions_gate_reads_writes_and_deletes() {
    let (service, _) = service();
    assert_eq!(
        send(&service, &put("k", Ops::new().int(op_type::WRITE, "n", 5)))
            .header
            .result_code,
        0
    );
    // [EQ, [BIN, INT, "n"], 5] and [EQ, [BIN, INT, "n"], 6].
    let is_5: &[u8] = &[0x93, 0x01, 0x93, 0x51, 0x02, 0xA1, b'n', 0x05];
    let is_6: &[u8] = &[0x93, 0x01, 0x93, 0x51, 0x02, 0xA1, b'n', 0x06];
    let read = MsgHeader {
        info1: info1::READ | info1::GET_ALL,
        ..MsgHeader::default()
    };
    let write = MsgHeader {
        info2: info2::WRITE,
        ..MsgHeader::default()
    };
    let delete = MsgHeader {
        info2: info2::WRITE | info2::DELETE,
        ..MsgHeader::default()
    };
    let none = Ops::new();
    let set_7 = Ops::new().int(op_type::WRITE, "n", 7);
    let code = |header: MsgHeader, ops: &Ops, filter: &[u8]| {
        send(
            &service,
            &request_filtered("k", header, ops, false, Some(filter)),
        )
        .header
        .result_code
    };
    let filtered_out = ResultCode::FilteredOut.code();
    assert_eq!(code(read, &none, is_6), filtered_out);
    assert_eq!(code(read, &none, is_5), 0);
    assert_eq!(code(write, &set_7, is_6), filtered_out);
    assert_eq!(code(delete, &none, is_6), filtered_out);
    // Nothing changed: n is still 5, generation 1.
    let reply = send(&service, &get("k"));
    assert_eq!(reply.header.generation, 1);
    assert_eq!(
        reply.bins,
        vec![(b"n".to_vec(), 1, 5i64.to_be_bytes().to_vec())]
    );
    assert_eq!(code(write, &set_7, is_5), 0);
    assert_eq!(code(delete, &none, is_5), filtered_out, "n is 7 now");
    // A write that creates a record is not filtered.
    let create = send(
        &service,
        &request_filtered("new", write, &set_7, false, Some(is_6)),
    );
    assert_eq!(create.header.result_code, 0);
    // A filter that does not parse is a parameter error.
    assert_eq!(code(read, &none, &[0x91, 0x01]), 4);
    let stats = &service.namespace(b"test").unwrap().stats;
    assert_eq!(stats.client_read_filtered_out.load(Ordering::Relaxed), 1);
    assert_eq!(stats.client_write_filtered_out.load(Ordering::Relaxed), 1);
    assert_eq!(stats.client_delete_filtered_out.load(Ordering::Relaxed), 2);
}

#[test]
fn expression_ops_read_and_write_bins() {
    let (service, _) = service();
    send(
        &service,
        &put(
            "k",
            Ops::new()
                .int(op_type::WRITE, "a", 4)
                .int(op_type::WRITE, "b", 5),
        ),
    );
    // [[ADD, [BIN, INT, "a"], [BIN, INT, "b"]], 0]
    let sum: &[u8] = &[
        0x92, 0x93, 0x14, 0x93, 0x51, 0x02, 0xA1, b'a', 0x93, 0x51, 0x02, 0xA1, b'b', 0x00,
    ];
    // An operate: write the sum to "s", then read "s" + "a" by expression.
    let reply = send(
        &service,
        &put(
            "k",
            Ops::new().op(op_type::EXP_MODIFY, 4, "s", sum).op(
                op_type::EXP_READ,
                4,
                "r",
                &[
                    0x92, 0x93, 0x14, 0x93, 0x51, 0x02, 0xA1, b's', 0x93, 0x51, 0x02, 0xA1, b'a',
                    0x00,
                ],
            ),
        ),
    );
    assert_eq!(reply.header.result_code, 0);
    assert_eq!(
        reply.bins,
        vec![(b"r".to_vec(), 1, 13i64.to_be_bytes().to_vec())]
    );
    let reply = send(&service, &get("k"));
    assert!(reply
        .bins
        .contains(&(b"s".to_vec(), 1, 9i64.to_be_bytes().to_vec())));
    // On the read path too.
    let read = request(
        "k",
        MsgHeader {
            info1: info1::READ,
            ..MsgHeader::default()
        },
        &Ops::new().op(op_type::EXP_READ, 4, "r", sum),
        false,
    );
    let reply = send(&service, &read);
    assert_eq!(
        reply.bins,
        vec![(b"r".to_vec(), 1, 9i64.to_be_bytes().to_vec())]
    );
    // A failing expression (a missing bin) fails the operate (26) and
    // stores nothing.
    let missing: &[u8] = &[0x92, 0x93, 0x51, 0x02, 0xA1, b'z', 0x00];
    let reply = send(
        &service,
        &put(
            "k",
            Ops::new()
                .int(op_type::WRITE, "a", 100)
                .op(op_type::EXP_MODIFY, 4, "t", missing),
        ),
    );
    assert_eq!(reply.header.result_code, ResultCode::OpNotApplicable.code());
    let reply = send(&service, &get("k"));
    assert!(reply
        .bins
        .contains(&(b"a".to_vec(), 1, 4i64.to_be_bytes().to_vec())));
}

#[test]
fn replies_past_the_largest_message_are_refused_not_built() {
    let (service, _) = service();
    let big = vec![7u8; 900 * 1024];
    assert_eq!(
        send(
            &service,
            &put("k", Ops::new().op(op_type::WRITE, 4, "b", &big))
        )
        .header
        .result_code,
        0
    );
    // 150 reads of a 900 KiB bin: a 132 MiB reply.
    let mut reads = Ops::new();
    for _ in 0..150 {
        reads = reads.op(op_type::READ, 0, "b", &[]);
    }
    let read = MsgHeader {
        info1: info1::READ,
        ..MsgHeader::default()
    };
    let too_big = ResultCode::RecordTooBig.code();
    assert_eq!(
        send(&service, &request("k", read, &reads, false))
            .header
            .result_code,
        too_big
    );
    // The same through an operate (the write path), which stores nothing.
    let mut operate = Ops::new().int(op_type::WRITE, "n", 1);
    for _ in 0..150 {
        operate = operate.op(op_type::READ, 0, "b", &[]);
    }
    let read_write = MsgHeader {
        info1: info1::READ,
        info2: info2::WRITE,
        ..MsgHeader::default()
    };
    assert_eq!(
        send(&service, &request("k", read_write, &operate, false))
            .header
            .result_code,
        too_big
    );
    let reply = send(&service, &get("k"));
    assert_eq!(reply.header.generation, 1);
    // 100 reads (88 MiB) are answered.
    let mut reads = Ops::new();
    for _ in 0..100 {
        reads = reads.op(op_type::READ, 0, "b", &[]);
    }
    let reply = send(&service, &request("k", read, &reads, false));
    assert_eq!(reply.header.result_code, 0);
    assert_eq!(reply.bins.len(), 100);
}

#[test]
fn a_bit_resize_past_the_record_limit_is_refused_before_it_is_built() {
    // [RESIZE, 100 MiB, 0, 0] on a namespace whose records stop at 1 MiB.
    let (service, _) = service();
    let resize = [0x94, 0x00, 0xce, 0x06, 0x40, 0x00, 0x00, 0x00, 0x00];
    let reply = send(
        &service,
        &put("k", Ops::new().op(op_type::BITS_MODIFY, 4, "b", &resize)),
    );
    assert_eq!(reply.header.result_code, ResultCode::RecordTooBig.code());
    let stats = &service.namespace(b"test").unwrap().stats;
    // Counted as the record-size check counts a record too big.
    assert_eq!(stats.fail_record_too_big.load(Ordering::Relaxed), 1);
}

#[test]
fn an_op_on_a_missing_bin_makes_the_bin_from_its_operand() {
    // As the reference (and the Go suite's "Add must work"): an add of a
    // string to a missing bin creates a string bin; to a string bin it is 12.
    let (service, _) = service();
    let add = |value: &[u8]| {
        send(
            &service,
            &put("k", Ops::new().op(op_type::INCR, 3, "s", value)),
        )
        .header
        .result_code
    };
    assert_eq!(add(b"text"), 0);
    assert_eq!(
        send(&service, &get("k")).bins,
        vec![(b"s".to_vec(), 3, b"text".to_vec())]
    );
    assert_eq!(add(b"more"), ResultCode::IncompatibleType.code());
}

#[test]
fn list_and_map_writes_are_checked_and_nested_ones_made_canonical() {
    let (service, _) = service();
    let write = |particle: u8, bytes: &[u8]| {
        send(
            &service,
            &put("k", Ops::new().op(op_type::WRITE, particle, "c", bytes)),
        )
        .header
        .result_code
    };
    // Not msgpack, trailing bytes, a map sent as a list, truncated.
    assert_eq!(write(20, &[0xc1]), 4);
    assert_eq!(write(20, &[0x91, 0x01, 0x02]), 4);
    assert_eq!(write(20, &[0x81, 0x01, 0x02]), 4);
    assert_eq!(write(19, &[0x82, 0x01]), 4);
    // An unordered list is stored as sent.
    assert_eq!(write(20, &[0x93, 0x03, 0x01, 0x02]), 0);
    let stored = |service: &Service| {
        send(service, &get("k"))
            .bins
            .into_iter()
            .find(|(name, _, _)| name == b"c")
            .map(|(_, particle, bytes)| (particle, bytes))
    };
    assert_eq!(stored(&service), Some((20, vec![0x93, 0x03, 0x01, 0x02])));
    // A key-ordered map (ext flags 0x01 first) sent unsorted, or with a
    // duplicate key, is refused, as the reference refuses it.
    let map = [
        0x84, 0xc7, 0x00, 0x01, 0xc0, 0x02, 0x0a, 0x01, 0x0b, 0x02, 0x0c,
    ];
    assert_eq!(write(19, &map), 4);
    let map = [0x83, 0xc7, 0x00, 0x01, 0xc0, 0x01, 0x0b, 0x01, 0x0c];
    assert_eq!(write(19, &map), 4);
    // So is an ordered list out of order.
    assert_eq!(write(20, &[0x93, 0xc7, 0x00, 0x01, 0x02, 0x01]), 4);
    // In order, a key-ordered map is stored re-packed at its smallest (the
    // key 1 sent as a uint64), its nested ordered list put in order.
    let map = [
        0x82, 0xc7, 0x00, 0x01, 0xc0, 0xcf, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x93, 0xc7, 0x00, 0x01,
        0x02, 0x01,
    ];
    assert_eq!(write(19, &map), 0);
    assert_eq!(
        stored(&service),
        Some((
            19,
            vec![0x82, 0xc7, 0x00, 0x01, 0xc0, 0x01, 0x93, 0xc7, 0x00, 0x01, 0x01, 0x02]
        ))
    );
    // An unordered map is stored in key order, still unordered (no ext
    // header), as the reference stores every map since its 7.0: "z" 1,
    // "a" 2 reads back as "a" 2, "z" 1.
    let map = [0x82, 0xa1, b'z', 0x01, 0xa1, b'a', 0x02];
    assert_eq!(write(19, &map), 0);
    assert_eq!(
        stored(&service),
        Some((19, vec![0x82, 0xa1, b'a', 0x02, 0xa1, b'z', 0x01]))
    );
    // A key twice is refused, in an unordered map too, nested as well.
    assert_eq!(write(19, &[0x82, 0xa1, b'a', 0x01, 0xa1, b'a', 0x02]), 4);
    assert_eq!(
        write(20, &[0x91, 0x82, 0xa1, b'a', 0x01, 0xa1, b'a', 0x02]),
        4
    );
}

#[test]
fn cdt_ops_that_grow_a_bin_past_the_record_limit_stop_at_the_first() {
    let (service, _) = service();
    // [3 (INSERT), index, 7] at 0, 1 M, 2 M, ... : each pads with nils.
    let mut ops = Ops::new();
    for i in 0..8i64 {
        let mut payload = vec![0x93, 0x03, 0xd2];
        payload.extend_from_slice(&((i * 1_000_000) as i32).to_be_bytes());
        payload.push(0x07);
        ops = ops.op(op_type::CDT_MODIFY, 4, "l", &payload);
    }
    assert_eq!(
        send(&service, &put("k", ops)).header.result_code,
        ResultCode::RecordTooBig.code()
    );
    assert_eq!(
        send(&service, &get("k")).header.result_code,
        ResultCode::NotFound.code()
    );
}

#[test]
fn respond_all_ops_gives_one_entry_per_op() {
    let (service, _) = service();
    let ops = Ops::new()
        .int(op_type::WRITE, "a", 1)
        .op(op_type::READ, 0, "a", b"")
        .op(op_type::READ, 0, "missing", b"");
    let operate = request(
        "k",
        MsgHeader {
            info1: info1::READ,
            info2: info2::WRITE | info2::RESPOND_ALL_OPS,
            ..MsgHeader::default()
        },
        &ops,
        false,
    );
    let reply = send(&service, &operate);
    assert_eq!(reply.bins.len(), 3);
    assert_eq!(reply.bins[0].1, 0);
    assert_eq!(reply.bins[1].2, 1i64.to_be_bytes().to_vec());
    assert_eq!(reply.bins[2].1, 0);
}

#[test]
fn a_header_read_in_a_write_holds_its_slot_under_respond_all_ops() {
    let (service, _) = service();
    send(&service, &put("k", Ops::new().int(op_type::WRITE, "a", 1)));
    // touch + get_header, as a client's operate sends them.
    let ops = Ops::new()
        .op(op_type::TOUCH, 0, "", b"")
        .op(op_type::READ, 0, "", b"");
    let operate = |info2_bits| {
        request(
            "k",
            MsgHeader {
                info1: info1::READ | info1::GET_NO_BINS,
                info2: info2_bits,
                ..MsgHeader::default()
            },
            &ops,
            false,
        )
    };
    let reply = send(&service, &operate(info2::WRITE | info2::RESPOND_ALL_OPS));
    assert_eq!(reply.header.result_code, 0);
    assert_eq!(
        reply.bins.len(),
        1,
        "the touch answers nothing, the read a nil"
    );
    assert!(reply.bins[0].0.is_empty());
    assert_eq!(reply.bins[0].1, citrine_types::ParticleType::Null as u8);
    // Without RESPOND_ALL_OPS neither answers.
    let reply = send(&service, &operate(info2::WRITE));
    assert_eq!(reply.header.result_code, 0);
    assert!(reply.bins.is_empty());
}

/// On a missing record, an operate holding a touch answers 2 before any
/// other op's error and before the generation check, as the reference does.
#[test]
fn a_touch_on_a_missing_record_answers_not_found_first() {
    let (service, _) = service();
    let operate = |info2_bits: u8, generation: u32, ops: &Ops| {
        let frame = request(
            "k",
            MsgHeader {
                info2: info2::WRITE | info2_bits,
                generation,
                ..MsgHeader::default()
            },
            ops,
            false,
        );
        send(&service, &frame).header.result_code
    };
    // An append of a string then an increment of that bin: 12 on its own.
    let failing = Ops::new()
        .op(op_type::APPEND, 3, "a", b"x")
        .int(op_type::INCR, "a", 1);
    assert_eq!(operate(0, 0, &failing), ResultCode::IncompatibleType.code());
    let with_touch = failing.op(op_type::TOUCH, 0, "", b"");
    assert_eq!(operate(0, 0, &with_touch), ResultCode::NotFound.code());
    let touch = Ops::new().op(op_type::TOUCH, 0, "", b"");
    assert_eq!(
        operate(info2::GENERATION, 5, &touch),
        ResultCode::NotFound.code()
    );
}

#[test]
fn touch_and_delete() {
    let (service, _) = service();
    let touch = request(
        "k",
        MsgHeader {
            info2: info2::WRITE,
            ..MsgHeader::default()
        },
        &Ops::new().op(op_type::TOUCH, 0, "", b""),
        false,
    );
    assert_eq!(
        send(&service, &touch).header.result_code,
        ResultCode::NotFound.code()
    );
    send(&service, &put("k", Ops::new().int(op_type::WRITE, "a", 1)));
    assert_eq!(send(&service, &touch).header.generation, 2);
    let delete = request(
        "k",
        MsgHeader {
            info2: info2::WRITE | info2::DELETE,
            ..MsgHeader::default()
        },
        &Ops::new(),
        false,
    );
    assert_eq!(send(&service, &delete).header.result_code, 0);
    assert_eq!(
        send(&service, &delete).header.result_code,
        ResultCode::NotFound.code()
    );
    assert_eq!(
        send(&service, &get("k")).header.result_code,
        ResultCode::NotFound.code()
    );
    // A delete-record op inside an operate.
    send(&service, &put("k", Ops::new().int(op_type::WRITE, "a", 1)));
    let delete_op = request(
        "k",
        MsgHeader {
            info2: info2::WRITE,
            ..MsgHeader::default()
        },
        &Ops::new().op(op_type::DELETE_ALL, 0, "", b""),
        false,
    );
    assert_eq!(send(&service, &delete_op).header.result_code, 0);
    assert_eq!(
        send(&service, &get("k")).header.result_code,
        ResultCode::NotFound.code()
    );
}

#[test]
fn send_key_is_stored_and_checked() {
    let (service, _) = service();
    let with_key = request(
        "k",
        MsgHeader {
            info2: info2::WRITE,
            ..MsgHeader::default()
        },
        &Ops::new().int(op_type::WRITE, "a", 1),
        true,
    );
    send(&service, &with_key);
    let reply = send(&service, &get("k"));
    assert_eq!(
        reply.fields,
        vec![(field_type::KEY, UserKey::String("k".into()).to_field())]
    );
}

#[test]
fn errors_use_protocol_codes() {
    let (service, _) = service();
    let long_name = put("k", Ops::new().int(op_type::WRITE, "sixteen-chars-xx", 1));
    assert_eq!(
        send(&service, &long_name).header.result_code,
        ResultCode::BinName.code()
    );
    let big = put(
        "k",
        Ops::new().op(op_type::WRITE, 4, "b", &vec![0u8; 2 << 20]),
    );
    assert_eq!(
        send(&service, &big).header.result_code,
        ResultCode::RecordTooBig.code()
    );
    let cdt = put(
        "k",
        // A context by expression in an ordinary op ([0xff, [4, true],
        // [size]]) cannot be followed (the reference answers 26; only path
        // ops take one).
        Ops::new()
            .op(
                op_type::WRITE,
                citrine_types::ParticleType::List as u8,
                "l",
                &[0x91, 0x01],
            )
            .op(
                op_type::CDT_READ,
                4,
                "l",
                b"\x93\xcc\xff\x92\x04\xc3\x91\x10",
            ),
    );
    assert_eq!(
        send(&service, &cdt).header.result_code,
        ResultCode::OpNotApplicable.code()
    );
    // A path without a context ([0xfe, [], 0]) is malformed.
    let cdt = put(
        "k",
        Ops::new().op(op_type::CDT_READ, 4, "l", b"\x93\xcc\xfe\x90\x00"),
    );
    assert_eq!(
        send(&service, &cdt).header.result_code,
        ResultCode::Parameter.code()
    );
    let unknown_op = put("k", Ops::new().op(99, 1, "a", &[0; 8]));
    assert_eq!(
        send(&service, &unknown_op).header.result_code,
        ResultCode::Parameter.code()
    );
    let bad_particle = put("k", Ops::new().op(op_type::WRITE, 99, "a", &[0; 8]));
    assert_eq!(
        send(&service, &bad_particle).header.result_code,
        ResultCode::Parameter.code()
    );
    // Unknown namespace.
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(
        &mut out,
        &MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            ..MsgHeader::default()
        },
    );
    writer
        .field(field_type::NAMESPACE, b"nosuch")
        .field(field_type::DIGEST, &[0; 20]);
    writer.finish();
    assert_eq!(
        send(&service, &out).header.result_code,
        ResultCode::Namespace.code()
    );
    // A malformed body inside a sound frame: parameter error, connection kept.
    let mut frame = get("k");
    frame.push(0);
    let size = (frame.len() - 8) as u64;
    frame[..8].copy_from_slice(&ProtoHeader::encode(MessageType::Message, size));
    assert_eq!(
        send(&service, &frame).header.result_code,
        ResultCode::Parameter.code()
    );
}

#[test]
fn stop_writes_and_eviction() {
    let mut config = NamespaceConfig::in_memory("test");
    config.storage_engine = StorageEngineConfig::Memory {
        data_size: 4 << 20,
        evict_used_pct: 50,
        stop_writes_used_pct: 80,
    };
    // Every record may go in one pass (the default allows 0.5 % a pass).
    config.evict_tenths_pct = 1000;
    let (service, clock) = service_with(config);
    let value = vec![7u8; 10_000];
    let mut stopped_at = None;
    for index in 0..1000 {
        let frame = request(
            &format!("k{index}"),
            MsgHeader {
                info2: info2::WRITE,
                record_ttl: 1000 + index,
                ..MsgHeader::default()
            },
            &Ops::new().op(op_type::WRITE, 4, "b", &value),
            false,
        );
        let code = send(&service, &frame).header.result_code;
        if code != 0 {
            assert_eq!(code, ResultCode::OutOfSpace.code());
            stopped_at = Some(index);
            break;
        }
    }
    let stopped_at = stopped_at.expect("stop-writes engaged");
    assert!(stopped_at > 200, "stopped too early at {stopped_at}");
    let namespace = service.namespace(b"test").unwrap();
    clock.advance_ms(1);
    let report = nsup::run_pass(namespace, service.now());
    assert!(report.evicted > 0);
    assert!(namespace.used_pct() < 50, "used {}%", namespace.used_pct());
    // The survivors are the ones with the longest TTLs.
    let last = request(
        &format!("k{}", stopped_at - 1),
        MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            ..MsgHeader::default()
        },
        &Ops::new(),
        false,
    );
    assert_eq!(send(&service, &last).header.result_code, 0);
    assert_eq!(
        send(&service, &get("k0")).header.result_code,
        ResultCode::NotFound.code()
    );
    // Writes resume.
    let frame = put("again", Ops::new().int(op_type::WRITE, "a", 1));
    assert_eq!(send(&service, &frame).header.result_code, 0);
}

#[test]
fn concurrent_increments_are_atomic() {
    let (service, _) = service();
    let service = Arc::new(service);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let service = service.clone();
            std::thread::spawn(move || {
                let frame = put("counter", Ops::new().int(op_type::INCR, "n", 1));
                for _ in 0..2000 {
                    assert_eq!(send(&service, &frame).header.result_code, 0);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let reply = send(&service, &get("counter"));
    assert_eq!(reply.bins[0].2, 16_000i64.to_be_bytes().to_vec());
}

/// A record UDF call on `key` (fields 30-32), with `args` as a msgpack
/// list of integers.
fn udf_call(key: &str, module: &str, function: &str, args: &[i64]) -> Vec<u8> {
    let user_key = UserKey::String(key.into());
    let digest = of_key("demo", &user_key);
    let mut list = vec![0x90 | args.len() as u8];
    for arg in args {
        list.push(0xd3);
        list.extend_from_slice(&arg.to_be_bytes());
    }
    let header = MsgHeader {
        info2: info2::WRITE,
        transaction_ttl: 5000,
        ..MsgHeader::default()
    };
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(field_type::DIGEST, &digest.0)
        .field(field_type::UDF_FILENAME, module.as_bytes())
        .field(field_type::UDF_FUNCTION, function.as_bytes())
        .field(field_type::UDF_ARGLIST, &list);
    writer.finish();
    out
}

/// Each single-record request counts once in its namespace's histogram:
/// reads (found or not), writes and deletes, record UDFs; a request for a
/// namespace the node lacks counts nowhere.
#[test]
fn single_record_requests_count_in_their_latency_histograms() {
    use base64::Engine as _;
    let (service, _) = service();
    let source = "function one(rec)\n  return 1\nend";
    let content = base64::engine::general_purpose::STANDARD.encode(source);
    let put_module = format!("udf-put:filename=one.lua;content={content};");
    assert_eq!(info(&service, &[&put_module])[0].1, "ok");
    send(&service, &put("a", Ops::new().int(op_type::WRITE, "x", 1)));
    send(&service, &get("a"));
    send(&service, &get("missing"));
    let delete = MsgHeader {
        info2: info2::WRITE | info2::DELETE,
        ..MsgHeader::default()
    };
    send(&service, &request("a", delete, &Ops::new(), false));
    send(&service, &udf_call("a", "one", "one", &[]));
    let mut elsewhere = get("a");
    let at = elsewhere
        .windows(4)
        .position(|window| window == b"test")
        .unwrap();
    elsewhere[at..at + 4].copy_from_slice(b"nope");
    assert_eq!(send(&service, &elsewhere).header.result_code, 20);
    let totals = crate::latency::totals(service.latencies());
    let expected = [("{test}-read", 2), ("{test}-write", 2), ("{test}-udf", 1)];
    assert_eq!(
        totals,
        expected.map(|(name, count)| (name.to_owned(), count))
    );
}

/// A request handed over with the time it was received (as the server's
/// service threads hand them) counts its latency from then.
#[test]
fn latency_counts_from_when_the_request_was_received() {
    let (service, _) = service();
    let frame = get("a");
    let header = ProtoHeader::decode(&frame[..8].try_into().unwrap()).unwrap();
    let arrival = Arrival {
        received: Some(std::time::Instant::now() - std::time::Duration::from_millis(5)),
        ..Arrival::default()
    };
    let mut out = Vec::new();
    let rest = service.handle_streaming_from(header, &frame[8..], &mut out, arrival);
    assert!(rest.unwrap().is_none());
    let read = &service.latencies().histograms()[1];
    assert_eq!(read.name(), "{test}-read");
    let counts = read.snapshot().counts;
    // 5 ms and a little: the bucket of [4, 8) ms.
    assert_eq!(counts[crate::latency::TICK_BITS + 3], 1, "{counts:?}");
    assert_eq!(counts.iter().sum::<u64>(), 1);
}

/// `enable-benchmarks-storage` (the reference's, 8.1.2, asked with a
/// memory namespace): set per namespace, shown by `get-config` as
/// `storage-engine.enable-benchmarks-storage`; while on, every record
/// stored counts in `{test}-device-write-size` (bytes: 64-127 bytes in
/// bucket 7) and the ticker dumps it with `{test}-device-read-size`; not
/// in `latencies:`.
#[test]
fn storage_benchmarks_count_record_sizes_only_while_on() {
    let (service, _) = service();
    let config = |service: &Service| {
        let answer = &info(service, &["get-config:context=namespace;id=test"])[0].1;
        answer.contains(";storage-engine.enable-benchmarks-storage=true")
    };
    assert!(!config(&service));
    send(
        &service,
        &put("before", Ops::new().int(op_type::WRITE, "x", 1)),
    );
    let set = "set-config:context=namespace;id=test;enable-benchmarks-storage=true";
    assert_eq!(info(&service, &[set])[0].1, "ok");
    assert!(config(&service));
    let big = vec![b'v'; 90];
    send(
        &service,
        &put("a", Ops::new().op(op_type::WRITE, 4, "x", &big)),
    );
    send(
        &service,
        &put("b", Ops::new().op(op_type::WRITE, 4, "x", &big)),
    );
    let unit = service.latencies().unit();
    let dump = service.latencies().benchmarks().dump(unit);
    let at = dump
        .iter()
        .position(|line| line == "histogram dump: {test}-device-write-size (2 total) bytes")
        .unwrap_or_else(|| panic!("{dump:?}"));
    assert_eq!(dump[at + 1], " (07: 0000000002)");
    assert!(dump.contains(&"histogram dump: {test}-device-read-size (0 total) bytes".into()));
    let hist = "latencies:hist={test}-device-write-size";
    assert_eq!(info(&service, &[hist])[0].1, "ERROR:4:bad hist name");
    let off = "set-config:context=namespace;id=test;enable-benchmarks-storage=false";
    assert_eq!(info(&service, &[off])[0].1, "ok");
    send(
        &service,
        &put("c", Ops::new().op(op_type::WRITE, 4, "x", &big)),
    );
    assert!(service.latencies().benchmarks().dump(unit).is_empty());
    assert_eq!(info(&service, &[set])[0].1, "ok");
    let dump = service.latencies().benchmarks().dump(unit);
    assert!(dump.contains(&"histogram dump: {test}-device-write-size (2 total) bytes".into()));
}

/// `enable-benchmarks-*`: set and shown as the reference answers; while
/// a group is on its requests count in its stage histograms (start, run,
/// response), and not while it is off; `latencies:` lists none of them.
#[test]
fn benchmark_groups_count_their_stages_only_while_on() {
    let (service, _) = service();
    let set = "set-config:context=namespace;id=test;enable-benchmarks-read=true";
    assert_eq!(info(&service, &[set])[0].1, "ok");
    let refused = [
        "set-config:context=namespace;id=test;enable-benchmarks-read=yes",
        "set-config:context=namespace;id=test;enable-benchmarks-proxy=true",
    ];
    for command in refused {
        assert_eq!(
            info(&service, &[command])[0].1,
            "ERROR:4:invalid set-config parameter"
        );
    }
    let elsewhere = "set-config:context=namespace;id=nope;enable-benchmarks-read=true";
    assert_eq!(
        info(&service, &[elsewhere])[0].1,
        "ERROR:20:namespace not found on node"
    );
    let config = &info(&service, &["get-config:context=namespace;id=test"])[0].1;
    assert!(config.contains(";enable-benchmarks-read=true;"), "{config}");
    assert!(
        config.contains(";enable-benchmarks-write=false"),
        "{config}"
    );

    send(&service, &put("a", Ops::new().int(op_type::WRITE, "x", 1)));
    send(&service, &get("a"));
    send(&service, &get("a"));
    let totals = |service: &Service| -> Vec<String> {
        let unit = service.latencies().unit();
        service
            .latencies()
            .benchmarks()
            .dump(unit)
            .into_iter()
            .filter(|line| line.starts_with("histogram dump"))
            .collect()
    };
    let dump = totals(&service);
    assert_eq!(
        dump,
        [
            "histogram dump: {test}-read-start (2 total) msec",
            "histogram dump: {test}-read-restart (0 total) msec",
            "histogram dump: {test}-read-dup-res (0 total) msec",
            "histogram dump: {test}-read-repl-ping (0 total) msec",
            "histogram dump: {test}-read-local (2 total) msec",
            "histogram dump: {test}-read-response (2 total) msec",
        ]
    );
    let latencies = &info(&service, &["latencies:"])[0].1;
    assert!(!latencies.contains("-read-start"), "{latencies}");

    let off = "set-config:context=namespace;id=test;enable-benchmarks-read=false";
    assert_eq!(info(&service, &[off])[0].1, "ok");
    send(&service, &get("a"));
    assert!(totals(&service).is_empty());
    assert_eq!(info(&service, &[set])[0].1, "ok");
    assert_eq!(
        totals(&service)[0],
        "histogram dump: {test}-read-start (2 total) msec"
    );
}

#[test]
fn udfs_and_writes_on_one_record_lose_no_update() {
    use base64::Engine as _;
    let (service, _) = service();
    // A slow read-modify-write: the record may change while it runs, and
    // then it must run again on the new record, not overwrite it.
    let source = "function add(rec, n)\n  local v = rec['n'] or 0\n  local x = 0\n  for i = 1, 20000 do x = x + i end\n  rec['n'] = v + n\n  aerospike:update(rec)\n  return rec['n']\nend";
    let content = base64::engine::general_purpose::STANDARD.encode(source);
    let answers = info(
        &service,
        &[&format!("udf-put:filename=slow.lua;content={content};")],
    );
    assert_eq!(answers[0].1, "ok");
    let service = Arc::new(service);
    let threads: Vec<_> = (0..6)
        .map(|thread| {
            let service = service.clone();
            std::thread::spawn(move || {
                let mut added = 0i64;
                for _ in 0..150 {
                    let (frame, by) = if thread % 2 == 0 {
                        (udf_call("hot", "slow", "add", &[1]), 1)
                    } else {
                        (put("hot", Ops::new().int(op_type::INCR, "n", 1)), 1)
                    };
                    match send(&service, &frame).header.result_code {
                        0 => added += by,
                        14 => {} // key busy: the UDF lost its record three times
                        code => panic!("result {code}"),
                    }
                }
                added
            })
        })
        .collect();
    let added: i64 = threads
        .into_iter()
        .map(|thread| thread.join().unwrap())
        .sum();
    assert!(added > 450, "most calls succeed: {added}");
    let reply = send(&service, &get("hot"));
    assert_eq!(
        reply.bins[0].2,
        added.to_be_bytes().to_vec(),
        "no update lost"
    );
    assert!(
        service
            .namespace(b"test")
            .unwrap()
            .stats
            .client_udf_complete
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
}

/// A UDF call stopped before its function runs (here: create-only on a
/// record that exists) counts as a UDF error, not as a plain write's.
#[test]
fn a_udf_call_refused_before_it_runs_counts_as_a_udf_error() {
    let (service, _) = crate::batch::tests::service();
    crate::batch::tests::put(&service, "demo", "k", &[("n", 1)], false);
    let mut frame = udf_call("k", "m", "f", &[]);
    frame[8 + 2] |= info2::CREATE_ONLY;
    let reply = crate::batch::tests::run(&service, &frame);
    assert_eq!(reply[0].header.result_code, ResultCode::RecordExists.code());
    let stats = &service.namespace(b"test").unwrap().stats;
    let load = |counter: &citrine_types::stripes::Counter| {
        counter.load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!(load(&stats.client_udf_error), 1);
    assert_eq!(load(&stats.client_write_error), 0);
}

/// A client's record UDFs count by what they did, as the reference's
/// `client_lang_*` (8.1.2, asked with the same calls): a read, an update,
/// a remove, a failing function, and a remove of a record that does not
/// exist (which changed nothing: a read).
#[test]
fn a_clients_udfs_count_by_what_they_did() {
    use base64::Engine as _;
    let (service, _) = crate::batch::tests::service();
    let source = "function rd(rec) return rec['n'] end
function upd(rec) rec['m'] = 1 aerospike:update(rec) end
function del(rec) aerospike:remove(rec) end
function bad(rec) error('boom') end";
    let content = base64::engine::general_purpose::STANDARD.encode(source);
    let answers = info(
        &service,
        &[&format!("udf-put:filename=lang.lua;content={content};")],
    );
    assert_eq!(answers[0].1, "ok");
    for key in ["r", "u", "d", "b"] {
        crate::batch::tests::put(&service, "demo", key, &[("n", 1)], false);
    }
    let calls = [
        ("r", "rd", 0),
        ("u", "upd", 0),
        ("d", "del", 0),
        ("b", "bad", 100),
    ];
    let calls = calls.into_iter().chain([("gone", "del", 0)]);
    for (key, function, code) in calls {
        let reply = crate::batch::tests::run(&service, &udf_call(key, "lang", function, &[]));
        assert_eq!(reply[0].header.result_code, code, "{function} {key}");
    }
    let stats = &service.namespace(b"test").unwrap().stats;
    let load = |counter: &citrine_types::stripes::Counter| {
        counter.load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!(load(&stats.client_udf_complete), 4);
    assert_eq!(load(&stats.client_udf_error), 1);
    assert_eq!(load(&stats.client_lang_read_success), 2);
    assert_eq!(load(&stats.client_lang_write_success), 1);
    assert_eq!(load(&stats.client_lang_delete_success), 1);
    assert_eq!(load(&stats.client_lang_error), 1);
}

/// Empty module or function names are a call that fails when it runs
/// (100, with the reference's words in `FAILURE`), not a malformed request
/// (4); a missing field still is.
#[test]
fn a_udf_call_with_empty_names_fails_as_a_udf_error() {
    let (service, _) = crate::batch::tests::service();
    crate::batch::tests::put(&service, "demo", "k", &[("n", 1)], false);
    let failure = |frame: &[u8]| {
        let reply = crate::batch::tests::run(&service, frame);
        let text = reply[0]
            .bin("FAILURE")
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned());
        (reply[0].header.result_code, text)
    };
    let module_missing = Some("UDF: Execution Error 1".to_owned());
    assert_eq!(
        failure(&udf_call("k", "", "", &[])),
        (100, module_missing.clone())
    );
    assert_eq!(
        failure(&udf_call("k", "", "f", &[])),
        (100, module_missing.clone())
    );
    assert_eq!(
        failure(&udf_call("k", "absent", "f", &[])),
        (100, module_missing)
    );
    // On a record that does not exist, too.
    assert_eq!(failure(&udf_call("nope", "", "", &[])).0, 100);
    // A module field and no function field: malformed.
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(
        &mut out,
        &MsgHeader {
            info2: info2::WRITE,
            transaction_ttl: 5000,
            ..MsgHeader::default()
        },
    );
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(
            field_type::DIGEST,
            &of_key("demo", &UserKey::String("k".into())).0,
        )
        .field(field_type::UDF_FILENAME, b"m");
    writer.finish();
    assert_eq!(failure(&out), (4, None));
}

/// The view (cluster key `key`, two copies of namespace `test`) of
/// `members`, as node `me` publishes it.
pub(crate) fn view(me: u64, key: u64, members: &[u64]) -> crate::cluster_state::ClusterState {
    use crate::cluster_state::{ClusterMember, ClusterState};
    let members = members
        .iter()
        .map(|id| ClusterMember {
            node_id: citrine_types::NodeId(*id),
            rack_id: 0,
            service_address: String::new(),
            tls: None,
        })
        .collect();
    ClusterState::new(
        citrine_types::NodeId(me),
        key,
        members,
        &[("test".into(), 2)],
        2,
        2,
    )
}

pub(crate) fn info(service: &Service, commands: &[&str]) -> Vec<(String, String)> {
    let frame = citrine_wire::info::request_frame(commands);
    let mut header_bytes = [0u8; 8];
    header_bytes.copy_from_slice(&frame[..8]);
    let mut out = Vec::new();
    service
        .handle(
            ProtoHeader::decode(&header_bytes).unwrap(),
            &frame[8..],
            &mut out,
        )
        .unwrap();
    assert_eq!(out[1], 1);
    citrine_wire::info::parse_response(&out[8..])
}

#[test]
fn info_answers() {
    let (service, _) = service();
    let answers = info(
        &service,
        &[
            "node",
            "build",
            "partition-generation",
            "replicas",
            "peers-clear-std",
            "namespaces",
            "bogus",
            "namespace/test",
            "namespace/none",
        ],
    );
    assert_eq!(answers[0], ("node".into(), "BB9020011AC4202".into()));
    assert_eq!(answers[1].1, "8.1.2.0");
    assert_eq!(answers[2].1, "1");
    let (namespace, rest) = answers[3].1.split_once(':').unwrap();
    assert_eq!(namespace, "test");
    let parts: Vec<&str> = rest.split(',').collect();
    assert_eq!(parts[0], "0");
    assert_eq!(parts[1], "1");
    assert_eq!(parts[2].len(), 684);
    assert!(parts[2].ends_with("8="));
    assert_eq!(answers[4].1, "1,3000,[]");
    assert_eq!(answers[5].1, "test");
    assert_eq!(answers[6].1, "ERROR:4:unrecognized command");
    assert!(answers[7].1.contains("objects=0;"));
    assert_eq!(answers[8].1, "type=unknown");
}

#[test]
fn help_lists_the_commands_the_server_answers() {
    let (service, _) = service();
    let answers = info(&service, &["help"]);
    let listed: Vec<&str> = answers[0].1.split(';').collect();
    assert_eq!(listed, crate::info::COMMANDS);
    // Every listed command is one the server knows (asked bare: the ones
    // that change something need parameters and refuse without them).
    let answers = info(&service, crate::info::COMMANDS);
    for (command, answer) in answers {
        assert_ne!(answer, "ERROR:4:unrecognized command", "{command}");
    }
    assert_eq!(
        info(&service, &["no-such-command"])[0].1,
        "ERROR:4:unrecognized command"
    );
}

#[test]
fn udf_modules_are_registered_listed_fetched_and_removed() {
    use base64::Engine as _;
    let (service, _) = service();
    let source = "function f(rec) return 1 end";
    let content = base64::engine::general_purpose::STANDARD.encode(source);
    let put = format!(
        "udf-put:filename=m.lua;content={content};content-len={};udf-type=LUA;",
        content.len()
    );
    let bad = base64::engine::general_purpose::STANDARD.encode("function f(\n  returned\nend");
    let answers = info(
        &service,
        &[
            &put,
            "udf-list",
            "udf-get:filename=m.lua",
            &format!("udf-put:filename=bad.lua;content={bad};udf-type=LUA;"),
            "udf-put:filename=x.lua;content=%%%;udf-type=LUA;",
            "udf-put:filename=../x.lua;content=AA==;udf-type=LUA;",
            "features",
        ],
    );
    assert_eq!(answers[0].1, "ok");
    let hash = citrine_udf::Module::new("m.lua", source.into()).hash;
    assert_eq!(
        answers[1].1,
        format!("filename=m.lua,hash={hash},type=LUA;")
    );
    assert!(
        answers[2]
            .1
            .ends_with(&format!("type=LUA;content={content};")),
        "{:?}",
        answers[2]
    );
    assert!(
        answers[3]
            .1
            .starts_with("error=compile_error;file=bad.lua;line="),
        "{:?}",
        answers[3]
    );
    assert_eq!(answers[4].1, "error=invalid_base64_content");
    assert_eq!(answers[5].1, "error=invalid_filename");
    assert!(answers[6].1.split(';').any(|feature| feature == "udf"));
    let answers = info(
        &service,
        &[
            "udf-remove:filename=m.lua",
            "udf-list",
            "udf-get:filename=m.lua",
            "udf-remove:filename=m.lua",
        ],
    );
    assert_eq!(answers[0].1, "ok");
    assert_eq!(answers[1].1, "");
    assert_eq!(answers[2].1, "error=not_found");
    assert_eq!(answers[3].1, "ok", "removing what is not there is ok");
}

#[test]
fn a_udf_module_name_follows_the_references_rules() {
    use base64::Engine as _;
    let (service, _) = service();
    let content = base64::engine::general_purpose::STANDARD.encode("function f(rec) return 1 end");
    let put = |name: &str| format!("udf-put:filename={name};content={content};udf-type=LUA;");
    let long = format!("{}.lua", "m".repeat(123));
    let too_long = format!("{}.lua", "m".repeat(124));
    let names = [
        "UPPER.LUA",
        "a$b-c_d.lua",
        &long,
        "noext",
        "m.",
        ".m.lua",
        "a/b.lua",
        "a b.lua",
        &too_long,
    ];
    let commands: Vec<String> = names.iter().map(|name| put(name)).collect();
    let commands: Vec<&str> = commands.iter().map(String::as_str).collect();
    let answers = info(&service, &commands);
    let got: Vec<&str> = answers.iter().map(|(_, answer)| answer.as_str()).collect();
    let refused = "error=invalid_filename";
    assert_eq!(
        got,
        ["ok", "ok", "ok", refused, refused, refused, refused, refused, refused]
    );
    let listed = info(&service, &["udf-list"]);
    for name in &names[..3] {
        assert!(listed[0].1.contains(&format!("filename={name},")), "{name}");
    }
    // Any extension registers, but only a `.lua` module can be called.
    assert!(service.udf_registry().get("UPPER.LUA").is_some());
    let answers = info(&service, &["udf-remove:filename=UPPER.LUA", "udf-list"]);
    assert_eq!(answers[0].1, "ok");
    assert!(!answers[1].1.contains("UPPER.LUA"));
}

#[test]
fn udf_modules_merge_newest_wins_and_removals_stick() {
    use base64::Engine as _;
    let (a, _) = service();
    let (b, _) = service();
    let put = |service: &Service, source: &str| {
        let content = base64::engine::general_purpose::STANDARD.encode(source);
        let answers = info(
            service,
            &[&format!("udf-put:filename=m.lua;content={content};")],
        );
        assert_eq!(answers[0].1, "ok");
    };
    put(&a, "function f(rec) return 1 end");
    let first_push = info(&a, &["udf-list"]);
    b.udf_modules().merge(&a.udf_modules().text());
    assert_eq!(info(&b, &["udf-list"]), first_push);
    let stale = a.udf_modules().text();
    let answers = info(&a, &["udf-remove:filename=m.lua"]);
    assert_eq!(answers[0].1, "ok");
    b.udf_modules().merge(&a.udf_modules().text());
    assert_eq!(info(&b, &["udf-list"])[0].1, "");
    // An older push does not bring the module back.
    b.udf_modules().merge(&stale);
    assert_eq!(info(&b, &["udf-list"])[0].1, "");
    // A newer put on b reaches a.
    put(&b, "function f(rec) return 2 end");
    a.udf_modules().merge(&b.udf_modules().text());
    assert_eq!(info(&a, &["udf-list"]), info(&b, &["udf-list"]));
    assert!(a.udf_registry().get("m.lua").is_some());
}

#[test]
fn udf_modules_are_kept_in_the_work_directory() {
    use base64::Engine as _;
    let directory = std::env::temp_dir().join(format!(
        "citrine-udf-test-{}-{}",
        std::process::id(),
        line!()
    ));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    let encode = |source: &str| base64::engine::general_purpose::STANDARD.encode(source);
    let (first, _) = service();
    first.keep_udf_modules(&directory).unwrap();
    let put_a = format!(
        "udf-put:filename=a.lua;content={};",
        encode("function f(r) return 1 end")
    );
    let put_b = format!(
        "udf-put:filename=b.lua;content={};",
        encode("function f(r) return 2 end")
    );
    let answers = info(
        &first,
        &[&put_a, &put_b, "udf-remove:filename=a.lua", "udf-list"],
    );
    assert!(
        answers[..3].iter().all(|(_, answer)| answer == "ok"),
        "{answers:?}"
    );
    let listed = answers[3].1.clone();
    // A new process over the same directory has b, and a's tombstone (an
    // older push of a from a peer does not bring it back).
    let (second, _) = service();
    second.keep_udf_modules(&directory).unwrap();
    assert_eq!(info(&second, &["udf-list"])[0].1, listed);
    let (peer, _) = service();
    let answers = info(&peer, &[&put_a]);
    assert_eq!(answers[0].1, "ok");
    // The peer's put is older than the removal only if its clock says so:
    // both run on the same test clock, so compare versions the way a merge
    // does: whatever wins, every node ends up with the same list.
    second.udf_modules().merge(&peer.udf_modules().text());
    peer.udf_modules().merge(&second.udf_modules().text());
    assert_eq!(info(&second, &["udf-list"]), info(&peer, &["udf-list"]));
    // A line that no longer makes a module is dropped, not fatal.
    let file = directory.join(crate::udf::MODULES_FILE);
    let mut text = std::fs::read_to_string(&file).unwrap();
    text.push_str("version=1.1;filename=bad.lua;content=%%%\n");
    std::fs::write(&file, text).unwrap();
    let (third, _) = service();
    third.keep_udf_modules(&directory).unwrap();
    assert!(info(&third, &["udf-list"])[0].1.contains("b.lua"));
    // A change the file cannot keep (here the file's place is taken by a
    // directory) is refused and not made: it would be gone after a restart.
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir_all(file.join("in-the-way")).unwrap();
    let answers = info(&third, &[&put_a, "udf-remove:filename=b.lua", "udf-list"]);
    assert!(
        answers[0].1.starts_with("error=write_failed"),
        "{answers:?}"
    );
    assert!(
        answers[1].1.starts_with("error=write_failed"),
        "{answers:?}"
    );
    assert!(!answers[2].1.contains("a.lua"), "{answers:?}");
    assert!(answers[2].1.contains("b.lua"), "{answers:?}");
    let _ = std::fs::remove_dir_all(&directory);
}

#[test]
fn namespace_info_names_each_statistic_once_with_failed_partitions() {
    let (service, _) = service();
    let answers = info(&service, &["namespace/test"]);
    let mut seen = std::collections::HashSet::new();
    for pair in answers[0].1.split(';') {
        let name = pair.split('=').next().unwrap_or_default();
        assert!(
            seen.insert(name.to_owned()),
            "{name} twice in {}",
            answers[0].1
        );
    }
    for name in [
        "objects",
        "tombstones",
        "client_read_success",
        "partitions_failed",
    ] {
        assert!(seen.contains(name), "{name} missing in {}", answers[0].1);
    }
}

#[test]
fn namespace_info_lists_the_conflict_resolution_policy() {
    let (service, _) = service();
    let answers = info(
        &service,
        &["namespace/test", "get-config:context=namespace;id=test"],
    );
    for (_, value) in &answers {
        assert!(
            value.contains("conflict-resolution-policy=generation;"),
            "{value}"
        );
        assert!(value.contains(";rack-id=0;"), "{value}");
    }
    let mut config = NamespaceConfig::in_memory("test");
    config.conflict_resolution_policy = crate::config::ConflictResolutionPolicy::LastUpdateTime;
    let (service, _) = service_with(config);
    let answers = info(
        &service,
        &["namespace/test", "get-config:context=namespace;id=test"],
    );
    for (_, value) in &answers {
        assert!(
            value.contains("conflict-resolution-policy=last-update-time;"),
            "{value}"
        );
    }
}

#[test]
fn truncate_removes_older_records() {
    let (service, clock) = service();
    send(
        &service,
        &put("old", Ops::new().int(op_type::WRITE, "a", 1)),
    );
    clock.advance_ms(10);
    let answers = info(&service, &["truncate:namespace=test;set=demo"]);
    assert_eq!(answers[0].1, "ok");
    assert_eq!(
        send(&service, &get("old")).header.result_code,
        ResultCode::NotFound.code()
    );
    clock.advance_ms(10);
    send(
        &service,
        &put("new", Ops::new().int(op_type::WRITE, "a", 1)),
    );
    assert_eq!(send(&service, &get("new")).header.result_code, 0);
}

#[test]
fn truncate_covers_its_own_millisecond_and_not_what_comes_after() {
    // The clock does not move: the writes before and after the command
    // share its millisecond, as a fast client's do.
    let (service, _clock) = service();
    for key in ["a", "b"] {
        let reply = send(&service, &put(key, Ops::new().int(op_type::WRITE, "v", 1)));
        assert_eq!(reply.header.result_code, 0);
    }
    let answers = info(&service, &["truncate:namespace=test;set=demo"]);
    assert_eq!(answers[0].1, "ok");
    for key in ["a", "b"] {
        assert_eq!(
            send(&service, &get(key)).header.result_code,
            ResultCode::NotFound.code(),
            "{key} was acknowledged before the truncation"
        );
    }
    // Acknowledged after the truncation: kept, by a write and a rewrite.
    send(&service, &put("a", Ops::new().int(op_type::WRITE, "v", 2)));
    send(&service, &put("a", Ops::new().int(op_type::WRITE, "v", 3)));
    let reply = send(&service, &get("a"));
    assert_eq!(reply.header.result_code, 0);
    assert_eq!(reply.header.generation, 2);
    // A second truncation in the same millisecond takes them too.
    let answers = info(&service, &["truncate:namespace=test;set=demo"]);
    assert_eq!(answers[0].1, "ok");
    assert_eq!(
        send(&service, &get("a")).header.result_code,
        ResultCode::NotFound.code()
    );
}

#[test]
fn admin_login_answers_security_not_enabled() {
    let (service, _) = service();
    let mut body = vec![0u8; 16];
    body[2] = citrine_wire::admin::command::LOGIN;
    let mut out = Vec::new();
    service
        .handle(
            ProtoHeader {
                version: 2,
                message_type: MessageType::Admin,
                size: 16,
            },
            &body,
            &mut out,
        )
        .unwrap();
    assert_eq!(out.len(), 24);
    assert_eq!(out[9], ResultCode::SecurityNotEnabled.code());
}

#[test]
fn compressed_requests_are_inflated() {
    let (service, _) = service();
    let frame = put("k", Ops::new().op(op_type::WRITE, 3, "s", &[b'z'; 400]));
    let compressed = citrine_wire::frame::deflate(&frame);
    assert!(compressed.len() < frame.len());
    let reply = send(&service, &compressed);
    assert_eq!(reply.header.result_code, 0);
    assert_eq!(send(&service, &get("k")).bins[0].2.len(), 400);
    // Garbage compressed data closes the connection.
    let mut out = Vec::new();
    let result = service.handle(
        ProtoHeader {
            version: 2,
            message_type: MessageType::Compressed,
            size: 12,
        },
        &[0, 0, 0, 0, 0, 0, 0, 30, 1, 2, 3, 4],
        &mut out,
    );
    assert!(result.is_err());
}

/// A read that names no bins, asks for none of them and not for the header
/// alone (a select of no bins) is refused with 4 once the record is found,
/// as the reference does; GET_NO_BINS wins over GET_ALL and read ops.
#[test]
fn a_read_of_no_bins_is_refused_and_no_bin_data_wins() {
    let (service, _) = service();
    send(&service, &put("k", Ops::new().int(op_type::WRITE, "a", 1)));
    let read = |key: &str, info1_bits: u8, ops: &Ops| {
        send(
            &service,
            &request(
                key,
                MsgHeader {
                    info1: info1_bits,
                    ..MsgHeader::default()
                },
                ops,
                false,
            ),
        )
    };
    let none = Ops::new();
    let reply = read("k", info1::READ, &none);
    assert_eq!(reply.header.result_code, ResultCode::Parameter.code());
    let reply = read("missing", info1::READ, &none);
    assert_eq!(reply.header.result_code, ResultCode::NotFound.code());
    let read_a = Ops::new().op(op_type::READ, 0, "a", b"");
    for bits in [
        info1::READ | info1::GET_NO_BINS,
        info1::READ | info1::GET_ALL | info1::GET_NO_BINS,
    ] {
        for ops in [&none, &read_a] {
            let reply = read("k", bits, ops);
            assert_eq!(reply.header.result_code, 0);
            assert_eq!(reply.header.generation, 1);
            assert!(reply.bins.is_empty(), "info1 {bits:#x}: {:?}", reply.bins);
        }
    }
}

#[test]
fn read_touch_resets_the_ttl_when_little_remains() {
    let (service, clock) = service();
    let write = request(
        "k",
        MsgHeader {
            info2: info2::WRITE,
            record_ttl: 100,
            ..MsgHeader::default()
        },
        &Ops::new().int(op_type::WRITE, "a", 1),
        false,
    );
    let written = send(&service, &write).header;
    let touch_read = |percent: u32| {
        request(
            "k",
            MsgHeader {
                info1: info1::READ | info1::GET_ALL,
                record_ttl: percent,
                ..MsgHeader::default()
            },
            &Ops::new(),
            false,
        )
    };
    // 10 s in: 90 % remains, more than 80 %: no touch.
    clock.advance_ms(10_000);
    let reply = send(&service, &touch_read(80)).header;
    assert_eq!(
        (reply.generation, reply.record_ttl),
        (written.generation, written.record_ttl)
    );
    // 30 s in: 70 % remains, less than 80 %: the read answers the record as
    // it was (as the reference does: the official Node client's test
    // expects the old TTL), then the TTL is reset to 100 s from now.
    clock.advance_ms(20_000);
    let reply = send(&service, &touch_read(80)).header;
    assert_eq!(
        (reply.generation, reply.record_ttl),
        (written.generation, written.record_ttl)
    );
    let reply = send(&service, &touch_read(0)).header;
    // The reference (CE 8.1.2, asked through the Python client) keeps the
    // generation of a record a read touched; its last-update time moves.
    assert_eq!(reply.generation, written.generation);
    assert_eq!(reply.record_ttl, service.now().citrusleaf_seconds + 100);
    let stats = &service.namespace(b"test").expect("namespace test").stats;
    assert_eq!(stats.read_touch_success.load(Ordering::Relaxed), 1);
    assert_eq!(stats.read_touch_skip.load(Ordering::Relaxed), 1);
    // Exactly the percentage remaining (50 of 100 s) touches too, as the
    // reference does (remaining <= ttl * pct / 100).
    clock.advance_ms(50_000);
    send(&service, &touch_read(50));
    let reply = send(&service, &touch_read(0)).header;
    assert_eq!(reply.generation, written.generation);
    assert_eq!(reply.record_ttl, service.now().citrusleaf_seconds + 100);
    // A plain read (0) never touches.
    clock.advance_ms(60_000);
    let reply = send(&service, &touch_read(0)).header;
    assert_eq!(reply.generation, written.generation);
    assert_eq!(
        send(&service, &touch_read(101)).header.result_code,
        ResultCode::Parameter.code()
    );
}

/// Lookahead reads the right lookup from a real request, and prefetching
/// a batch (records present, absent, and in a partition another thread
/// holds write-locked) neither blocks nor changes what the requests return.
#[test]
fn lookahead_finds_the_lookup_and_changes_nothing() {
    let (service, _) = service();
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    for key in &keys[..30] {
        send(&service, &put(key, Ops::new().int(op_type::WRITE, "n", 7)));
    }
    let frames: Vec<Vec<u8>> = keys.iter().map(|key| get(key)).collect();
    let lookups: Vec<lookahead::Lookup> = frames
        .iter()
        .map(|frame| {
            service
                .lookup_of(&frame[8..])
                .expect("a single-record read")
        })
        .collect();
    let digest = of_key("demo", &UserKey::String("k3".into()));
    assert_eq!(lookups[3], lookahead::Lookup::new(0, digest));

    // Not single-record lookups: unknown namespace, truncated, batch.
    let mut other = frames[0].clone();
    let at = other.windows(4).position(|w| w == b"test").unwrap();
    other[at..at + 4].copy_from_slice(b"tess");
    assert_eq!(service.lookup_of(&other[8..]), None);
    assert_eq!(service.lookup_of(&frames[0][8..30]), None);
    let mut batch = frames[0].clone();
    batch[8 + 1] |= info1::BATCH;
    assert_eq!(service.lookup_of(&batch[8..]), None);

    // A partition write-locked elsewhere: prefetch must skip it, not wait.
    let namespace = service.namespace(b"test").unwrap();
    let held = namespace.index.partition(digest.partition()).write();
    service.prefetch(&lookups);
    drop(held);

    for (i, frame) in frames.iter().enumerate() {
        let reply = send(&service, frame);
        if i < 30 {
            assert_eq!(reply.header.result_code, 0, "key {i}");
            assert_eq!(
                reply.bins,
                vec![(b"n".to_vec(), 1, 7i64.to_be_bytes().to_vec())]
            );
        } else {
            assert_eq!(reply.header.result_code, 2, "key {i}: not found");
        }
    }
}

/// `rack-ids` answers this node's rack (the one it joined the view with) in
/// every namespace, as the rack-aware clients parse it; before its first
/// view, its configured rack (0 here).
/// (It answered `ERROR:25:enterprise only`: rack-aware clients learned no
/// rack.)
#[test]
fn rack_ids_answer_this_nodes_rack_in_every_namespace() {
    use crate::cluster_state::{ClusterMember, ClusterState};
    let (service, _) = service_with_all(vec![
        NamespaceConfig::in_memory("test"),
        NamespaceConfig::in_memory("bar"),
    ]);
    assert_eq!(info(&service, &["rack-ids"])[0].1, "test:0;bar:0");
    let member = |id: u64, rack_id: u32| ClusterMember {
        node_id: citrine_types::NodeId(id),
        rack_id,
        service_address: String::new(),
        tls: None,
    };
    let me = service.node_id.0;
    service.publish_cluster(ClusterState::new(
        service.node_id,
        0x51,
        vec![member(me, 3), member(me + 2, 4)],
        &[("test".into(), 2), ("bar".into(), 2)],
        2,
        2,
    ));
    assert_eq!(info(&service, &["rack-ids"])[0].1, "test:3;bar:3");
}

/// `racks:` groups the view's nodes by rack in every namespace (racks and
/// nodes ascending), `racks:namespace=NS` answers one namespace, an unknown
/// one is an error; before the first view the node is alone in its
/// configured rack (0 here).
#[test]
fn racks_group_the_views_nodes_by_rack() {
    use crate::cluster_state::{ClusterMember, ClusterState};
    let (service, _) = service_with_all(vec![
        NamespaceConfig::in_memory("test"),
        NamespaceConfig::in_memory("bar"),
    ]);
    let me = service.node_id;
    assert_eq!(
        info(&service, &["racks:"])[0].1,
        format!("ns=test:rack_0={me};ns=bar:rack_0={me}")
    );
    let member = |id: u64, rack_id: u32| ClusterMember {
        node_id: citrine_types::NodeId(id),
        rack_id,
        service_address: String::new(),
        tls: None,
    };
    let (a, b, c) = (me.0 + 0x30, me.0 + 0x10, me.0 + 0x20);
    service.publish_cluster(ClusterState::new(
        me,
        0x51,
        vec![member(a, 1), member(me.0, 2), member(b, 2), member(c, 1)],
        &[("test".into(), 2), ("bar".into(), 2)],
        2,
        2,
    ));
    let node = |id: u64| citrine_types::NodeId(id).to_string();
    let racks = format!("rack_1={},{}:rack_2={me},{}", node(c), node(a), node(b));
    assert_eq!(
        info(&service, &["racks:"])[0].1,
        format!("ns=test:{racks};ns=bar:{racks}")
    );
    assert_eq!(
        info(&service, &["racks:namespace=bar"])[0].1,
        format!("ns=bar:{racks}")
    );
    assert_eq!(
        info(&service, &["racks:namespace=nope"])[0].1,
        "ERROR:4:namespace not found"
    );
}

/// A request that waited in a stalled node's socket is refused with 9 once
/// its client's timeout has run out since it may have arrived (its client
/// gave up and may have written the record since); one with time left, or
/// whose client set no timeout, runs.
#[test]
fn a_request_held_past_its_timeout_is_refused_not_run() {
    let (service, clock) = service();
    let put_with_ttl = |value: i64, transaction_ttl: u32| {
        request(
            "held",
            MsgHeader {
                info2: info2::WRITE,
                transaction_ttl,
                ..MsgHeader::default()
            },
            &Ops::new().int(op_type::WRITE, "v", value),
            false,
        )
    };
    let send_since = |frame: &[u8], waiting_since_ms: Option<u64>| {
        let header = ProtoHeader::decode(frame[..8].try_into().unwrap()).unwrap();
        let mut out = Vec::new();
        let pending = service
            .handle_streaming_since(header, &frame[8..], &mut out, waiting_since_ms)
            .unwrap();
        assert!(pending.is_none());
        Message::decode(&out[8..]).unwrap().header.result_code
    };
    let expired = || {
        service
            .dist()
            .stats
            .expired_refusals
            .load(Ordering::Relaxed)
    };
    clock.advance_ms(10_000);
    let now = service.now().unix_ms;
    // Waited 150 ms of a 100 ms timeout: refused, nothing written.
    assert_eq!(send_since(&put_with_ttl(1, 100), Some(now - 150)), 9);
    assert_eq!(expired(), 1);
    assert_eq!(send(&service, &get("held")).header.result_code, 2);
    // Exactly at the deadline: refused too.
    assert_eq!(send_since(&put_with_ttl(1, 100), Some(now - 100)), 9);
    assert_eq!(expired(), 2);
    // 50 ms of 100: runs.
    assert_eq!(send_since(&put_with_ttl(2, 100), Some(now - 50)), 0);
    // No client timeout: runs however long it waited.
    assert_eq!(send_since(&put_with_ttl(3, 0), Some(now - 60_000)), 0);
    // Read as it arrived: runs.
    assert_eq!(send_since(&put_with_ttl(4, 100), None), 0);
    assert_eq!(expired(), 2);
    let reply = send(&service, &get("held"));
    assert_eq!(reply.bins[0].2, 4i64.to_be_bytes().to_vec());
    // A batch that waited past its timeout is refused as a whole.
    let batch = request(
        "held",
        MsgHeader {
            info1: info1::READ | info1::BATCH,
            transaction_ttl: 100,
            ..MsgHeader::default()
        },
        &Ops::new(),
        false,
    );
    assert_eq!(send_since(&batch, Some(now - 500)), 9);
    assert_eq!(expired(), 3);
}

/// A device namespace whose device starts failing syncs: the flusher's
/// failed sync puts the engine in its failed state, after which a client
/// write, delete or replica write is refused with 1 (SERVER_ERROR) and
/// reads are still answered; the namespace statistics say so.
#[test]
fn a_failed_device_sync_refuses_writes_with_server_error_and_keeps_reads() {
    use citrine_storage::device::io::{Fault, IoOp, SimDisk, Trigger};
    use citrine_storage::device::{DeviceConfig, Media};
    let disk = SimDisk::new((1 << 20) + 16 * (64 << 10), 7);
    let engine = DeviceConfig {
        write_block_size: 64 << 10,
        media: Media::Simulated(vec![disk.clone()]),
        ..DeviceConfig::new("test", vec!["sim0".into()], 0)
    };
    let (service, _) = service_with(NamespaceConfig {
        storage_engine: StorageEngineConfig::Device {
            engine,
            flush_max_ms: 1000,
            index_image: None,
        },
        ..NamespaceConfig::in_memory("test")
    });
    let namespace = service.namespace(b"test").unwrap();
    let write = |key: &str| {
        send(&service, &put(key, Ops::new().int(op_type::WRITE, "a", 1)))
            .header
            .result_code
    };
    assert_eq!(write("synced"), 0);
    crate::device::flush_tick(namespace);
    assert_eq!(write("unsynced"), 0);
    disk.inject(Fault {
        op: IoOp::Sync,
        trigger: Trigger::Always,
    });
    crate::device::flush_tick(namespace);
    assert_eq!(write("refused"), ResultCode::ServerError.code());
    assert_eq!(write("synced"), ResultCode::ServerError.code());
    let delete = request(
        "synced",
        MsgHeader {
            info2: info2::WRITE | info2::DELETE,
            ..MsgHeader::default()
        },
        &Ops::new(),
        false,
    );
    assert_eq!(
        send(&service, &delete).header.result_code,
        ResultCode::ServerError.code()
    );
    let copy = crate::replication::ReplicaWrite {
        namespace: "test".into(),
        digest: of_key("demo", &UserKey::String("copy".into())),
        set_name: b"demo".to_vec(),
        generation: 1,
        life: 0,
        void_time: 0,
        last_update_ms: START_MS,
        durable: false,
        body: Some(Vec::new()),
        xdr_write: false,
    };
    assert_eq!(
        crate::replication::apply_replica_write(service.dist(), &copy),
        ResultCode::ServerError
    );
    for key in ["synced", "unsynced"] {
        let reply = send(&service, &get(key));
        assert_eq!(reply.header.result_code, 0, "{key}");
        assert_eq!(reply.bins.len(), 1);
    }
    assert_eq!(
        send(&service, &get("refused")).header.result_code,
        ResultCode::NotFound.code()
    );
    let answers = info(&service, &["namespace/test"]);
    assert!(
        answers[0].1.contains(";device_failed=true;"),
        "{}",
        answers[0].1
    );
    assert!(
        answers[0].1.contains(";device_writes_refused=4;"),
        "{}",
        answers[0].1
    );
}

/// `SetName()` in an operate that creates the record gives the request's
/// set, as the reference's does (it answered '' here, no metadata naming
/// the set yet).
#[test]
fn set_name_in_a_write_expression_is_the_requests_set() {
    let (service, _) = service();
    // [[SET_NAME], 0]
    let set_name: &[u8] = &[0x92, 0x91, 70, 0x00];
    let reply = send(
        &service,
        &put(
            "new",
            Ops::new().op(op_type::EXP_MODIFY, 4, "s", set_name).op(
                op_type::EXP_READ,
                4,
                "r",
                set_name,
            ),
        ),
    );
    assert_eq!(reply.header.result_code, 0);
    assert_eq!(reply.bins, vec![(b"r".to_vec(), 3, b"demo".to_vec())]);
    let reply = send(&service, &get("new"));
    assert!(reply.bins.contains(&(b"s".to_vec(), 3, b"demo".to_vec())));
}

/// Strong-consistency namespaces: the roster commands and the refusals.
pub(crate) mod sc;

/// A client's transaction through the service.
mod txn;

/// Eviction's pace (`evict-tenths-pct`) and run-time thresholds.
mod eviction;
