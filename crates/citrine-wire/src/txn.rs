//! Multi-record transaction (MRT) fields of an AS_MSG: the `info4` bits,
//! field 5 (transaction id), field 6 (deadline) and field 3 (record
//! version), as `shared/protocol/02-as-msg.md` §2.4, §3.2 and §11 lay
//! them out.
//!
//! Owns: [`TxnFields::parse`] (the three fields of a decoded message or a
//! batch row, each size checked), [`RecordVersion`] (7 bytes little
//! endian: a 40-bit last-update time in Citrusleaf-epoch ms below a 16-bit
//! generation) and [`add_reply_field`] (a field inserted into a reply
//! already written, for the version and deadline a transaction answers).
//!
//! Invariants: parsing never panics and allocates nothing; a field of the
//! wrong size is an error, never truncated or padded; an encoded version
//! decodes to itself.

use crate::frame::{MessageType, ProtoHeader, PROTO_HEADER_SIZE};
use crate::msg::{field_type, Field, MSG_HEADER_SIZE};
use crate::DecodeError;

/// `info4` bits (requests; the reference answers 0).
pub mod info4 {
    /// Verify the record version sent in field 3 (a commit's verify read).
    pub const VERIFY_READ: u8 = 0x01;
    /// Roll the transaction forward on this record.
    pub const ROLL_FORWARD: u8 = 0x02;
    /// Roll the transaction back on this record.
    pub const ROLL_BACK: u8 = 0x04;
    /// Server-internal: a roll the monitor drives.
    pub const MONITOR_DRIVEN: u8 = 0x08;
    /// The write must be the one that locks the record for its transaction.
    pub const ON_LOCKING_ONLY: u8 = 0x10;
    /// The bits that make a request a verify or a roll.
    pub const COMMIT_BITS: u8 = VERIFY_READ | ROLL_FORWARD | ROLL_BACK;
}

/// Bytes of a RECORD_VERSION field.
pub const RECORD_VERSION_SIZE: usize = 7;
/// Bytes of a TXN_ID field.
pub const TXN_ID_SIZE: usize = 8;
/// Bytes of a TXN_DEADLINE field.
pub const TXN_DEADLINE_SIZE: usize = 4;

/// Bits of the last-update time in a record version.
const LUT_BITS: u32 = 40;

/// A record's version as transactions compare it: its last-update time
/// (Citrusleaf-epoch ms, low 40 bits) and generation (16 bits above).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecordVersion(u64);

impl RecordVersion {
    /// The version of a record last updated at `last_update_citrusleaf_ms`
    /// with `generation`.
    pub fn new(last_update_citrusleaf_ms: u64, generation: u16) -> RecordVersion {
        let lut = last_update_citrusleaf_ms & ((1u64 << LUT_BITS) - 1);
        RecordVersion(lut | (u64::from(generation) << LUT_BITS))
    }

    /// The version a field 3 carries; `None` unless it is 7 bytes.
    pub fn decode(bytes: &[u8]) -> Option<RecordVersion> {
        if bytes.len() != RECORD_VERSION_SIZE {
            return None;
        }
        let mut word = [0u8; 8];
        word[..RECORD_VERSION_SIZE].copy_from_slice(bytes);
        Some(RecordVersion(u64::from_le_bytes(word)))
    }

    /// The 7 bytes of field 3.
    pub fn encode(self) -> [u8; RECORD_VERSION_SIZE] {
        let word = self.0.to_le_bytes();
        let mut bytes = [0u8; RECORD_VERSION_SIZE];
        bytes.copy_from_slice(&word[..RECORD_VERSION_SIZE]);
        bytes
    }

    /// The 56-bit value, as the clients hold it.
    pub fn value(self) -> u64 {
        self.0
    }
}

/// The transaction fields of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxnFields {
    /// Field 5: the transaction's id.
    pub id: Option<u64>,
    /// Field 6: the transaction's deadline, as the monitor answered it.
    pub deadline: Option<u32>,
    /// Field 3: the version the transaction read.
    pub version: Option<RecordVersion>,
}

impl TxnFields {
    /// The transaction fields among `fields` (the first of each type
    /// counts); a field of the wrong size is an error.
    pub fn parse<'a>(
        fields: impl IntoIterator<Item = Field<'a>>,
    ) -> Result<TxnFields, DecodeError> {
        let mut found = TxnFields::default();
        for field in fields {
            match field.field_type {
                field_type::TXN_ID if found.id.is_none() => {
                    let bytes: [u8; TXN_ID_SIZE] = field
                        .data
                        .try_into()
                        .map_err(|_| DecodeError::Invalid("transaction id size"))?;
                    found.id = Some(u64::from_le_bytes(bytes));
                }
                field_type::TXN_DEADLINE if found.deadline.is_none() => {
                    let bytes: [u8; TXN_DEADLINE_SIZE] = field
                        .data
                        .try_into()
                        .map_err(|_| DecodeError::Invalid("transaction deadline size"))?;
                    found.deadline = Some(u32::from_le_bytes(bytes));
                }
                field_type::RECORD_VERSION if found.version.is_none() => {
                    found.version = Some(
                        RecordVersion::decode(field.data)
                            .ok_or(DecodeError::Invalid("record version size"))?,
                    );
                }
                _ => {}
            }
        }
        Ok(found)
    }
}

