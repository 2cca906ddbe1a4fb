//! AS_MSG (proto type 3): the 22-byte header, fields and ops.
//!
//! Requests are decoded as borrowed views ([`Message`]) over the frame body:
//! decoding walks every field and op once, checking every length against the
//! body, so the iterators handed out afterwards never see an out-of-bounds
//! length. Responses (and, for the client, requests) are encoded by
//! [`MessageWriter`] straight into a caller-owned buffer, so a reply costs no
//! allocation once the connection's buffer has grown.
//!
//! Invariant: a decoded [`Message`] consumed its body exactly — fields and ops
//! account for every byte after the header (the reference server rejects
//! trailing bytes with result 4, and so do we).

use crate::frame::{MessageType, ProtoHeader, PROTO_HEADER_SIZE};
use crate::{read_u16, read_u32, DecodeError};

/// Size of the AS_MSG header.
pub const MSG_HEADER_SIZE: usize = 22;

/// `info1` bits.
pub mod info1 {
    pub const READ: u8 = 0x01;
    pub const GET_ALL: u8 = 0x02;
    pub const SHORT_QUERY: u8 = 0x04;
    pub const BATCH: u8 = 0x08;
    pub const XDR: u8 = 0x10;
    pub const GET_NO_BINS: u8 = 0x20;
    pub const READ_MODE_AP_ALL: u8 = 0x40;
    pub const COMPRESS_RESPONSE: u8 = 0x80;
}

/// `info2` bits.
pub mod info2 {
    pub const WRITE: u8 = 0x01;
    pub const DELETE: u8 = 0x02;
    pub const GENERATION: u8 = 0x04;
    pub const GENERATION_GT: u8 = 0x08;
    pub const DURABLE_DELETE: u8 = 0x10;
    pub const CREATE_ONLY: u8 = 0x20;
    pub const RELAX_AP_LONG_QUERY: u8 = 0x40;
    pub const RESPOND_ALL_OPS: u8 = 0x80;
}

/// `info3` bits.
pub mod info3 {
    pub const LAST: u8 = 0x01;
    pub const COMMIT_MASTER: u8 = 0x02;
    pub const PARTITION_DONE: u8 = 0x04;
    pub const UPDATE_ONLY: u8 = 0x08;
    pub const CREATE_OR_REPLACE: u8 = 0x10;
    pub const REPLACE_ONLY: u8 = 0x20;
    pub const SC_READ_TYPE: u8 = 0x40;
    pub const SC_READ_RELAX: u8 = 0x80;
}

/// Field types.
pub mod field_type {
    pub const NAMESPACE: u8 = 0;
    pub const SET: u8 = 1;
    pub const KEY: u8 = 2;
    pub const RECORD_VERSION: u8 = 3;
    pub const DIGEST: u8 = 4;
    pub const TXN_ID: u8 = 5;
    pub const TXN_DEADLINE: u8 = 6;
    pub const TASK_ID: u8 = 7;
    pub const SOCKET_TIMEOUT: u8 = 9;
    pub const RECORDS_PER_SECOND: u8 = 10;
    pub const PID_ARRAY: u8 = 11;
    pub const DIGEST_ARRAY: u8 = 12;
    pub const MAX_RECORDS: u8 = 13;
    pub const LUT: u8 = 14;
    pub const BVAL_ARRAY: u8 = 15;
    pub const INDEX_NAME: u8 = 21;
    pub const INDEX_RANGE: u8 = 22;
    pub const INDEX_CONTEXT: u8 = 23;
    pub const INDEX_EXPRESSION: u8 = 24;
    pub const INDEX_TYPE: u8 = 26;
    pub const UDF_FILENAME: u8 = 30;
    pub const UDF_FUNCTION: u8 = 31;
    pub const UDF_ARGLIST: u8 = 32;
    pub const UDF_OP: u8 = 33;
    pub const QUERY_BINLIST: u8 = 40;
    pub const BATCH_INDEX: u8 = 41;
    pub const BATCH_INDEX_WITH_SET: u8 = 42;
    pub const FILTER_EXPRESSION: u8 = 43;
    pub const ERROR_DETAILS: u8 = 45;
}

