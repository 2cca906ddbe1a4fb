//! Evaluation of a parsed expression against one record, with the
//! reference's semantics (`exp_eval_*` in the reference server).
//!
//! Owns: [`Val`] (a runtime value; `Unknown` is the third truth value and
//! the failure of any op), [`run`] and the conversions between values and
//! particles.
//!
//! Rules: an op whose operand is unknown is unknown, except AND (false
//! wins over unknown), OR (true wins over unknown); a missing bin, a bin or
//! key of another type than asked, integer division or modulo by zero (and
//! `i64::MIN / -1`), a comparison of structures holding an unordered map, a
//! failed module call or a call result of another type than declared are
//! unknown. Integer add, subtract, multiply, negate, abs and shifts wrap
//! (two's complement, shift counts taken modulo 64), as the reference's C
//! does on its platforms; float to int of NaN or out-of-range values gives
//! `i64::MIN` (x86's conversion result).
//!
//! Invariants: evaluation never panics; reading scalar bins and metadata
//! and comparing scalars does not allocate (values borrow the record and
//! the expression); depth is bounded by the parser's nesting limit; the
//! bytes one evaluation makes (call payloads and results, copies of
//! variables, key and value lists) are bounded by [`EVAL_BUDGET`], and an
//! evaluation that would exceed it is unknown as a whole.

use crate::parse::{Arg, Arith, Call, CmpOp, IntOp, Meta, Module, Node, PathCall, Shift, Ty};
use crate::Record;
use citrine_cdt::path::{LoopVars, Mode, Modified, PathEval, Verdict};
use citrine_cdt::value::{self, Value};
use citrine_cdt::Family;
use citrine_types::ParticleType;
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::cmp::Ordering;

/// Particle type numbers used here.
const P_NULL: u8 = ParticleType::Null as u8;
const P_INT: u8 = ParticleType::Integer as u8;
const P_FLOAT: u8 = ParticleType::Float as u8;
const P_STR: u8 = ParticleType::String as u8;
const P_BLOB: u8 = ParticleType::Blob as u8;
const P_BOOL: u8 = ParticleType::Bool as u8;
const P_HLL: u8 = ParticleType::Hll as u8;
const P_MAP: u8 = ParticleType::Map as u8;
const P_LIST: u8 = ParticleType::List as u8;
const P_GEO: u8 = ParticleType::GeoJson as u8;

/// A list or map value as msgpack bytes. Literals were decoded as op
/// payloads (wildcards mean what they say); bins and call results are
/// stored values.
#[derive(Clone, Debug)]
pub(crate) struct Cdt<'a> {
    pub bytes: Cow<'a, [u8]>,
    pub literal: bool,
}

impl Cdt<'_> {
    fn decode(&self) -> Option<Value> {
        if self.literal {
            value::decode(&self.bytes).ok()
        } else {
            value::decode_stored(&self.bytes).ok()
        }
    }
}

