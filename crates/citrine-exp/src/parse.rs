//! The expression tree and its parser: msgpack bytes (protocol 05 §4.2) to
//! a [`Node`] per op, with the static type of every node checked as the
//! reference's build pass checks it.
//!
//! Owns: [`Node`], [`Ty`] (the wire's expression types), [`Call`] (a module
//! call: CDT, bits or HLL op payload inside an expression) and [`parse`].
//!
//! Type rules (the reference's `build_*` functions): comparisons need both
//! sides of one type and refuse GeoJSON and HLL; arithmetic takes all
//! integers or all floats (no mixing, no promotion); `pow`/`log` floats,
//! `mod` integers; logic ops booleans; `cond` branches one type (an
//! `unknown` op [0] fits any); `let` variables take their definitions'
//! types and are visible in later definitions and the scope expression; a
//! module call's bin argument is a list or map (CDT), blob (bits), HLL
//! (HLL) or nil. Any violation is PARAMETER.
//!
//! Invariants: parsing never panics; nesting deeper than [`MAX_DEPTH`]
//! and inputs larger than [`MAX_SIZE`] are refused; literals are decoded
//! (lists and maps to canonical form) here, never during evaluation.

use crate::posix;
use crate::reader::{Cursor, Kind};
use crate::ExpError;
use citrine_cdt::value::{self, Value};
use citrine_types::BIN_NAME_MAX;
use regex::bytes::Regex;

/// Deepest nesting of expression nodes accepted.
pub(crate) const MAX_DEPTH: usize = 64;
/// Largest expression accepted, bytes (the reference's `EXP_MAX_SIZE`).
pub(crate) const MAX_SIZE: usize = 1 << 20;
/// Most vectors a module call's payload splits into around its evaluated
/// arguments (the reference's `OP_CALL_MAX_VEC_IDX`).
const CALL_MAX_VECS: usize = 18;

/// Op code of the context form of a CDT payload.
const CDT_CONTEXT_EVAL: u64 = 0xff;
/// Op code of the CDT SELECT form (expressions applied inside a CDT).
const CDT_SELECT: u64 = 0xfe;

/// An expression's static type (wire codes 0..=9), plus the internal type
/// of `result_remove` [100].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    Nil,
    Bool,
    Int,
    Str,
    List,
    Map,
    Blob,
    Float,
    Geo,
    Hll,
    Remove,
}

