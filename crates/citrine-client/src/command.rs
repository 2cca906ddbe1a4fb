//! Single-record commands on the wire: keys, operations, request encoding
//! and answer decoding (02 §6–§8).
//!
//! Invariant: every request this module builds carries namespace, set (when
//! non-empty) and digest fields, in the official clients' order, then the
//! user key when `send_key` is set, the policy's filter expression (field
//! 43) when it has one, the UDF fields (30, 31, 32) of a UDF call, then the
//! ops; the frame is complete
//! (proto header patched) and can be resent unchanged on retries.

use crate::error::{Error, Result};
use crate::value::{Bin, Value};
use citrine_types::{Digest, PartitionId};
use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::msg::{field_type, info1, info2, op_type, Message, MessageWriter, MsgHeader};
use std::collections::BTreeMap;

/// A record's address: namespace, set and digest (plus the user key if known).
#[derive(Clone, Debug, PartialEq)]
pub struct Key {
    pub namespace: String,
    pub set: String,
    pub user_key: Option<UserKey>,
    pub digest: Digest,
}

/// Values usable as user keys.
pub trait IntoUserKey {
    fn into_user_key(self) -> UserKey;
}
impl IntoUserKey for UserKey {
    fn into_user_key(self) -> UserKey {
        self
    }
}
impl IntoUserKey for i64 {
    fn into_user_key(self) -> UserKey {
        UserKey::Integer(self)
    }
}
impl IntoUserKey for &str {
    fn into_user_key(self) -> UserKey {
        UserKey::String(self.to_owned())
    }
}
impl IntoUserKey for String {
    fn into_user_key(self) -> UserKey {
        UserKey::String(self)
    }
}
impl IntoUserKey for Vec<u8> {
    fn into_user_key(self) -> UserKey {
        UserKey::Blob(self)
    }
}

impl Key {
    /// A key from a user key; the digest is computed as every client does.
    pub fn new(namespace: impl Into<String>, set: impl Into<String>, key: impl IntoUserKey) -> Key {
        let set = set.into();
        let user_key = key.into_user_key();
        let digest = of_key(&set, &user_key);
        Key {
            namespace: namespace.into(),
            set,
            user_key: Some(user_key),
            digest,
        }
    }

    /// A key from a known digest.
    pub fn from_digest(
        namespace: impl Into<String>,
        set: impl Into<String>,
        digest: Digest,
    ) -> Key {
        Key {
            namespace: namespace.into(),
            set: set.into(),
            user_key: None,
            digest,
        }
    }

    /// The partition the record lives in.
    pub fn partition(&self) -> PartitionId {
        self.digest.partition()
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.namespace.is_empty() || self.namespace.len() > citrine_types::NAMESPACE_NAME_MAX {
            return Err(Error::InvalidArgument(format!(
                "namespace {:?} must be 1..=31 bytes",
                self.namespace
            )));
        }
        if self.set.len() > citrine_types::SET_NAME_MAX {
            return Err(Error::InvalidArgument(format!(
                "set {:?} is longer than 63 bytes",
                self.set
            )));
        }
        Ok(())
    }
}

/// Which bins a get returns.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Bins {
    /// Every bin.
    #[default]
    All,
    /// Only these bins.
    Names(Vec<String>),
    /// No bins: generation and expiration only.
    Header,
}

/// One operation of an `operate` command.
#[derive(Clone, Debug, PartialEq)]
pub enum Operation {
    /// Read one bin.
    Read(String),
    /// Read every bin.
    ReadAll,
    /// Read only the record's metadata.
    ReadHeader,
    /// Write (or, with `Value::Nil`, delete) a bin.
    Write(Bin),
    /// Add an integer or float to a bin (creates it when absent).
    Add(Bin),
    /// Append to a string or blob bin.
    Append(Bin),
    /// Prepend to a string or blob bin.
    Prepend(Bin),
    /// Refresh the record's TTL and bump its generation.
    Touch,
    /// Delete the whole record.
    Delete,
    /// A list or map operation on a bin (build one with [`crate::cdt`]):
    /// `payload` is its msgpack `[op_code, args...]`; `modify` says
    /// whether it writes.
    Cdt {
        bin: String,
        modify: bool,
        payload: Vec<u8>,
    },
    /// Any other operation, as it goes on the wire (02 §4): bit, HLL and
    /// expression operations, for instance. `write` says whether it
    /// changes the record.
    Raw {
        op_type: u8,
        particle_type: u8,
        bin: String,
        value: Vec<u8>,
        write: bool,
    },
}