/// Op types.
pub mod op_type {
    pub const READ: u8 = 1;
    pub const WRITE: u8 = 2;
    pub const CDT_READ: u8 = 3;
    pub const CDT_MODIFY: u8 = 4;
    pub const INCR: u8 = 5;
    pub const EXP_READ: u8 = 7;
    pub const EXP_MODIFY: u8 = 8;
    pub const APPEND: u8 = 9;
    pub const PREPEND: u8 = 10;
    pub const TOUCH: u8 = 11;
    pub const BITS_READ: u8 = 12;
    pub const BITS_MODIFY: u8 = 13;
    pub const DELETE_ALL: u8 = 14;
    pub const HLL_READ: u8 = 15;
    pub const HLL_MODIFY: u8 = 16;
}

/// The 22-byte AS_MSG header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsgHeader {
    pub info1: u8,
    pub info2: u8,
    pub info3: u8,
    pub info4: u8,
    pub result_code: u8,
    pub generation: u32,
    pub record_ttl: u32,
    pub transaction_ttl: u32,
    pub n_fields: u16,
    pub n_ops: u16,
}

impl MsgHeader {
    /// Decodes the header at the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<MsgHeader, DecodeError> {
        if bytes.len() < MSG_HEADER_SIZE {
            return Err(DecodeError::Truncated {
                what: "AS_MSG header",
                needed: MSG_HEADER_SIZE,
                available: bytes.len(),
            });
        }
        if usize::from(bytes[0]) != MSG_HEADER_SIZE {
            return Err(DecodeError::Invalid("AS_MSG header size"));
        }
        Ok(MsgHeader {
            info1: bytes[1],
            info2: bytes[2],
            info3: bytes[3],
            info4: bytes[4],
            result_code: bytes[5],
            generation: read_u32(bytes, 6, "generation")?,
            record_ttl: read_u32(bytes, 10, "record ttl")?,
            transaction_ttl: read_u32(bytes, 14, "transaction ttl")?,
            n_fields: read_u16(bytes, 18, "field count")?,
            n_ops: read_u16(bytes, 20, "op count")?,
        })
    }

    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.push(MSG_HEADER_SIZE as u8);
        out.push(self.info1);
        out.push(self.info2);
        out.push(self.info3);
        out.push(self.info4);
        out.push(self.result_code);
        out.extend_from_slice(&self.generation.to_be_bytes());
        out.extend_from_slice(&self.record_ttl.to_be_bytes());
        out.extend_from_slice(&self.transaction_ttl.to_be_bytes());
        out.extend_from_slice(&self.n_fields.to_be_bytes());
        out.extend_from_slice(&self.n_ops.to_be_bytes());
    }
}

/// A field: type and data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'a> {
    pub field_type: u8,
    pub data: &'a [u8],
}

/// An op (bin operation): op type, particle type, bin name and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op<'a> {
    pub op_type: u8,
    pub particle_type: u8,
    pub flags: u8,
    pub name: &'a [u8],
    /// XDR's last-update time, present when flag bit 0 is set.
    pub lut: Option<u64>,
    pub value: &'a [u8],
}

/// A decoded AS_MSG: its header and borrowed views of its fields and ops.
#[derive(Clone, Copy, Debug)]
pub struct Message<'a> {
    pub header: MsgHeader,
    fields: &'a [u8],
    ops: &'a [u8],
    /// The last field's size ran past the end of the message, and its data
    /// is the rest of the message (see [`Message::decode`]).
    last_field_clamped: bool,
}

