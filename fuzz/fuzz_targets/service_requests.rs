//! The client's side of a node (`citrine_service::Service::handle`): info
//! commands, single-record messages, batches, scans, queries, UDF calls,
//! compressed frames and admin requests with arbitrary bodies, into one node
//! that keeps its state across inputs (a view of its own, an in-memory
//! namespace `test`, no fabric, no files), as a client's connection feeds it.
//!
//! Input: a sequence of requests, each `kind` (1 byte: its low 2 bits pick
//! info, message, compressed or admin; its high bit first moves the node's
//! clock on by `length` seconds, so records expire), `length` (2 bytes,
//! little-endian), then up to `length` bytes of body.
//!
//! A message's timeout is held to at most a second (and a timeout of 0, the
//! server's default, made a second): a record UDF that loops forever runs as
//! long as its request's timeout allows, up to 10 s, which would read as a
//! hang here.
//!
//! Oracle: no panic, no hang, memory bounded by libFuzzer; every request the
//! node does not close the connection on is answered with whole, well-formed
//! proto frames (version 2, the sizes adding up, an info request answered by
//! info frames, a message by message frames); afterwards the node still
//! answers `build`, and a read of a key with found or not found.
#![no_main]

use citrine_service::{ManualClock, Service};
use citrine_wire::msg::{field_type, info1, MessageWriter, MsgHeader};
use citrine_wire::{MessageType, ProtoHeader, PROTO_HEADER_SIZE};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};

const NODE: u64 = 0xB2;

fn node() -> &'static (Arc<ManualClock>, Service) {
    static NODE_STATE: OnceLock<(Arc<ManualClock>, Service)> = OnceLock::new();
    NODE_STATE.get_or_init(|| citrine_wire_fuzz::node::single_node(NODE, 1, 1))
}

/// Checks that `out` is a run of whole proto frames of the expected kinds.
fn check_reply(request: MessageType, out: &[u8]) {
    assert!(!out.is_empty(), "{request:?} request answered nothing");
    let mut rest = out;
    while !rest.is_empty() {
        let Some((head, after)) = rest.split_first_chunk::<PROTO_HEADER_SIZE>() else {
            panic!(
                "a reply ends inside a proto header: {} bytes left",
                rest.len()
            );
        };
        let header = ProtoHeader::decode(head).expect("a reply's proto header decodes");
        assert_eq!(header.version, 2, "reply proto version");
        let expected = match request {
            MessageType::Info => [MessageType::Info, MessageType::Info],
            MessageType::Admin => [MessageType::Admin, MessageType::Admin],
            // A message may be answered compressed, never with anything else.
            _ => [MessageType::Message, MessageType::Compressed],
        };
        assert!(
            expected.contains(&header.message_type),
            "{request:?} request answered with a {:?} frame",
            header.message_type
        );
        let size = usize::try_from(header.size).expect("size fits");
        assert!(size <= after.len(), "a reply frame is cut short");
        rest = &after[size..];
    }
}

/// The node's answer to one request frame of `kind` (`None`: it closes
/// the connection).
fn answer(service: &Service, kind: MessageType, body: &[u8]) -> Option<Vec<u8>> {
    let header = ProtoHeader {
        version: 2,
        message_type: kind,
        size: body.len() as u64,
    };
    let mut out = Vec::new();
    service.handle(header, body, &mut out).ok().map(|_| out)
}

fn send(service: &Service, kind: MessageType, body: &[u8]) {
    if let Some(out) = answer(service, kind, body) {
        check_reply(kind, &out);
    }
}

fuzz_target!(|data: &[u8]| {
    let (clock, service) = node();
    let mut rest = data;
    while let Some((&kind, after)) = rest.split_first() {
        let Some((length, after)) = after.split_first_chunk::<2>() else {
            break;
        };
        let length = u16::from_le_bytes(*length);
        if kind & 0x80 != 0 {
            clock.advance_ms(u64::from(length) * 1000);
        }
        let length = usize::from(length).min(after.len());
        let (body, after) = after.split_at(length);
        let kind = match kind & 3 {
            0 => MessageType::Info,
            1 => MessageType::Message,
            2 => MessageType::Compressed,
            _ => MessageType::Admin,
        };
        if kind == MessageType::Message && body.len() >= 22 {
            let mut held = body.to_vec();
            let timeout = u32::from_be_bytes([held[14], held[15], held[16], held[17]]);
            if timeout == 0 || timeout > 1000 {
                held[14..18].copy_from_slice(&1000u32.to_be_bytes());
            }
            send(service, kind, &held);
        } else {
            send(service, kind, body);
        }
        rest = after;
    }
    // Still serving: an info answer and a read.
    let out = answer(service, MessageType::Info, b"build\n").expect("build is answered");
    assert!(
        out.ends_with(format!("build\t{}\n", citrine_service::info::BUILD).as_bytes()),
        "build answered {:?}",
        String::from_utf8_lossy(&out)
    );
    let out = answer(service, MessageType::Message, &read_of_a_key()).expect("a read is answered");
    check_reply(MessageType::Message, &out);
    // Found or not found: nothing a client sends makes a node refuse reads.
    let code = out.get(PROTO_HEADER_SIZE + 5).copied();
    assert!(matches!(code, Some(0 | 2)), "the read answered {code:?}");
});

/// A read of key "k" in `test`/`demo` (all bins), as the official clients
/// send it: namespace, set and digest fields.
fn read_of_a_key() -> Vec<u8> {
    let digest = citrine_wire::digest::compute(b"demo", 3, b"k");
    let header = MsgHeader {
        info1: info1::READ | info1::GET_ALL,
        transaction_ttl: 1000,
        ..MsgHeader::default()
    };
    let mut body = Vec::new();
    let mut writer = MessageWriter::begin_bare(&mut body, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(field_type::DIGEST, &digest.0);
    writer.finish();
    body
}