impl Operation {
    /// `add` is also called `incr`.
    pub fn incr(name: impl Into<String>, by: i64) -> Operation {
        Operation::Add(Bin::new(name, by))
    }

    pub(crate) fn is_write(&self) -> bool {
        match self {
            Operation::Read(_) | Operation::ReadAll | Operation::ReadHeader => false,
            Operation::Cdt { modify, .. } => *modify,
            Operation::Raw { write, .. } => *write,
            _ => true,
        }
    }

    pub(crate) fn encode(&self, writer: &mut MessageWriter<'_>) {
        let bin_op = |writer: &mut MessageWriter<'_>, op: u8, bin: &Bin| {
            writer.op_with(op, bin.value.particle_type(), bin.name.as_bytes(), |out| {
                bin.value.encode_into(out)
            });
        };
        match self {
            Operation::Read(name) => {
                writer.op(op_type::READ, 0, name.as_bytes(), &[]);
            }
            Operation::ReadAll => {
                writer.op(op_type::READ, 0, &[], &[]);
            }
            Operation::ReadHeader => {}
            Operation::Write(bin) => bin_op(writer, op_type::WRITE, bin),
            Operation::Add(bin) => bin_op(writer, op_type::INCR, bin),
            Operation::Append(bin) => bin_op(writer, op_type::APPEND, bin),
            Operation::Prepend(bin) => bin_op(writer, op_type::PREPEND, bin),
            Operation::Touch => {
                writer.op(op_type::TOUCH, 0, &[], &[]);
            }
            Operation::Delete => {
                writer.op(op_type::DELETE_ALL, 0, &[], &[]);
            }
            Operation::Cdt {
                bin,
                modify,
                payload,
            } => {
                let kind = if *modify {
                    op_type::CDT_MODIFY
                } else {
                    op_type::CDT_READ
                };
                writer.op(kind, 4, bin.as_bytes(), payload);
            }
            Operation::Raw {
                op_type,
                particle_type,
                bin,
                value,
                ..
            } => {
                writer.op(*op_type, *particle_type, bin.as_bytes(), value);
            }
        }
    }

    pub(crate) fn bin_name(&self) -> Option<&str> {
        match self {
            Operation::Read(name) => Some(name),
            Operation::Write(bin)
            | Operation::Add(bin)
            | Operation::Append(bin)
            | Operation::Prepend(bin) => Some(&bin.name),
            Operation::Cdt { bin, .. } | Operation::Raw { bin, .. } => Some(bin),
            _ => None,
        }
    }
}

/// A record returned by a read or operate.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Record {
    pub generation: u32,
    /// Void time: seconds since 2010-01-01 UTC when the record expires; 0 = never.
    pub void_time: u32,
    /// Bins by name. In operate answers a bin returned by several ops keeps the last value.
    pub bins: BTreeMap<String, Value>,
}

impl Record {
    /// Remaining time to live in seconds (`None` = never expires).
    pub fn ttl(&self) -> Option<u32> {
        if self.void_time == 0 {
            return None;
        }
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_millis() as u64)
            .unwrap_or(0);
        let now = citrine_types::citrusleaf_epoch_seconds(unix_ms);
        Some(self.void_time.saturating_sub(now).max(1))
    }

    /// A bin's value.
    pub fn bin(&self, name: &str) -> Option<&Value> {
        self.bins.get(name)
    }
}

/// The decoded answer of a single-record command.
#[derive(Debug)]
pub(crate) struct Answer {
    pub result_code: u8,
    pub record: Record,
    /// Node that answered (filled in by the execution loop).
    pub node: Option<String>,
}

impl Record {
    /// The record a message carries: generation, void time and its ops'
    /// bins (a bin returned by several ops keeps the last value). Every
    /// answer that returns records (single, batch row, scan) reads it so.
    pub(crate) fn from_message(message: &Message<'_>) -> std::result::Result<Record, String> {
        Record::from_message_as(message, false)
    }

    /// As [`Record::from_message`]; with `raw`, every bin is a
    /// [`Value::Raw`]: its particle type and bytes exactly as sent.
    pub(crate) fn from_message_as(
        message: &Message<'_>,
        raw: bool,
    ) -> std::result::Result<Record, String> {
        let mut record = Record {
            generation: message.header.generation,
            void_time: message.header.record_ttl,
            bins: BTreeMap::new(),
        };
        for op in message.ops() {
            let name = String::from_utf8_lossy(op.name).into_owned();
            if raw {
                let value = Value::Raw {
                    particle: op.particle_type,
                    bytes: op.value.to_vec(),
                };
                record.bins.insert(name, value);
                continue;
            }
            let value = Value::decode(op.particle_type, op.value).ok_or_else(|| {
                format!(
                    "bin {name:?}: bad value of particle type {}",
                    op.particle_type
                )
            })?;
            record.bins.insert(name, value);
        }
        Ok(record)
    }
}

