//! The operations the server evaluates on one bin's value (001 §2.1's
//! "complex data types" and their kin): list and map bins and the CDT
//! operations on them (op types `CDT_READ` 3 and `CDT_MODIFY` 4; payloads
//! as in protocol 05 §2), bitwise operations on blob bins (`BITS_READ` 12,
//! `BITS_MODIFY` 13) and HyperLogLog bins (`HLL_READ` 15, `HLL_MODIFY` 16;
//! 05 §3).
//!
//! This crate is pure: bytes in, bytes out, no I/O and no locks. The
//! transaction service hands [`apply`] one op's family, payload and the bin
//! it names; it answers with the bin's new value (after any modify op) and
//! the op's result, or a [`CdtError`] that maps to a result code.
//!
//! Layout: [`value`] (the msgpack dialect, the value model and the
//! reference order), `context` (walking `[0xff, [ctx...], op]` into nested
//! collections, creating them on request), `result` (return types shared by
//! the by-index/rank/value/key selectors), `list` (op codes below 64) and
//! `map` (64..128); [`bits`] and [`hll`] for the other two families;
//! [`path`] for path expressions (op 0xfe), whose filters and modify
//! expressions the caller evaluates.
//! [`apply_within`] lets the caller bound what an op may build.
//!
//! Invariants: [`operate`] never panics on any input; an error leaves the
//! bin unchanged (the caller drops the whole transaction); a value written
//! back is canonical (ordered lists sorted, key-ordered maps sorted by key
//! with unique keys, smallest msgpack forms).

pub mod bits;
pub mod hll;
pub mod path;
pub mod value;

mod context;
mod list;
mod map;
mod result;

use citrine_types::{ParticleType, ResultCode};
pub use value::Value;

/// Why a CDT op failed. Each maps to the reference server's result code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CdtError {
    /// Malformed payload, unknown op code, argument of the wrong kind,
    /// index out of range where the op requires it (4).
    Parameter,
    /// The bin or context element is not a collection of the op's kind (12).
    IncompatibleType,
    /// An update-only write found no such element (23).
    ElementNotFound,
    /// A create-only write found the element (24).
    ElementExists,
    /// The op cannot apply to the value it found (26).
    OpNotApplicable,
    /// A form this server does not implement yet (16).
    Unsupported,
    /// A create-only bit or HLL write found the bin (6).
    BinExists,
    /// An update-only bit or HLL write found no bin (17).
    BinNotFound,
    /// The bin would grow past the caller's size limit (13).
    TooBig,
    /// A path's modify expression was unknown for a leaf and the op did
    /// not say NO_FAIL (1, as the reference answers).
    ExpressionFailed,
}

impl CdtError {
    /// The wire result code.
    pub fn result_code(self) -> ResultCode {
        match self {
            CdtError::Parameter => ResultCode::Parameter,
            CdtError::IncompatibleType => ResultCode::IncompatibleType,
            CdtError::ElementNotFound => ResultCode::ElementNotFound,
            CdtError::ElementExists => ResultCode::ElementExists,
            CdtError::OpNotApplicable => ResultCode::OpNotApplicable,
            CdtError::Unsupported => ResultCode::UnsupportedFeature,
            CdtError::BinExists => ResultCode::BinExists,
            CdtError::BinNotFound => ResultCode::BinNotFound,
            CdtError::TooBig => ResultCode::RecordTooBig,
            CdtError::ExpressionFailed => ResultCode::ServerError,
        }
    }
}

/// What one CDT op did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The bin's new value (particle type, bytes) after a modify op (`None` after a read, or a modify op on a missing bin that created nothing).
    pub bin: Option<(u8, Vec<u8>)>,
    /// The op's result as a particle (type, bytes), when it has one.
    pub result: Option<(u8, Vec<u8>)>,
}

/// The three op families this crate evaluates, each a pair of wire op
/// types (read, modify).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// List and map ops (`CDT_READ`, `CDT_MODIFY`).
    Cdt,
    /// Bitwise ops on blob bins (`BITS_READ`, `BITS_MODIFY`).
    Bits,
    /// HyperLogLog ops (`HLL_READ`, `HLL_MODIFY`).
    Hll,
}

/// Applies one op of `family` (see [`operate`] for the arguments).
pub fn apply(
    family: Family,
    payload: &[u8],
    bin: Option<(u8, &[u8])>,
    modify: bool,
) -> Result<Outcome, CdtError> {
    apply_within(family, payload, bin, modify, u64::MAX)
}