/// A runtime value. Strings, blobs and HLLs without particle prefixes;
/// GeoJSON as its particle (flags, cells, text).
#[derive(Clone, Debug)]
pub(crate) enum Val<'a> {
    Unknown,
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Cow<'a, [u8]>),
    Blob(Cow<'a, [u8]>),
    Hll(Cow<'a, [u8]>),
    Geo(Cow<'a, [u8]>),
    List(Cdt<'a>),
    Map(Cdt<'a>),
    /// `result_remove` [100]: only meaningful inside CDT selections.
    Remove,
}

impl<'a> Val<'a> {
    fn has_type(&self, ty: Ty) -> bool {
        matches!(
            (self, ty),
            (Val::Nil, Ty::Nil)
                | (Val::Bool(_), Ty::Bool)
                | (Val::Int(_), Ty::Int)
                | (Val::Float(_), Ty::Float)
                | (Val::Str(_), Ty::Str)
                | (Val::Blob(_), Ty::Blob)
                | (Val::Hll(_), Ty::Hll)
                | (Val::Geo(_), Ty::Geo)
                | (Val::List(_), Ty::List)
                | (Val::Map(_), Ty::Map)
                | (Val::Remove, Ty::Remove)
        )
    }

    /// A particle (type, bytes) as the record or a CDT op holds it.
    pub(crate) fn from_particle(particle: u8, bytes: &'a [u8]) -> Val<'a> {
        Val::from_particle_cow(particle, Cow::Borrowed(bytes))
    }

    fn from_particle_cow(particle: u8, bytes: Cow<'a, [u8]>) -> Val<'a> {
        match particle {
            P_NULL => Val::Nil,
            P_INT => match int_from_bytes(&bytes) {
                Some(i) => Val::Int(i),
                None => Val::Unknown,
            },
            P_FLOAT => match <[u8; 8]>::try_from(bytes.as_ref()) {
                Ok(word) => Val::Float(f64::from_bits(u64::from_be_bytes(word))),
                Err(_) => Val::Unknown,
            },
            P_STR => Val::Str(bytes),
            P_BLOB => Val::Blob(bytes),
            P_BOOL => Val::Bool(bytes.first().is_some_and(|&b| b != 0)),
            P_HLL => Val::Hll(bytes),
            P_GEO => Val::Geo(bytes),
            P_LIST => Val::List(Cdt {
                bytes,
                literal: false,
            }),
            P_MAP => Val::Map(Cdt {
                bytes,
                literal: false,
            }),
            // Blob subtypes (Java, Python... blobs) are none of the
            // expression types: the reference's bin reads answer unknown.
            _ => Val::Unknown,
        }
    }

    /// The value as a particle for a reply or a bin: `Ok(None)` for nil,
    /// `Err` for what is no storable value (unknown, `result_remove`).
    pub(crate) fn into_particle(self) -> Result<Option<(u8, Vec<u8>)>, ()> {
        Ok(Some(match self {
            Val::Unknown | Val::Remove => return Err(()),
            Val::Nil => return Ok(None),
            Val::Bool(b) => (P_BOOL, vec![u8::from(b)]),
            Val::Int(i) => (P_INT, i.to_be_bytes().to_vec()),
            Val::Float(f) => (P_FLOAT, f.to_bits().to_be_bytes().to_vec()),
            // Strings are bytes, as stored (UTF-8 is the clients' affair).
            Val::Str(s) => (P_STR, s.into_owned()),
            Val::Blob(b) => (P_BLOB, b.into_owned()),
            Val::Hll(h) => (P_HLL, h.into_owned()),
            Val::Geo(g) => (P_GEO, g.into_owned()),
            Val::List(l) => (P_LIST, l.bytes.into_owned()),
            Val::Map(m) => (P_MAP, m.bytes.into_owned()),
        }))
    }

    /// The value as an element of a CDT (what the reference packs when an
    /// expression feeds an op payload or IN_LIST); `None` when it has none.
    fn to_value(&self) -> Option<Value> {
        Some(match self {
            Val::Unknown | Val::Remove => return None,
            Val::Nil => Value::Nil,
            Val::Bool(b) => Value::Bool(*b),
            Val::Int(i) => Value::Int(*i),
            Val::Float(f) => Value::Double(*f),
            Val::Str(s) => Value::Str(s.to_vec()),
            Val::Blob(b) => Value::Blob(P_BLOB, b.to_vec()),
            Val::Hll(h) => Value::Blob(P_HLL, h.to_vec()),
            Val::Geo(g) => Value::Geo(geo_text(g)?.to_vec()),
            Val::List(c) | Val::Map(c) => c.decode()?,
        })
    }

    /// The value packed as msgpack into `out` (an op payload argument).
    fn pack(&self, out: &mut Vec<u8>) -> Option<()> {
        match self {
            Val::List(c) | Val::Map(c) => out.extend_from_slice(&c.bytes),
            other => value::encode(&other.to_value()?, out),
        }
        Some(())
    }

    /// Bytes the value owns (copying it copies them); borrowed values
    /// and scalars own none.
    fn owned_len(&self) -> usize {
        match self {
            Val::Str(Cow::Owned(b))
            | Val::Blob(Cow::Owned(b))
            | Val::Hll(Cow::Owned(b))
            | Val::Geo(Cow::Owned(b)) => b.len(),
            Val::List(c) | Val::Map(c) => match &c.bytes {
                Cow::Owned(b) => b.len(),
                Cow::Borrowed(_) => 0,
            },
            _ => 0,
        }
    }

    /// The value as the bin argument of a module call.
    fn as_bin(&self) -> Result<Option<Particle<'_>>, ()> {
        Ok(Some(match self {
            Val::Unknown | Val::Remove => return Err(()),
            Val::Nil => return Ok(None),
            Val::Bool(b) => (P_BOOL, Cow::Owned(vec![u8::from(*b)])),
            Val::Int(i) => (P_INT, Cow::Owned(i.to_be_bytes().to_vec())),
            Val::Float(f) => (P_FLOAT, Cow::Owned(f.to_bits().to_be_bytes().to_vec())),
            Val::Str(s) => (P_STR, Cow::Borrowed(s.as_ref())),
            Val::Blob(b) => (P_BLOB, Cow::Borrowed(b.as_ref())),
            Val::Hll(h) => (P_HLL, Cow::Borrowed(h.as_ref())),
            Val::Geo(g) => (P_GEO, Cow::Borrowed(g.as_ref())),
            Val::List(c) => (P_LIST, Cow::Borrowed(c.bytes.as_ref())),
            Val::Map(c) => (P_MAP, Cow::Borrowed(c.bytes.as_ref())),
        }))
    }
}

/// A particle type and its bytes, borrowed where it can be.
type Particle<'a> = (u8, Cow<'a, [u8]>);

/// An integer particle: 8 bytes big-endian (shorter forms zero-extended).
fn int_from_bytes(bytes: &[u8]) -> Option<i64> {
    if bytes.len() > 8 {
        return None;
    }
    let mut word = [0u8; 8];
    word[8 - bytes.len()..].copy_from_slice(bytes);
    Some(i64::from_be_bytes(word))
}

/// The text of a GeoJSON particle (flags u8, cell count u16, cells, text).
fn geo_text(particle: &[u8]) -> Option<&[u8]> {
    let cells = usize::from(u16::from_be_bytes([*particle.get(1)?, *particle.get(2)?]));
    particle.get(3 + cells * 8..)
}

/// One side of a geo comparison as a shape: a literal's, parsed at parse
/// time, or the value's; `Err` with the comparison's result when it is
/// settled without one (unknown, or false for a value that is no shape).
fn geo_side<'a>(
    (node, literal): &'a (Node, Option<citrine_geo::Shape>),
    cx: &Ctx<'a>,
    env: &mut Vec<Val<'a>>,
) -> Result<Cow<'a, citrine_geo::Shape>, Val<'a>> {
    if let Some(literal) = literal {
        return Ok(Cow::Borrowed(literal));
    }
    match eval(node, cx, env) {
        Val::Geo(particle) => geo_text(&particle)
            .and_then(citrine_geo::Shape::parse)
            .map(Cow::Owned)
            .ok_or(Val::Bool(false)),
        _ => Err(Val::Unknown),
    }
}

/// Bytes of values one evaluation may make in all: module call payloads
/// and results, copies of variables, map keys and values lists (the
/// reference's largest message, `PROTO_SIZE_MAX`). Without a bound a
/// 1 MiB expression could hold thousands of 128 MiB blobs at once (`let`
/// keeps every definition) or copy one big value once per use.
pub(crate) const EVAL_BUDGET: usize = 128 << 20;

/// What evaluation needs besides the tree.
pub(crate) struct Ctx<'a> {
    pub record: &'a dyn Record,
    pub now_ms: u64,
    /// Bytes of [`EVAL_BUDGET`] not yet spent.
    budget: Cell<usize>,
    /// Set once a step found the budget spent: the whole evaluation then
    /// fails (unknown), whatever its result would have been.
    exhausted: Cell<bool>,
    /// The loop variables of the path expressions being walked, innermost
    /// last: key, value, index.
    loop_vars: RefCell<Vec<[Option<Val<'static>>; 3]>>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(record: &'a dyn Record, now_ms: u64) -> Ctx<'a> {
        Ctx {
            record,
            now_ms,
            budget: Cell::new(EVAL_BUDGET),
            exhausted: Cell::new(false),
            loop_vars: RefCell::new(Vec::new()),
        }
    }

    /// The innermost path's loop variable `index` (key 0, value 1,
    /// index 2), when bound.
    fn loop_var(&self, index: u8) -> Option<Val<'static>> {
        let frames = self.loop_vars.borrow();
        frames.last()?.get(usize::from(index))?.clone()
    }

    /// Runs `f` with `vars` bound as the innermost loop variables.
    fn with_loop_vars<T>(&self, vars: &LoopVars<'_>, f: impl FnOnce() -> T) -> T {
        let frame = [
            vars.key.map(val_of),
            Some(val_of(vars.value)),
            vars.index.map(Val::Int),
        ];
        let bytes: usize = frame.iter().flatten().map(Val::owned_len).sum();
        if !self.spend(bytes) {
            return f();
        }
        self.loop_vars.borrow_mut().push(frame);
        let result = f();
        self.loop_vars.borrow_mut().pop();
        result
    }

    /// Takes `bytes` from the budget; false when they are not there (and
    /// from then on for every request).
    fn spend(&self, bytes: usize) -> bool {
        match self.budget.get().checked_sub(bytes) {
            Some(left) if !self.exhausted.get() => {
                self.budget.set(left);
                true
            }
            _ => {
                self.exhausted.set(true);
                false
            }
        }
    }
}

