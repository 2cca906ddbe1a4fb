//! HyperLogLog bins and their operations (op types `HLL_READ` 15 and
//! `HLL_MODIFY` 16; protocol 05 §3), with the reference server's
//! semantics: HyperMinHash sketches (see `sketch` for the particle
//! layout), values hashed with MurmurHash3 x64-128 over their msgpack
//! bytes exactly as the client sent them.
//!
//! Owns: parsing an HLL op payload (`[code, args...]`), the
//! create/update/no-fail flag rules, choosing the shape of the sketch a
//! modify op writes, and the result of each op:
//!
//! | code | op | result |
//! |---|---|---|
//! | 0 | INIT | none |
//! | 1 | ADD | integer: how many values changed a register |
//! | 2 | SET_UNION | none |
//! | 3 | REFRESH_COUNT | integer: the count, now cached in the bin |
//! | 4 | FOLD | none |
//! | 50 | COUNT | integer |
//! | 51 | GET_UNION | HLL particle |
//! | 52 / 53 | UNION_COUNT / INTERSECT_COUNT | integer |
//! | 54 | SIMILARITY | float |
//! | 55 | DESCRIBE | list `[index_bits, minhash_bits]` |
//! | 56 | MAY_CONTAIN | integer 1 when adding every value would change nothing, else 0 |
//!
//! Invariants: [`operate`] never panics; an error changes nothing; a bin
//! written back is a valid sketch whose length matches its header; a read
//! of a missing bin answers nothing; a modify code under the read op type
//! (or the reverse) is a parameter error.

mod murmur3;
mod sketch;

use crate::{to_particle, CdtError, Outcome, Value};
use citrine_types::ParticleType;
use sketch::{Check, Shape, Sketch};

/// Write flags (`HLLWriteFlags`).
const CREATE_ONLY: u64 = 0x01;
const UPDATE_ONLY: u64 = 0x02;
const NO_FAIL: u64 = 0x04;
const ALLOW_FOLD: u64 = 0x08;

// Modify op codes.
const INIT: u64 = 0;
const ADD: u64 = 1;
const SET_UNION: u64 = 2;
const REFRESH_COUNT: u64 = 3;
const FOLD: u64 = 4;
// Read op codes.
const COUNT: u64 = 50;
const GET_UNION: u64 = 51;
const UNION_COUNT: u64 = 52;
const INTERSECT_COUNT: u64 = 53;
const SIMILARITY: u64 = 54;
const DESCRIBE: u64 = 55;
const MAY_CONTAIN: u64 = 56;

/// Whether `bytes` may be stored as an HLL bin (what a plain write of an
/// HLL particle must satisfy; the reference refuses others with result
/// code 4).
pub fn valid_particle(bytes: &[u8]) -> bool {
    Sketch::parse(bytes, Check::Stored).is_some()
}

/// Applies one op: `payload` is the op's value (msgpack), `bin` the named
/// bin's particle type and bytes when the record has it, `modify` whether
/// the op came as the modify op type.
pub fn operate(
    payload: &[u8],
    bin: Option<(u8, &[u8])>,
    modify: bool,
) -> Result<Outcome, CdtError> {
    if !modify && bin.is_none() {
        // A read of a missing bin answers nothing (02 §8).
        return Ok(Outcome::default());
    }
    let current = match bin {
        None => None,
        Some((particle, bytes)) if particle == ParticleType::Hll as u8 => Some(
            // The reference answers "unknown" for a corrupt stored sketch;
            // no such bin can be stored here, so the nearest code will do.
            Sketch::parse(bytes, Check::Stored).ok_or(CdtError::Parameter)?,
        ),
        Some(_) => return Err(CdtError::IncompatibleType),
    };
    let op = Op::parse(payload, modify)?;
    if modify {
        modify_op(&op, current)
    } else {
        let current = current.ok_or(CdtError::Parameter)?;
        read_op(&op, &current)
    }
}