/// [`apply`] for a caller that will not store a bin of more than
/// `max_bin_bytes`: ops that could build one from a small request (a bit
/// resize or insert) refuse with [`CdtError::TooBig`] before allocating it.
/// List, map and HLL ops grow a bin by at most their arguments (or a bounded
/// padding), so the caller's check of the result suffices for them.
pub fn apply_within(
    family: Family,
    payload: &[u8],
    bin: Option<(u8, &[u8])>,
    modify: bool,
    max_bin_bytes: u64,
) -> Result<Outcome, CdtError> {
    match family {
        Family::Cdt => operate(payload, bin, modify),
        Family::Bits => bits::operate_within(payload, bin, modify, max_bin_bytes),
        Family::Hll => hll::operate(payload, bin, modify),
    }
}

/// The element a context leads to inside `value`, read-only: `context` is
/// the msgpack array of `[ctx_type, ctx_value, ...]` pairs (what a
/// secondary index definition's `context=` carries, and a query's
/// INDEX_CONTEXT field). `Ok(None)` when the path cannot be followed (a
/// step finds no element, or meets a scalar); [`CdtError::Parameter`] for
/// a malformed context, [`CdtError::Unsupported`] for the forms `operate`
/// does not implement either.
pub fn select(value: Value, context: &[u8]) -> Result<Option<Value>, CdtError> {
    let steps = parse_context(context)?;
    let mut slot = Some(value);
    match context::apply(&mut slot, &steps, false, &mut |element| Ok(element.take())) {
        Err(CdtError::OpNotApplicable) => Ok(None),
        found => found,
    }
}

/// Checks a context's bytes (see [`select`]) without applying it.
pub fn check_context(context: &[u8]) -> Result<(), CdtError> {
    parse_context(context).map(|_| ())
}

fn parse_context(context: &[u8]) -> Result<Vec<context::Step>, CdtError> {
    match value::decode(context).map_err(|_| CdtError::Parameter)? {
        Value::List(list) => {
            context::check(&list.items)?;
            context::parse(list.items)
        }
        _ => Err(CdtError::Parameter),
    }
}

/// Op code that announces a context: `[0xff, [ctx...], [op...]]`.
const CONTEXT_EVAL: i64 = 0xff;
/// Op code of a path payload ([`path`]): evaluated with its expressions
/// by the expression crate (`citrine_exp::path_op`), not by [`operate`].
const SELECT: i64 = path::SELECT;
/// List op codes are below this; map op codes from here to 127.
const MAP_CODES: i64 = 64;

/// Applies one CDT op. `payload` is the op's value (msgpack); `bin` is the
/// named bin's particle type and bytes when the record has it; `modify` is
/// whether the op came as `CDT_MODIFY` (a modifying op code under
/// `CDT_READ` is refused).
///
/// The order of judgement is the reference's: a `CDT_READ` of a missing
/// bin answers nothing, unparsed; then the payload's shape; then the
/// context is walked (a path that cannot be followed answers
/// `OpNotApplicable`, a context on a bin that is no collection
/// `Parameter`); only then the op code and its arguments.
pub fn operate(
    payload: &[u8],
    bin: Option<(u8, &[u8])>,
    modify: bool,
) -> Result<Outcome, CdtError> {
    if !modify && bin.is_none() {
        // A read of a missing bin answers nothing (02 §8).
        return Ok(Outcome::default());
    }
    let (ctx, code, op) = parse_request(payload)?;
    let args = &op[1..];
    let kind = op_kind(code, modify);
    // An op code that cannot run is refused where the context leads; the
    // walk is a write's when the op type is.
    let modifies = kind.map_or(modify, |(_, modifies)| modifies);
    let mut root = match bin {
        None => None,
        Some((particle, bytes))
            if particle == ParticleType::List as u8 || particle == ParticleType::Map as u8 =>
        {
            Some(value::decode_stored(bytes).map_err(|_| CdtError::Parameter)?)
        }
        Some(_) if ctx.is_empty() => return Err(CdtError::IncompatibleType),
        Some(_) => return Err(CdtError::Parameter),
    };
    if !modifies && root.is_none() {
        // A read code sent as `CDT_MODIFY` on a missing bin.
        return Ok(Outcome::default());
    }
    let result = context::apply(&mut root, &ctx, modifies, &mut |slot| match kind? {
        (Kind::List, _) => list::apply(code, args, slot),
        (Kind::Map, _) => map::apply(code, args, slot),
    })?;
    if modifies {
        if let Some(after) = root.as_mut() {
            // Nested collections an op stored as sent (arguments) are put
            // in order, and nothing deeper than a stored value may be is
            // written (the next decode would refuse it).
            value::canonicalize(after);
            if value::depth(after) > value::MAX_DEPTH {
                return Err(CdtError::Parameter);
            }
        }
    }
    let bin = match (&root, modifies) {
        // A modify op's bin is written back even when the op changed
        // nothing (a skipped NO_FAIL write): the transaction stores the
        // record and bumps its generation either way, as the reference's.
        (Some(after), true) => {
            let particle = match after {
                Value::List(_) => ParticleType::List,
                Value::Map(_) => ParticleType::Map,
                _ => return Err(CdtError::IncompatibleType),
            };
            Some((particle as u8, value::to_bytes(after)))
        }
        _ => None,
    };
    Ok(Outcome {
        bin,
        result: result.map(|value| to_particle(&value)),
    })
}