/// Evaluates `root` with `slots` variable slots.
pub(crate) fn run<'a>(root: &'a Node, slots: usize, cx: &Ctx<'a>) -> Val<'a> {
    // No allocation for expressions without variables.
    let mut env: Vec<Val<'a>> = Vec::new();
    if slots > 0 {
        env.resize(slots, Val::Unknown);
    }
    let result = eval(root, cx, &mut env);
    debug_assert_eq!(env.len(), slots);
    if cx.exhausted.get() {
        return Val::Unknown;
    }
    result
}

/// Evaluates an operand; returns unknown from the enclosing function when
/// it is unknown.
macro_rules! known {
    ($e:expr) => {
        match $e {
            Val::Unknown => return Val::Unknown,
            v => v,
        }
    };
}

fn eval<'a>(node: &'a Node, cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Val<'a> {
    match node {
        Node::Unknown => Val::Unknown,
        Node::Nil => Val::Nil,
        Node::Bool(b) => Val::Bool(*b),
        Node::Int(i) => Val::Int(*i),
        Node::Float(f) => Val::Float(*f),
        Node::Str(s) => Val::Str(Cow::Borrowed(s)),
        Node::Blob(b) => Val::Blob(Cow::Borrowed(b)),
        Node::Hll(h) => Val::Hll(Cow::Borrowed(h)),
        Node::Geo(g) => Val::Geo(Cow::Borrowed(g)),
        Node::List(lit) => Val::List(Cdt {
            bytes: Cow::Borrowed(&lit.bytes),
            literal: true,
        }),
        Node::Map(lit) => Val::Map(Cdt {
            bytes: Cow::Borrowed(&lit.bytes),
            literal: true,
        }),
        Node::Compare(op, ty, args) => {
            let a = known!(eval(&args[0], cx, env));
            let b = known!(eval(&args[1], cx, env));
            compare(*op, *ty, &a, &b)
        }
        Node::Regex(regex, subject) => regex_match(regex, subject, cx, env),
        Node::GeoCmp(sides) => geo_compare(sides, cx, env),
        Node::InList(args) => in_list(args, cx, env),
        Node::And(args) => and(args, cx, env),
        Node::Or(args) => or(args, cx, env),
        Node::Not(arg) => match known!(eval(arg, cx, env)) {
            Val::Bool(b) => Val::Bool(!b),
            _ => Val::Unknown,
        },
        Node::Exclusive(args) => exclusive(args, cx, env),
        Node::Arith(op, float, args) => arith(*op, *float, args, cx, env),
        Node::Pow(args) => floats2(args, cx, env, f64::powf),
        Node::Log(args) => floats2(args, cx, env, |x, base| x.ln() / base.ln()),
        Node::Mod(args) => modulo(args, cx, env),
        Node::Abs(arg) => match known!(eval(arg, cx, env)) {
            Val::Int(i) => Val::Int(i.wrapping_abs()),
            Val::Float(f) => Val::Float(f.abs()),
            _ => Val::Unknown,
        },
        Node::Floor(arg) => float1(arg, cx, env, f64::floor),
        Node::Ceil(arg) => float1(arg, cx, env, f64::ceil),
        Node::ToInt(arg) => match known!(eval(arg, cx, env)) {
            Val::Float(f) => Val::Int(float_to_int(f)),
            _ => Val::Unknown,
        },
        Node::ToFloat(arg) => match known!(eval(arg, cx, env)) {
            Val::Int(i) => Val::Float(i as f64),
            _ => Val::Unknown,
        },
        Node::IntBits(op, args) => int_bits(*op, args, cx, env),
        Node::IntNot(arg) => match known!(eval(arg, cx, env)) {
            Val::Int(i) => Val::Int(!i),
            _ => Val::Unknown,
        },
        Node::Count(arg) => match known!(eval(arg, cx, env)) {
            Val::Int(i) => Val::Int(i64::from(i.count_ones())),
            _ => Val::Unknown,
        },
        Node::Shift(kind, args) => shift(*kind, args, cx, env),
        Node::Scan(left, args) => bit_scan(*left, args, cx, env),
        Node::DigestMod(modulus) => digest_mod(*modulus, cx),
        Node::Meta(meta) => metadata(*meta, cx),
        Node::Key(ty) => record_key(*ty, cx),
        Node::Bin(ty, name) => bin(*ty, name, cx),
        Node::BinType(name) => Val::Int(cx.record.bin(name).map_or(0, |(p, _)| i64::from(p))),
        Node::BinExists(name) => Val::Bool(cx.record.bin(name).is_some()),
        Node::ResultRemove => Val::Remove,
        Node::MapKeys(values, arg) => map_keys(*values, arg, cx, env),
        // The builtin variables (the element a CDT selection is at) are
        // bound only inside CDT selections, which this server does not
        // evaluate: outside them the reference answers unknown.
        // A copy of the bound value: counted, as a variable's copies are.
        Node::VarBuiltin(ty, index) => match cx.loop_var(*index) {
            Some(value) if value.has_type(*ty) && cx.spend(value.owned_len()) => value,
            _ => Val::Unknown,
        },
        Node::Path(call) => path_call(call, cx, env),
        Node::Cond(cases, default) => cond(cases, default, cx, env),
        Node::Let(defs, body) => let_in(defs, body, cx, env),
        Node::Var(slot) => match env.get(*slot) {
            // Each use copies what the value owns.
            Some(value) if cx.spend(value.owned_len()) => value.clone(),
            _ => Val::Unknown,
        },
        Node::Call(call) => module_call(call, cx, env),
    }
}