/// Parses one AS_MSG answer body.
pub(crate) fn parse_answer(body: &[u8]) -> std::result::Result<Answer, String> {
    let (message, _) = Message::decode_prefix(body).map_err(|error| error.to_string())?;
    Ok(Answer {
        result_code: message.header.result_code,
        record: Record::from_message(&message)?,
        node: None,
    })
}

/// Header and ops of a request, before the key fields are added.
pub(crate) struct Request<'a> {
    pub header: MsgHeader,
    pub ops: RequestOps<'a>,
}

pub(crate) enum RequestOps<'a> {
    None,
    ReadNames(&'a [String]),
    Bins(u8, &'a [Bin]),
    Operations(&'a [Operation]),
    /// A record UDF: no ops, the call's fields instead.
    Udf(&'a crate::udf::UdfFields),
}

/// Encodes a complete request frame into `out`.
pub(crate) fn encode_request(
    out: &mut Vec<u8>,
    key: &Key,
    send_key: bool,
    filter: Option<&[u8]>,
    request: &Request<'_>,
) -> Result<()> {
    key.validate()?;
    let check_name = |name: &str| {
        if name.len() > citrine_types::BIN_NAME_MAX {
            Err(Error::InvalidArgument(format!(
                "bin name {name:?} is longer than 15 bytes"
            )))
        } else {
            Ok(())
        }
    };
    match &request.ops {
        RequestOps::None | RequestOps::Udf(_) => {}
        RequestOps::ReadNames(names) => names.iter().try_for_each(|name| check_name(name))?,
        RequestOps::Bins(_, bins) => bins.iter().try_for_each(|bin| check_name(&bin.name))?,
        RequestOps::Operations(ops) => ops
            .iter()
            .filter_map(Operation::bin_name)
            .try_for_each(check_name)?,
    }
    let mut writer = MessageWriter::begin(out, &request.header);
    writer.field(field_type::NAMESPACE, key.namespace.as_bytes());
    if !key.set.is_empty() {
        writer.field(field_type::SET, key.set.as_bytes());
    }
    writer.field(field_type::DIGEST, &key.digest.0);
    if send_key {
        if let Some(user_key) = &key.user_key {
            writer.field(field_type::KEY, &user_key.to_field());
        }
    }
    if let Some(filter) = filter {
        writer.field(field_type::FILTER_EXPRESSION, filter);
    }
    if let RequestOps::Udf(call) = &request.ops {
        call.write_fields(&mut writer);
    }
    match &request.ops {
        RequestOps::None | RequestOps::Udf(_) => {}
        RequestOps::ReadNames(names) => {
            for name in names.iter() {
                writer.op(op_type::READ, 0, name.as_bytes(), &[]);
            }
        }
        RequestOps::Bins(op, bins) => {
            for bin in bins.iter() {
                writer.op_with(*op, bin.value.particle_type(), bin.name.as_bytes(), |out| {
                    bin.value.encode_into(out)
                });
            }
        }
        RequestOps::Operations(ops) => {
            for op in ops.iter() {
                op.encode(&mut writer);
            }
        }
    }
    writer.finish();
    Ok(())
}

/// The (info1, has_write) of an operate request with `ops`.
pub(crate) fn operate_flags(ops: &[Operation]) -> (u8, bool) {
    let mut bits1 = 0;
    let mut has_write = false;
    let mut reads_bins = false;
    let mut read_header = false;
    for op in ops {
        match op {
            Operation::Read(_) => {
                bits1 |= info1::READ;
                reads_bins = true;
            }
            Operation::ReadAll => {
                bits1 |= info1::READ | info1::GET_ALL;
                reads_bins = true;
            }
            Operation::ReadHeader => {
                bits1 |= info1::READ;
                read_header = true;
            }
            // Reads that return a bin's (derived) value.
            Operation::Cdt { modify: false, .. } | Operation::Raw { write: false, .. } => {
                bits1 |= info1::READ;
                reads_bins = true;
            }
            _ => {}
        }
        has_write |= op.is_write();
    }
    if read_header && !reads_bins {
        bits1 |= info1::GET_NO_BINS;
    }
    (bits1, has_write)
}

/// Whether an operate with `ops` asks for one answer per op
/// (`RESPOND_ALL_OPS`, 02 §6): when it has a map, bit, HLL or expression
/// op and no read-all op, as the official clients send it.
pub(crate) fn respond_all_ops(ops: &[Operation]) -> bool {
    let reads_all = ops.iter().any(|op| matches!(op, Operation::ReadAll));
    let needs = ops.iter().any(|op| match op {
        // Map op codes are 64..127 (05 §2); the code is the payload's
        // first element, a one-byte positive fixint after the array header.
        Operation::Cdt { payload, .. } => {
            payload.get(1).is_some_and(|code| (64..128).contains(code))
        }
        Operation::Raw { op_type, .. } => matches!(
            *op_type,
            op_type::BITS_READ
                | op_type::BITS_MODIFY
                | op_type::HLL_READ
                | op_type::HLL_MODIFY
                | op_type::EXP_READ
                | op_type::EXP_MODIFY
        ),
        _ => false,
    });
    needs && !reads_all
}

/// info2 bits of a delete command.
pub(crate) const WRITE_DELETE: u8 = info2::WRITE | info2::DELETE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_put_bytes() {
        // 02 §6.1: put ("test","demo","key1") a = 1, 1000 ms.
        let key = Key::new("test", "demo", "key1");
        let bins = [Bin::new("a", 1i64)];
        let header = MsgHeader {
            info2: info2::WRITE,
            transaction_ttl: 1000,
            ..MsgHeader::default()
        };
        let mut out = Vec::new();
        encode_request(
            &mut out,
            &key,
            false,
            None,
            &Request {
                header,
                ops: RequestOps::Bins(op_type::WRITE, &bins),
            },
        )
        .expect("encodes");
        let expected = "02030000000000521600010000000000000000000000000003e8000300010000000500746573740000000501\
            64656d6f0000001504ec91192d4b7f8ce35d5d78d34bca65cbaaaac9600000000d02010001610000000000000001";
        let hex: String = out.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(hex, expected);
    }

    #[test]
    fn parses_the_reference_answer() {
        let answer = [
            0x16, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x1d, 0xcd, 0x65, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0,
            0x0d, 1, 1, 0, 1, b'a', 0, 0, 0, 0, 0, 0, 0, 1,
        ];
        let parsed = parse_answer(&answer).expect("parses");
        assert_eq!(parsed.result_code, 0);
        assert_eq!(parsed.record.generation, 1);
        assert_eq!(parsed.record.void_time, 0x1DCD6500);
        assert_eq!(parsed.record.bin("a"), Some(&Value::Int(1)));
        assert!(parse_answer(&answer[..30]).is_err());
    }

    #[test]
    fn operate_bits_and_validation() {
        assert_eq!(
            operate_flags(&[Operation::ReadHeader]),
            (info1::READ | info1::GET_NO_BINS, false)
        );
        assert_eq!(
            operate_flags(&[Operation::incr("a", 1), Operation::Read("a".into())]),
            (info1::READ, true)
        );
        assert_eq!(
            operate_flags(&[Operation::ReadAll, Operation::Touch]),
            (info1::READ | info1::GET_ALL, true)
        );
        let key = Key::new("test", "", 5i64);
        let ops = [Operation::Read("a_very_long_bin_name".into())];
        let mut out = Vec::new();
        let header = MsgHeader::default();
        assert!(encode_request(
            &mut out,
            &key,
            false,
            None,
            &Request {
                header,
                ops: RequestOps::Operations(&ops)
            }
        )
        .is_err());
        let bad = Key::new("", "", 5i64);
        assert!(encode_request(
            &mut out,
            &bad,
            false,
            None,
            &Request {
                header,
                ops: RequestOps::None
            }
        )
        .is_err());
    }

    #[test]
    fn send_key_adds_field_two() {
        let key = Key::new("test", "", 7i64);
        let mut out = Vec::new();
        let header = MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            ..MsgHeader::default()
        };
        encode_request(
            &mut out,
            &key,
            true,
            None,
            &Request {
                header,
                ops: RequestOps::None,
            },
        )
        .expect("encodes");
        let message = Message::decode(&out[8..]).expect("decodes");
        assert_eq!(
            message.header.n_fields, 3,
            "namespace, digest, key (empty set omitted)"
        );
        assert_eq!(
            message.field(field_type::KEY),
            Some(&[1, 0, 0, 0, 0, 0, 0, 0, 7][..])
        );
    }
}