/// Inserts a field before the fields of the reply that starts at
/// `out[start..]` and ends `out` (a frame when `framed`, else a bare
/// AS_MSG), counting
/// it in the header and, for a frame, in the proto size. Does nothing
/// when `out[start..]` is too short to hold the reply's header.
pub fn add_reply_field(out: &mut Vec<u8>, start: usize, framed: bool, kind: u8, data: &[u8]) {
    let header_at = if framed {
        start + PROTO_HEADER_SIZE
    } else {
        start
    };
    let fields_at = header_at + MSG_HEADER_SIZE;
    if out.len() < fields_at {
        return;
    }
    let count = u16::from_be_bytes([out[header_at + 18], out[header_at + 19]]);
    out[header_at + 18..header_at + 20].copy_from_slice(&count.saturating_add(1).to_be_bytes());
    let mut field = Vec::with_capacity(5 + data.len());
    field.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
    field.push(kind);
    field.extend_from_slice(data);
    out.splice(fields_at..fields_at, field);
    if framed {
        ProtoHeader::patch(&mut out[start..], MessageType::Message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Message, MessageWriter, MsgHeader};

    fn field(field_type: u8, data: &[u8]) -> Field<'_> {
        Field { field_type, data }
    }

    #[test]
    fn versions_are_seven_bytes_little_endian_lut_below_generation() {
        let version = RecordVersion::new(0x01_2345_6789, 0xabcd);
        assert_eq!(version.encode(), [0x89, 0x67, 0x45, 0x23, 0x01, 0xcd, 0xab]);
        assert_eq!(RecordVersion::decode(&version.encode()), Some(version));
        assert_eq!(version.value(), 0x00ab_cd01_2345_6789);
        assert_eq!(RecordVersion::decode(&[0; 6]), None);
        assert_eq!(RecordVersion::decode(&[0; 8]), None);
    }

    #[test]
    fn parses_the_three_fields_and_refuses_wrong_sizes() {
        let id = 0x1122_3344_5566_7788u64.to_le_bytes();
        let deadline = 77u32.to_le_bytes();
        let version = RecordVersion::new(5, 2).encode();
        let fields = [
            field(field_type::NAMESPACE, b"test"),
            field(field_type::TXN_ID, &id),
            field(field_type::TXN_DEADLINE, &deadline),
            field(field_type::RECORD_VERSION, &version),
        ];
        let parsed = TxnFields::parse(fields).expect("parses");
        assert_eq!(parsed.id, Some(0x1122_3344_5566_7788));
        assert_eq!(parsed.deadline, Some(77));
        assert_eq!(parsed.version, Some(RecordVersion::new(5, 2)));
        assert_eq!(TxnFields::parse([]), Ok(TxnFields::default()));
        for (kind, size) in [
            (field_type::TXN_ID, 7),
            (field_type::TXN_DEADLINE, 8),
            (field_type::RECORD_VERSION, 8),
        ] {
            let data = vec![0u8; size];
            assert!(TxnFields::parse([field(kind, &data)]).is_err(), "{kind}");
        }
    }

    #[test]
    fn a_field_added_to_a_reply_decodes_with_it() {
        for framed in [true, false] {
            let mut out = vec![9u8; 3];
            let header = MsgHeader {
                generation: 4,
                ..MsgHeader::default()
            };
            let mut writer = if framed {
                MessageWriter::begin(&mut out, &header)
            } else {
                MessageWriter::begin_bare(&mut out, &header)
            };
            writer.op(1, 1, b"a", &[0, 0, 0, 0, 0, 0, 0, 1]);
            writer.finish();
            add_reply_field(&mut out, 3, framed, field_type::TXN_DEADLINE, &[1, 2, 3, 4]);
            let body = if framed { &out[3 + 8..] } else { &out[3..] };
            let message = Message::decode(body).expect("decodes");
            assert_eq!(message.header.generation, 4);
            assert_eq!(
                message.field(field_type::TXN_DEADLINE),
                Some(&[1, 2, 3, 4][..])
            );
            assert_eq!(message.ops().count(), 1);
            if framed {
                let mut proto = [0u8; 8];
                proto.copy_from_slice(&out[3..11]);
                let size = ProtoHeader::decode(&proto).expect("proto").size;
                assert_eq!(size as usize, out.len() - 11);
            }
        }
    }
}