impl<'a> Message<'a> {
    /// Decodes one AS_MSG that must occupy `body` exactly.
    ///
    /// One leniency, the reference server's: when a message has no ops, its
    /// last field may declare more bytes than the message holds, and its
    /// data is then the rest of the message. The reference checks only that
    /// each field starts inside the message, and the official Go client
    /// (v8.5.0) sends such frames: a batch with a filter expression sizes
    /// its BATCH_INDEX field as if it held the filter field too. Whatever
    /// reads that field still checks its own contents (a batch payload its
    /// row count and every row's length).
    pub fn decode(body: &'a [u8]) -> Result<Message<'a>, DecodeError> {
        let (message, used) = Message::decode_inner(body, true)?;
        if used != body.len() {
            return Err(DecodeError::Invalid("extra bytes follow fields and ops"));
        }
        Ok(message)
    }

    /// Decodes one AS_MSG at the start of `bytes`, returning it and the number
    /// of bytes it occupies (for concatenated messages in streams).
    pub fn decode_prefix(bytes: &'a [u8]) -> Result<(Message<'a>, usize), DecodeError> {
        Message::decode_inner(bytes, false)
    }

    /// `whole`: `bytes` is the whole message (the last field may be
    /// clamped, see [`Message::decode`]).
    fn decode_inner(bytes: &'a [u8], whole: bool) -> Result<(Message<'a>, usize), DecodeError> {
        let header = MsgHeader::decode(bytes)?;
        let mut offset = MSG_HEADER_SIZE;
        let fields_start = offset;
        let mut last_field_clamped = false;
        for index in 0..header.n_fields {
            let size = read_u32(bytes, offset, "field size")? as usize;
            if size == 0 {
                return Err(DecodeError::Invalid("field size 0"));
            }
            let end = offset
                .checked_add(4)
                .and_then(|at| at.checked_add(size))
                .ok_or(DecodeError::Invalid("field size"))?;
            let last = index + 1 == header.n_fields && header.n_ops == 0;
            if end > bytes.len() && whole && last && offset + 5 <= bytes.len() {
                // The reference's leniency: the last field ends the message.
                last_field_clamped = true;
                offset = bytes.len();
                break;
            }
            if end > bytes.len() {
                return Err(DecodeError::Truncated {
                    what: "field",
                    needed: end,
                    available: bytes.len(),
                });
            }
            offset = end;
        }
        let fields = &bytes[fields_start..offset];
        let ops_start = offset;
        for _ in 0..header.n_ops {
            let size = read_u32(bytes, offset, "op size")? as usize;
            if size < 4 {
                return Err(DecodeError::Invalid("op size below 4"));
            }
            let end = offset
                .checked_add(4)
                .and_then(|at| at.checked_add(size))
                .ok_or(DecodeError::Invalid("op size"))?;
            if end > bytes.len() {
                return Err(DecodeError::Truncated {
                    what: "op",
                    needed: end,
                    available: bytes.len(),
                });
            }
            let flags = bytes[offset + 6];
            let name_length = usize::from(bytes[offset + 7]);
            let lut_length = if flags & 1 != 0 { 8 } else { 0 };
            if 4 + name_length + lut_length > size {
                return Err(DecodeError::Invalid("op bin name length exceeds op size"));
            }
            offset = end;
        }
        let ops = &bytes[ops_start..offset];
        Ok((
            Message {
                header,
                fields,
                ops,
                last_field_clamped,
            },
            offset,
        ))
    }

    /// Whether the last field was sized past the end of the message and
    /// taken as its rest (the leniency [`Message::decode`] describes).
    pub fn last_field_clamped(&self) -> bool {
        self.last_field_clamped
    }

    /// Iterates the fields in wire order.
    pub fn fields(&self) -> FieldIter<'a> {
        FieldIter {
            rest: self.fields,
            clamp_last: self.last_field_clamped,
        }
    }

    /// The data of the first field of `field_type`, if present.
    pub fn field(&self, field_type: u8) -> Option<&'a [u8]> {
        self.fields()
            .find(|field| field.field_type == field_type)
            .map(|field| field.data)
    }

    /// Iterates the ops in wire order.
    pub fn ops(&self) -> OpIter<'a> {
        OpIter { rest: self.ops }
    }
}

/// Iterator over fields: validated ones ([`Message::fields`]), or the
/// fields of a body not decoded yet ([`FieldIter::unchecked`]).
pub struct FieldIter<'a> {
    rest: &'a [u8],
    /// The last field's data is the rest of the bytes, whatever its size
    /// says (a [`Message`] decoded with the reference's leniency).
    clamp_last: bool,
}

impl<'a> FieldIter<'a> {
    /// The fields of an AS_MSG body that has not been validated, for a
    /// quick look before [`Message::decode`]: take `header.n_fields` of
    /// them (past those come the ops). It stops at the first field that
    /// does not fit.
    pub fn unchecked(body: &'a [u8]) -> FieldIter<'a> {
        FieldIter {
            rest: body.get(MSG_HEADER_SIZE..).unwrap_or_default(),
            clamp_last: false,
        }
    }
}

impl<'a> Iterator for FieldIter<'a> {
    type Item = Field<'a>;
    fn next(&mut self) -> Option<Field<'a>> {
        let size = read_u32(self.rest, 0, "field size").ok()? as usize;
        let mut end = 4usize.checked_add(size)?;
        if self.clamp_last && end > self.rest.len() {
            end = self.rest.len();
        }
        let field_type = *self.rest.get(4)?;
        let data = self.rest.get(5..end)?;
        self.rest = self.rest.get(end..)?;
        Some(Field { field_type, data })
    }
}

