//! The fuzzing oracle for `citrine-wire`, shared by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/*`) and by the stable smoke fuzzer
//! (`crates/citrine-wire/tests/fuzz_smoke.rs`, which includes this file with
//! `#[path]`), so both check exactly the same invariants.
//!
//! Every `check_*` function feeds arbitrary bytes to the decoders and asserts
//! cheap invariants on what they return. A panic anywhere (in a decoder or in
//! an assertion here) is a finding. Also here: [`seed_frames`] and
//! [`seed_message_streams`], the valid inputs both fuzzers start from.
//!
//! Dependency-free apart from `citrine_wire` itself, and free of `unwrap` and
//! `unsafe` (the workspace lints deny both).

#![allow(dead_code)]

use citrine_wire::admin::{self, AdminHeader, ADMIN_HEADER_SIZE};
use citrine_wire::frame::{
    self, MessageType, ProtoHeader, PROTO_HEADER_SIZE, PROTO_SIZE_MAX, PROTO_VERSION,
};
use citrine_wire::info::{self, InfoCommand, InfoResponse};
use citrine_wire::msg::{
    field_type, info1, info2, info3, op_type, write_status, Message, MessageWriter, MsgHeader,
    MSG_HEADER_SIZE,
};

/// True when `inner` lies entirely inside `outer` (address-wise), i.e. a
/// borrowed view handed out by a decoder points into the input it was given.
fn lies_within(outer: &[u8], inner: &[u8]) -> bool {
    let start = outer.as_ptr() as usize;
    let end = start + outer.len();
    let inner_start = inner.as_ptr() as usize;
    inner_start >= start
        && inner_start
            .checked_add(inner.len())
            .is_some_and(|inner_end| inner_end <= end)
}

/// The whole-frame oracle (target `wire_frame`): the first 8 bytes are a proto
/// header, everything after them is the body (the announced size is checked
/// by the header oracle but not used to cut the body, so the fuzzer needs not
/// match it to reach the body decoders). Returns whether the body decoded
/// (a hint for the smoke fuzzer, which keeps such inputs to mutate further).
pub fn check_frame(data: &[u8]) -> bool {
    let Some((head, body)) = data.split_first_chunk::<PROTO_HEADER_SIZE>() else {
        return false;
    };
    let Some(header) = check_proto_header(head) else {
        return false;
    };
    match header.message_type {
        MessageType::Message => check_as_msg(body),
        MessageType::Compressed => check_compressed(body),
        MessageType::Info => check_info(body),
        MessageType::Admin => check_admin(body),
        MessageType::InternalXdr => false,
    }
}

/// The stream oracle (target `wire_message`): `data` is a sequence of bare
/// AS_MSGs (no proto headers), as in a multi-record stream frame. Walks it with
/// `decode_prefix` until the end or the first error. Returns how many
/// messages decoded.
pub fn check_messages(data: &[u8]) -> usize {
    check_as_msg(data);
    let mut decoded = 0;
    let mut rest = data;
    while !rest.is_empty() {
        match Message::decode_prefix(rest) {
            Ok((message, used)) => {
                assert!(
                    (MSG_HEADER_SIZE..=rest.len()).contains(&used),
                    "decode_prefix used {used} bytes of {}",
                    rest.len()
                );
                check_decoded(&message, &rest[..used]);
                rest = &rest[used..];
                decoded += 1;
            }
            Err(_) => break,
        }
    }
    decoded
}

/// `TxnFields::parse` against the first field of each transaction type:
/// it fails exactly when one has the wrong size, and otherwise carries
/// their values; a version re-encodes to its bytes.
pub fn check_txn_fields(message: &Message<'_>) {
    use citrine_wire::txn::{RecordVersion, TxnFields};
    let first = |kind: u8| message.field(kind);
    let id = first(field_type::TXN_ID);
    let deadline = first(field_type::TXN_DEADLINE);
    let version = first(field_type::RECORD_VERSION);
    let sizes_ok = id.is_none_or(|data| data.len() == 8)
        && deadline.is_none_or(|data| data.len() == 4)
        && version.is_none_or(|data| data.len() == 7);
    let parsed = TxnFields::parse(message.fields());
    assert_eq!(parsed.is_ok(), sizes_ok, "txn fields {parsed:?}");
    let Ok(parsed) = parsed else {
        return;
    };
    assert_eq!(parsed.id.is_some(), id.is_some());
    assert_eq!(parsed.deadline.is_some(), deadline.is_some());
    if let (Some(parsed), Some(bytes)) = (parsed.version, version) {
        assert_eq!(&parsed.encode()[..], bytes);
        assert_eq!(RecordVersion::decode(bytes), Some(parsed));
    }
}