/// One kind of argument, in payload order.
#[derive(Clone, Copy, Debug)]
enum Arg {
    /// A list of values to hash (no lists or maps among them).
    Values,
    /// A list of HLL blobs.
    Sketches,
    /// Index bit count, or -1 for "unset".
    IndexBits,
    /// Minhash bit count, or -1 for "unset".
    MinhashBits,
    /// Write flags.
    Flags,
}

/// What an op code takes: at least `min` of `args` (in order), and the
/// write flags it accepts.
struct Signature {
    min: usize,
    args: &'static [Arg],
    flags: u64,
}

fn signature(code: u64, modify: bool) -> Option<Signature> {
    use Arg::*;
    let sig = |min, args, flags| Some(Signature { min, args, flags });
    match (modify, code) {
        (true, INIT) => sig(
            0,
            &[IndexBits, MinhashBits, Flags],
            CREATE_ONLY | UPDATE_ONLY | NO_FAIL,
        ),
        (true, ADD) => sig(
            1,
            &[Values, IndexBits, MinhashBits, Flags],
            CREATE_ONLY | NO_FAIL,
        ),
        (true, SET_UNION) => sig(
            1,
            &[Sketches, Flags],
            CREATE_ONLY | UPDATE_ONLY | NO_FAIL | ALLOW_FOLD,
        ),
        (true, REFRESH_COUNT) => sig(0, &[], 0),
        (true, FOLD) => sig(1, &[IndexBits], 0),
        (false, COUNT | DESCRIBE) => sig(0, &[], 0),
        (false, GET_UNION | UNION_COUNT | INTERSECT_COUNT | SIMILARITY) => sig(1, &[Sketches], 0),
        (false, MAY_CONTAIN) => sig(1, &[Values], 0),
        _ => None,
    }
}

/// A parsed op.
#[derive(Debug, Default)]
struct Op<'a> {
    code: u64,
    /// Values' msgpack bytes, as sent.
    values: Vec<&'a [u8]>,
    sketches: Vec<Sketch>,
    /// `None` when absent or -1.
    index_bits: Option<u8>,
    minhash_bits: Option<u8>,
    flags: u64,
}

