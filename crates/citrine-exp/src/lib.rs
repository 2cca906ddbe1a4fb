//! Expressions (protocol 05 §4): the msgpack expression trees that clients
//! send as a filter (field 43 `FILTER_EXP`, on any single-record command,
//! batch parent or row, scan and query) and as the value of the
//! `EXP_READ` (7) and `EXP_MODIFY` (8) ops.
//!
//! This crate is pure: an [`Expression`] is parsed once from the request's
//! bytes ([`Expression::parse`]) and evaluated against one record through
//! the [`Record`] trait the transaction service implements for its views of
//! a record (the stored body on the read path, the working bins on the
//! write path). No I/O, no locks, no clock: the caller passes "now".
//!
//! Layout: `reader` (a token cursor over msgpack), `parse` (the tree, one
//! node per op, literals decoded and types checked once), `eval` (the
//! reference's evaluation rules, three-valued), `posix` (regular
//! expressions in POSIX syntax), `display` (an expression written out as
//! the reference lists an index's); this file holds the API and the
//! `EXP_READ`/`EXP_MODIFY` op semantics (flags, bin policies).
//!
//! Semantics are the reference server's (`exp.c`, `expop.c`): expressions
//! are statically typed when parsed (a mismatch is PARAMETER), evaluated
//! with three-valued logic (a missing bin, a bin of another type, a failed
//! module call are "unknown"), and an unknown result fails an `EXP_READ` or
//! `EXP_MODIFY` op (OP_NOT_APPLICABLE) unless it says `EVAL_NO_FAIL`.
//! Module calls (`[127, ...]`: list, map, bit and HLL ops inside an
//! expression) run `citrine_cdt::apply` on the evaluated bin argument;
//! a call whose payload is a path (CDT SELECT, op 0xfe: `SelectByPath`,
//! `ModifyByPath`) runs `citrine_cdt::path` with its filters and modify
//! expression evaluated here, the loop variables (`[122, type, key 0 |
//! value 1 | index 2]`) bound to the element at hand ([`path_op`] does
//! the same for the `CDT_READ`/`CDT_MODIFY` op form).
//!
//! Invariants: parsing and evaluation never panic on any input; evaluation
//! does not allocate for expressions that only compare scalars read from
//! bins and metadata (the common filter); the values one evaluation makes
//! are bounded in all (`eval::EVAL_BUDGET`, 128 MiB: running out is an
//! evaluation failure); an evaluation error is never a silent "true".

#![deny(unsafe_code)]

pub mod display;
mod eval;
mod parse;
mod posix;
mod reader;

#[cfg(test)]
mod tests;

use citrine_types::ResultCode;
use eval::{Ctx, Val};
use parse::{Node, Ty};
use reader::Cursor;

/// Why an expression was refused or failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpError {
    /// Malformed expression bytes, unknown op code, wrong argument count or
    /// literal kind, nesting too deep (4).
    Parameter,
    /// A form this server does not implement (16).
    Unsupported,
    /// An `EXP_READ`/`EXP_MODIFY` op's evaluation failed (a bin of the wrong
    /// type, a missing bin, an arithmetic error) and the op did not carry
    /// `EVAL_NO_FAIL` (26).
    OpNotApplicable,
    /// An `EXP_MODIFY` op with CREATE_ONLY found the bin (6).
    BinExists,
    /// An `EXP_MODIFY` op with UPDATE_ONLY found no bin (17).
    BinNotFound,
    /// An `EXP_MODIFY` op's result was of a type that cannot be stored (12):
    /// a map keeping its selection order (a CDT result shape). A nil result
    /// without ALLOW_DELETE is OP_NOT_APPLICABLE (26), as the reference's.
    IncompatibleType,
}

impl ExpError {
    /// The wire result code.
    pub fn result_code(self) -> ResultCode {
        match self {
            ExpError::Parameter => ResultCode::Parameter,
            ExpError::Unsupported => ResultCode::UnsupportedFeature,
            ExpError::OpNotApplicable => ResultCode::OpNotApplicable,
            ExpError::BinExists => ResultCode::BinExists,
            ExpError::BinNotFound => ResultCode::BinNotFound,
            ExpError::IncompatibleType => ResultCode::IncompatibleType,
        }
    }
}

