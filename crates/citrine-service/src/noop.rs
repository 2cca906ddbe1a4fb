//! No-op mode (`citrined --noop`): the benchmark ceiling.
//!
//! A node in no-op mode runs everything a real node runs — its listener,
//! service threads, frame parsing, info commands, cluster view — but
//! answers every AS_MSG without touching a namespace: a single-record
//! command gets a header-only success (result 0, generation 1, no bins),
//! a batch, scan or query gets an empty stream (its LAST message, result
//! 0). Nothing is stored, so reads return no bins.
//!
//! What a benchmark measures against it is the cost of the client, the
//! network path and this server's own I/O layer: the ceiling a real node
//! on the same machine, at the same moment, can approach but not pass.
//! `scripts/go-benchmark.sh` and `bench/run.sh` quote Citrine as a
//! fraction of it.
//!
//! Invariant: exactly one reply per request frame, in request order, as
//! for a real node (a batch or scan reply ends with its LAST message).

use crate::transaction;
use citrine_types::ResultCode;
use citrine_wire::msg::{field_type, info1, write_status, FieldIter, MsgHeader};

/// The generation every no-op reply reports.
const GENERATION: u32 = 1;

/// Appends the no-op answer to one AS_MSG body. It reads only the message
/// header and the field types, never validates the rest: a body too short
/// for a header gets a parameter error, as from a real node.
pub(crate) fn reply(body: &[u8], out: &mut Vec<u8>) {
    let Ok(header) = MsgHeader::decode(body) else {
        transaction::write_refusal(out, body, ResultCode::Parameter);
        return;
    };
    let single_record = header.info1 & info1::BATCH == 0
        && FieldIter::unchecked(body)
            .take(usize::from(header.n_fields))
            .any(|field| field.field_type == field_type::DIGEST);
    if single_record {
        write_status(out, ResultCode::Ok.code(), GENERATION, 0);
    } else {
        transaction::write_stream_end(out, ResultCode::Ok);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use citrine_wire::msg::{info2, info3, Message, MessageWriter};

    fn request(header: MsgHeader, digest: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut writer = MessageWriter::begin(&mut out, &header);
        writer.field(field_type::NAMESPACE, b"test");
        if digest {
            writer.field(field_type::DIGEST, &[7; 20]);
        }
        writer.op(2, 1, b"n", &5i64.to_be_bytes());
        writer.finish();
        // The writer emits the proto header first: the body is what follows.
        out.split_off(citrine_wire::frame::PROTO_HEADER_SIZE)
    }

    fn answer(body: &[u8]) -> MsgHeader {
        let mut out = Vec::new();
        reply(body, &mut out);
        let reply = Message::decode(&out[citrine_wire::frame::PROTO_HEADER_SIZE..]).unwrap();
        assert_eq!(reply.ops().count(), 0, "a no-op reply carries no bins");
        reply.header
    }

    #[test]
    fn a_single_record_command_gets_a_header_only_success() {
        let write = MsgHeader {
            info2: info2::WRITE,
            ..MsgHeader::default()
        };
        let header = answer(&request(write, true));
        assert_eq!(header.result_code, ResultCode::Ok.code());
        assert_eq!(header.generation, GENERATION);
        assert_eq!(header.info3 & info3::LAST, 0);
    }

    #[test]
    fn a_batch_or_scan_gets_an_empty_stream() {
        let batch = MsgHeader {
            info1: info1::READ | info1::BATCH,
            ..MsgHeader::default()
        };
        let scan = MsgHeader {
            info1: info1::READ,
            ..MsgHeader::default()
        };
        for header in [
            answer(&request(batch, false)),
            answer(&request(scan, false)),
        ] {
            assert_eq!(header.result_code, ResultCode::Ok.code());
            assert_ne!(header.info3 & info3::LAST, 0, "the stream ends at once");
        }
    }

    #[test]
    fn a_body_too_short_for_a_header_gets_a_parameter_error() {
        assert_eq!(answer(&[0; 5]).result_code, ResultCode::Parameter.code());
        let header = answer(&[22, info1::BATCH, 0]);
        assert_eq!(header.result_code, ResultCode::Parameter.code());
        assert_ne!(header.info3 & info3::LAST, 0);
    }
}