impl<'a> Op<'a> {
    fn parse(payload: &'a [u8], modify: bool) -> Result<Op<'a>, CdtError> {
        let mut reader = Reader::new(payload);
        let count = reader.array_len().ok_or(CdtError::Parameter)?;
        if count == 0 {
            return Err(CdtError::Parameter);
        }
        let code = reader.uint().ok_or(CdtError::Parameter)?;
        let sig = signature(code, modify).ok_or(CdtError::Parameter)?;
        let n_args = count - 1;
        if n_args < sig.min || n_args > sig.args.len() {
            return Err(CdtError::Parameter);
        }
        let mut op = Op {
            code,
            ..Op::default()
        };
        for arg in &sig.args[..n_args] {
            op.parse_arg(*arg, &mut reader, sig.flags)?;
        }
        if matches!(code, INTERSECT_COUNT | SIMILARITY) && op.sketches.len() > 2 {
            // More than three sketches in all only work with a common,
            // non-zero minhash bit count.
            let q = op.sketches[0].shape().q;
            if q == 0 || op.sketches.iter().any(|s| s.shape().q != q) {
                return Err(CdtError::Parameter);
            }
        }
        Ok(op)
    }

    fn parse_arg(
        &mut self,
        arg: Arg,
        reader: &mut Reader<'a>,
        allowed_flags: u64,
    ) -> Result<(), CdtError> {
        match arg {
            Arg::Values => {
                let n = reader.array_len().ok_or(CdtError::Parameter)?;
                if n == 0 {
                    return Err(CdtError::Parameter);
                }
                self.values = Vec::with_capacity(n.min(4096));
                for _ in 0..n {
                    self.values
                        .push(reader.scalar().ok_or(CdtError::Parameter)?);
                }
            }
            Arg::Sketches => {
                // A list of HLLs, or one HLL alone (what an expression's
                // HLL-valued argument packs to).
                let n = if reader.peek().is_some_and(is_array_header) {
                    reader.array_len().ok_or(CdtError::Parameter)?
                } else {
                    1
                };
                if n == 0 {
                    return Err(CdtError::Parameter);
                }
                self.sketches = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    let blob = reader.bytes().ok_or(CdtError::Parameter)?;
                    // A particle-type byte, then the sketch.
                    let sketch = match blob.split_first() {
                        Some((_, sketch)) if sketch.len() >= sketch::HEADER_LEN => {
                            Sketch::parse(sketch, Check::Argument)
                        }
                        _ => None,
                    };
                    self.sketches.push(sketch.ok_or(CdtError::Parameter)?);
                }
            }
            Arg::IndexBits => {
                let p = reader.int().ok_or(CdtError::Parameter)?;
                self.index_bits = match p {
                    -1 => None,
                    p if sketch::valid_index_bits(p as u64) => Some(p as u8),
                    _ => return Err(CdtError::Parameter),
                };
            }
            Arg::MinhashBits => {
                let q = reader.int().ok_or(CdtError::Parameter)?;
                self.minhash_bits = match q {
                    -1 => None,
                    q if sketch::valid_minhash_bits(q as u64) => {
                        if let Some(p) = self.index_bits {
                            if !sketch::valid_combined_bits(u64::from(p), q as u64) {
                                return Err(CdtError::Parameter);
                            }
                        }
                        Some(q as u8)
                    }
                    _ => return Err(CdtError::Parameter),
                };
            }
            Arg::Flags => {
                let flags = reader.uint().ok_or(CdtError::Parameter)?;
                if flags & !allowed_flags != 0
                    || (flags & CREATE_ONLY != 0 && flags & UPDATE_ONLY != 0)
                {
                    return Err(CdtError::Parameter);
                }
                self.flags = flags;
            }
        }
        Ok(())
    }
}

/// A modify op on the bin's current sketch (`None`: no bin).
fn modify_op(op: &Op, current: Option<Sketch>) -> Result<Outcome, CdtError> {
    match (&current, op.flags) {
        (Some(_), flags) if flags & CREATE_ONLY != 0 => {
            return if flags & NO_FAIL != 0 {
                Ok(Outcome::default())
            } else {
                Err(CdtError::BinExists)
            };
        }
        (None, flags) if flags & UPDATE_ONLY != 0 => {
            return if flags & NO_FAIL != 0 {
                Ok(Outcome::default())
            } else {
                Err(CdtError::BinNotFound)
            };
        }
        _ => {}
    }
    let (after, result) = match op.code {
        INIT => (Sketch::new(init_shape(op, current.as_ref())?), None),
        ADD => {
            let mut sketch = match current {
                Some(sketch) => sketch,
                None => Sketch::new(new_shape(op)?),
            };
            let changed = op.values.iter().filter(|v| sketch.add(v)).count() as u64;
            (sketch, Some(int(changed)))
        }
        SET_UNION => {
            let shape = union_shape(op, current.as_ref())?;
            let mut all: Vec<&Sketch> = op.sketches.iter().collect();
            all.extend(current.as_ref());
            debug_assert_eq!(sketch::common_shape(&all), Some(shape));
            let mut union = Sketch::new(shape);
            for sketch in &all {
                union.union_with(sketch);
            }
            (union, None)
        }
        REFRESH_COUNT => {
            let mut sketch = current.ok_or(CdtError::BinNotFound)?;
            let count = sketch.refresh();
            (sketch, Some(int(count)))
        }
        FOLD => {
            let old = current.ok_or(CdtError::BinNotFound)?;
            let old_shape = old.shape();
            let p = op.index_bits.ok_or(CdtError::OpNotApplicable)?;
            if old_shape.q != 0 || old_shape.p < p {
                return Err(CdtError::OpNotApplicable);
            }
            if old_shape.p == p {
                (old, None)
            } else {
                let mut folded = Sketch::new(Shape { p, q: 0 });
                folded.union_with(&old);
                (folded, None)
            }
        }
        _ => return Err(CdtError::Parameter),
    };
    Ok(Outcome {
        bin: Some((ParticleType::Hll as u8, after.to_bytes())),
        result,
    })
}