/// `ProtoHeader::decode` against a reference predicate written from
/// 01-framing.md; returns the header when it decoded.
pub fn check_proto_header(bytes: &[u8; PROTO_HEADER_SIZE]) -> Option<ProtoHeader> {
    let result = ProtoHeader::decode(bytes);
    let version = bytes[0];
    let raw_type = bytes[1];
    let mut size_bytes = [0u8; 8];
    size_bytes[2..].copy_from_slice(&bytes[2..]);
    let size = u64::from_be_bytes(size_bytes);
    let expected_ok = (1..=5).contains(&raw_type)
        && (version == PROTO_VERSION || (version == 0 && raw_type == MessageType::Admin as u8))
        && size <= PROTO_SIZE_MAX;
    assert_eq!(
        result.is_ok(),
        expected_ok,
        "ProtoHeader::decode({bytes:02x?}) = {result:?}"
    );
    let header = result.ok()?;
    assert_eq!(header.version, version);
    assert_eq!(header.message_type as u8, raw_type);
    assert_eq!(header.size, size);
    if version == PROTO_VERSION {
        assert_eq!(
            &ProtoHeader::encode(header.message_type, header.size),
            bytes,
            "header re-encodes"
        );
    }
    Some(header)
}

/// An AS_MSG body: `decode` and `decode_prefix` must agree, and whatever
/// decoded must satisfy [`check_decoded`]. Returns whether `decode` accepted it.
pub fn check_as_msg(body: &[u8]) -> bool {
    let exact = Message::decode(body);
    let prefix = Message::decode_prefix(body);
    match (&exact, &prefix) {
        (Ok(message), Ok((prefixed, used))) => {
            assert_eq!(
                *used,
                body.len(),
                "decode accepted a body decode_prefix did not consume"
            );
            assert_eq!(message.header, prefixed.header);
        }
        (Ok(message), Err(error)) => {
            // Only the reference's leniency: a last field sized past the end
            // (no ops) is the rest of the message.
            assert!(
                message.last_field_clamped(),
                "decode accepted a body decode_prefix rejected ({error})"
            );
            assert_eq!(message.header.n_ops, 0, "a clamped field with ops after it");
            let fields: Vec<_> = message.fields().collect();
            assert_eq!(fields.len(), usize::from(message.header.n_fields));
            let last = fields.last().map(|field| field.data);
            assert!(last.is_some_and(|data| lies_within(body, data)
                && data.as_ptr() as usize + data.len() == body.as_ptr() as usize + body.len()));
            return true;
        }
        (Err(_), Ok((_, used))) => {
            assert_ne!(
                *used,
                body.len(),
                "decode rejected a body decode_prefix consumed exactly"
            )
        }
        (Err(_), Err(_)) => {}
    }
    if let Ok((message, used)) = prefix {
        assert!(
            (MSG_HEADER_SIZE..=body.len()).contains(&used),
            "decode_prefix used {used} of {}",
            body.len()
        );
        check_decoded(&message, &body[..used]);
        let alone = Message::decode(&body[..used]);
        assert!(
            alone.is_ok(),
            "a decoded prefix does not decode on its own: {alone:?}"
        );
    }
    exact.is_ok()
}