/// `regex_compare`: whether the string operand matches.
fn regex_match<'a>(
    regex: &regex::bytes::Regex,
    subject: &'a Node,
    cx: &Ctx<'a>,
    env: &mut Vec<Val<'a>>,
) -> Val<'a> {
    match known!(eval(subject, cx, env)) {
        Val::Str(s) => {
            // The reference matches a C string: up to the first NUL.
            let s = match s.iter().position(|&b| b == 0) {
                Some(nul) => &s[..nul],
                None => &s[..],
            };
            Val::Bool(regex.is_match(s))
        }
        _ => Val::Unknown,
    }
}

/// `geo_compare`: whether the left shape is within (or contains) the right.
fn geo_compare<'a>(
    sides: &'a [(Node, Option<citrine_geo::Shape>); 2],
    cx: &Ctx<'a>,
    env: &mut Vec<Val<'a>>,
) -> Val<'a> {
    let [left, right] = sides;
    let left = match geo_side(left, cx, env) {
        Ok(shape) => shape,
        Err(settled) => return settled,
    };
    match geo_side(right, cx, env) {
        Ok(right) => Val::Bool(citrine_geo::selects(&left, &right)),
        Err(settled) => settled,
    }
}

/// `in_list`: whether the needle equals an item of the list.
fn in_list<'a>(args: &'a [Node; 2], cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Val<'a> {
    let needle = known!(eval(&args[0], cx, env));
    let Val::List(list) = known!(eval(&args[1], cx, env)) else {
        return Val::Unknown;
    };
    let (Some(needle), Some(Value::List(list))) = (needle.to_value(), list.decode()) else {
        return Val::Unknown;
    };
    Val::Bool(
        list.items
            .iter()
            .any(|item| value::compare(&needle, item) == Ordering::Equal),
    )
}

/// `and`: false at the first false operand; otherwise unknown if any
/// operand was not a boolean.
fn and<'a>(args: &'a [Node], cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Val<'a> {
    let mut unknown = false;
    for arg in args {
        match eval(arg, cx, env) {
            Val::Bool(false) => return Val::Bool(false),
            Val::Bool(true) => {}
            _ => unknown = true,
        }
    }
    if unknown {
        Val::Unknown
    } else {
        Val::Bool(true)
    }
}

/// `or`: true at the first true operand; otherwise unknown if any operand
/// was not a boolean.
fn or<'a>(args: &'a [Node], cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Val<'a> {
    let mut unknown = false;
    for arg in args {
        match eval(arg, cx, env) {
            Val::Bool(true) => return Val::Bool(true),
            Val::Bool(false) => {}
            _ => unknown = true,
        }
    }
    if unknown {
        Val::Unknown
    } else {
        Val::Bool(false)
    }
}

/// `exclusive`: exactly one true; an unknown operand ends it unknown, a
/// second true ends it false.
fn exclusive<'a>(args: &'a [Node], cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Val<'a> {
    let mut seen = false;
    for arg in args {
        match eval(arg, cx, env) {
            Val::Bool(true) if seen => return Val::Bool(false),
            Val::Bool(true) => seen = true,
            Val::Bool(false) => {}
            _ => return Val::Unknown,
        }
    }
    Val::Bool(seen)
}