/// The shape of a sketch INIT or ADD creates: index bits required,
/// minhash bits 0 when unset.
fn new_shape(op: &Op) -> Result<Shape, CdtError> {
    let p = op.index_bits.ok_or(CdtError::OpNotApplicable)?;
    Ok(Shape {
        p,
        q: op.minhash_bits.unwrap_or(0),
    })
}

/// INIT's shape: unset counts keep the existing bin's.
fn init_shape(op: &Op, current: Option<&Sketch>) -> Result<Shape, CdtError> {
    let Some(old) = current else {
        return new_shape(op);
    };
    let old = old.shape();
    let shape = Shape {
        p: op.index_bits.unwrap_or(old.p),
        q: op.minhash_bits.unwrap_or(old.q),
    };
    if !sketch::valid_combined_bits(u64::from(shape.p), u64::from(shape.q)) {
        return Err(CdtError::OpNotApplicable);
    }
    Ok(shape)
}

/// SET_UNION's shape. Without a bin: the arguments' common shape. With
/// one: the bin's, unless that would take finer registers than an
/// argument has (or minhash bits one lacks) — refused without
/// ALLOW_FOLD, folded down with it.
fn union_shape(op: &Op, current: Option<&Sketch>) -> Result<Shape, CdtError> {
    let refs: Vec<&Sketch> = op.sketches.iter().collect();
    let args = sketch::common_shape(&refs).ok_or(CdtError::Parameter)?;
    let Some(old) = current else {
        return Ok(args);
    };
    let old = old.shape();
    if op.flags & ALLOW_FOLD == 0 {
        if old.p > args.p || (old.q != 0 && old.q != args.q) {
            return Err(CdtError::OpNotApplicable);
        }
        Ok(old)
    } else {
        Ok(Shape {
            p: old.p.min(args.p),
            q: if old.q == args.q { args.q } else { 0 },
        })
    }
}

/// A read op on the bin's sketch.
fn read_op(op: &Op, current: &Sketch) -> Result<Outcome, CdtError> {
    // The op's sketches, then the bin's.
    let mut all: Vec<&Sketch> = op.sketches.iter().collect();
    all.push(current);
    let result = match op.code {
        COUNT => int(current.estimate()),
        GET_UNION => {
            let union = sketch::union_all(&all).ok_or(CdtError::Parameter)?;
            (ParticleType::Hll as u8, union.to_bytes())
        }
        UNION_COUNT => int(sketch::union_count(&all)),
        INTERSECT_COUNT | SIMILARITY => {
            if op.sketches.len() > 2 {
                // Parsing checked the arguments share their minhash bits.
                let q = op.sketches[0].shape().q;
                let mine = current.shape().q;
                if mine == 0 || mine != q {
                    return Err(CdtError::OpNotApplicable);
                }
            }
            if op.code == INTERSECT_COUNT {
                int(sketch::intersect_count(&all))
            } else {
                float(sketch::similarity(&all))
            }
        }
        DESCRIBE => {
            let shape = current.shape();
            to_particle(&Value::List(crate::value::List {
                flags: 0,
                items: vec![Value::Int(shape.p.into()), Value::Int(shape.q.into())],
            }))
        }
        MAY_CONTAIN => {
            let all_in = op.values.iter().all(|v| current.may_contain(v));
            int(u64::from(all_in))
        }
        _ => return Err(CdtError::Parameter),
    };
    Ok(Outcome {
        bin: None,
        result: Some(result),
    })
}