/// Three-valued outcome of a filter (the reference's "trilean").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Truth {
    True,
    False,
    /// The expression could not be decided (a missing bin, a bin of another
    /// type). As a filter it does not pass: the command answers
    /// FILTERED_OUT (27), a scan skips the record.
    Unknown,
}

/// What the evaluator may ask of a record. Times are Unix time.
pub trait Record {
    /// The named bin's particle type and bytes (as stored: integers 8-byte
    /// big-endian, floats IEEE bits big-endian, strings as sent, blobs raw,
    /// lists and maps msgpack, booleans one byte, GeoJSON with its 3-byte
    /// particle header, HLL as stored).
    fn bin(&self, name: &[u8]) -> Option<(u8, &[u8])>;
    /// The stored user key (particle type, bytes), when the record has one.
    fn key(&self) -> Option<(u8, &[u8])>;
    /// The record's 20-byte digest.
    fn digest(&self) -> &[u8; 20];
    /// The record's set name (empty when it has none).
    fn set_name(&self) -> &[u8];
    /// Last-update time, Unix milliseconds.
    fn last_update_ms(&self) -> u64;
    /// Expiry, Unix seconds; `None` = never expires.
    fn void_time_s(&self) -> Option<u64>;
    /// The record's stored size in bytes (what the reference's
    /// `record_size` reports).
    fn record_size(&self) -> u64;
    /// Whether the record is a tombstone (a durable delete).
    fn is_tombstone(&self) -> bool;
    /// Whether the record exists at all (false when a write evaluates an
    /// expression before the record is created).
    fn exists(&self) -> bool;
    /// Whether the namespace keeps records in memory only (no device):
    /// the deprecated `device_size` (65) then answers 0 and `memory_size`
    /// (73) the record size, the other way round otherwise, as the
    /// reference does.
    fn in_memory(&self) -> bool {
        false
    }
}

/// A parsed expression.
#[derive(Debug)]
pub struct Expression {
    root: Node,
    ty: Ty,
    /// Variable slots evaluation needs (`let` definitions in scope at once).
    slots: usize,
}

impl Expression {
    /// Parses an expression from its msgpack bytes (field 43's data). A
    /// filter must be boolean: an expression of another type is refused
    /// (PARAMETER), as the reference refuses it.
    pub fn parse(bytes: &[u8]) -> Result<Expression, ExpError> {
        let expression = Expression::parse_any(bytes)?;
        if expression.ty != Ty::Bool {
            return Err(ExpError::Parameter);
        }
        Ok(expression)
    }

    /// Parses an expression of any type (the value of an `EXP_READ` or
    /// `EXP_MODIFY` op).
    fn parse_any(bytes: &[u8]) -> Result<Expression, ExpError> {
        let parsed = parse::parse(bytes)?;
        Ok(Expression {
            root: parsed.root,
            ty: parsed.ty,
            slots: parsed.slots,
        })
    }

    /// Parses an expression of any type: the value a secondary index on an
    /// expression (`sindex-create ...;exp=`) indexes.
    pub fn parse_value(bytes: &[u8]) -> Result<Expression, ExpError> {
        Expression::parse_any(bytes)
    }

    /// Whether the expression may define a secondary index whose values are
    /// of the kind `kind` names (its static type: a bin or call of that
    /// type), as the reference checks: it must read a bin or the digest
    /// modulo, and must not read the record's key or any metadata but the
    /// digest (an index holds values that only a write changes).
    pub fn indexable_as(&self, kind: IndexValue) -> bool {
        let typed = matches!(
            (kind, self.ty),
            (IndexValue::Int, Ty::Int)
                | (IndexValue::Str, Ty::Str)
                | (IndexValue::Blob, Ty::Blob)
                | (IndexValue::List, Ty::List)
                | (IndexValue::Map, Ty::Map)
                | (IndexValue::Geo, Ty::Geo)
        );
        let (mut reads_record, mut forbidden) = (false, false);
        self.root.walk(&mut |node| match node {
            Node::Bin(..) | Node::BinType(_) | Node::DigestMod(_) => {
                reads_record = true;
            }
            // The reference (CE 8.1.2) refuses an index expression that
            // asks whether a bin exists, as it refuses the key and metadata.
            Node::Key(_) | Node::Meta(_) | Node::BinExists(_) => forbidden = true,
            _ => {}
        });
        typed && reads_record && !forbidden
    }