/// `mod`: zero, and the one quotient that overflows, are unknown.
fn modulo<'a>(args: &'a [Node; 2], cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Val<'a> {
    let Some((a, b)) = ints2(args, cx, env) else {
        return Val::Unknown;
    };
    match a.checked_rem(b) {
        Some(r) => Val::Int(r),
        None => Val::Unknown,
    }
}

/// `int_and`, `int_or`, `int_xor` over every operand.
fn int_bits<'a>(op: IntOp, args: &'a [Node], cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Val<'a> {
    let mut acc: Option<i64> = None;
    for arg in args {
        let Val::Int(x) = known!(eval(arg, cx, env)) else {
            return Val::Unknown;
        };
        acc = Some(match (acc, op) {
            (None, _) => x,
            (Some(a), IntOp::And) => a & x,
            (Some(a), IntOp::Or) => a | x,
            (Some(a), IntOp::Xor) => a ^ x,
        });
    }
    acc.map_or(Val::Unknown, Val::Int)
}

/// `int_lshift`, `int_rshift`, `int_arshift`. Counts are taken modulo 64,
/// as x86 does for the reference's (undefined in C) out-of-range shifts.
fn shift<'a>(kind: Shift, args: &'a [Node; 2], cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Val<'a> {
    let Some((value, count)) = ints2(args, cx, env) else {
        return Val::Unknown;
    };
    let count = count as u32;
    Val::Int(match kind {
        Shift::Left => value.wrapping_shl(count),
        Shift::Right => (value as u64).wrapping_shr(count) as i64,
        Shift::Arith => value.wrapping_shr(count),
    })
}

/// `int_lscan`, `int_rscan`: the position of the first bit equal to the
/// search value, counted from the most significant bit (0); -1 if none.
fn bit_scan<'a>(left: bool, args: &'a [Node; 2], cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Val<'a> {
    let Val::Int(value) = known!(eval(&args[0], cx, env)) else {
        return Val::Unknown;
    };
    let Val::Bool(set) = known!(eval(&args[1], cx, env)) else {
        return Val::Unknown;
    };
    let bits = if set { value as u64 } else { !(value as u64) };
    Val::Int(match (bits, left) {
        (0, _) => -1,
        (_, true) => i64::from(bits.leading_zeros()),
        (_, false) => 63 - i64::from(bits.trailing_zeros()),
    })
}

/// `digest_modulo`: the reference reads digest bytes 16..20 as a native
/// (little-endian) 32-bit word.
fn digest_mod<'a>(modulus: i64, cx: &Ctx<'a>) -> Val<'a> {
    let digest = cx.record.digest();
    let word = u32::from_le_bytes([digest[16], digest[17], digest[18], digest[19]]);
    Val::Int(i64::from(word) % modulus)
}

/// `key`: the stored user key, if it has the asked type.
fn record_key<'a>(ty: Ty, cx: &Ctx<'a>) -> Val<'a> {
    let Some((particle, bytes)) = cx.record.key() else {
        return Val::Unknown;
    };
    let key = match particle {
        P_INT if bytes.len() == 8 => Val::from_particle(P_INT, bytes),
        P_STR | P_BLOB => Val::from_particle(particle, bytes),
        _ => Val::Unknown,
    };
    if key.has_type(ty) {
        key
    } else {
        Val::Unknown
    }
}

/// `bin`: the bin's value, if it has the asked type.
fn bin<'a>(ty: Ty, name: &[u8], cx: &Ctx<'a>) -> Val<'a> {
    match cx.record.bin(name) {
        Some((particle, bytes)) => {
            let value = Val::from_particle(particle, bytes);
            if value.has_type(ty) {
                value
            } else {
                Val::Unknown
            }
        }
        None => Val::Unknown,
    }
}

/// A map's keys (or values) as a new list, its size counted.
fn map_keys<'a>(values: bool, arg: &'a Node, cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Val<'a> {
    let Val::Map(map) = known!(eval(arg, cx, env)) else {
        return Val::Unknown;
    };
    let Some(Value::Map(map)) = map.decode() else {
        return Val::Unknown;
    };
    let items = map
        .entries
        .into_iter()
        .map(|(k, v)| if values { v } else { k })
        .collect();
    let list = Value::List(value::List { flags: 0, items });
    let bytes = value::to_bytes(&list);
    if !cx.spend(bytes.len()) {
        return Val::Unknown;
    }
    Val::List(Cdt {
        bytes: Cow::Owned(bytes),
        literal: false,
    })
}

/// `cond`: the action of the first true test, else the default; a test
/// that is not a boolean makes it unknown.
fn cond<'a>(
    cases: &'a [(Node, Node)],
    default: &'a Node,
    cx: &Ctx<'a>,
    env: &mut Vec<Val<'a>>,
) -> Val<'a> {
    for (test, action) in cases {
        match eval(test, cx, env) {
            Val::Bool(true) => return eval(action, cx, env),
            Val::Bool(false) => {}
            _ => return Val::Unknown,
        }
    }
    eval(default, cx, env)
}

/// `let`: binds each definition to its slot, then evaluates the body.
fn let_in<'a>(
    defs: &'a [(usize, Node)],
    body: &'a Node,
    cx: &Ctx<'a>,
    env: &mut Vec<Val<'a>>,
) -> Val<'a> {
    for (slot, def) in defs {
        debug_assert!(*slot < env.len(), "the parser counts every slot");
        let value = eval(def, cx, env);
        if let Some(place) = env.get_mut(*slot) {
            *place = value;
        }
    }
    eval(body, cx, env)
}