/// Invariants of a decoded message over the exact bytes it consumed: counts
/// match the header, every view lies inside the input, fields and ops account
/// for every byte, and (when no op carries flags) `MessageWriter` re-encodes
/// the very same bytes.
pub fn check_decoded(message: &Message<'_>, consumed: &[u8]) {
    let header = message.header;
    assert_eq!(
        MsgHeader::decode(consumed),
        Ok(header),
        "header decodes alone"
    );
    assert_eq!(usize::from(consumed[0]), MSG_HEADER_SIZE);

    let mut accounted = MSG_HEADER_SIZE;
    let mut n_fields = 0usize;
    for field in message.fields() {
        assert!(
            lies_within(consumed, field.data),
            "field data outside the input"
        );
        accounted += 4 + 1 + field.data.len();
        n_fields += 1;
        assert!(
            n_fields <= usize::from(header.n_fields),
            "more fields than announced"
        );
    }
    assert_eq!(n_fields, usize::from(header.n_fields), "field count");
    check_txn_fields(message);
    if let Some(first) = message.fields().next() {
        assert_eq!(
            message.field(first.field_type).map(<[u8]>::as_ptr),
            Some(first.data.as_ptr())
        );
    }

    let mut n_ops = 0usize;
    let mut all_flags_zero = true;
    for op in message.ops() {
        assert!(lies_within(consumed, op.name), "op name outside the input");
        assert!(
            lies_within(consumed, op.value),
            "op value outside the input"
        );
        assert!(op.name.len() <= usize::from(u8::MAX));
        assert_eq!(
            op.lut.is_some(),
            op.flags & 1 != 0,
            "lut present iff flag bit 0"
        );
        accounted += 4 + 4 + op.name.len() + if op.lut.is_some() { 8 } else { 0 } + op.value.len();
        all_flags_zero &= op.flags == 0;
        n_ops += 1;
        assert!(
            n_ops <= usize::from(header.n_ops),
            "more ops than announced"
        );
    }
    assert_eq!(n_ops, usize::from(header.n_ops), "op count");
    assert_eq!(
        accounted,
        consumed.len(),
        "fields and ops must account for every byte"
    );

    if all_flags_zero {
        let mut out = Vec::with_capacity(consumed.len());
        let mut writer = MessageWriter::begin_bare(&mut out, &header);
        for field in message.fields() {
            writer.field(field.field_type, field.data);
        }
        for op in message.ops() {
            writer.op(op.op_type, op.particle_type, op.name, op.value);
        }
        let length = writer.finish();
        assert_eq!(length, consumed.len(), "re-encoded length");
        assert!(
            out == consumed,
            "MessageWriter does not reproduce the decoded bytes"
        );
    }
}

/// A type-4 body: whatever inflates must be a consistent type-3 frame whose
/// body is then checked as an AS_MSG. Returns whether both decoded.
pub fn check_compressed(body: &[u8]) -> bool {
    let Ok((header, inner)) = frame::inflate(body) else {
        return false;
    };
    assert_eq!(header.message_type, MessageType::Message);
    assert_eq!(header.version, PROTO_VERSION);
    assert_eq!(header.size, inner.len() as u64, "inner size");
    let mut announced = [0u8; 8];
    announced.copy_from_slice(&body[..8]);
    assert_eq!(
        u64::from_be_bytes(announced),
        inner.len() as u64 + PROTO_HEADER_SIZE as u64,
        "original length"
    );
    check_as_msg(&inner)
}

/// A type-1 body, read both as a request and as a response. Returns whether
/// it held at least one line.
pub fn check_info(body: &[u8]) -> bool {
    let lines = info::request_lines(body);
    for line in &lines {
        assert!(
            !line.is_empty() && !line.contains('\n'),
            "request line {line:?}"
        );
        let command = InfoCommand::parse(line);
        assert_eq!(command.line, line.as_str());
        assert!(line.starts_with(command.name));
        assert!(
            !command.name.contains(['/', ':']),
            "name {:?}",
            command.name
        );
        for argument in &command.positional {
            assert!(!argument.contains(['/', ':']), "positional {argument:?}");
        }
        for (key, value) in &command.params {
            assert!(
                !key.contains([';', '=']) && !value.contains(';'),
                "param {key:?}={value:?}"
            );
            assert!(command.param(key).is_some());
        }
    }
    // A request built from these lines splits back into them.
    let commands: Vec<&str> = lines.iter().map(String::as_str).collect();
    let frame = info::request_frame(&commands);
    assert_eq!(
        info::request_lines(&frame[PROTO_HEADER_SIZE..]),
        lines,
        "request round trip"
    );

    let pairs = info::parse_response(body);
    assert_eq!(
        pairs.len(),
        lines.len(),
        "responses and requests split lines alike"
    );
    for (line, value) in &pairs {
        assert!(
            !line.contains(['\n', '\t']) && !value.contains('\n'),
            "pair {line:?} {value:?}"
        );
    }
    // An answer echoing each tab-free line parses back into (line, value).
    let mut response = InfoResponse::new();
    let echoed: Vec<&String> = lines.iter().filter(|line| !line.contains('\t')).collect();
    for line in &echoed {
        response.push(line, "v");
    }
    let parsed = info::parse_response(response.body());
    assert_eq!(parsed.len(), echoed.len(), "response round trip");
    for ((line, value), original) in parsed.iter().zip(&echoed) {
        assert!(line == *original && value == "v", "response round trip");
    }
    !lines.is_empty()
}

/// A type-2 body. Returns whether the header decoded.
pub fn check_admin(body: &[u8]) -> bool {
    match AdminHeader::decode(body) {
        Ok(header) => {
            assert!(body.len() >= ADMIN_HEADER_SIZE);
            assert_eq!(
                [
                    header.scheme,
                    header.result,
                    header.command,
                    header.n_fields
                ],
                [body[0], body[1], body[2], body[3]]
            );
            true
        }
        Err(_) => {
            assert!(
                body.len() < ADMIN_HEADER_SIZE,
                "admin header rejected {} bytes",
                body.len()
            );
            false
        }
    }
}