    /// Evaluates the expression against `record` at `now_ms` to a particle
    /// (type, bytes); `None` when the result is nil or the evaluation
    /// failed (an expression index does not index such a record).
    pub fn value(&self, record: &dyn Record, now_ms: u64) -> Option<(u8, Vec<u8>)> {
        self.evaluate(record, now_ms).into_particle().ok().flatten()
    }

    /// Evaluates the expression as a filter against `record` at `now_ms`
    /// (Unix milliseconds). Anything but a boolean result is `Unknown`.
    pub fn filter(&self, record: &dyn Record, now_ms: u64) -> Truth {
        match self.evaluate(record, now_ms) {
            Val::Bool(true) => Truth::True,
            Val::Bool(false) => Truth::False,
            _ => Truth::Unknown,
        }
    }

    fn evaluate<'a>(&'a self, record: &'a dyn Record, now_ms: u64) -> Val<'a> {
        let cx = Ctx::new(record, now_ms);
        eval::run(&self.root, self.slots, &cx)
    }
}

/// The kind of value a secondary index on an expression holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexValue {
    Int,
    Str,
    Blob,
    /// A list (a LIST collection index).
    List,
    /// A map (a MAPKEYS or MAPVALUES collection index).
    Map,
    /// GeoJSON (a GEO2DSPHERE index).
    Geo,
}

/// The result of an `EXP_MODIFY` op for its bin.
#[derive(Debug, PartialEq, Eq)]
pub enum BinWrite {
    /// Store this particle (type, bytes) in the bin.
    Store(u8, Vec<u8>),
    /// Delete the bin (a nil result with ALLOW_DELETE).
    Delete,
    /// Leave the bin as it is (a failure excused by POLICY_NO_FAIL or
    /// EVAL_NO_FAIL).
    Keep,
}

/// `EXP_READ` flag: an evaluation failure answers nil instead of failing.
pub const EVAL_NO_FAIL: u64 = 0x10;
/// `EXP_MODIFY` flag: fail when the bin exists.
pub const CREATE_ONLY: u64 = 0x01;
/// `EXP_MODIFY` flag: fail when the bin does not exist.
pub const UPDATE_ONLY: u64 = 0x02;
/// `EXP_MODIFY` flag: a nil result deletes the bin.
pub const ALLOW_DELETE: u64 = 0x04;
/// `EXP_MODIFY` flag: a refused write (by the flags above, a nil result
/// without ALLOW_DELETE, an unstorable result) leaves the bin instead of
/// failing.
pub const POLICY_NO_FAIL: u64 = 0x08;

const READ_FLAGS: u64 = EVAL_NO_FAIL;
const MODIFY_FLAGS: u64 = CREATE_ONLY | UPDATE_ONLY | ALLOW_DELETE | POLICY_NO_FAIL | EVAL_NO_FAIL;

/// Splits an op's value `[expression, flags]` (flags optional) and checks
/// the flags against `allowed`.
fn op_payload(payload: &[u8], allowed: u64) -> Result<(Expression, u64), ExpError> {
    let mut cur = Cursor::new(payload);
    let count = cur.array().ok_or(ExpError::Parameter)?;
    if !(1..=2).contains(&count) {
        return Err(ExpError::Parameter);
    }
    let expression = cur.value().ok_or(ExpError::Parameter)?;
    // A second element that is no unsigned integer leaves the default
    // flags, as the reference's parse does.
    let flags = if count == 2 {
        cur.uint().unwrap_or(0)
    } else {
        0
    };
    if flags & !allowed != 0 {
        return Err(ExpError::Parameter);
    }
    Ok((Expression::parse_any(expression)?, flags))
}

/// A `CDT_READ` or `CDT_MODIFY` op whose payload is a path expression
/// (`citrine_cdt::path::is_path`: CDT SELECT, op 0xfe) on the bin `bin` of
/// `record`: its filters and modify expression are evaluated here, with
/// the record's bins and metadata readable as in any expression. The
/// selection is the op's result; an apply gives the bin's new value and
/// no result. A missing bin gives neither.
pub fn path_op(
    payload: &[u8],
    bin: Option<(u8, &[u8])>,
    modify: bool,
    record: &dyn Record,
    now_ms: u64,
) -> Result<citrine_cdt::Outcome, ResultCode> {
    eval::path_op(payload, bin, modify, record, now_ms)
}