impl Ty {
    /// A wire type code (bins, keys, call return types, builtins).
    fn from_wire(code: u64) -> Option<Ty> {
        Some(match code {
            0 => Ty::Nil,
            1 => Ty::Bool,
            2 => Ty::Int,
            3 => Ty::Str,
            4 => Ty::List,
            5 => Ty::Map,
            6 => Ty::Blob,
            7 => Ty::Float,
            8 => Ty::Geo,
            9 => Ty::Hll,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IntOp {
    And,
    Or,
    Xor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shift {
    Left,
    /// Logical (zero-filling).
    Right,
    /// Arithmetic (sign-filling).
    Arith,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Meta {
    DeviceSize,
    LastUpdate,
    SinceUpdate,
    VoidTime,
    Ttl,
    SetName,
    KeyExists,
    IsTombstone,
    MemorySize,
    RecordSize,
}

/// Which op family a module call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Module {
    Cdt,
    Bits,
    Hll,
}

/// A list or map literal, as canonical bytes (ordered collections sorted,
/// smallest encodings): what it evaluates to, stores as and compares by.
#[derive(Debug)]
pub(crate) struct Lit {
    pub bytes: Vec<u8>,
}

/// One argument of a module call's op payload.
#[derive(Debug)]
pub(crate) enum Arg {
    /// Msgpack copied into the payload as it came.
    Raw(Vec<u8>),
    /// An expression (any array argument), evaluated and packed in place.
    Exp(Node),
}

/// A module call `[127, return type, module, payload, bin]`.
#[derive(Debug)]
pub(crate) struct Call {
    pub ret: Ty,
    pub module: Module,
    pub modify: bool,
    /// The payload's bytes up to its op code (headers, context).
    pub header: Vec<u8>,
    pub args: Vec<Arg>,
    pub target: Node,
}

/// A path expression `[127, return type, 0 or 0x40, [0xfe, ctx, flags
/// (, modify expression)], bin]` (the select form, or with the modify
/// flag the apply form), or the payload of a `CDT_READ`/`CDT_MODIFY` op
/// of that code (then `target` is nil: the op's bin is the target).
#[derive(Debug)]
pub(crate) struct PathCall {
    pub ret: Ty,
    pub path: citrine_cdt::path::Path,
    /// The filters of "all children" levels, parsed, by level.
    pub filters: Vec<(usize, Parsed)>,
    /// The apply form's expression.
    pub modify: Option<Parsed>,
    pub target: Node,
}

/// Parses a path payload's expressions (`depth`: how deep the payload
/// sits in an enclosing expression, so nesting stays bounded).
pub(crate) fn path_request(
    payload: &[u8],
    ret: Ty,
    target: Node,
    depth: usize,
) -> Result<PathCall, ExpError> {
    let path = citrine_cdt::path::Path::parse(payload).map_err(|error| match error {
        citrine_cdt::CdtError::Unsupported => ExpError::Unsupported,
        _ => PARAM,
    })?;
    let mut filters = Vec::new();
    for (level, bytes) in path.filters() {
        let filter = parse_at(bytes, depth + 1)?;
        want(filter.ty == Ty::Bool)?;
        filters.push((level, filter));
    }
    let modify = match path.modify_expression() {
        Some(bytes) => Some(parse_at(bytes, depth + 1)?),
        None => None,
    };
    Ok(PathCall {
        ret,
        path,
        filters,
        modify,
        target,
    })
}

/// One parsed op. Literal strings, blobs and HLLs hold their bytes without
/// the particle prefix; a GeoJSON literal holds a GeoJSON particle (flags,
/// no cells, text).
#[derive(Debug)]
pub(crate) enum Node {
    /// [0]: evaluates to unknown.
    Unknown,
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Vec<u8>),
    Blob(Vec<u8>),
    Hll(Vec<u8>),
    Geo(Vec<u8>),
    List(Lit),
    Map(Lit),
    Compare(CmpOp, Ty, Box<[Node; 2]>),
    Regex(Box<Regex>, Box<Node>),
    /// A point inside a region, or a region holding a point (either
    /// side); a GeoJSON literal's shape is parsed once, here.
    GeoCmp(Box<[(Node, Option<citrine_geo::Shape>); 2]>),
    InList(Box<[Node; 2]>),
    And(Vec<Node>),
    Or(Vec<Node>),
    Not(Box<Node>),
    Exclusive(Vec<Node>),
    /// Float when the bool is set, integers otherwise.
    Arith(Arith, bool, Vec<Node>),
    Pow(Box<[Node; 2]>),
    Log(Box<[Node; 2]>),
    Mod(Box<[Node; 2]>),
    Abs(Box<Node>),
    Floor(Box<Node>),
    Ceil(Box<Node>),
    ToInt(Box<Node>),
    ToFloat(Box<Node>),
    IntBits(IntOp, Vec<Node>),
    IntNot(Box<Node>),
    Shift(Shift, Box<[Node; 2]>),
    Count(Box<Node>),
    /// Left scan when the bool is set.
    Scan(bool, Box<[Node; 2]>),
    DigestMod(i64),
    Meta(Meta),
    Key(Ty),
    Bin(Ty, Vec<u8>),
    BinType(Vec<u8>),
    BinExists(Vec<u8>),
    ResultRemove,
    /// Map values when the bool is set, keys otherwise.
    MapKeys(bool, Box<Node>),
    /// [122, type, index]: the element a path expression is at (key 0,
    /// value 1, index 2), bound only inside its filters and modify
    /// expression (unknown elsewhere, or when of another type).
    VarBuiltin(Ty, u8),
    /// A path expression (a module call whose payload is CDT SELECT).
    Path(Box<PathCall>),
    Cond(Vec<(Node, Node)>, Box<Node>),
    Let(Vec<(usize, Node)>, Box<Node>),
    Var(usize),
    Call(Box<Call>),
}

impl Node {
    /// Calls `visit` on this node and every node below it.
    pub(crate) fn walk(&self, visit: &mut dyn FnMut(&Node)) {
        visit(self);
        match self {
            Node::Compare(_, _, pair)
            | Node::InList(pair)
            | Node::Pow(pair)
            | Node::Log(pair)
            | Node::Mod(pair)
            | Node::Shift(_, pair)
            | Node::Scan(_, pair) => pair.iter().for_each(|node| node.walk(visit)),
            Node::GeoCmp(pair) => pair.iter().for_each(|(node, _)| node.walk(visit)),
            Node::Regex(_, node)
            | Node::Not(node)
            | Node::Abs(node)
            | Node::Floor(node)
            | Node::Ceil(node)
            | Node::ToInt(node)
            | Node::ToFloat(node)
            | Node::IntNot(node)
            | Node::Count(node)
            | Node::MapKeys(_, node) => node.walk(visit),
            Node::And(nodes)
            | Node::Or(nodes)
            | Node::Exclusive(nodes)
            | Node::Arith(_, _, nodes)
            | Node::IntBits(_, nodes) => nodes.iter().for_each(|node| node.walk(visit)),
            Node::Cond(branches, otherwise) => {
                for (condition, value) in branches {
                    condition.walk(visit);
                    value.walk(visit);
                }
                otherwise.walk(visit);
            }
            Node::Let(definitions, body) => {
                for (_, value) in definitions {
                    value.walk(visit);
                }
                body.walk(visit);
            }
            Node::Path(call) => {
                for (_, filter) in &call.filters {
                    filter.root.walk(visit);
                }
                if let Some(modify) = &call.modify {
                    modify.root.walk(visit);
                }
                call.target.walk(visit);
            }
            Node::Call(call) => {
                for arg in &call.args {
                    if let Arg::Exp(node) = arg {
                        node.walk(visit);
                    }
                }
                call.target.walk(visit);
            }
            Node::Unknown
            | Node::Nil
            | Node::Bool(_)
            | Node::Int(_)
            | Node::Float(_)
            | Node::Str(_)
            | Node::Blob(_)
            | Node::Hll(_)
            | Node::Geo(_)
            | Node::List(_)
            | Node::Map(_)
            | Node::DigestMod(_)
            | Node::Meta(_)
            | Node::Key(_)
            | Node::Bin(..)
            | Node::BinType(_)
            | Node::BinExists(_)
            | Node::ResultRemove
            | Node::VarBuiltin(..)
            | Node::Var(_) => {}
        }
    }
}

/// A parsed expression: the tree, its static type and how many variable
/// slots evaluation needs.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub root: Node,
    pub ty: Ty,
    pub slots: usize,
}

/// Parses a whole expression (`bytes` holds exactly one).
pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed, ExpError> {
    parse_at(bytes, 0)
}

/// [`parse`] for an expression nested `depth` deep in another (a path's
/// filter or modify expression): the nesting limit counts both.
fn parse_at(bytes: &[u8], depth: usize) -> Result<Parsed, ExpError> {
    if bytes.len() > MAX_SIZE {
        return Err(ExpError::Parameter);
    }
    let mut parser = Parser {
        cur: Cursor::new(bytes),
        scope: Vec::new(),
        next_slot: 0,
        max_slots: 0,
    };
    let (root, ty) = parser.node(depth)?;
    if !parser.cur.is_empty() {
        return Err(ExpError::Parameter);
    }
    debug_assert!(parser.scope.is_empty() && parser.next_slot == 0);
    Ok(Parsed {
        root,
        ty,
        slots: parser.max_slots,
    })
}

/// A variable in scope; `ty` is `None` while its definition is parsed.
struct Var<'a> {
    name: &'a [u8],
    slot: usize,
    ty: Option<Ty>,
}

struct Parser<'a> {
    cur: Cursor<'a>,
    scope: Vec<Var<'a>>,
    next_slot: usize,
    max_slots: usize,
}

const PARAM: ExpError = ExpError::Parameter;

fn want(ok: bool) -> Result<(), ExpError> {
    if ok {
        Ok(())
    } else {
        Err(PARAM)
    }
}

fn bin_name_ok(name: &[u8]) -> bool {
    name.len() <= BIN_NAME_MAX
}

/// Let variable names: a letter or underscore, then letters, digits,
/// underscores (ASCII, as `isalpha`/`isalnum` in the C locale).
fn var_name_ok(name: &[u8]) -> bool {
    match name.split_first() {
        Some((first, rest)) => {
            (first.is_ascii_alphabetic() || *first == b'_')
                && rest.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_')
        }
        None => false,
    }
}

/// A GeoJSON particle around `text`: flags 0, no cells.
pub(crate) fn geo_particle(text: &[u8]) -> Vec<u8> {
    let mut particle = Vec::with_capacity(3 + text.len());
    particle.extend_from_slice(&[0, 0, 0]);
    particle.extend_from_slice(text);
    particle
}

impl<'a> Parser<'a> {
    fn node(&mut self, depth: usize) -> Result<(Node, Ty), ExpError> {
        if depth >= MAX_DEPTH {
            return Err(PARAM);
        }
        match self.cur.peek().ok_or(PARAM)? {
            Kind::Nil => {
                self.cur.value().ok_or(PARAM)?;
                Ok((Node::Nil, Ty::Nil))
            }
            Kind::Bool => Ok((Node::Bool(self.cur.boolean().ok_or(PARAM)?), Ty::Bool)),
            Kind::Int => Ok((Node::Int(self.cur.int().ok_or(PARAM)?), Ty::Int)),
            Kind::Float => Ok((Node::Float(self.cur.float().ok_or(PARAM)?), Ty::Float)),
            Kind::Bytes => {
                let payload = self.cur.bytes().ok_or(PARAM)?;
                let (&prefix, content) = payload.split_first().ok_or(PARAM)?;
                match prefix {
                    value::STRING_PREFIX => Ok((Node::Str(content.to_vec()), Ty::Str)),
                    4 => Ok((Node::Blob(content.to_vec()), Ty::Blob)),
                    18 => Ok((Node::Hll(content.to_vec()), Ty::Hll)),
                    value::GEOJSON_PREFIX => {
                        // The reference parses the GeoJSON here; this
                        // server has no geometry yet and only keeps text.
                        want(!content.is_empty() && std::str::from_utf8(content).is_ok())?;
                        Ok((Node::Geo(geo_particle(content)), Ty::Geo))
                    }
                    _ => Err(PARAM),
                }
            }
            Kind::Map => {
                let bytes = self.cur.value().ok_or(PARAM)?;
                Ok((Node::Map(literal(bytes, false)?), Ty::Map))
            }
            Kind::Array => self.op(depth),
            Kind::Other => Err(PARAM),
        }
    }