/// Iterator over validated ops.
pub struct OpIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for OpIter<'a> {
    type Item = Op<'a>;
    fn next(&mut self) -> Option<Op<'a>> {
        let (op, used) = split_op(self.rest)?;
        self.rest = self.rest.get(used..)?;
        Some(op)
    }
}

/// Decodes the op at the start of `bytes`: the op and the bytes it occupies
/// (its size field included). `None` when the op does not fit in `bytes` or
/// its size cannot hold its header, name and LUT.
pub fn split_op(bytes: &[u8]) -> Option<(Op<'_>, usize)> {
    let size = read_u32(bytes, 0, "op size").ok()? as usize;
    if size < 4 {
        return None;
    }
    let end = 4usize.checked_add(size)?;
    let body = bytes.get(4..end)?;
    let op_type = *body.first()?;
    let particle_type = *body.get(1)?;
    let flags = *body.get(2)?;
    let name_length = usize::from(*body.get(3)?);
    let name = body.get(4..4 + name_length)?;
    let mut value_start = 4 + name_length;
    let lut = if flags & 1 != 0 {
        let lut_bytes = body.get(value_start..value_start + 8)?;
        value_start += 8;
        let mut word = [0u8; 8];
        word.copy_from_slice(lut_bytes);
        Some(u64::from_be_bytes(word))
    } else {
        None
    };
    let value = body.get(value_start..)?;
    Some((
        Op {
            op_type,
            particle_type,
            flags,
            name,
            lut,
            value,
        },
        end,
    ))
}

/// Encodes one AS_MSG frame (proto header, AS_MSG header, fields, ops) into a
/// caller-owned buffer. Fields must be written before ops; `finish` patches
/// the proto size and the field and op counts.
pub struct MessageWriter<'b> {
    buffer: &'b mut Vec<u8>,
    frame_start: usize,
    n_fields: u16,
    n_ops: u16,
    with_proto_header: bool,
}