// ---------------------------------------------------------------------------
// Seeds: valid inputs built with the crate's own encoders.

const DIGEST: [u8; 20] = [
    0xec, 0x91, 0x19, 0x2d, 0x4b, 0x7f, 0x8c, 0xe3, 0x5d, 0x5d, 0x78, 0xd3, 0x4b, 0xca, 0x65, 0xcb,
    0xaa, 0xaa, 0xc9, 0x60,
];

fn key_fields(writer: &mut MessageWriter<'_>) {
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(field_type::DIGEST, &DIGEST);
}

/// A bare (no proto header) or framed AS_MSG.
fn as_msg(framed: bool, header: MsgHeader, build: impl FnOnce(&mut MessageWriter<'_>)) -> Vec<u8> {
    let mut out = Vec::new();
    let mut writer = if framed {
        MessageWriter::begin(&mut out, &header)
    } else {
        MessageWriter::begin_bare(&mut out, &header)
    };
    build(&mut writer);
    writer.finish();
    out
}

fn get_all(framed: bool) -> Vec<u8> {
    let header = MsgHeader {
        info1: info1::READ | info1::GET_ALL,
        transaction_ttl: 1000,
        ..MsgHeader::default()
    };
    as_msg(framed, header, key_fields)
}

fn get_bins(framed: bool) -> Vec<u8> {
    let header = MsgHeader {
        info1: info1::READ,
        transaction_ttl: 1000,
        ..MsgHeader::default()
    };
    as_msg(framed, header, |writer| {
        key_fields(writer);
        writer
            .op(op_type::READ, 0, b"a", b"")
            .op(op_type::READ, 0, b"bin2", b"");
    })
}

fn put(framed: bool) -> Vec<u8> {
    let header = MsgHeader {
        info2: info2::WRITE,
        record_ttl: 3600,
        transaction_ttl: 1000,
        ..MsgHeader::default()
    };
    as_msg(framed, header, |writer| {
        key_fields(writer);
        writer
            .op(op_type::WRITE, 1, b"a", &1i64.to_be_bytes())
            .op(op_type::WRITE, 2, b"f", &1.5f64.to_be_bytes())
            .op(op_type::WRITE, 3, b"s", b"hello")
            .op(op_type::WRITE, 4, b"blob", &[0, 0xff, 0x7f, 0x80])
            .op(op_type::APPEND, 3, b"s", b"!")
            .op_with(op_type::INCR, 1, b"counter", |value| {
                value.extend_from_slice(&7i64.to_be_bytes())
            });
    })
}

/// A put inside a transaction: id, deadline and read version fields, the
/// lock-only `info4` bit.
fn txn_put(framed: bool) -> Vec<u8> {
    let header = MsgHeader {
        info2: info2::WRITE,
        info4: citrine_wire::txn::info4::ON_LOCKING_ONLY,
        transaction_ttl: 1000,
        ..MsgHeader::default()
    };
    as_msg(framed, header, |writer| {
        key_fields(writer);
        writer
            .field(field_type::TXN_ID, &0x0123_4567_89ab_cdefu64.to_le_bytes())
            .field(field_type::RECORD_VERSION, &[1, 2, 3, 4, 5, 6, 7])
            .field(field_type::TXN_DEADLINE, &4242u32.to_le_bytes())
            .op(op_type::WRITE, 1, b"a", &1i64.to_be_bytes());
    })
}

/// A record in a scan/query stream answer: bins as ops, the generation and
/// void time in the header.
fn record(framed: bool, last: bool) -> Vec<u8> {
    let header = MsgHeader {
        info3: if last { info3::LAST } else { 0 },
        generation: 3,
        record_ttl: 0x1234_5678,
        ..MsgHeader::default()
    };
    as_msg(framed, header, |writer| {
        if !last {
            writer.field(field_type::DIGEST, &DIGEST);
            writer.op(op_type::READ, 1, b"a", &42i64.to_be_bytes()).op(
                op_type::READ,
                3,
                b"name",
                b"citrine",
            );
        }
    })
}

/// An XDR-style write whose op carries flag bit 0 and an 8-byte LUT.
fn put_with_lut(framed: bool) -> Vec<u8> {
    let header = MsgHeader {
        info1: info1::XDR,
        info2: info2::WRITE,
        ..MsgHeader::default()
    };
    let mut out = Vec::new();
    let mut writer = if framed {
        MessageWriter::begin(&mut out, &header)
    } else {
        MessageWriter::begin_bare(&mut out, &header)
    };
    key_fields(&mut writer);
    writer.field(field_type::LUT, &0x1700_0000_0000_0000u64.to_be_bytes());
    writer.op_with(op_type::WRITE, 1, b"x", |value| {
        value.extend_from_slice(&0x1700_0000_0000_0001u64.to_be_bytes());
        value.extend_from_slice(&9i64.to_be_bytes());
    });
    writer.finish();
    // The op is the last thing written: size(4) type particle FLAGS name_len "x" lut value.
    let op_at = out.len() - (4 + 4 + 1 + 8 + 8);
    out[op_at + 6] = 1;
    out
}

/// A batch request: digest array and a filter expression, plus an op.
fn batch(framed: bool) -> Vec<u8> {
    let header = MsgHeader {
        info1: info1::READ | info1::BATCH,
        transaction_ttl: 500,
        ..MsgHeader::default()
    };
    let mut index = Vec::new();
    for position in 0u32..2 {
        index.extend_from_slice(&position.to_be_bytes());
        index.extend_from_slice(&DIGEST);
        index.push(0);
    }
    as_msg(framed, header, |writer| {
        writer
            .field(field_type::NAMESPACE, b"test")
            .field(field_type::BATCH_INDEX, &index)
            .field(field_type::FILTER_EXPRESSION, &[0x93, 0x01, 0x02, 0x03]);
        writer.op(op_type::READ, 0, b"a", b"");
    })
}

fn admin_frame(version: u8, command: u8, fields: &[(u8, &[u8])]) -> Vec<u8> {
    let mut body = vec![0u8; ADMIN_HEADER_SIZE];
    body[2] = command;
    body[3] = fields.len() as u8;
    for (id, data) in fields {
        body.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
        body.push(*id);
        body.extend_from_slice(data);
    }
    let mut out = ProtoHeader::encode(MessageType::Admin, body.len() as u64).to_vec();
    out[0] = version;
    out.extend_from_slice(&body);
    out
}

/// Complete valid frames (proto header included) of every type.
pub fn seed_frames() -> Vec<Vec<u8>> {
    let mut seeds = vec![
        get_all(true),
        get_bins(true),
        put(true),
        put_with_lut(true),
        txn_put(true),
        batch(true),
        record(true, false),
        record(true, true),
    ];
    let mut status = Vec::new();
    write_status(&mut status, 2, 0, 0);
    seeds.push(status);
    seeds.push(frame::deflate(&put(true)));
    seeds.push(frame::deflate(&get_bins(true)));
    seeds.push(frame::deflate(&batch(true)));
    seeds.push(info::request_frame(&[
        "node",
        "build",
        "namespaces",
        "partition-generation",
    ]));
    seeds.push(info::request_frame(&[
        "namespace/test",
        "get-config:context=namespace;namespace=test",
        "sets/test/demo",
        "set-config:context=service;proto-fd-max=1000;flag",
        "cluster-stable:",
    ]));
    let mut response = InfoResponse::new();
    response.push("node", "BB9020011AC4202");
    response.push("namespaces", "test;bar");
    let mut answer = Vec::new();
    response.write_frame(&mut answer);
    seeds.push(answer);
    let credential = b"$2a$10$7EqJtq98hPqEX7fNZaFWoOhi5BSkFEwI1a6nLVCZAgbXb8JBbLTS2";
    seeds.push(admin_frame(
        2,
        admin::command::LOGIN,
        &[(0, b"admin"), (3, credential)],
    ));
    seeds.push(admin_frame(
        0,
        admin::command::AUTHENTICATE,
        &[(0, b"admin"), (5, &[0xde, 0xad, 0xbe, 0xef])],
    ));
    let mut reply = Vec::new();
    admin::write_reply(&mut reply, 52);
    seeds.push(reply);
    seeds
}

/// Concatenated bare AS_MSGs, as in stream answers and batch frames.
pub fn seed_message_streams() -> Vec<Vec<u8>> {
    let mut scan = Vec::new();
    for _ in 0..3 {
        scan.extend_from_slice(&record(false, false));
    }
    scan.extend_from_slice(&record(false, true));
    let mut mixed = get_bins(false);
    mixed.extend_from_slice(&put_with_lut(false));
    mixed.extend_from_slice(&batch(false));
    mixed.extend_from_slice(&txn_put(false));
    vec![get_all(false), put(false), scan, mixed]
}