    /// `n` operands all of type `ty`.
    fn typed(&mut self, n: usize, ty: Ty, depth: usize) -> Result<Vec<Node>, ExpError> {
        let mut out = Vec::with_capacity(n.min(16));
        for _ in 0..n {
            let (node, t) = self.node(depth + 1)?;
            want(t == ty)?;
            out.push(node);
        }
        Ok(out)
    }

    fn one(&mut self, ty: Ty, depth: usize) -> Result<Box<Node>, ExpError> {
        let (node, t) = self.node(depth + 1)?;
        want(t == ty)?;
        Ok(Box::new(node))
    }

    fn two(&mut self, a: Ty, b: Ty, depth: usize) -> Result<Box<[Node; 2]>, ExpError> {
        let (x, tx) = self.node(depth + 1)?;
        let (y, ty) = self.node(depth + 1)?;
        want(tx == a && ty == b)?;
        Ok(Box::new([x, y]))
    }

    /// Operands of the variadic arithmetic ops: all integers or all floats.
    fn numbers(&mut self, n: usize, depth: usize) -> Result<(Vec<Node>, Ty), ExpError> {
        want(n >= 1)?;
        let mut ty = None;
        let mut out = Vec::with_capacity(n.min(16));
        for _ in 0..n {
            let (node, t) = self.node(depth + 1)?;
            want(matches!(t, Ty::Int | Ty::Float) && ty.is_none_or(|ty| ty == t))?;
            ty = Some(t);
            out.push(node);
        }
        Ok((out, ty.ok_or(PARAM)?))
    }

