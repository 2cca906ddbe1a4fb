//! No-op mode (`citrined --noop`): the benchmark ceiling.
//!
//! A node in no-op mode runs everything a real node runs — its listener,
//! service threads, frame parsing, info commands, cluster view — but
//! answers every AS_MSG without touching a namespace: a single-record
//! command gets a header-only success (result 0, generation 1, no bins);
//! a batch gets one such success per row (carrying the row's batch index)
//! and its LAST message, or just the LAST a real node refuses it with (4
//! when its rows do not parse or there are none, 151 past
//! `batch-max-requests`);
//! a scan or query gets an empty stream (its LAST message, result 0).
//! Nothing is stored, so reads return no bins.
//!
//! What a benchmark measures against it is the cost of the client, the
//! network path and this server's own I/O layer: the ceiling a real node
//! on the same machine, at the same moment, can approach but not pass.
//! `scripts/go-benchmark.sh` and `bench/run.sh` quote Citrine as a
//! fraction of it.
//!
//! Invariant: exactly one reply per request frame, in request order, as
//! for a real node (a batch or scan reply ends with its LAST message).

use crate::{batch, transaction};
use citrine_types::ResultCode;
use citrine_wire::frame::{MessageType, ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::msg::{
    field_type, info1, info3, write_status, FieldIter, MessageWriter, MsgHeader,
};

/// The generation every no-op reply reports.
const GENERATION: u32 = 1;

/// Appends the no-op answer to one AS_MSG body. It reads only the message
/// header and the field types, never validates the rest: a body too short
/// for a header gets a parameter error, as from a real node.
pub(crate) fn reply(body: &[u8], batch_max_rows: u32, out: &mut Vec<u8>) {
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
    } else if header.info1 & info1::BATCH != 0 {
        batch_reply(body, header, batch_max_rows, out);
    } else {
        transaction::write_stream_end(out, ResultCode::Ok);
    }
}

/// One header-only success per row of a batch, then LAST/0, in one frame.
fn batch_reply(body: &[u8], header: MsgHeader, max_rows: u32, out: &mut Vec<u8>) {
    let payload = FieldIter::unchecked(body)
        .take(usize::from(header.n_fields))
        .find(|field| {
            matches!(
                field.field_type,
                field_type::BATCH_INDEX | field_type::BATCH_INDEX_WITH_SET
            )
        })
        .map(|field| field.data);
    let rows = payload
        .ok_or(batch::BatchError::Malformed("no batch field"))
        .and_then(|payload| {
            // The checks a real node makes before it runs any row.
            let count = batch::validate(payload, batch::Parent::default(), max_rows)?;
            let mut reader = batch::RowReader::new(payload, batch::Parent::default());
            (0..count)
                .map(|_| reader.next_row().map(|row| row.index))
                .collect::<Result<Vec<u32>, _>>()
        });
    let indexes = match rows {
        Ok(indexes) => indexes,
        Err(error) => {
            transaction::write_stream_end(out, error.code());
            return;
        }
    };
    let frame_start = out.len();
    out.extend_from_slice(&[0; PROTO_HEADER_SIZE]);
    for index in indexes {
        let row = MsgHeader {
            generation: GENERATION,
            transaction_ttl: index,
            ..MsgHeader::default()
        };
        MessageWriter::begin_bare(out, &row).finish();
    }
    let last = MsgHeader {
        info3: info3::LAST,
        ..MsgHeader::default()
    };
    MessageWriter::begin_bare(out, &last).finish();
    ProtoHeader::patch(&mut out[frame_start..], MessageType::Message);
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
        reply(body, 5000, &mut out);
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
    fn a_scan_gets_an_empty_stream() {
        let scan = MsgHeader {
            info1: info1::READ,
            ..MsgHeader::default()
        };
        let header = answer(&request(scan, false));
        assert_eq!(header.result_code, ResultCode::Ok.code());
        assert_ne!(header.info3 & info3::LAST, 0, "the stream ends at once");
    }

    #[test]
    fn a_batch_gets_a_success_per_row_then_its_last_message() {
        let header = MsgHeader {
            info1: info1::BATCH,
            ..MsgHeader::default()
        };
        // Two rows: a legacy read row (index 7), then a REPEAT (index 3).
        let mut payload = vec![0, 0, 0, 2, 0];
        payload.extend_from_slice(&7u32.to_be_bytes());
        payload.extend_from_slice(&[1; 20]);
        payload.extend_from_slice(&[0, info1::READ, 0, 1, 0, 0]);
        payload.extend_from_slice(&5u32.to_be_bytes());
        payload.push(field_type::NAMESPACE);
        payload.extend_from_slice(b"test");
        payload.extend_from_slice(&3u32.to_be_bytes());
        payload.extend_from_slice(&[2; 20]);
        payload.push(1);
        let frame = |payload: &[u8]| {
            let mut out = Vec::new();
            let mut writer = MessageWriter::begin(&mut out, &header);
            writer.field(field_type::BATCH_INDEX, payload);
            writer.finish();
            out.split_off(PROTO_HEADER_SIZE)
        };
        let mut out = Vec::new();
        reply(&frame(&payload), 5000, &mut out);
        let mut rest = &out[PROTO_HEADER_SIZE..];
        let mut messages = Vec::new();
        while !rest.is_empty() {
            let (message, used) = Message::decode_prefix(rest).unwrap();
            messages.push(message.header);
            rest = &rest[used..];
        }
        assert_eq!(messages.len(), 3);
        assert_eq!(
            (messages[0].transaction_ttl, messages[1].transaction_ttl),
            (7, 3)
        );
        assert!(messages[..2]
            .iter()
            .all(|row| row.result_code == 0 && row.generation == GENERATION && row.info3 == 0));
        assert_eq!(messages[2].info3 & info3::LAST, info3::LAST);
        assert_eq!(messages[2].result_code, 0);
        // A row cut short: the whole batch is refused with 4.
        let mut out = Vec::new();
        reply(&frame(&payload[..payload.len() - 3]), 5000, &mut out);
        let last = Message::decode(&out[PROTO_HEADER_SIZE..]).unwrap().header;
        assert_eq!(last.result_code, ResultCode::Parameter.code());
        assert_ne!(last.info3 & info3::LAST, 0);
        // Bytes after the last row, no rows, or more rows than allowed: as
        // a real node refuses them.
        for (payload, max_rows, code) in [
            ([&payload[..], &[0]].concat(), 5000, ResultCode::Parameter),
            (vec![0, 0, 0, 0, 0], 5000, ResultCode::Parameter),
            (payload.clone(), 1, ResultCode::BatchMaxRequests),
        ] {
            let mut out = Vec::new();
            reply(&frame(&payload), max_rows, &mut out);
            let last = Message::decode(&out[PROTO_HEADER_SIZE..]).unwrap().header;
            assert_eq!(last.result_code, code.code());
            assert_ne!(last.info3 & info3::LAST, 0);
        }
        // So is a batch without its rows.
        assert_eq!(
            answer(&request(header, false)).result_code,
            ResultCode::Parameter.code()
        );
    }

    #[test]
    fn a_body_too_short_for_a_header_gets_a_parameter_error() {
        assert_eq!(answer(&[0; 5]).result_code, ResultCode::Parameter.code());
        let header = answer(&[22, info1::BATCH, 0]);
        assert_eq!(header.result_code, ResultCode::Parameter.code());
        assert_ne!(header.info3 & info3::LAST, 0);
    }
}