/// x86's conversion of a double to a 64-bit integer: truncation toward
/// zero, `i64::MIN` for NaN and out-of-range values.
fn float_to_int(f: f64) -> i64 {
    // 2^63 is exactly representable; every double below it fits.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if f.is_nan() || !(-LIMIT..LIMIT).contains(&f) {
        i64::MIN
    } else {
        f as i64
    }
}

fn ints2<'a>(args: &'a [Node; 2], cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Option<(i64, i64)> {
    let Val::Int(a) = eval(&args[0], cx, env) else {
        return None;
    };
    let Val::Int(b) = eval(&args[1], cx, env) else {
        return None;
    };
    Some((a, b))
}

fn floats2<'a>(
    args: &'a [Node; 2],
    cx: &Ctx<'a>,
    env: &mut Vec<Val<'a>>,
    f: impl Fn(f64, f64) -> f64,
) -> Val<'a> {
    let Val::Float(a) = known!(eval(&args[0], cx, env)) else {
        return Val::Unknown;
    };
    let Val::Float(b) = known!(eval(&args[1], cx, env)) else {
        return Val::Unknown;
    };
    Val::Float(f(a, b))
}

fn float1<'a>(
    arg: &'a Node,
    cx: &Ctx<'a>,
    env: &mut Vec<Val<'a>>,
    f: impl Fn(f64) -> f64,
) -> Val<'a> {
    match known!(eval(arg, cx, env)) {
        Val::Float(x) => Val::Float(f(x)),
        _ => Val::Unknown,
    }
}

/// A number operand of the variadic arithmetic ops.
#[derive(Clone, Copy)]
enum Num {
    I(i64),
    F(f64),
}

fn arith<'a>(
    op: Arith,
    float: bool,
    args: &'a [Node],
    cx: &Ctx<'a>,
    env: &mut Vec<Val<'a>>,
) -> Val<'a> {
    let mut nums = args.iter();
    let mut next = |env: &mut Vec<Val<'a>>| -> Option<Option<Num>> {
        let arg = nums.next()?;
        Some(match (eval(arg, cx, env), float) {
            (Val::Int(i), false) => Some(Num::I(i)),
            (Val::Float(f), true) => Some(Num::F(f)),
            _ => None,
        })
    };
    let Some(Some(first)) = next(env) else {
        return Val::Unknown;
    };
    let mut acc = first;
    let mut rest = 0usize;
    // Division divides the first operand by the product of the others.
    let mut divisor = if float { Num::F(1.0) } else { Num::I(1) };
    while let Some(arg) = next(env) {
        let Some(x) = arg else {
            return Val::Unknown;
        };
        rest += 1;
        acc = match (op, acc, x) {
            (Arith::Add, Num::I(a), Num::I(b)) => Num::I(a.wrapping_add(b)),
            (Arith::Sub, Num::I(a), Num::I(b)) => Num::I(a.wrapping_sub(b)),
            (Arith::Mul, Num::I(a), Num::I(b)) => Num::I(a.wrapping_mul(b)),
            (Arith::Add, Num::F(a), Num::F(b)) => Num::F(a + b),
            (Arith::Sub, Num::F(a), Num::F(b)) => Num::F(a - b),
            (Arith::Mul, Num::F(a), Num::F(b)) => Num::F(a * b),
            // Only replaced when the comparison holds, so a NaN operand
            // is kept or skipped as the reference's `<`/`>` decide.
            (Arith::Min, Num::I(a), Num::I(b)) => Num::I(if a > b { b } else { a }),
            (Arith::Max, Num::I(a), Num::I(b)) => Num::I(if a < b { b } else { a }),
            (Arith::Min, Num::F(a), Num::F(b)) => Num::F(if a > b { b } else { a }),
            (Arith::Max, Num::F(a), Num::F(b)) => Num::F(if a < b { b } else { a }),
            (Arith::Div, acc, x) => {
                divisor = match (divisor, x) {
                    (Num::I(d), Num::I(b)) => Num::I(d.wrapping_mul(b)),
                    (Num::F(d), Num::F(b)) => Num::F(d * b),
                    _ => return Val::Unknown,
                };
                acc
            }
            _ => return Val::Unknown,
        };
    }
    match (op, rest) {
        // One operand: negation, and the reciprocal.
        (Arith::Sub, 0) => acc = neg(acc),
        (Arith::Div, 0) => {
            divisor = acc;
            acc = if float { Num::F(1.0) } else { Num::I(1) };
        }
        _ => {}
    }
    if op == Arith::Div {
        acc = match (acc, divisor) {
            (Num::F(a), Num::F(d)) => Num::F(a / d),
            // By zero, and i64::MIN / -1, are unknown.
            (Num::I(a), Num::I(d)) => match a.checked_div(d) {
                Some(q) => Num::I(q),
                None => return Val::Unknown,
            },
            _ => return Val::Unknown,
        };
    }
    match acc {
        Num::I(i) => Val::Int(i),
        Num::F(f) => Val::Float(f),
    }
}

fn neg(x: Num) -> Num {
    match x {
        Num::I(i) => Num::I(0i64.wrapping_sub(i)),
        Num::F(f) => Num::F(0.0 - f),
    }
}