    fn bin_name(&mut self) -> Result<Vec<u8>, ExpError> {
        let name = self.cur.bytes().ok_or(PARAM)?;
        want(bin_name_ok(name))?;
        Ok(name.to_vec())
    }

    /// One operation: `[code, args...]`, dispatched by its code's family.
    fn op(&mut self, depth: usize) -> Result<(Node, Ty), ExpError> {
        let count = self.cur.array().ok_or(PARAM)?;
        want(count >= 1)?;
        let code = self.cur.uint().ok_or(PARAM)?;
        let n = count - 1;
        match code {
            0..=19 => self.logic_op(code, n, depth),
            20..=51 => self.number_op(code, n, depth),
            64..=83 => self.record_op(code, n),
            99..=128 => self.flow_op(code, n, depth),
            _ => Err(PARAM),
        }
    }

    /// Comparisons, matching and boolean logic (codes 0-19).
    fn logic_op(&mut self, code: u64, n: usize, depth: usize) -> Result<(Node, Ty), ExpError> {
        let arity = |expected: usize| want(n == expected);
        Ok(match code {
            0 => {
                arity(0)?;
                (Node::Unknown, Ty::Bool)
            }
            1..=6 => {
                arity(2)?;
                let op = match code {
                    1 => CmpOp::Eq,
                    2 => CmpOp::Ne,
                    3 => CmpOp::Gt,
                    4 => CmpOp::Ge,
                    5 => CmpOp::Lt,
                    _ => CmpOp::Le,
                };
                let (a, ta) = self.node(depth + 1)?;
                let (b, tb) = self.node(depth + 1)?;
                want(ta == tb && !matches!(ta, Ty::Geo | Ty::Hll))?;
                (Node::Compare(op, ta, Box::new([a, b])), Ty::Bool)
            }
            7 => {
                arity(3)?;
                let flags = self.cur.int().ok_or(PARAM)?;
                let pattern = self.cur.bytes().ok_or(PARAM)?;
                let subject = self.one(Ty::Str, depth)?;
                let regex = posix::compile(pattern, flags).map_err(|_| PARAM)?;
                (Node::Regex(Box::new(regex), subject), Ty::Bool)
            }
            8 => {
                arity(2)?;
                let mut side = || -> Result<(Node, Option<citrine_geo::Shape>), ExpError> {
                    let (node, ty) = self.node(depth + 1)?;
                    want(ty == Ty::Geo)?;
                    let shape = match &node {
                        // A literal that is no shape is refused now.
                        Node::Geo(particle) => Some(
                            citrine_geo::Shape::parse(particle.get(3..).unwrap_or_default())
                                .ok_or(PARAM)?,
                        ),
                        _ => None,
                    };
                    Ok((node, shape))
                };
                let left = side()?;
                let right = side()?;
                (Node::GeoCmp(Box::new([left, right])), Ty::Bool)
            }
            9 => {
                arity(2)?;
                let (value, _) = self.node(depth + 1)?;
                let (list, tl) = self.node(depth + 1)?;
                want(tl == Ty::List)?;
                (Node::InList(Box::new([value, list])), Ty::Bool)
            }
            16 | 17 | 19 => {
                want(n >= 2)?;
                let args = self.typed(n, Ty::Bool, depth)?;
                let node = match code {
                    16 => Node::And(args),
                    17 => Node::Or(args),
                    _ => Node::Exclusive(args),
                };
                (node, Ty::Bool)
            }
            18 => {
                arity(1)?;
                (Node::Not(self.one(Ty::Bool, depth)?), Ty::Bool)
            }
            _ => return Err(PARAM),
        })
    }
    /// Arithmetic and integer bit operations (codes 20-51).
    fn number_op(&mut self, code: u64, n: usize, depth: usize) -> Result<(Node, Ty), ExpError> {
        match code {
            20..=31 | 50 | 51 => self.arith_op(code, n, depth),
            32..=41 => self.int_bits_op(code, n, depth),
            _ => Err(PARAM),
        }
    }
    /// Arithmetic (codes 20-31, 50 and 51).
    fn arith_op(&mut self, code: u64, n: usize, depth: usize) -> Result<(Node, Ty), ExpError> {
        let arity = |expected: usize| want(n == expected);
        Ok(match code {
            20..=23 | 50 | 51 => {
                let op = match code {
                    20 => Arith::Add,
                    21 => Arith::Sub,
                    22 => Arith::Mul,
                    23 => Arith::Div,
                    50 => Arith::Min,
                    _ => Arith::Max,
                };
                let (args, ty) = self.numbers(n, depth)?;
                (Node::Arith(op, ty == Ty::Float, args), ty)
            }
            24 | 25 => {
                arity(2)?;
                let args = self.two(Ty::Float, Ty::Float, depth)?;
                let node = if code == 24 {
                    Node::Pow(args)
                } else {
                    Node::Log(args)
                };
                (node, Ty::Float)
            }
            26 => {
                arity(2)?;
                (Node::Mod(self.two(Ty::Int, Ty::Int, depth)?), Ty::Int)
            }
            27 => {
                arity(1)?;
                let (arg, ty) = self.node(depth + 1)?;
                want(matches!(ty, Ty::Int | Ty::Float))?;
                (Node::Abs(Box::new(arg)), ty)
            }
            28 | 29 => {
                arity(1)?;
                let arg = self.one(Ty::Float, depth)?;
                let node = if code == 28 {
                    Node::Floor(arg)
                } else {
                    Node::Ceil(arg)
                };
                (node, Ty::Float)
            }
            30 => {
                arity(1)?;
                (Node::ToInt(self.one(Ty::Float, depth)?), Ty::Int)
            }
            31 => {
                arity(1)?;
                (Node::ToFloat(self.one(Ty::Int, depth)?), Ty::Float)
            }
            _ => return Err(PARAM),
        })
    }
    /// Integer bit operations (codes 32-41).
    fn int_bits_op(&mut self, code: u64, n: usize, depth: usize) -> Result<(Node, Ty), ExpError> {
        let arity = |expected: usize| want(n == expected);
        Ok(match code {
            32..=34 => {
                want(n >= 1)?;
                let op = match code {
                    32 => IntOp::And,
                    33 => IntOp::Or,
                    _ => IntOp::Xor,
                };
                (Node::IntBits(op, self.typed(n, Ty::Int, depth)?), Ty::Int)
            }
            35 | 39 => {
                arity(1)?;
                let arg = self.one(Ty::Int, depth)?;
                let node = if code == 35 {
                    Node::IntNot(arg)
                } else {
                    Node::Count(arg)
                };
                (node, Ty::Int)
            }
            36..=38 => {
                arity(2)?;
                let kind = match code {
                    36 => Shift::Left,
                    37 => Shift::Right,
                    _ => Shift::Arith,
                };
                (
                    Node::Shift(kind, self.two(Ty::Int, Ty::Int, depth)?),
                    Ty::Int,
                )
            }
            40 | 41 => {
                arity(2)?;
                (
                    Node::Scan(code == 40, self.two(Ty::Int, Ty::Bool, depth)?),
                    Ty::Int,
                )
            }
            _ => return Err(PARAM),
        })
    }
    /// The record's digest, metadata, key and bins (codes 64-83).
    fn record_op(&mut self, code: u64, n: usize) -> Result<(Node, Ty), ExpError> {
        let arity = |expected: usize| want(n == expected);
        Ok(match code {
            64 => {
                arity(1)?;
                // The reference keeps the modulus as a 32-bit integer.
                let modulus = i64::from(self.cur.int().ok_or(PARAM)? as i32);
                want(modulus != 0)?;
                (Node::DigestMod(modulus), Ty::Int)
            }
            65..=74 => {
                arity(0)?;
                let (meta, ty) = match code {
                    65 => (Meta::DeviceSize, Ty::Int),
                    66 => (Meta::LastUpdate, Ty::Int),
                    67 => (Meta::SinceUpdate, Ty::Int),
                    68 => (Meta::VoidTime, Ty::Int),
                    69 => (Meta::Ttl, Ty::Int),
                    70 => (Meta::SetName, Ty::Str),
                    71 => (Meta::KeyExists, Ty::Bool),
                    72 => (Meta::IsTombstone, Ty::Bool),
                    73 => (Meta::MemorySize, Ty::Int),
                    _ => (Meta::RecordSize, Ty::Int),
                };
                (Node::Meta(meta), ty)
            }
            80 => {
                arity(1)?;
                let ty = match self.cur.uint().ok_or(PARAM)? {
                    2 => Ty::Int,
                    3 => Ty::Str,
                    6 => Ty::Blob,
                    _ => return Err(PARAM),
                };
                (Node::Key(ty), ty)
            }
            81 => {
                arity(2)?;
                let ty = Ty::from_wire(self.cur.uint().ok_or(PARAM)?).ok_or(PARAM)?;
                (Node::Bin(ty, self.bin_name()?), ty)
            }
            82 => {
                arity(1)?;
                (Node::BinType(self.bin_name()?), Ty::Int)
            }
            83 => {
                arity(1)?;
                (Node::BinExists(self.bin_name()?), Ty::Bool)
            }
            _ => return Err(PARAM),
        })
    }
    /// Results, variables, control flow, literals and module calls (codes 99-128).
    fn flow_op(&mut self, code: u64, n: usize, depth: usize) -> Result<(Node, Ty), ExpError> {
        let arity = |expected: usize| want(n == expected);
        Ok(match code {
            // to_string: the reference's number formatting is not
            // established yet.
            99 => return Err(ExpError::Unsupported),
            100 => {
                arity(0)?;
                (Node::ResultRemove, Ty::Remove)
            }
            101 | 102 => {
                arity(1)?;
                let (map, _) = self.node(depth + 1)?;
                (Node::MapKeys(code == 102, Box::new(map)), Ty::List)
            }
            122 => {
                arity(2)?;
                let ty = Ty::from_wire(self.cur.uint().ok_or(PARAM)?).ok_or(PARAM)?;
                let index = self.cur.uint().ok_or(PARAM)?;
                want(index < 3 && (index != 2 || ty == Ty::Int))?;
                (Node::VarBuiltin(ty, index as u8), ty)
            }
            123 => self.cond(n, depth)?,
            124 => {
                arity(1)?;
                let name = self.cur.bytes().ok_or(PARAM)?;
                let var = self
                    .scope
                    .iter()
                    .rev()
                    .find(|var| var.name == name)
                    .ok_or(PARAM)?;
                // A variable used inside its own definition has no type.
                let ty = var.ty.ok_or(PARAM)?;
                (Node::Var(var.slot), ty)
            }
            125 => self.let_(n, depth)?,
            126 => {
                arity(1)?;
                want(self.cur.peek() == Some(Kind::Array))?;
                let bytes = self.cur.value().ok_or(PARAM)?;
                (Node::List(literal(bytes, true)?), Ty::List)
            }
            127 => {
                arity(4)?;
                self.call(depth)?
            }
            // An expression in the AEL text language.
            128 => return Err(ExpError::Unsupported),
            _ => return Err(PARAM),
        })
    }
    fn cond(&mut self, n: usize, depth: usize) -> Result<(Node, Ty), ExpError> {
        want(n >= 3 && n % 2 == 1)?;
        let mut ty = None;
        let mut cases = Vec::with_capacity((n / 2).min(16));
        for _ in 0..n / 2 {
            let (test, tt) = self.node(depth + 1)?;
            want(tt == Ty::Bool)?;
            let (action, ta) = self.node(depth + 1)?;
            // An `unknown` action fits any type.
            if !matches!(action, Node::Unknown) {
                let expected = *ty.get_or_insert(ta);
                want(ta == expected)?;
            }
            cases.push((test, action));
        }
        let (default, td) = self.node(depth + 1)?;
        let ty = match ty {
            None => td,
            Some(ty) => {
                want(matches!(default, Node::Unknown) || td == ty)?;
                ty
            }
        };
        Ok((Node::Cond(cases, Box::new(default)), ty))
    }