/// A request's context steps (none without one), op code and op items
/// (`[code, args...]`).
fn parse_request(payload: &[u8]) -> Result<(Vec<context::Step>, i64, Vec<Value>), CdtError> {
    let mut items = request_items(payload)?;
    let (ctx, op) = match items.first().and_then(Value::as_int) {
        Some(CONTEXT_EVAL) => {
            if items.len() != 3 {
                return Err(CdtError::Parameter);
            }
            let op = items.pop().ok_or(CdtError::Parameter)?;
            let ctx = items.pop().ok_or(CdtError::Parameter)?;
            let (Value::List(ctx), Value::List(op)) = (ctx, op) else {
                return Err(CdtError::Parameter);
            };
            (context::parse(ctx.items)?, op.items)
        }
        Some(SELECT) => return Err(CdtError::Unsupported),
        Some(_) => (Vec::new(), items),
        None => return Err(CdtError::Parameter),
    };
    let code = op
        .first()
        .and_then(Value::as_int)
        .ok_or(CdtError::Parameter)?;
    Ok((ctx, code, op))
}

/// The collection kind op `code` works on and whether it modifies;
/// [`CdtError::Parameter`] for an unknown code, or a modifying one sent
/// as a read (`modify` false).
fn op_kind(code: i64, modify: bool) -> Result<(Kind, bool), CdtError> {
    let kind = if (0..MAP_CODES).contains(&code) {
        Kind::List
    } else if (MAP_CODES..128).contains(&code) {
        Kind::Map
    } else {
        return Err(CdtError::Parameter);
    };
    let modifies = match kind {
        Kind::List => list::is_modify(code),
        Kind::Map => map::is_modify(code),
    }
    .ok_or(CdtError::Parameter)?;
    if modifies && !modify {
        return Err(CdtError::Parameter);
    }
    Ok((kind, modifies))
}

/// The items of a CDT op payload: `[code, args...]` or
/// `[0xff, [ctx...], [code, args...]]`.
///
/// Clients written before the reference's 3.x CDT rework (the Rust client
/// 1.x among them) still send the first form as a big-endian 16-bit op
/// code followed by an optional msgpack array of the arguments. Its first
/// byte is 0 (every op code is below 256), which no msgpack array starts
/// with, so the two forms cannot be confused; the reference tells them
/// apart the same way.
fn request_items(payload: &[u8]) -> Result<Vec<Value>, CdtError> {
    if let [0, code, args @ ..] = payload {
        let mut items = vec![Value::Int(i64::from(*code))];
        if !args.is_empty() {
            let Value::List(args) = value::decode(args).map_err(|_| CdtError::Parameter)? else {
                return Err(CdtError::Parameter);
            };
            items.extend(args.items);
        }
        return Ok(items);
    }
    match value::decode(payload).map_err(|_| CdtError::Parameter)? {
        Value::List(request) => Ok(request.items),
        _ => Err(CdtError::Parameter),
    }
}

#[derive(Clone, Copy)]
enum Kind {
    List,
    Map,
}

/// A result value as the particle a reply op carries (02 §8).
pub(crate) fn to_particle(value: &Value) -> (u8, Vec<u8>) {
    match value {
        Value::Nil | Value::Wildcard | Value::Infinity => (ParticleType::Null as u8, Vec::new()),
        Value::Bool(b) => (ParticleType::Bool as u8, vec![u8::from(*b)]),
        Value::Int(i) => (ParticleType::Integer as u8, i.to_be_bytes().to_vec()),
        Value::UInt(u) => (ParticleType::Integer as u8, u.to_be_bytes().to_vec()),
        Value::Double(d) => (
            ParticleType::Float as u8,
            d.to_bits().to_be_bytes().to_vec(),
        ),
        Value::Str(s) => (ParticleType::String as u8, s.clone()),
        Value::Geo(g) => {
            // The GeoJSON particle: flags (1), cell count (2), cells, text.
            let mut particle = vec![0, 0, 0];
            particle.extend_from_slice(g);
            (ParticleType::GeoJson as u8, particle)
        }
        Value::Blob(0, b) => (ParticleType::Blob as u8, b.clone()),
        Value::Blob(subtype, b) => (*subtype, b.clone()),
        Value::List(_) | Value::Ext(..) => (ParticleType::List as u8, value::to_bytes(value)),
        Value::Map(_) => (ParticleType::Map as u8, value::to_bytes(value)),
    }
}

#[cfg(test)]
mod tests;