fn metadata<'a>(meta: Meta, cx: &Ctx<'a>) -> Val<'a> {
    let record = cx.record;
    let size = i64::try_from(record.record_size()).unwrap_or(i64::MAX);
    match meta {
        Meta::RecordSize => Val::Int(size),
        // The deprecated sizes: the record's size where it is stored.
        Meta::DeviceSize => Val::Int(if record.in_memory() { 0 } else { size }),
        Meta::MemorySize => Val::Int(if record.in_memory() { size } else { 0 }),
        Meta::LastUpdate => Val::Int(
            i64::try_from(record.last_update_ms().saturating_mul(1_000_000)).unwrap_or(i64::MAX),
        ),
        Meta::SinceUpdate => Val::Int(
            i64::try_from(cx.now_ms.saturating_sub(record.last_update_ms())).unwrap_or(i64::MAX),
        ),
        Meta::VoidTime => Val::Int(match record.void_time_s() {
            None => -1,
            Some(s) => i64::try_from(s.saturating_mul(1_000_000_000)).unwrap_or(i64::MAX),
        }),
        Meta::Ttl => Val::Int(match record.void_time_s() {
            None => -1,
            // A record past its void time not yet removed reports 1.
            Some(void) => {
                let now = cx.now_ms / 1000;
                i64::try_from(void.saturating_sub(now).max(1)).unwrap_or(i64::MAX)
            }
        }),
        Meta::SetName => Val::Str(Cow::Borrowed(record.set_name())),
        Meta::KeyExists => Val::Bool(record.key().is_some()),
        Meta::IsTombstone => Val::Bool(record.is_tombstone()),
    }
}

/// Compares two known values of the static type `ty`.
fn compare<'a>(op: CmpOp, ty: Ty, a: &Val<'a>, b: &Val<'a>) -> Val<'a> {
    if !a.has_type(ty) || !b.has_type(ty) {
        return Val::Unknown;
    }
    let ordering = match (a, b) {
        (Val::Nil, Val::Nil) => Some(Ordering::Equal),
        (Val::Bool(x), Val::Bool(y)) => Some(x.cmp(y)),
        (Val::Int(x), Val::Int(y)) => Some(x.cmp(y)),
        (Val::Float(x), Val::Float(y)) => x.partial_cmp(y),
        (Val::Str(x), Val::Str(y)) | (Val::Blob(x), Val::Blob(y)) => Some(x.cmp(y)),
        (Val::List(x), Val::List(y)) | (Val::Map(x), Val::Map(y)) => {
            let (Some(x), Some(y)) = (x.decode(), y.decode()) else {
                return Val::Unknown;
            };
            let (ordering, unordered) = value::compare_noting_unordered(&x, &y);
            // Structures holding unordered maps have no order to compare.
            if unordered {
                return Val::Unknown;
            }
            Some(ordering)
        }
        _ => return Val::Unknown,
    };
    // A NaN compares as unordered: only "not equal" holds.
    Val::Bool(match (op, ordering) {
        (CmpOp::Ne, None) => true,
        (_, None) => false,
        (CmpOp::Eq, Some(o)) => o == Ordering::Equal,
        (CmpOp::Ne, Some(o)) => o != Ordering::Equal,
        (CmpOp::Gt, Some(o)) => o == Ordering::Greater,
        (CmpOp::Ge, Some(o)) => o != Ordering::Less,
        (CmpOp::Lt, Some(o)) => o == Ordering::Less,
        (CmpOp::Le, Some(o)) => o != Ordering::Greater,
    })
}

fn module_call<'a>(call: &'a Call, cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Val<'a> {
    debug_assert!(!call.header.is_empty(), "a payload starts with its op code");
    let mut payload = call.header.clone();
    for arg in &call.args {
        match arg {
            Arg::Raw(raw) => payload.extend_from_slice(raw),
            Arg::Exp(exp) => {
                if eval(exp, cx, env).pack(&mut payload).is_none() {
                    return Val::Unknown;
                }
            }
        }
    }
    let target = eval(&call.target, cx, env);
    let Ok(bin) = target.as_bin() else {
        return Val::Unknown;
    };
    if !cx.spend(payload.len()) {
        return Val::Unknown;
    }
    let family = match call.module {
        Module::Cdt => Family::Cdt,
        Module::Bits => Family::Bits,
        Module::Hll => Family::Hll,
    };
    let bin_ref = bin.as_ref().map(|(p, bytes)| (*p, bytes.as_ref()));
    let Ok(outcome) = citrine_cdt::apply(family, &payload, bin_ref, call.modify) else {
        return Val::Unknown;
    };
    // A modifying call's value is the collection after the op (unchanged
    // when the op wrote nothing back); a reading call's is the op's result.
    let particle = if call.modify {
        outcome
            .bin
            .or_else(|| bin.map(|(p, bytes)| (p, bytes.into_owned())))
    } else {
        outcome.result
    };
    if !cx.spend(particle.as_ref().map_or(0, |(_, bytes)| bytes.len())) {
        return Val::Unknown;
    }
    let value = match particle {
        None => Val::Nil,
        Some((p, bytes)) => Val::from_particle_cow(p, Cow::Owned(bytes)),
    };
    if value.has_type(call.ret) {
        value
    } else {
        Val::Unknown
    }
}