    fn let_(&mut self, n: usize, depth: usize) -> Result<(Node, Ty), ExpError> {
        want(n >= 3 && n % 2 == 1)?;
        let vars = n / 2;
        let mut defs = Vec::with_capacity(vars.min(16));
        for _ in 0..vars {
            let name = self.cur.bytes().ok_or(PARAM)?;
            want(var_name_ok(name))?;
            // Names are unique across all enclosing scopes.
            want(!self.scope.iter().any(|var| var.name == name))?;
            let slot = self.next_slot;
            self.next_slot += 1;
            self.scope.push(Var {
                name,
                slot,
                ty: None,
            });
            let (def, ty) = self.node(depth + 1)?;
            if let Some(var) = self.scope.last_mut() {
                var.ty = Some(ty);
            }
            defs.push((slot, def));
        }
        let (body, ty) = self.node(depth + 1)?;
        self.max_slots = self.max_slots.max(self.next_slot);
        debug_assert!(self.scope.len() >= vars && self.next_slot >= vars);
        self.scope.truncate(self.scope.len() - vars);
        self.next_slot -= vars;
        Ok((Node::Let(defs, Box::new(body)), ty))
    }

    fn call(&mut self, depth: usize) -> Result<(Node, Ty), ExpError> {
        let ret = Ty::from_wire(self.cur.uint().ok_or(PARAM)?).ok_or(PARAM)?;
        let system = self.cur.uint().ok_or(PARAM)?;
        let module = match system & !0x40 {
            0 => Module::Cdt,
            1 => Module::Bits,
            2 => Module::Hll,
            // Any other module, the string module of servers 8.2+ (3)
            // included: 4, as the reference (8.1.2) refuses it.
            _ => return Err(PARAM),
        };
        let modify = system & 0x40 != 0;

        if module == Module::Cdt {
            if let Some(path) = self.path_call(ret, modify, depth)? {
                return Ok((path, ret));
            }
        }
        let (header, count) = self.call_header(module)?;
        let args = self.call_args(count, depth)?;
        let (target, tt) = self.node(depth + 1)?;
        let fits = match module {
            Module::Cdt => matches!(tt, Ty::List | Ty::Map),
            Module::Bits => tt == Ty::Blob,
            Module::Hll => tt == Ty::Hll,
        };
        want(fits || tt == Ty::Nil)?;
        let call = Call {
            ret,
            module,
            modify,
            header,
            args,
            target,
        };
        Ok((Node::Call(Box::new(call)), ret))
    }
    /// A CDT call whose payload is a path (SELECT or apply) and its
    /// target; `None` (nothing read) when the payload is no path.
    fn path_call(&mut self, ret: Ty, modify: bool, depth: usize) -> Result<Option<Node>, ExpError> {
        let mut ahead = self.cur;
        let payload = ahead.value().ok_or(PARAM)?;
        if !citrine_cdt::path::is_path(payload) {
            return Ok(None);
        }
        self.cur = ahead;
        let (target, tt) = self.node(depth + 1)?;
        want(matches!(tt, Ty::List | Ty::Map | Ty::Nil))?;
        let call = path_request(payload, ret, target, depth)?;
        let apply = call.path.mode() == citrine_cdt::path::Mode::Apply;
        want(apply == modify)?;
        Ok(Some(Node::Path(Box::new(call))))
    }
    /// The op payload's head, `[op` or `[0xff, ctx, [op` (a context only
    /// for CDT calls): its bytes, and how many items its array has.
    fn call_header(&mut self, module: Module) -> Result<(Vec<u8>, usize), ExpError> {
        let start = self.cur.at();
        let mut count = self.cur.array().ok_or(PARAM)?;
        want(count >= 1)?;
        let mut code = self.cur.uint().ok_or(PARAM)?;
        if code == CDT_CONTEXT_EVAL {
            want(module == Module::Cdt && count == 3)?;
            self.cur.value().ok_or(PARAM)?;
            count = self.cur.array().ok_or(PARAM)?;
            want(count >= 1)?;
            code = self.cur.uint().ok_or(PARAM)?;
        }
        if code == CDT_SELECT {
            // A path payload is handled above; a SELECT under a context or
            // another module is no payload the reference takes.
            return Err(PARAM);
        }
        Ok((self.cur.since(start).to_vec(), count))
    }
    /// The op's `count - 1` arguments: raw values, or expressions
    /// (arrays) evaluated per record.
    fn call_args(&mut self, count: usize, depth: usize) -> Result<Vec<Arg>, ExpError> {
        // Vectors, as the reference splits the payload: the header and each
        // run of raw arguments is one, each evaluated argument another.
        let mut vecs = 0usize;
        let mut open = true; // the current vector has bytes
        let mut args = Vec::with_capacity((count - 1).min(16));
        for _ in 1..count {
            match self.cur.peek().ok_or(PARAM)? {
                Kind::Array => {
                    if open {
                        vecs += 1;
                        want(vecs < CALL_MAX_VECS)?;
                    }
                    vecs += 1;
                    want(vecs < CALL_MAX_VECS)?;
                    open = false;
                    let (arg, _) = self.node(depth + 1)?;
                    args.push(Arg::Exp(arg));
                }
                _ => {
                    let raw = self.cur.value().ok_or(PARAM)?;
                    open = true;
                    args.push(Arg::Raw(raw.to_vec()));
                }
            }
        }
        if open {
            want(vecs < CALL_MAX_VECS)?;
        }
        Ok(args)
    }
}

/// A list (quoted) or map literal in canonical form.
fn literal(bytes: &[u8], list: bool) -> Result<Lit, ExpError> {
    let mut decoded = value::decode(bytes).map_err(|_| PARAM)?;
    want(matches!(
        (&decoded, list),
        (Value::List(_), true) | (Value::Map(_), false)
    ))?;
    value::canonicalize(&mut decoded);
    want(value::depth(&decoded) <= value::MAX_DEPTH)?;
    let bytes = value::to_bytes(&decoded);
    debug_assert!(value::decode(&bytes).is_ok_and(|again| value::to_bytes(&again) == bytes));
    Ok(Lit { bytes })
}