/// An integer result particle (the reference's counts are unsigned 64-bit,
/// sent as the 8 big-endian bytes).
fn int(n: u64) -> (u8, Vec<u8>) {
    (ParticleType::Integer as u8, n.to_be_bytes().to_vec())
}

fn float(x: f64) -> (u8, Vec<u8>) {
    (
        ParticleType::Float as u8,
        x.to_bits().to_be_bytes().to_vec(),
    )
}

/// The few msgpack reads an HLL payload needs, keeping the raw bytes of
/// values (they are hashed as sent). Every read returns `None` on
/// malformed or truncated input and leaves the position unspecified.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }

    fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn be(&mut self, n: usize) -> Option<u64> {
        Some(
            self.take(n)?
                .iter()
                .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)),
        )
    }

    /// The next byte, not taken.
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    /// An array header's element count.
    fn array_len(&mut self) -> Option<usize> {
        match self.byte()? {
            b @ 0x90..=0x9f => Some(usize::from(b & 0x0f)),
            0xdc => Some(self.be(2)? as usize),
            0xdd => Some(self.be(4)? as usize),
            _ => None,
        }
    }

    /// Any msgpack integer as its 64-bit two's-complement pattern.
    fn uint(&mut self) -> Option<u64> {
        let b = self.byte()?;
        Some(match b {
            0x00..=0x7f => u64::from(b),
            0xe0..=0xff => i64::from(b as i8) as u64,
            0xcc => self.be(1)?,
            0xcd => self.be(2)?,
            0xce => self.be(4)?,
            0xcf => self.be(8)?,
            0xd0 => i64::from(self.be(1)? as u8 as i8) as u64,
            0xd1 => i64::from(self.be(2)? as u16 as i16) as u64,
            0xd2 => i64::from(self.be(4)? as u32 as i32) as u64,
            0xd3 => self.be(8)?,
            _ => return None,
        })
    }

    fn int(&mut self) -> Option<i64> {
        self.uint().map(|u| u as i64)
    }

    /// The payload of a `str` or `bin`.
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = match self.byte()? {
            b @ 0xa0..=0xbf => usize::from(b & 0x1f),
            0xc4 | 0xd9 => self.be(1)? as usize,
            0xc5 | 0xda => self.be(2)? as usize,
            0xc6 | 0xdb => self.be(4)? as usize,
            _ => return None,
        };
        self.take(n)
    }

    /// The whole encoding of one value that is not an array or a map.
    fn scalar(&mut self) -> Option<&'a [u8]> {
        let start = self.at;
        let b = self.byte()?;
        let body = match b {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 0,
            0xa0..=0xbf => usize::from(b & 0x1f),
            0xcc | 0xd0 => 1,
            0xcd | 0xd1 => 2,
            0xce | 0xd2 | 0xca => 4,
            0xcf | 0xd3 | 0xcb => 8,
            0xc4 | 0xd9 => self.be(1)? as usize,
            0xc5 | 0xda => self.be(2)? as usize,
            0xc6 | 0xdb => self.be(4)? as usize,
            // fixext 1..16: type byte and data.
            0xd4 => 2,
            0xd5 => 3,
            0xd6 => 5,
            0xd7 => 9,
            0xd8 => 17,
            0xc7 => 1 + self.be(1)? as usize,
            0xc8 => 1 + self.be(2)? as usize,
            0xc9 => 1 + self.be(4)? as usize,
            // Arrays, maps and the unused 0xc1.
            _ => return None,
        };
        self.take(body)?;
        self.bytes.get(start..self.at)
    }
}

/// Whether `byte` starts a msgpack array.
fn is_array_header(byte: u8) -> bool {
    matches!(byte, 0x90..=0x9f | 0xdc | 0xdd)
}

#[cfg(test)]
mod tests;