/// An `EXP_READ` op parsed once, to be evaluated on many records (a
/// query's projection runs it on each record it returns).
#[derive(Debug)]
pub struct ReadOp {
    expression: Expression,
    flags: u64,
}

impl ReadOp {
    /// Parses an `EXP_READ` op's payload (`[expression, flags]`): what
    /// [`read_op`] refuses before evaluation.
    pub fn parse(payload: &[u8]) -> Result<ReadOp, ExpError> {
        let (expression, flags) = op_payload(payload, READ_FLAGS)?;
        Ok(ReadOp { expression, flags })
    }

    /// The op's result on `record` as a particle (type, bytes), `None` for
    /// a nil result.
    pub fn evaluate(
        &self,
        record: &dyn Record,
        now_ms: u64,
    ) -> Result<Option<(u8, Vec<u8>)>, ExpError> {
        match self.expression.evaluate(record, now_ms).into_particle() {
            Ok(particle) => Ok(particle),
            Err(()) if self.flags & EVAL_NO_FAIL != 0 => Ok(None),
            Err(()) => Err(ExpError::OpNotApplicable),
        }
    }
}

/// Evaluates an `EXP_READ` op: `payload` is the op's value
/// (`[expression, flags]`). Answers the result as a particle (type, bytes),
/// `None` for a nil result.
pub fn read_op(
    payload: &[u8],
    record: &dyn Record,
    now_ms: u64,
) -> Result<Option<(u8, Vec<u8>)>, ExpError> {
    ReadOp::parse(payload)?.evaluate(record, now_ms)
}

/// Evaluates an `EXP_MODIFY` op: `payload` is the op's value
/// (`[expression, flags]`), `record` the record as the ops before this one
/// left it. Answers what to do to the op's bin.
///
/// Order, as the reference's: the payload and flags are checked, then
/// CREATE_ONLY / UPDATE_ONLY against the bin (BIN_EXISTS / BIN_NOT_FOUND,
/// or nothing with POLICY_NO_FAIL) before any evaluation; a failed
/// evaluation is OP_NOT_APPLICABLE unless EVAL_NO_FAIL; a nil result
/// deletes an existing bin with ALLOW_DELETE and is OP_NOT_APPLICABLE
/// without it (nothing happens to a missing bin); a map that keeps its
/// selection order (a CDT result, flag 0x08) cannot be stored
/// (INCOMPATIBLE_TYPE). POLICY_NO_FAIL turns each refusal into leaving
/// the bin as it is.
pub fn modify_op(
    payload: &[u8],
    bin_name: &[u8],
    record: &dyn Record,
    now_ms: u64,
) -> Result<BinWrite, ExpError> {
    let (expression, flags) = op_payload(payload, MODIFY_FLAGS)?;
    let refuse = |error: ExpError| {
        if flags & POLICY_NO_FAIL != 0 {
            Ok(BinWrite::Keep)
        } else {
            Err(error)
        }
    };
    let live = record.bin(bin_name).is_some();
    if live && flags & CREATE_ONLY != 0 {
        return refuse(ExpError::BinExists);
    }
    if !live && flags & UPDATE_ONLY != 0 {
        return refuse(ExpError::BinNotFound);
    }
    let result = expression.evaluate(record, now_ms).into_particle();
    match result {
        Err(()) if flags & EVAL_NO_FAIL != 0 => Ok(BinWrite::Keep),
        Err(()) => Err(ExpError::OpNotApplicable),
        Ok(None) if !live => Ok(BinWrite::Keep),
        Ok(None) if flags & ALLOW_DELETE != 0 => Ok(BinWrite::Delete),
        Ok(None) => refuse(ExpError::OpNotApplicable),
        Ok(Some((particle, bytes))) if is_preserve_order_map(particle, &bytes) => {
            refuse(ExpError::IncompatibleType)
        }
        Ok(Some((particle, bytes))) => Ok(BinWrite::Store(particle, bytes)),
    }
}

/// Whether a particle is a map whose flags say "an ordered list of
/// entries" (a result shape, not a storable map).
fn is_preserve_order_map(particle: u8, bytes: &[u8]) -> bool {
    use citrine_cdt::value::{self, Value};
    particle == citrine_types::ParticleType::Map as u8
        && matches!(value::decode_stored(bytes), Ok(Value::Map(m)) if m.flags & value::MAP_PRESERVE_ORDER != 0)
}