impl<'b> MessageWriter<'b> {
    /// Starts a complete frame (proto header included) at the end of `buffer`.
    pub fn begin(buffer: &'b mut Vec<u8>, header: &MsgHeader) -> MessageWriter<'b> {
        let frame_start = buffer.len();
        buffer.extend_from_slice(&[0u8; PROTO_HEADER_SIZE]);
        header.encode_into(buffer);
        MessageWriter {
            buffer,
            frame_start,
            n_fields: 0,
            n_ops: 0,
            with_proto_header: true,
        }
    }

    /// Starts a bare AS_MSG (no proto header), for messages concatenated in
    /// one frame of a stream.
    pub fn begin_bare(buffer: &'b mut Vec<u8>, header: &MsgHeader) -> MessageWriter<'b> {
        let frame_start = buffer.len();
        header.encode_into(buffer);
        MessageWriter {
            buffer,
            frame_start,
            n_fields: 0,
            n_ops: 0,
            with_proto_header: false,
        }
    }

    /// Appends a field.
    pub fn field(&mut self, field_type: u8, data: &[u8]) -> &mut Self {
        debug_assert_eq!(self.n_ops, 0, "fields must precede ops");
        self.buffer
            .extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
        self.buffer.push(field_type);
        self.buffer.extend_from_slice(data);
        self.n_fields += 1;
        self
    }

    /// Appends an op.
    pub fn op(&mut self, op_type: u8, particle_type: u8, name: &[u8], value: &[u8]) -> &mut Self {
        debug_assert!(name.len() <= u8::MAX as usize);
        let size = 4 + name.len() + value.len();
        self.buffer.extend_from_slice(&(size as u32).to_be_bytes());
        self.buffer.push(op_type);
        self.buffer.push(particle_type);
        self.buffer.push(0);
        self.buffer.push(name.len() as u8);
        self.buffer.extend_from_slice(name);
        self.buffer.extend_from_slice(value);
        self.n_ops += 1;
        self
    }

    /// Appends an op whose value is written by `write_value` directly into the
    /// buffer (avoids an intermediate copy for large values).
    pub fn op_with(
        &mut self,
        op_type: u8,
        particle_type: u8,
        name: &[u8],
        write_value: impl FnOnce(&mut Vec<u8>),
    ) -> &mut Self {
        let size_at = self.buffer.len();
        self.buffer.extend_from_slice(&[0u8; 4]);
        self.buffer.push(op_type);
        self.buffer.push(particle_type);
        self.buffer.push(0);
        self.buffer.push(name.len() as u8);
        self.buffer.extend_from_slice(name);
        write_value(self.buffer);
        let size = (self.buffer.len() - size_at - 4) as u32;
        self.buffer[size_at..size_at + 4].copy_from_slice(&size.to_be_bytes());
        self.n_ops += 1;
        self
    }

    /// Number of ops written so far.
    pub fn op_count(&self) -> u16 {
        self.n_ops
    }

    /// Bytes of this message (or frame) written so far.
    pub fn written(&self) -> usize {
        self.buffer.len() - self.frame_start
    }

    /// Drops everything this writer wrote: the buffer is as before `begin`.
    pub fn abandon(self) {
        self.buffer.truncate(self.frame_start);
    }

    /// Patches counts (and the proto header) and returns the frame's length.
    pub fn finish(self) -> usize {
        let header_at = if self.with_proto_header {
            self.frame_start + PROTO_HEADER_SIZE
        } else {
            self.frame_start
        };
        self.buffer[header_at + 18..header_at + 20].copy_from_slice(&self.n_fields.to_be_bytes());
        self.buffer[header_at + 20..header_at + 22].copy_from_slice(&self.n_ops.to_be_bytes());
        if self.with_proto_header {
            ProtoHeader::patch(&mut self.buffer[self.frame_start..], MessageType::Message);
        }
        self.buffer.len() - self.frame_start
    }
}

/// Encodes a header-only reply (result code, generation, void time).
pub fn write_status(buffer: &mut Vec<u8>, result_code: u8, generation: u32, void_time: u32) {
    let header = MsgHeader {
        result_code,
        generation,
        record_ttl: void_time,
        ..MsgHeader::default()
    };
    MessageWriter::begin(buffer, &header).finish();
}

/// Low bits of an XDR write's `LUT` field (14) holding the last-update
/// time; the shipping node's id sits above them.
const LUT_TIME_BITS: u32 = 40;

/// The `LUT` field (14) an XDR write carries: the record's last-update
/// time (Unix ms) as Citrusleaf-epoch ms in the low 40 bits, the source
/// node's id above.
pub fn xdr_lut_field(source_id: u8, last_update_unix_ms: u64) -> [u8; 8] {
    let mask = (1u64 << LUT_TIME_BITS) - 1;
    let lut = last_update_unix_ms.saturating_sub(citrine_types::CITRUSLEAF_EPOCH_UNIX_MS) & mask;
    ((u64::from(source_id) << LUT_TIME_BITS) | lut).to_be_bytes()
}

/// The last-update time (Unix ms) an XDR write's `LUT` field carries.
pub fn xdr_lut_unix_ms(field: [u8; 8]) -> u64 {
    let mask = (1u64 << LUT_TIME_BITS) - 1;
    (u64::from_be_bytes(field) & mask) + citrine_types::CITRUSLEAF_EPOCH_UNIX_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdr_lut_field_is_citrusleaf_ms_below_the_source_id() {
        let unix_ms = citrine_types::CITRUSLEAF_EPOCH_UNIX_MS + 0x1234;
        let field = xdr_lut_field(3, unix_ms);
        assert_eq!(u64::from_be_bytes(field), (3 << 40) | 0x1234);
        assert_eq!(xdr_lut_unix_ms(field), unix_ms);
    }
    use crate::frame::ProtoHeader;

    /// The worked example of 02 §6.1: put ("test","demo","key1") a = 1.
    const PUT_FRAME: &str = "0203000000000052\
        160001000000\
        0000000000000000000003e8\
        00030001\
        000000050074657374\
        0000000501\
        64656d6f\
        0000001504ec91192d4b7f8ce35d5d78d34bca65cbaaaac960\
        0000000d020100016100000000000000 01";

    fn unhex(text: &str) -> Vec<u8> {
        let clean: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        (0..clean.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&clean[at..at + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn decodes_the_reference_put() {
        let frame = unhex(PUT_FRAME);
        let mut header_bytes = [0u8; 8];
        header_bytes.copy_from_slice(&frame[..8]);
        let proto = ProtoHeader::decode(&header_bytes).expect("header");
        assert_eq!(proto.size as usize, frame.len() - 8);
        let message = Message::decode(&frame[8..]).expect("decodes");
        assert_eq!(message.header.info2, info2::WRITE);
        assert_eq!(message.header.transaction_ttl, 1000);
        assert_eq!(message.field(field_type::NAMESPACE), Some(&b"test"[..]));
        assert_eq!(message.field(field_type::SET), Some(&b"demo"[..]));
        assert_eq!(message.field(field_type::DIGEST).map(<[u8]>::len), Some(20));
        let ops: Vec<Op<'_>> = message.ops().collect();
        assert_eq!(ops.len(), 1);
        assert_eq!(ops[0].op_type, op_type::WRITE);
        assert_eq!(ops[0].name, b"a");
        assert_eq!(ops[0].value, &[0, 0, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn writer_reproduces_the_reference_put() {
        let frame = unhex(PUT_FRAME);
        let mut out = Vec::new();
        let header = MsgHeader {
            info2: info2::WRITE,
            transaction_ttl: 1000,
            ..MsgHeader::default()
        };
        let mut writer = MessageWriter::begin(&mut out, &header);
        writer
            .field(field_type::NAMESPACE, b"test")
            .field(field_type::SET, b"demo")
            .field(field_type::DIGEST, &frame[53..73]);
        writer.op(op_type::WRITE, 1, b"a", &1i64.to_be_bytes());
        let length = writer.finish();
        assert_eq!(length, frame.len());
        assert_eq!(out, frame);
    }

    #[test]
    fn rejects_trailing_and_truncated_bytes() {
        let frame = unhex(PUT_FRAME);
        let mut longer = frame[8..].to_vec();
        longer.push(0);
        assert!(Message::decode(&longer).is_err());
        for cut in 0..frame.len() - 8 {
            assert!(Message::decode(&frame[8..8 + cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn rejects_op_name_longer_than_op() {
        let mut out = Vec::new();
        let mut writer = MessageWriter::begin(&mut out, &MsgHeader::default());
        writer.op(op_type::READ, 0, b"abc", b"");
        writer.finish();
        // Claim a 200-byte name inside a 7-byte op.
        out[8 + MSG_HEADER_SIZE + 7] = 200;
        assert!(Message::decode(&out[8..]).is_err());
    }

    #[test]
    fn a_last_field_sized_past_the_end_is_the_rest_of_the_message() {
        // What the official Go client sends for a batch with a filter: the
        // last field (no ops follow) claims 15 bytes more than there are.
        let header = MsgHeader::default();
        let two_fields = || {
            let mut out = Vec::new();
            let mut writer = MessageWriter::begin_bare(&mut out, &header);
            writer
                .field(field_type::FILTER_EXPRESSION, &[0xc3])
                .field(field_type::BATCH_INDEX, b"payload");
            writer.finish();
            out
        };
        let mut body = two_fields();
        let last_size_at = body.len() - (4 + 1 + 7);
        body[last_size_at..last_size_at + 4].copy_from_slice(&(1u32 + 7 + 15).to_be_bytes());
        let message = Message::decode(&body).expect("lenient on the last field");
        assert_eq!(
            message.field(field_type::BATCH_INDEX),
            Some(&b"payload"[..])
        );
        assert_eq!(
            message.field(field_type::FILTER_EXPRESSION),
            Some(&[0xc3][..])
        );
        // Not in a stream, where the next message would be read as data.
        assert!(Message::decode_prefix(&body).is_err());
        // Not a field other than the last.
        let mut early = two_fields();
        early[MSG_HEADER_SIZE..MSG_HEADER_SIZE + 4].copy_from_slice(&100u32.to_be_bytes());
        assert!(Message::decode(&early).is_err());
        // Not when ops follow the fields.
        let mut with_op = Vec::new();
        let mut writer = MessageWriter::begin_bare(&mut with_op, &header);
        writer
            .field(field_type::BATCH_INDEX, b"payload")
            .op(op_type::READ, 0, b"a", &[]);
        writer.finish();
        with_op[MSG_HEADER_SIZE..MSG_HEADER_SIZE + 4].copy_from_slice(&100u32.to_be_bytes());
        assert!(Message::decode(&with_op).is_err());
        // A size that leaves no room for the field's type byte stays an error.
        let mut short = Vec::new();
        MessageWriter::begin_bare(&mut short, &header).finish();
        short[18..20].copy_from_slice(&1u16.to_be_bytes());
        short.extend_from_slice(&[0, 0, 0, 9]);
        assert!(Message::decode(&short).is_err());
    }
}