/// A CDT value as an owned runtime value (a loop variable).
fn val_of(value: &Value) -> Val<'static> {
    match value {
        Value::Nil => Val::Nil,
        Value::Bool(b) => Val::Bool(*b),
        Value::Int(i) => Val::Int(*i),
        Value::Double(f) => Val::Float(*f),
        Value::Str(s) => Val::Str(Cow::Owned(s.clone())),
        Value::Blob(P_HLL, bytes) => Val::Hll(Cow::Owned(bytes.clone())),
        Value::Blob(P_BLOB | 0, bytes) => Val::Blob(Cow::Owned(bytes.clone())),
        Value::Geo(text) => Val::Geo(Cow::Owned(crate::parse::geo_particle(text))),
        Value::List(_) => Val::List(Cdt {
            bytes: Cow::Owned(value::to_bytes(value)),
            literal: false,
        }),
        Value::Map(_) => Val::Map(Cdt {
            bytes: Cow::Owned(value::to_bytes(value)),
            literal: false,
        }),
        // Integers above i64, other blob subtypes, exts: no expression
        // type reads them.
        _ => Val::Unknown,
    }
}

/// Answers a path's filters and modify expression for the CDT walk.
struct PathEvaluator<'c, 'a> {
    call: &'a PathCall,
    cx: &'c Ctx<'a>,
}

impl PathEval for PathEvaluator<'_, '_> {
    fn filter(&mut self, level: usize, vars: &LoopVars<'_>) -> Verdict {
        let Some((_, filter)) = self.call.filters.iter().find(|(at, _)| *at == level) else {
            return Verdict::Unknown;
        };
        let result = self
            .cx
            .with_loop_vars(vars, || run(&filter.root, filter.slots, self.cx));
        match result {
            Val::Bool(true) => Verdict::Yes,
            Val::Bool(false) => Verdict::No,
            _ => Verdict::Unknown,
        }
    }

    fn modify(&mut self, vars: &LoopVars<'_>) -> Modified {
        let Some(modify) = &self.call.modify else {
            return Modified::Unknown;
        };
        let result = self
            .cx
            .with_loop_vars(vars, || run(&modify.root, modify.slots, self.cx));
        // Each leaf's new value is a copy: counted, so a big value written
        // into many leaves cannot grow past the evaluation's budget.
        let size = match &result {
            Val::List(cdt) | Val::Map(cdt) => cdt.bytes.len(),
            Val::Str(bytes) | Val::Blob(bytes) | Val::Hll(bytes) | Val::Geo(bytes) => bytes.len(),
            _ => 0,
        };
        if !self.cx.spend(size.saturating_add(16)) {
            return Modified::Unknown;
        }
        match result {
            Val::Remove => Modified::Remove,
            other => other.to_value().map_or(Modified::Unknown, Modified::Value),
        }
    }
}

/// What a path call gives for `root`: the selection, or the whole
/// collection after the apply.
fn walk_path(call: &PathCall, cx: &Ctx<'_>, root: Value) -> Result<Value, citrine_cdt::CdtError> {
    let mut evaluator = PathEvaluator { call, cx };
    if call.path.mode() == Mode::Apply {
        let mut root = root;
        call.path.apply(&mut root, &mut evaluator)?;
        Ok(root)
    } else {
        call.path.select(&root, &mut evaluator)
    }
}

fn path_call<'a>(call: &'a PathCall, cx: &Ctx<'a>, env: &mut Vec<Val<'a>>) -> Val<'a> {
    let root = match eval(&call.target, cx, env) {
        Val::List(cdt) | Val::Map(cdt) => match cdt.decode() {
            Some(root) => root,
            None => return Val::Unknown,
        },
        _ => return Val::Unknown,
    };
    let Ok(result) = walk_path(call, cx, root) else {
        return Val::Unknown;
    };
    let bytes = value::to_bytes(&result);
    if !cx.spend(bytes.len()) {
        return Val::Unknown;
    }
    let cdt = Cdt {
        bytes: Cow::Owned(bytes),
        literal: false,
    };
    let value = match result {
        Value::List(_) => Val::List(cdt),
        Value::Map(_) => Val::Map(cdt),
        _ => return Val::Unknown,
    };
    if value.has_type(call.ret) {
        value
    } else {
        Val::Unknown
    }
}

/// A `CDT_READ` or `CDT_MODIFY` op whose payload is a path (op 0xfe) on
/// the bin `bin` of `record`: the selection as the op's result, or the bin
/// after the apply.
pub(crate) fn path_op(
    payload: &[u8],
    bin: Option<(u8, &[u8])>,
    modify: bool,
    record: &dyn Record,
    now_ms: u64,
) -> Result<citrine_cdt::Outcome, citrine_types::ResultCode> {
    use citrine_types::ResultCode;
    let call = crate::parse::path_request(payload, Ty::Nil, Node::Nil, 0)
        .map_err(|error| error.result_code())?;
    if (call.path.mode() == Mode::Apply) != modify {
        // An apply under CDT_READ, or a select under CDT_MODIFY.
        return Err(ResultCode::Parameter);
    }
    let Some((particle, bytes)) = bin else {
        // Nothing to select from or rewrite.
        return Ok(citrine_cdt::Outcome::default());
    };
    if particle != P_LIST && particle != P_MAP {
        return Err(ResultCode::IncompatibleType);
    }
    let root = value::decode_stored(bytes).map_err(|_| ResultCode::Parameter)?;
    let cx = Ctx::new(record, now_ms);
    let result = walk_path(&call, &cx, root).map_err(citrine_cdt::CdtError::result_code);
    if cx.exhausted.get() {
        // The copies the walk made outgrew the evaluation's budget.
        return Err(ResultCode::RecordTooBig);
    }
    let result = result?;
    let particle = match result {
        Value::List(_) => P_LIST,
        _ => P_MAP,
    };
    let encoded = Some((particle, value::to_bytes(&result)));
    Ok(if modify {
        citrine_cdt::Outcome {
            bin: encoded,
            result: None,
        }
    } else {
        citrine_cdt::Outcome {
            bin: None,
            result: encoded,
        }
    })
}
