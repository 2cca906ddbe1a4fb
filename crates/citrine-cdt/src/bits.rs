//! Bitwise operations on blob bins (op types `BITS_READ` 12 and
//! `BITS_MODIFY` 13; protocol 05 §3): the reference server's resize,
//! insert, remove, set, or, xor, and, not, shifts, integer add, subtract
//! and set, and the reads get, count, scans and get-integer.
//!
//! A payload is `[op_code, args...]`; offsets count bits (bytes for insert
//! and remove) from the blob's first, most significant bit, and a negative
//! offset counts back from the blob's end. Modify ops (codes 0..=12) come
//! only as `BITS_MODIFY`, reads (50..=54) only as `BITS_READ`; anything
//! else is a parameter error.
//!
//! Reference behaviour kept here (aerospike-server `particle_blob.c`):
//! arguments are parsed and checked before the bin is looked at; only
//! resize and insert create a missing bin; a create-only write on an
//! existing bin answers `BinExists`, any other write on a missing bin
//! `BinNotFound`; a span past the blob's end answers `OpNotApplicable`
//! (`Parameter` for remove) unless the op is partial (cut at the end) or
//! no-fail (skipped); an integer overflow under the FAIL action answers
//! `OpNotApplicable`. A read of a missing bin answers nothing, unparsed.
//!
//! Invariants: [`operate`] never panics; a skipped (no-fail) or failed op
//! leaves the bin as it was (`Outcome.bin` is `None`); the in-place ops
//! never change the blob's length; a written blob is shorter than the
//! reference's 128 MiB bound.

use crate::value::{self, Value};
use crate::{to_particle, CdtError, Outcome};
use citrine_types::ParticleType;

/// The reference's bound on message and blob sizes (`PROTO_SIZE_MAX`).
const PROTO_SIZE_MAX: u64 = 128 * 1024 * 1024;
/// The same bound in bits: the largest offset, size or shift accepted.
const MAX_BITS: u64 = PROTO_SIZE_MAX * 8;

/// Write flags (the ops' policy argument).
const CREATE_ONLY: u64 = 0x01;
const UPDATE_ONLY: u64 = 0x02;
const NO_FAIL: u64 = 0x04;
const PARTIAL: u64 = 0x08;

/// Resize flags.
const FROM_FRONT: u64 = 0x01;
const GROW_ONLY: u64 = 0x02;
const SHRINK_ONLY: u64 = 0x04;

/// Integer sub-flags (add, subtract, get-integer).
const SIGNED: u64 = 0x01;
const SATURATE: u64 = 0x02;
const WRAP: u64 = 0x04;

/// The ops, by wire code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Code {
    Resize,
    Insert,
    Remove,
    Set,
    Or,
    Xor,
    And,
    Not,
    LShift,
    RShift,
    Add,
    Subtract,
    SetInt,
    Get,
    Count,
    LScan,
    RScan,
    GetInt,
}

impl Code {
    /// The op of a wire code, refusing a read code under the modify op
    /// type and the reverse, as the reference does.
    fn from_wire(raw: u64, modify: bool) -> Result<Code, CdtError> {
        let code = match raw {
            0 => Code::Resize,
            1 => Code::Insert,
            2 => Code::Remove,
            3 => Code::Set,
            4 => Code::Or,
            5 => Code::Xor,
            6 => Code::And,
            7 => Code::Not,
            8 => Code::LShift,
            9 => Code::RShift,
            10 => Code::Add,
            11 => Code::Subtract,
            12 => Code::SetInt,
            50 => Code::Get,
            51 => Code::Count,
            52 => Code::LScan,
            53 => Code::RScan,
            54 => Code::GetInt,
            _ => return Err(CdtError::Parameter),
        };
        if code.is_modify() == modify {
            Ok(code)
        } else {
            Err(CdtError::Parameter)
        }
    }

    fn is_modify(self) -> bool {
        !matches!(
            self,
            Code::Get | Code::Count | Code::LScan | Code::RScan | Code::GetInt
        )
    }

    /// The arguments after the code, in order; how many of them are
    /// required; the write flags the op accepts.
    fn spec(self) -> (&'static [Arg], usize, u64) {
        use Arg::*;
        const GROW: u64 = CREATE_ONLY | UPDATE_ONLY | NO_FAIL;
        const SPAN: u64 = UPDATE_ONLY | NO_FAIL | PARTIAL;
        const INT: u64 = UPDATE_ONLY | NO_FAIL;
        match self {
            Code::Resize => (&[ByteSizeOrZero, Flags, ResizeFlags], 1, GROW),
            Code::Insert => (&[ByteOffset, Bytes, Flags], 2, GROW),
            Code::Remove => (&[ByteOffset, ByteSize, Flags], 2, SPAN),
            Code::Set | Code::Or | Code::Xor | Code::And => {
                (&[BitOffset, BitSize, Bytes, Flags], 3, SPAN)
            }
            Code::Not => (&[BitOffset, BitSize, Flags], 2, SPAN),
            Code::LShift | Code::RShift => (&[BitOffset, BitSize, Shift, Flags], 3, SPAN),
            Code::Add | Code::Subtract => {
                (&[BitOffset, IntSize, Number, Flags, ArithFlags], 3, INT)
            }
            Code::SetInt => (&[BitOffset, IntSize, Number, Flags], 3, INT),
            Code::Get | Code::Count => (&[BitOffset, BitSize], 2, 0),
            Code::LScan | Code::RScan => (&[BitOffset, BitSize, Bool], 3, 0),
            Code::GetInt => (&[BitOffset, IntSize, SignFlag], 2, 0),
        }
    }
}

/// The kinds of argument, each with the reference's checks.
#[derive(Clone, Copy)]
enum Arg {
    /// A byte offset, |offset| <= 128 MiB; kept in bits.
    ByteOffset,
    /// A bit offset, |offset| <= 1 Gibit.
    BitOffset,
    /// A byte count, 1..=128 MiB; kept in bits.
    ByteSize,
    /// A byte count, 0..=128 MiB (resize); kept in bits.
    ByteSizeOrZero,
    /// An integer's width in bits, 1..=64.
    IntSize,
    /// A bit count, 1..=1 Gibit.
    BitSize,
    /// The bit value a scan looks for.
    Bool,
    /// A shift in bits, 0..=1 Gibit.
    Shift,
    /// Any integer (its 64-bit two's complement pattern).
    Number,
    /// Bytes (a particle blob): sets the size when none came before,
    /// else must hold at least that many bits.
    Bytes,
    /// The write flags.
    Flags,
    /// Resize flags.
    ResizeFlags,
    /// Overflow action and sign of add and subtract.
    ArithFlags,
    /// The sign flag of get-integer.
    SignFlag,
}

/// The parsed arguments of one op (offsets and sizes in bits).
#[derive(Debug, Default)]
struct Args {
    offset: i64,
    size: u64,
    value: u64,
    bytes: Vec<u8>,
    flags: u64,
    subflags: u64,
    /// The largest blob the caller will store ([`operate_within`]).
    limit: u64,
}

/// An integer argument as the reference reads it: any msgpack integer,
/// negative ones as their two's complement.
fn number(arg: &Value) -> Result<u64, CdtError> {
    match arg {
        Value::Int(i) => Ok(*i as u64),
        Value::UInt(u) => Ok(*u),
        _ => Err(CdtError::Parameter),
    }
}

fn parse(code: Code, items: &[Value]) -> Result<Args, CdtError> {
    let (kinds, required, allowed_flags) = code.spec();
    if items.len() < required || items.len() > kinds.len() {
        return Err(CdtError::Parameter);
    }
    let mut args = Args {
        limit: u64::MAX,
        ..Args::default()
    };
    for (kind, item) in kinds.iter().zip(items) {
        match kind {
            Arg::ByteOffset => args.offset = offset(item, PROTO_SIZE_MAX)? * 8,
            Arg::BitOffset => args.offset = offset(item, MAX_BITS)?,
            Arg::ByteSize | Arg::ByteSizeOrZero => {
                let size = number(item)?;
                if size > PROTO_SIZE_MAX || (size == 0 && matches!(kind, Arg::ByteSize)) {
                    return Err(CdtError::Parameter);
                }
                args.size = size * 8;
            }
            Arg::IntSize => args.size = within(item, 1..=64)?,
            Arg::BitSize => args.size = within(item, 1..=MAX_BITS)?,
            Arg::Bool => match item {
                Value::Bool(b) => args.value = u64::from(*b),
                _ => return Err(CdtError::Parameter),
            },
            Arg::Shift => args.value = within(item, 0..=MAX_BITS)?,
            Arg::Number => args.value = number(item)?,
            Arg::Bytes => take_bytes(&mut args, item)?,
            Arg::Flags => args.flags = flags(item, allowed_flags, CREATE_ONLY | UPDATE_ONLY)?,
            Arg::ResizeFlags => {
                let allowed = FROM_FRONT | GROW_ONLY | SHRINK_ONLY;
                args.subflags = flags(item, allowed, GROW_ONLY | SHRINK_ONLY)?;
            }
            Arg::ArithFlags => {
                args.subflags = flags(item, SIGNED | SATURATE | WRAP, SATURATE | WRAP)?;
            }
            Arg::SignFlag => args.subflags = flags(item, SIGNED, 0)?,
        }
    }
    Ok(args)
}

/// An offset argument, at most `max` away from either end.
fn offset(item: &Value, max: u64) -> Result<i64, CdtError> {
    let offset = number(item)? as i64;
    if offset.unsigned_abs() > max {
        return Err(CdtError::Parameter);
    }
    Ok(offset)
}

/// An integer argument in `range`.
fn within(item: &Value, range: std::ops::RangeInclusive<u64>) -> Result<u64, CdtError> {
    let value = number(item)?;
    if !range.contains(&value) {
        return Err(CdtError::Parameter);
    }
    Ok(value)
}

/// A flags argument: only `allowed` bits, and not every bit of
/// `exclusive` at once (a pair that contradicts itself; 0: no such pair).
fn flags(item: &Value, allowed: u64, exclusive: u64) -> Result<u64, CdtError> {
    let flags = number(item)?;
    if flags & !allowed != 0 || (exclusive != 0 && flags & exclusive == exclusive) {
        return Err(CdtError::Parameter);
    }
    Ok(flags)
}

/// A bytes argument: not empty, and holding at least the size given
/// before it (which it sets when none was).
fn take_bytes(args: &mut Args, item: &Value) -> Result<(), CdtError> {
    // The particle prefix is already off (value::decode).
    let bytes = match item {
        Value::Blob(_, b) | Value::Str(b) | Value::Geo(b) => b,
        _ => return Err(CdtError::Parameter),
    };
    let bits = bytes.len() as u64 * 8;
    if bytes.is_empty() || (args.size != 0 && bits < args.size) {
        return Err(CdtError::Parameter);
    }
    if args.size == 0 {
        args.size = bits;
    }
    args.bytes = bytes.clone();
    Ok(())
}

/// What a modify op does to the bin.
enum Step {
    /// The blob's new bytes.
    Write(Vec<u8>),
    /// Nothing: a no-op or a no-fail skip.
    Skip,
}

/// The reference's answer to a refused write: skipped under NO_FAIL,
/// else `error`.
fn refuse(flags: u64, error: CdtError) -> Result<Step, CdtError> {
    if flags & NO_FAIL != 0 {
        Ok(Step::Skip)
    } else {
        Err(error)
    }
}

/// Applies one op: `payload` is the op's value (msgpack), `bin` the named
/// bin's particle type and bytes when the record has it, `modify` whether
/// the op came as the modify op type.
pub fn operate(
    payload: &[u8],
    bin: Option<(u8, &[u8])>,
    modify: bool,
) -> Result<Outcome, CdtError> {
    operate_within(payload, bin, modify, u64::MAX)
}

/// [`operate`], refusing ([`CdtError::TooBig`]) before it is built a blob
/// of more than `limit` bytes (the namespace's largest record: a resize or
/// insert must not allocate a blob the transaction would refuse anyway).
pub fn operate_within(
    payload: &[u8],
    bin: Option<(u8, &[u8])>,
    modify: bool,
    limit: u64,
) -> Result<Outcome, CdtError> {
    if !modify && bin.is_none() {
        // The reference never parses a read of a missing bin: no result.
        return Ok(Outcome::default());
    }
    let Value::List(request) = value::decode(payload).map_err(|_| CdtError::Parameter)? else {
        return Err(CdtError::Parameter);
    };
    if request.flags != 0 {
        // An ext where the op code belongs.
        return Err(CdtError::Parameter);
    }
    let (code, items) = request.items.split_first().ok_or(CdtError::Parameter)?;
    let code = Code::from_wire(number(code)?, modify)?;
    let mut args = parse(code, items)?;
    args.limit = limit;

    if !modify {
        let Some((particle, blob)) = bin else {
            return Ok(Outcome::default());
        };
        if particle != ParticleType::Blob as u8 {
            return Err(CdtError::IncompatibleType);
        }
        let result = read(code, &args, blob)?;
        return Ok(Outcome {
            bin: None,
            result: Some(result),
        });
    }

    let old = match bin {
        Some((particle, blob)) => {
            if args.flags & CREATE_ONLY != 0 {
                return skipped(refuse(args.flags, CdtError::BinExists)?);
            }
            if particle != ParticleType::Blob as u8 {
                return Err(CdtError::IncompatibleType);
            }
            blob
        }
        None => {
            if !matches!(code, Code::Insert | Code::Resize) || args.flags & UPDATE_ONLY != 0 {
                return skipped(refuse(args.flags, CdtError::BinNotFound)?);
            }
            &[]
        }
    };
    match write(code, &args, old)? {
        Step::Write(new) => {
            debug_assert!((new.len() as u64) < PROTO_SIZE_MAX);
            Ok(Outcome {
                bin: Some((ParticleType::Blob as u8, new)),
                result: None,
            })
        }
        Step::Skip => Ok(Outcome::default()),
    }
}

/// The outcome of a write refused before it started (only a no-fail skip
/// gets here: the error case returned early).
fn skipped(step: Step) -> Result<Outcome, CdtError> {
    debug_assert!(matches!(step, Step::Skip));
    Ok(Outcome::default())
}

/// Where a span starts, in bits from the blob's first: a negative offset
/// counts back from the end, and may not reach before the start.
fn normalize(offset: i64, blob_len: usize) -> Result<u64, CdtError> {
    let blob_bits = blob_len as u64 * 8;
    if offset >= 0 {
        return Ok(offset as u64);
    }
    let back = offset.unsigned_abs();
    if back > blob_bits {
        return Err(CdtError::Parameter);
    }
    Ok(blob_bits - back)
}

/// Bytes that hold `bits` bits.
fn bytes_for(bits: u64) -> u64 {
    bits.div_ceil(8)
}

/// Whether the span `[start, start + size)` lies within a blob of `len`
/// bytes, judged in whole bytes as the reference does.
fn span_fits(start: u64, size: u64, len: usize) -> bool {
    start / 8 + bytes_for(start % 8 + size) <= len as u64
}

/// Evaluates a modify op on `old` (empty for a missing bin).
fn write(code: Code, args: &Args, old: &[u8]) -> Result<Step, CdtError> {
    let start = normalize(args.offset, old.len())?;
    match code {
        Code::Resize => resize(args, old),
        Code::Insert => insert(args, old, start / 8),
        Code::Remove => remove(args, old, start / 8),
        Code::Set | Code::Or | Code::Xor | Code::And | Code::Not | Code::LShift | Code::RShift => {
            modify(code, args, old, start)
        }
        Code::Add | Code::Subtract | Code::SetInt => write_int(code, args, old, start),
        Code::Get | Code::Count | Code::LScan | Code::RScan | Code::GetInt => {
            Err(CdtError::Parameter)
        }
    }
}

/// `resize`: to `size` bytes, cut or zero-filled at the end (or the
/// front); refused against GROW_ONLY or SHRINK_ONLY.
fn resize(args: &Args, old: &[u8]) -> Result<Step, CdtError> {
    let old_len = old.len() as u64;
    let new_len = args.size / 8;
    if (new_len < old_len && args.subflags & GROW_ONLY != 0)
        || (new_len > old_len && args.subflags & SHRINK_ONLY != 0)
    {
        return refuse(args.flags, CdtError::Parameter);
    }
    if new_len == old_len {
        return Ok(Step::Skip);
    }
    check_size(new_len, args.limit)?;
    let new_len = new_len as usize;
    let front = args.subflags & FROM_FRONT != 0;
    let mut new = Vec::with_capacity(new_len);
    if new_len < old.len() {
        let cut = old.len() - new_len;
        new.extend_from_slice(if front { &old[cut..] } else { &old[..new_len] });
    } else if front {
        new.resize(new_len - old.len(), 0);
        new.extend_from_slice(old);
    } else {
        new.extend_from_slice(old);
        new.resize(new_len, 0);
    }
    Ok(Step::Write(new))
}

/// `insert`: the bytes at `byte_offset`, zero-filling a gap past the end.
fn insert(args: &Args, old: &[u8], byte_offset: u64) -> Result<Step, CdtError> {
    let old_len = old.len() as u64;
    let at = byte_offset.min(old_len) as usize;
    let gap = byte_offset.saturating_sub(old_len);
    check_size(old_len + gap + args.bytes.len() as u64, args.limit)?;
    let mut new = Vec::with_capacity(old.len() + gap as usize + args.bytes.len());
    new.extend_from_slice(&old[..at]);
    new.resize(new.len() + gap as usize, 0);
    new.extend_from_slice(&args.bytes);
    new.extend_from_slice(&old[at..]);
    Ok(Step::Write(new))
}

/// `remove`: `size` bytes from `byte_offset` (cut at the end with
/// PARTIAL).
fn remove(args: &Args, old: &[u8], byte_offset: u64) -> Result<Step, CdtError> {
    let (old_len, flags) = (old.len() as u64, args.flags);
    if byte_offset >= old_len {
        return refuse(flags, CdtError::Parameter);
    }
    let mut end = byte_offset + args.size / 8;
    if end > old_len {
        if flags & PARTIAL == 0 {
            return refuse(flags, CdtError::Parameter);
        }
        end = old_len;
    }
    check_size(old_len - (end - byte_offset), args.limit)?;
    let mut new = old.to_vec();
    new.drain(byte_offset as usize..end as usize);
    Ok(Step::Write(new))
}

/// `set`, the bitwise ops and the shifts over the span of `size` bits at
/// bit `start` (cut at the end with PARTIAL).
fn modify(code: Code, args: &Args, old: &[u8], start: u64) -> Result<Step, CdtError> {
    let (old_len, flags) = (old.len() as u64, args.flags);
    if start / 8 >= old_len {
        return refuse(flags, CdtError::OpNotApplicable);
    }
    let mut size = args.size;
    if !span_fits(start, size, old.len()) {
        if flags & PARTIAL == 0 {
            return refuse(flags, CdtError::OpNotApplicable);
        }
        // Cut at the blob's end.
        size = old_len * 8 - start;
    }
    check_size(old_len, args.limit)?;
    let mut new = old.to_vec();
    modify_span(code, args, &mut new, start, size);
    Ok(Step::Write(new))
}

/// `add`, `subtract` and `set-int` on the integer of `size` bits at bit
/// `start`.
fn write_int(code: Code, args: &Args, old: &[u8], start: u64) -> Result<Step, CdtError> {
    let flags = args.flags;
    if !span_fits(start, args.size, old.len()) {
        return refuse(flags, CdtError::OpNotApplicable);
    }
    check_size(old.len() as u64, args.limit)?;
    let bits = args.size as u32;
    let value = if code == Code::SetInt {
        args.value & mask(bits)
    } else {
        let load = load_int(old, start, bits);
        match arithmetic(
            load,
            args.value,
            bits,
            code == Code::Subtract,
            args.subflags,
        ) {
            Some(result) => result,
            None => return refuse(flags, CdtError::OpNotApplicable),
        }
    };
    let mut new = old.to_vec();
    store_int(&mut new, start, bits, value);
    Ok(Step::Write(new))
}

/// The reference refuses a result blob of 128 MiB or more (checked once
/// the op is known to apply, before it runs).
/// The reference's bound (4), then the caller's (13, what the record-size
/// check would answer once the blob was built).
fn check_size(len: u64, limit: u64) -> Result<(), CdtError> {
    if len >= PROTO_SIZE_MAX {
        Err(CdtError::Parameter)
    } else if len > limit {
        Err(CdtError::TooBig)
    } else {
        Ok(())
    }
}

/// The in-place ops on `blob`'s bits `[start, start + size)`.
fn modify_span(code: Code, args: &Args, blob: &mut [u8], start: u64, size: u64) {
    debug_assert!(start + size <= blob.len() as u64 * 8);
    let len = blob.len();
    let bits = match code {
        Code::Set => {
            write_bits(blob, start, size, &args.bytes);
            debug_assert_eq!(blob.len(), len);
            return;
        }
        Code::Or | Code::Xor | Code::And => {
            let mut bits = read_bits(blob, start, size);
            for (b, arg) in bits.iter_mut().zip(&args.bytes) {
                match code {
                    Code::Or => *b |= arg,
                    Code::Xor => *b ^= arg,
                    _ => *b &= arg,
                }
            }
            bits
        }
        Code::Not => {
            let mut bits = read_bits(blob, start, size);
            bits.iter_mut().for_each(|b| *b = !*b);
            bits
        }
        Code::LShift | Code::RShift => {
            let current = read_bits(blob, start, size);
            let mut bits = vec![0u8; bytes_for(size) as usize];
            let shift = args.value;
            if shift < size {
                if code == Code::LShift {
                    let kept = read_bits(&current, shift, size - shift);
                    write_bits(&mut bits, 0, size - shift, &kept);
                } else {
                    let kept = read_bits(&current, 0, size - shift);
                    write_bits(&mut bits, shift, size - shift, &kept);
                }
            }
            bits
        }
        _ => return,
    };
    write_bits(blob, start, size, &bits);
    debug_assert_eq!(blob.len(), len);
}

/// Evaluates a read op on an existing blob.
fn read(code: Code, args: &Args, blob: &[u8]) -> Result<(u8, Vec<u8>), CdtError> {
    let start = normalize(args.offset, blob.len())?;
    let size = args.size;
    if !span_fits(start, size, blob.len()) {
        return Err(CdtError::OpNotApplicable);
    }
    let answer = match code {
        Code::Get => return Ok((ParticleType::Blob as u8, read_bits(blob, start, size))),
        Code::Count => {
            let ones: u64 = read_bits(blob, start, size)
                .iter()
                .map(|b| u64::from(b.count_ones()))
                .sum();
            ones as i64
        }
        Code::LScan | Code::RScan => scan(
            &read_bits(blob, start, size),
            size,
            args.value == 1,
            code == Code::LScan,
        ),
        Code::GetInt => {
            let bits = size as u32;
            let load = load_int(blob, start, bits);
            if args.subflags & SIGNED != 0 {
                sign_extend(load, bits)
            } else {
                load as i64
            }
        }
        _ => return Err(CdtError::Parameter),
    };
    Ok(to_particle(&Value::Int(answer)))
}

/// The index of the first (`forward`) or last bit equal to `value` among
/// the first `size` bits of `bits`, or -1.
fn scan(bits: &[u8], size: u64, value: bool, forward: bool) -> i64 {
    let tail = (size % 8) as u32;
    let last = bits.len().saturating_sub(1);
    let hits = |i: usize, b: u8| {
        let b = if value { b } else { !b };
        if i == last && tail != 0 {
            b & byte_mask(0, tail)
        } else {
            b
        }
    };
    let found = if forward {
        bits.iter()
            .enumerate()
            .map(|(i, &b)| (i, hits(i, b)))
            .find(|&(_, b)| b != 0)
            .map(|(i, b)| i as u64 * 8 + u64::from(b.leading_zeros()))
    } else {
        bits.iter()
            .enumerate()
            .rev()
            .map(|(i, &b)| (i, hits(i, b)))
            .find(|&(_, b)| b != 0)
            .map(|(i, b)| i as u64 * 8 + 7 - u64::from(b.trailing_zeros()))
    };
    match found {
        Some(index) => {
            debug_assert!(index < size);
            index as i64
        }
        None => -1,
    }
}

/// The low `bits` bits set (`bits` in 1..=64).
fn mask(bits: u32) -> u64 {
    debug_assert!((1..=64).contains(&bits));
    u64::MAX >> (64 - bits)
}

/// `value`'s low `bits` bits as a signed integer.
fn sign_extend(value: u64, bits: u32) -> i64 {
    let unused = 64 - bits;
    ((value << unused) as i64) >> unused
}

/// The unsigned integer in bits `[start, start + bits)` (`bits` <= 64).
fn load_int(blob: &[u8], start: u64, bits: u32) -> u64 {
    let mut word = [0u8; 8];
    let loaded = read_bits(blob, start, u64::from(bits));
    word[..loaded.len()].copy_from_slice(&loaded);
    u64::from_be_bytes(word) >> (64 - bits)
}

/// Writes `value`'s low `bits` bits at `start`.
fn store_int(blob: &mut [u8], start: u64, bits: u32, value: u64) {
    let word = (value << (64 - bits)).to_be_bytes();
    write_bits(blob, start, u64::from(bits), &word);
}

/// Add or subtract on a `bits`-wide field: `None` when the result
/// overflows under the FAIL action. `value` is cut to the field's width
/// first; WRAP keeps the low bits of the result, SATURATE puts the bound
/// it passed. Unsigned, an add overflows when it carries out of the field
/// and a subtract when it borrows. Signed, the overflow test is the
/// reference's ([`signed_overflow`]), not the exact one.
fn arithmetic(load: u64, value: u64, bits: u32, subtract: bool, subflags: u64) -> Option<u64> {
    let field = mask(bits);
    let value = value & field;
    let wrapped = if subtract {
        load.wrapping_sub(value)
    } else {
        load.wrapping_add(value)
    } & field;
    if subflags & WRAP != 0 {
        return Some(wrapped);
    }
    let saturate = subflags & SATURATE != 0;
    let passed = if subflags & SIGNED != 0 {
        // A subtract adds the value negated (in 64 bits, then cut).
        let operand = if subtract {
            value.wrapping_neg()
        } else {
            value
        };
        signed_overflow(load, operand, wrapped, bits)
    } else if (subtract && wrapped > load) || (!subtract && wrapped < load) {
        Some(if subtract { Bound::Min } else { Bound::Max })
    } else {
        None
    };
    let half = 1u64 << (bits - 1);
    match passed {
        None => Some(wrapped),
        Some(_) if !saturate => None,
        Some(Bound::Max) if subflags & SIGNED != 0 => Some(half - 1),
        Some(Bound::Max) => Some(field),
        Some(Bound::Min) if subflags & SIGNED != 0 => Some(half),
        Some(Bound::Min) => Some(0),
    }
}

/// Which bound an arithmetic result passed.
#[derive(Clone, Copy)]
enum Bound {
    Min,
    Max,
}

/// The reference's signed overflow test on a `bits`-wide field, all three
/// read as two's complement of that width: the old value and the operand
/// both negative and the wrapped result strictly positive passed the
/// minimum; both strictly positive and the result negative passed the
/// maximum. A result of exactly 0 is no overflow (1 bit: -1 + -1 is 0,
/// written), and a subtract's negated operand is judged by its low bits
/// (2 bits: 0 - 2 adds -2, written; -1 - 2 adds -2 and gives 1, refused).
fn signed_overflow(load: u64, operand: u64, wrapped: u64, bits: u32) -> Option<Bound> {
    let (old, operand, result) = (
        sign_extend(load, bits),
        sign_extend(operand, bits),
        sign_extend(wrapped, bits),
    );
    if old < 0 && operand < 0 && result > 0 {
        Some(Bound::Min)
    } else if old > 0 && operand > 0 && result < 0 {
        Some(Bound::Max)
    } else {
        None
    }
}

/// Bits `from..to` of a byte, counted from its most significant bit.
fn byte_mask(from: u32, to: u32) -> u8 {
    debug_assert!(from <= to && to <= 8);
    let high = 0x00ffu16 >> from;
    let low = 0xff00u16 >> to;
    (high & low) as u8
}

/// Bits `[start, start + len)` of `src`, packed from the first byte's most
/// significant bit, the unused bits of the last byte zero.
fn read_bits(src: &[u8], start: u64, len: u64) -> Vec<u8> {
    debug_assert!(start + len <= src.len() as u64 * 8);
    let shift = (start % 8) as u32;
    let first = (start / 8) as usize;
    let n = bytes_for(len) as usize;
    let mut out: Vec<u8> = (0..n)
        .map(|i| {
            let hi = src.get(first + i).copied().unwrap_or(0);
            if shift == 0 {
                return hi;
            }
            let lo = src.get(first + i + 1).copied().unwrap_or(0);
            ((u16::from(hi) << shift) | (u16::from(lo) >> (8 - shift))) as u8
        })
        .collect();
    let tail = (len % 8) as u32;
    if let (Some(last), true) = (out.last_mut(), tail != 0) {
        *last &= byte_mask(0, tail);
    }
    out
}

/// Writes the first `len` bits of `bits` (packed as [`read_bits`] packs
/// them) over `dst`'s bits `[start, start + len)`; the bits around the
/// span keep their values.
fn write_bits(dst: &mut [u8], start: u64, len: u64, bits: &[u8]) {
    debug_assert!(start + len <= dst.len() as u64 * 8);
    debug_assert!(len <= bits.len() as u64 * 8);
    if len == 0 {
        return;
    }
    let end = start + len;
    let shift = (start % 8) as u32;
    let first = (start / 8) as usize;
    let last = ((end - 1) / 8) as usize;
    for (k, d) in (first..=last).enumerate() {
        let cur = bits.get(k).copied().unwrap_or(0);
        let window = if shift == 0 {
            cur
        } else {
            let prev = k
                .checked_sub(1)
                .and_then(|j| bits.get(j))
                .copied()
                .unwrap_or(0);
            ((u16::from(prev) << (8 - shift)) | (u16::from(cur) >> shift)) as u8
        };
        let from = if d == first { shift } else { 0 };
        let to = if d == last {
            ((end - 1) % 8) as u32 + 1
        } else {
            8
        };
        let m = byte_mask(from, to);
        if let Some(byte) = dst.get_mut(d) {
            *byte = (*byte & !m) | (window & m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::List;

    /// An op payload: the code, then the arguments.
    fn payload(code: i64, args: Vec<Value>) -> Vec<u8> {
        let mut items = vec![Value::Int(code)];
        items.extend(args);
        value::to_bytes(&Value::List(List { flags: 0, items }))
    }

    fn int(i: i64) -> Value {
        Value::Int(i)
    }

    fn blob(bytes: &[u8]) -> Value {
        Value::Blob(4, bytes.to_vec())
    }

    /// Runs a modify op on a blob bin (or none); the stored bytes after.
    fn modify(
        code: i64,
        args: Vec<Value>,
        bin: Option<&[u8]>,
    ) -> Result<Option<Vec<u8>>, CdtError> {
        let outcome = operate(
            &payload(code, args),
            bin.map(|b| (ParticleType::Blob as u8, b)),
            true,
        )?;
        assert!(outcome.result.is_none(), "a modify op answers nothing");
        Ok(outcome.bin.map(|(particle, bytes)| {
            assert_eq!(particle, ParticleType::Blob as u8);
            bytes
        }))
    }

    /// Runs modify ops in sequence on a blob.
    fn chain(initial: &[u8], ops: Vec<(i64, Vec<Value>)>) -> Vec<u8> {
        let mut current = initial.to_vec();
        for (code, args) in ops {
            if let Some(new) = modify(code, args, Some(&current)).expect("op applies") {
                current = new;
            }
        }
        current
    }

    fn read_op(code: i64, args: Vec<Value>, bin: &[u8]) -> Result<(u8, Vec<u8>), CdtError> {
        let outcome = operate(
            &payload(code, args),
            Some((ParticleType::Blob as u8, bin)),
            false,
        )?;
        assert!(outcome.bin.is_none());
        Ok(outcome.result.expect("a read answers"))
    }

    fn read_int(code: i64, args: Vec<Value>, bin: &[u8]) -> i64 {
        let (particle, bytes) = read_op(code, args, bin).expect("read applies");
        assert_eq!(particle, ParticleType::Integer as u8);
        i64::from_be_bytes(bytes.try_into().expect("8 bytes"))
    }

    fn read_blob(args: Vec<Value>, bin: &[u8]) -> Vec<u8> {
        let (particle, bytes) = read_op(50, args, bin).expect("read applies");
        assert_eq!(particle, ParticleType::Blob as u8);
        bytes
    }

    #[test]
    fn helpers_read_and_write_unaligned_spans() {
        let src = [0b1010_1100, 0b0101_0011];
        assert_eq!(read_bits(&src, 0, 16), src.to_vec());
        assert_eq!(read_bits(&src, 3, 7), vec![0b0110_0010]);
        assert_eq!(read_bits(&src, 6, 4), vec![0b0001_0000]);
        let mut dst = [0u8; 3];
        write_bits(&mut dst, 5, 10, &[0xff, 0xc0]);
        assert_eq!(dst, [0b0000_0111, 0b1111_1110, 0]);
        write_bits(&mut dst, 0, 24, &[0x12, 0x34, 0x56]);
        assert_eq!(dst, [0x12, 0x34, 0x56]);
        assert_eq!(byte_mask(1, 3), 0x60);
        assert_eq!(byte_mask(0, 8), 0xff);
        assert_eq!(byte_mask(4, 4), 0);
    }

    #[test]
    fn set_writes_bits_across_byte_boundaries() {
        // The official Java client's vectors (TestOperateBit.operateBitSet).
        let bit0 = blob(&[0x80]);
        let bits1 = blob(&[0x11, 0x22, 0x33]);
        let set = |offset, size, bytes: &Value| (3, vec![int(offset), int(size), bytes.clone()]);
        let after = chain(
            &[
                0x01, 0x12, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D,
                0x0E, 0x0F, 0x10, 0x11, 0x41,
            ],
            vec![
                set(1, 1, &bit0),
                set(15, 1, &bit0),
                set(16, 24, &bits1),
                set(40, 22, &bits1),
                set(73, 21, &bits1),
                set(100, 20, &bits1),
                set(120, 17, &bits1),
                set(144, 1, &bit0),
            ],
        );
        assert_eq!(
            after,
            vec![
                0x41, 0x13, 0x11, 0x22, 0x33, 0x11, 0x22, 0x33, 0x08, 0x08, 0x91, 0x1B, 0x01, 0x12,
                0x23, 0x11, 0x22, 0x11, 0xc1
            ]
        );
    }

    #[test]
    fn logic_ops_touch_only_their_span() {
        let bits1 = blob(&[0x11, 0x22, 0x33]);
        let initial = [0x80, 0x40, 0x01, 0x00, 0x00, 0x01, 0x02, 0x03];
        let spans = [(0, 5), (9, 7), (23, 6), (32, 8), (40, 24)];
        let run = |code| {
            chain(
                &initial,
                spans
                    .iter()
                    .map(|&(o, s)| (code, vec![int(o), int(s), bits1.clone()]))
                    .collect(),
            )
        };
        assert_eq!(run(4), vec![0x90, 0x48, 0x01, 0x20, 0x11, 0x11, 0x22, 0x33]);
        assert_eq!(run(5), vec![0x90, 0x48, 0x01, 0x20, 0x11, 0x10, 0x20, 0x30]);
        assert_eq!(run(6), vec![0, 0, 0, 0, 0, 0x01, 0x02, 0x03]);
        let not = chain(
            &initial,
            spans
                .iter()
                .map(|&(o, s)| (7, vec![int(o), int(s)]))
                .collect(),
        );
        assert_eq!(not, vec![0x78, 0x3F, 0x00, 0xF8, 0xFF, 0xFE, 0xFD, 0xFC]);
    }

    #[test]
    fn shifts_move_bits_within_the_span() {
        let shifts = [(0, 8, 1), (9, 7, 6), (23, 2, 1), (37, 18, 3)];
        let mut ops: Vec<_> = shifts
            .iter()
            .map(|&(o, s, n)| (8, vec![int(o), int(s), int(n)]))
            .collect();
        ops.push((8, vec![int(58), int(2), int(1)]));
        ops.push((8, vec![int(64), int(4), int(7)]));
        assert_eq!(
            chain(&[0x01, 0x01, 0x00, 0x80, 0xFF, 0x01, 0x01, 0x18, 0x01], ops),
            vec![0x02, 0x40, 0x01, 0x00, 0xF8, 0x08, 0x01, 0x28, 0x01]
        );
        assert_eq!(
            chain(&[0xFF; 3], vec![(8, vec![int(0), int(20), int(15)])]),
            vec![0xF8, 0x00, 0x0F]
        );
        let mut ops: Vec<_> = shifts
            .iter()
            .map(|&(o, s, n)| (9, vec![int(o), int(s), int(n)]))
            .collect();
        ops.push((9, vec![int(60), int(2), int(1)]));
        ops.push((9, vec![int(68), int(4), int(7)]));
        assert_eq!(
            chain(&[0x80, 0x40, 0x01, 0x00, 0xFF, 0x01, 0x01, 0x18, 0x80], ops),
            vec![0x40, 0x01, 0x00, 0x80, 0xF8, 0xE0, 0x21, 0x14, 0x80]
        );
        // A shift of the whole span or more clears it.
        assert_eq!(
            chain(&[0xFF, 0xFF], vec![(9, vec![int(4), int(8), int(8)])]),
            vec![0xF0, 0x0F]
        );
    }

    #[test]
    fn add_subtract_and_set_int_with_overflow_actions() {
        const WRAPPED: i64 = WRAP as i64;
        const SAT: i64 = SATURATE as i64;
        let add = |o, s, v, f: i64| (10, vec![int(o), int(s), int(v), int(0), int(f)]);
        let sub = |o, s, v, f: i64| (11, vec![int(o), int(s), int(v), int(0), int(f)]);
        assert_eq!(
            chain(
                &[0x38, 0x1F, 0x00, 0xE8, 0x7F],
                vec![
                    add(0, 5, 1, 0),
                    add(9, 7, 1, 0),
                    add(23, 6, 0x21, 0),
                    add(32, 8, 1, 0)
                ]
            ),
            vec![0x40, 0x20, 0x01, 0xF0, 0x80]
        );
        assert_eq!(
            chain(
                &[0; 6],
                vec![
                    add(0, 8, 0xFF, WRAPPED),
                    add(0, 8, 0xFF, WRAPPED),
                    add(8, 8, 0x7F, WRAPPED | 1),
                    add(8, 8, 0x7F, WRAPPED | 1),
                    add(16, 8, 0x80, WRAPPED | 1),
                    add(16, 8, 0xFF, WRAPPED | 1),
                    add(24, 8, 0x80, SAT),
                    add(24, 8, 0x80, SAT),
                    add(32, 8, 0x77, SAT | 1),
                    add(32, 8, 0x77, SAT | 1),
                    add(40, 8, 0x8F, SAT | 1),
                    add(40, 8, 0x8F, SAT | 1),
                ]
            ),
            vec![0xFE, 0xFE, 0x7F, 0xFF, 0x7F, 0x80]
        );
        assert_eq!(
            chain(
                &[0; 6],
                vec![
                    sub(0, 8, 1, WRAPPED),
                    sub(8, 8, 0x80, WRAPPED | 1),
                    sub(8, 8, 0x8A, WRAPPED | 1),
                    sub(16, 8, 0x7F, WRAPPED | 1),
                    sub(16, 8, 0x02, WRAPPED | 1),
                    sub(24, 8, 0xAA, SAT),
                    sub(32, 8, 0x77, SAT | 1),
                    sub(32, 8, 0x77, SAT | 1),
                    sub(40, 8, 0x81, SAT | 1),
                    sub(40, 8, 0x8F, SAT | 1),
                ]
            ),
            vec![0xFF, 0xF6, 0x7F, 0x00, 0x80, 0x7F]
        );
        // FAIL (the default action) refuses an overflow; NO_FAIL skips it.
        let full = [0xFF, 0x00];
        assert_eq!(
            modify(10, vec![int(0), int(8), int(1)], Some(&full)),
            Err(CdtError::OpNotApplicable)
        );
        assert_eq!(
            modify(11, vec![int(8), int(8), int(1)], Some(&full)),
            Err(CdtError::OpNotApplicable)
        );
        assert_eq!(
            modify(
                10,
                vec![int(0), int(8), int(0x7F), int(0), int(1)],
                Some(&[0x02])
            ),
            Err(CdtError::OpNotApplicable)
        );
        assert_eq!(
            modify(
                10,
                vec![int(0), int(8), int(1), int(NO_FAIL as i64)],
                Some(&full)
            ),
            Ok(None)
        );
        // A negative value is its two's complement cut to the width.
        assert_eq!(
            modify(12, vec![int(4), int(8), int(-1)], Some(&[0, 0])),
            Ok(Some(vec![0x0F, 0xF0]))
        );
        assert_eq!(
            modify(
                10,
                vec![int(0), int(8), int(-3), int(0), int(1)],
                Some(&[0x05])
            ),
            Ok(Some(vec![0x02]))
        );
        // 64-bit fields.
        assert_eq!(
            modify(
                10,
                vec![int(0), int(64), int(1), int(0), int(0)],
                Some(&[0xFF; 8])
            ),
            Err(CdtError::OpNotApplicable)
        );
        assert_eq!(
            modify(
                12,
                vec![int(4), int(64), Value::UInt(u64::MAX)],
                Some(&[0; 9])
            ),
            Ok(Some(vec![
                0x0F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xF0
            ]))
        );
        assert_eq!(
            chain(
                &[0x38, 0x1F, 0x00, 0xE8, 0x7F],
                vec![
                    (12, vec![int(0), int(5), int(1)]),
                    (12, vec![int(9), int(7), int(1)]),
                    (12, vec![int(23), int(6), int(3)]),
                    (12, vec![int(32), int(8), int(1)]),
                ]
            ),
            vec![0x08, 0x01, 0x00, 0x18, 0x01]
        );
    }

    #[test]
    fn signed_overflow_edges() {
        // -128 + -128 wraps to 0 and 0 - -128 adds -128: the reference
        // writes both (the result is not of the other sign).
        assert_eq!(arithmetic(0x80, 0x80, 8, false, SIGNED), Some(0));
        assert_eq!(arithmetic(0x80, 0x80, 8, false, SIGNED | SATURATE), Some(0));
        assert_eq!(arithmetic(0, 0x80, 8, true, SIGNED), Some(0x80));
        assert_eq!(arithmetic(0, 0x80, 8, true, SIGNED | SATURATE), Some(0x80));
        assert_eq!(arithmetic(1, 1, 1, false, 0), None);
        assert_eq!(arithmetic(0, 1, 1, false, SIGNED), Some(1));
        assert_eq!(arithmetic(1, 1, 1, true, SIGNED), Some(0));
        assert_eq!(
            arithmetic(i64::MAX as u64, 1, 64, false, SIGNED | SATURATE),
            Some(i64::MAX as u64)
        );
        assert_eq!(arithmetic(u64::MAX, 1, 64, false, WRAP), Some(0));
    }

    /// The reference's signed overflow test (8.1.2's answers): only both
    /// operands of one sign and a result strictly of the other overflow.
    #[test]
    fn signed_overflow_is_the_references_test() {
        // 1 bit: 0 - 1 = -1 and -1 + 1 = 0 are written; -1 + -1 wraps to
        // 0, written too.
        assert_eq!(arithmetic(0, 1, 1, true, SIGNED), Some(1));
        assert_eq!(arithmetic(1, 1, 1, false, SIGNED), Some(0));
        // 2 bits: 0 - 2 = -2 is written, -1 - 2 refused (it adds -2 and
        // gives 1), or saturated to the minimum.
        assert_eq!(arithmetic(0, 2, 2, true, SIGNED), Some(2));
        assert_eq!(arithmetic(3, 2, 2, true, SIGNED), None);
        assert_eq!(arithmetic(3, 2, 2, true, SIGNED | SATURATE), Some(2));
        // 3 bits: -4 + -4 wraps to 0: no overflow, even saturating; -3 - 4
        // adds -4 (4's negation cut to 3 bits) and gives 1: saturates to -4.
        assert_eq!(arithmetic(4, 4, 3, false, SIGNED | SATURATE), Some(0));
        assert_eq!(arithmetic(5, 4, 3, true, SIGNED | SATURATE), Some(4));
        // 3 bits: 1 - 4 adds -4 and gives -3: written.
        assert_eq!(arithmetic(1, 4, 3, true, SIGNED), Some(5));
        // 8 bits: 127 + 1 passes the maximum.
        assert_eq!(arithmetic(0x7F, 1, 8, false, SIGNED), None);
        assert_eq!(arithmetic(0x7F, 1, 8, false, SIGNED | SATURATE), Some(0x7F));
    }

    #[test]
    fn reads_get_count_and_integers() {
        let bytes = [0xC1, 0xAA, 0xAA];
        assert_eq!(read_blob(vec![int(0), int(1)], &bytes), vec![0x80]);
        assert_eq!(read_blob(vec![int(1), int(1)], &bytes), vec![0x80]);
        assert_eq!(read_blob(vec![int(7), int(1)], &bytes), vec![0x80]);
        assert_eq!(read_blob(vec![int(0), int(8)], &bytes), vec![0xC1]);
        assert_eq!(read_blob(vec![int(8), int(16)], &bytes), vec![0xAA, 0xAA]);
        assert_eq!(read_blob(vec![int(9), int(15)], &bytes), vec![0x55, 0x54]);
        assert_eq!(read_blob(vec![int(9), int(14)], &bytes), vec![0x55, 0x54]);
        assert_eq!(read_blob(vec![int(-4), int(4)], &bytes), vec![0xA0]);

        let bytes = [0xC1, 0xAA, 0xAB];
        let counts = [
            (0, 1, 1),
            (1, 1, 1),
            (7, 1, 1),
            (0, 8, 3),
            (8, 16, 9),
            (9, 15, 8),
            (9, 14, 7),
        ];
        for (offset, size, expected) in counts {
            assert_eq!(read_int(51, vec![int(offset), int(size)], &bytes), expected);
        }

        let bytes = [0x0F, 0x0F, 0x00];
        let ints = [
            (4, 4, 15, -1),
            (0, 8, 15, 15),
            (7, 4, 8, -8),
            (8, 16, 3840, 3840),
            (9, 15, 3840, 3840),
            (9, 14, 1920, 1920),
            (5, 17, 115648, -15424),
            (-12, 4, 15, -1),
        ];
        for (offset, size, unsigned, signed) in ints {
            assert_eq!(read_int(54, vec![int(offset), int(size)], &bytes), unsigned);
            assert_eq!(
                read_int(54, vec![int(offset), int(size), int(0)], &bytes),
                unsigned
            );
            assert_eq!(
                read_int(54, vec![int(offset), int(size), int(1)], &bytes),
                signed
            );
        }
        assert_eq!(read_int(54, vec![int(0), int(64)], &[0xFF; 8]), -1);
    }

    #[test]
    fn scans_find_bits_or_answer_minus_one() {
        let bytes = [0xFF, 0xFF, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x00, 0x01];
        let cases = [
            (0, 1, true, 0, 0),
            (0, 8, true, 0, 7),
            (0, 9, true, 0, 8),
            (0, 32, true, 0, 31),
            (0, 32, false, -1, -1),
            (1, 30, false, -1, -1),
            (32, 40, true, 39, 39),
            (33, 38, true, -1, -1),
            (32, 40, false, 0, 38),
            (33, 38, false, 0, 37),
            (0, 72, true, 0, 71),
            (0, 72, false, 32, 70),
            (-1, 1, true, 0, 0),
            (-1, 1, false, -1, -1),
        ];
        for (offset, size, value, left, right) in cases {
            let args = vec![int(offset), int(size), Value::Bool(value)];
            assert_eq!(
                read_int(52, args.clone(), &bytes),
                left,
                "lscan {offset} {size} {value}"
            );
            assert_eq!(
                read_int(53, args, &bytes),
                right,
                "rscan {offset} {size} {value}"
            );
        }
        // A match just before the span is not in it.
        assert_eq!(
            read_int(53, vec![int(2), int(6), Value::Bool(false)], &[0x3F]),
            -1
        );
        assert_eq!(
            read_int(53, vec![int(2), int(14), Value::Bool(false)], &[0x3F, 0xFF]),
            -1
        );
    }

    #[test]
    fn resize_grows_shrinks_and_creates() {
        let resize = |size, flags: u64, bin: Option<&[u8]>| {
            modify(0, vec![int(size), int(0), int(flags as i64)], bin)
        };
        assert_eq!(resize(3, 0, None), Ok(Some(vec![0, 0, 0])));
        assert_eq!(resize(0, 0, None), Ok(None));
        assert_eq!(resize(4, 0, Some(&[1, 2])), Ok(Some(vec![1, 2, 0, 0])));
        assert_eq!(
            resize(4, FROM_FRONT, Some(&[1, 2])),
            Ok(Some(vec![0, 0, 1, 2]))
        );
        assert_eq!(resize(1, 0, Some(&[1, 2, 3])), Ok(Some(vec![1])));
        assert_eq!(resize(1, FROM_FRONT, Some(&[1, 2, 3])), Ok(Some(vec![3])));
        assert_eq!(resize(0, 0, Some(&[1, 2, 3])), Ok(Some(vec![])));
        assert_eq!(resize(2, 0, Some(&[1, 2])), Ok(None));
        assert_eq!(
            resize(1, GROW_ONLY, Some(&[1, 2])),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            resize(3, SHRINK_ONLY, Some(&[1, 2])),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            modify(
                0,
                vec![int(1), int(NO_FAIL as i64), int(GROW_ONLY as i64)],
                Some(&[1, 2])
            ),
            Ok(None)
        );
        assert_eq!(
            resize(1, GROW_ONLY | SHRINK_ONLY, Some(&[1])),
            Err(CdtError::Parameter)
        );
        assert_eq!(resize(1, 8, Some(&[1])), Err(CdtError::Parameter));
        // Just the size is enough; the reference's bound holds.
        assert_eq!(modify(0, vec![int(2)], None), Ok(Some(vec![0, 0])));
        assert_eq!(
            modify(0, vec![int(PROTO_SIZE_MAX as i64)], None),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            modify(0, vec![int(PROTO_SIZE_MAX as i64 + 1)], None),
            Err(CdtError::Parameter)
        );
    }

    #[test]
    fn insert_and_remove_bytes() {
        let insert = |offset, bytes: &[u8], bin: Option<&[u8]>| {
            modify(1, vec![int(offset), blob(bytes)], bin)
        };
        assert_eq!(insert(1, &[0x0A], None), Ok(Some(vec![0x00, 0x0A])));
        assert_eq!(insert(0, &[9], Some(&[1, 2])), Ok(Some(vec![9, 1, 2])));
        assert_eq!(
            insert(1, &[9, 8], Some(&[1, 2])),
            Ok(Some(vec![1, 9, 8, 2]))
        );
        assert_eq!(insert(2, &[9], Some(&[1, 2])), Ok(Some(vec![1, 2, 9])));
        assert_eq!(
            insert(4, &[9], Some(&[1, 2])),
            Ok(Some(vec![1, 2, 0, 0, 9]))
        );
        assert_eq!(insert(-1, &[9], Some(&[1, 2])), Ok(Some(vec![1, 9, 2])));
        assert_eq!(insert(-3, &[9], Some(&[1, 2])), Err(CdtError::Parameter));
        assert_eq!(insert(-1, &[9], None), Err(CdtError::Parameter));
        assert_eq!(insert(0, &[], Some(&[1])), Err(CdtError::Parameter));

        let remove = |offset, size, flags: u64| {
            modify(
                2,
                vec![int(offset), int(size), int(flags as i64)],
                Some(&[1, 2, 3, 4]),
            )
        };
        assert_eq!(remove(1, 2, 0), Ok(Some(vec![1, 4])));
        assert_eq!(remove(-1, 1, 0), Ok(Some(vec![1, 2, 3])));
        assert_eq!(remove(2, 5, 0), Err(CdtError::Parameter));
        assert_eq!(remove(2, 5, PARTIAL), Ok(Some(vec![1, 2])));
        assert_eq!(remove(2, 5, NO_FAIL), Ok(None));
        assert_eq!(remove(4, 1, 0), Err(CdtError::Parameter));
        assert_eq!(remove(4, 1, NO_FAIL), Ok(None));
        assert_eq!(remove(0, 0, 0), Err(CdtError::Parameter));
        assert_eq!(remove(0, 4, 0), Ok(Some(vec![])));
        assert_eq!(remove(0, 1, CREATE_ONLY), Err(CdtError::Parameter));
    }

    #[test]
    fn bounds_partial_and_no_fail() {
        let bin: &[u8] = &[0xFF, 0xFF];
        let not = |offset, size, flags: u64| {
            modify(
                7,
                vec![int(offset), int(size), int(flags as i64)],
                Some(bin),
            )
        };
        assert_eq!(not(12, 8, 0), Err(CdtError::OpNotApplicable));
        assert_eq!(not(12, 8, PARTIAL), Ok(Some(vec![0xFF, 0xF0])));
        assert_eq!(not(12, 8, NO_FAIL), Ok(None));
        assert_eq!(not(16, 1, PARTIAL), Err(CdtError::OpNotApplicable));
        assert_eq!(not(16, 1, NO_FAIL | PARTIAL), Ok(None));
        assert_eq!(not(-4, 4, 0), Ok(Some(vec![0xFF, 0xF0])));
        assert_eq!(not(-17, 1, 0), Err(CdtError::Parameter));
        assert_eq!(not(-16, 1, 0), Ok(Some(vec![0x7F, 0xFF])));
        // PARTIAL cuts an unaligned span at the end of the blob.
        assert_eq!(
            modify(
                3,
                vec![int(13), int(16), blob(&[0, 0]), int(PARTIAL as i64)],
                Some(bin)
            ),
            Ok(Some(vec![0xFF, 0xF8]))
        );
        assert_eq!(
            modify(
                9,
                vec![int(9), int(16), int(1), int(PARTIAL as i64)],
                Some(bin)
            ),
            Ok(Some(vec![0xFF, 0xBF]))
        );
        // Integer ops and reads have no PARTIAL.
        assert_eq!(
            modify(
                12,
                vec![int(12), int(8), int(1), int(PARTIAL as i64)],
                Some(bin)
            ),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            modify(12, vec![int(12), int(8), int(1)], Some(bin)),
            Err(CdtError::OpNotApplicable)
        );
        assert_eq!(
            read_op(50, vec![int(9), int(8)], bin),
            Err(CdtError::OpNotApplicable)
        );
        assert_eq!(
            read_op(50, vec![int(0), int(17)], bin),
            Err(CdtError::OpNotApplicable)
        );
        assert_eq!(
            read_op(51, vec![int(-17), int(1)], bin),
            Err(CdtError::Parameter)
        );
        // An empty blob holds nothing to read or change.
        assert_eq!(
            read_op(51, vec![int(0), int(1)], &[]),
            Err(CdtError::OpNotApplicable)
        );
        assert_eq!(
            modify(7, vec![int(0), int(1)], Some(&[])),
            Err(CdtError::OpNotApplicable)
        );
    }

    #[test]
    fn bin_existence_and_type_rules() {
        let bit = || vec![int(0), int(1), blob(&[0x80])];
        // Only resize and insert create a bin.
        assert_eq!(modify(3, bit(), None), Err(CdtError::BinNotFound));
        let no_fail = vec![int(0), int(1), blob(&[0x80]), int(NO_FAIL as i64)];
        assert_eq!(modify(3, no_fail, None), Ok(None));
        assert_eq!(
            modify(1, vec![int(0), blob(&[1]), int(UPDATE_ONLY as i64)], None),
            Err(CdtError::BinNotFound)
        );
        assert_eq!(
            modify(
                1,
                vec![int(0), blob(&[1]), int(CREATE_ONLY as i64)],
                Some(&[2])
            ),
            Err(CdtError::BinExists)
        );
        assert_eq!(
            modify(
                1,
                vec![int(0), blob(&[1]), int((CREATE_ONLY | NO_FAIL) as i64)],
                Some(&[2])
            ),
            Ok(None)
        );
        assert_eq!(
            modify(1, vec![int(0), blob(&[1]), int(CREATE_ONLY as i64)], None),
            Ok(Some(vec![1]))
        );
        // CREATE_ONLY and UPDATE_ONLY together, or a flag an op lacks.
        assert_eq!(
            modify(
                0,
                vec![int(1), int((CREATE_ONLY | UPDATE_ONLY) as i64)],
                None
            ),
            Err(CdtError::Parameter)
        );
        let create_only = vec![int(0), int(1), blob(&[0x80]), int(CREATE_ONLY as i64)];
        assert_eq!(modify(3, create_only, Some(&[0])), Err(CdtError::Parameter));
        // Another particle type.
        let string = Some((ParticleType::String as u8, &b"ab"[..]));
        assert_eq!(
            operate(&payload(3, bit()), string, true).map(|_| ()),
            Err(CdtError::IncompatibleType)
        );
        assert_eq!(
            operate(&payload(51, vec![int(0), int(1)]), string, false).map(|_| ()),
            Err(CdtError::IncompatibleType)
        );
        let python = Some((ParticleType::PythonBlob as u8, &b"ab"[..]));
        assert_eq!(
            operate(&payload(51, vec![int(0), int(1)]), python, false).map(|_| ()),
            Err(CdtError::IncompatibleType)
        );
        // A read of a missing bin answers nothing, even when malformed.
        let outcome = operate(&[0xc1], None, false).expect("no bin, no read");
        assert!(outcome.bin.is_none() && outcome.result.is_none());
    }

    #[test]
    fn malformed_payloads_are_parameter_errors() {
        let bin = Some((ParticleType::Blob as u8, &[0u8, 0][..]));
        let refused = |bytes: &[u8], modify: bool| operate(bytes, bin, modify).map(|_| ());
        // Reads under the modify type and modifies under the read type.
        assert_eq!(
            refused(&payload(50, vec![int(0), int(1)]), true),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(&payload(7, vec![int(0), int(1)]), false),
            Err(CdtError::Parameter)
        );
        // Unknown codes, not a list, empty list, trailing bytes.
        assert_eq!(
            refused(&payload(13, vec![int(0)]), true),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(&payload(55, vec![int(0)]), false),
            Err(CdtError::Parameter)
        );
        assert_eq!(refused(&[0x01], true), Err(CdtError::Parameter));
        assert_eq!(refused(&[0x90], true), Err(CdtError::Parameter));
        assert_eq!(refused(&[0x91, 0x07, 0x00], true), Err(CdtError::Parameter));
        assert_eq!(refused(&[0x92, 0xc3, 0x00], true), Err(CdtError::Parameter));
        // Argument counts.
        assert_eq!(
            refused(&payload(7, vec![int(0)]), true),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(&payload(7, vec![int(0), int(1), int(0), int(0)]), true),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(&payload(52, vec![int(0), int(1)]), false),
            Err(CdtError::Parameter)
        );
        // Sizes and kinds.
        assert_eq!(
            refused(&payload(50, vec![int(0), int(0)]), false),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(&payload(50, vec![int(0), int(-1)]), false),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(&payload(54, vec![int(0), int(65)]), false),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(&payload(54, vec![int(0), int(8), int(2)]), false),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(&payload(52, vec![int(0), int(1), int(1)]), false),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(&payload(50, vec![int(MAX_BITS as i64 + 1), int(1)]), false),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(&payload(50, vec![Value::Double(0.0), int(1)]), false),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(&payload(3, vec![int(0), int(9), blob(&[0xFF])]), true),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(&payload(3, vec![int(0), int(1), int(1)]), true),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(
                &payload(8, vec![int(0), int(1), int(MAX_BITS as i64 + 1)]),
                true
            ),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(
                &payload(
                    10,
                    vec![
                        int(0),
                        int(8),
                        int(1),
                        int(0),
                        int(SATURATE as i64 | WRAP as i64)
                    ]
                ),
                true
            ),
            Err(CdtError::Parameter)
        );
        assert_eq!(
            refused(
                &payload(10, vec![int(0), int(8), int(1), int(0), int(8)]),
                true
            ),
            Err(CdtError::Parameter)
        );
    }

    #[test]
    fn every_span_of_a_small_blob_round_trips() {
        // Exhaustive against a bit-at-a-time model: set then get, not, count.
        let initial: Vec<u8> = vec![0xA5, 0x3C, 0xF0, 0x0F];
        let bit = |bytes: &[u8], i: u64| bytes[(i / 8) as usize] >> (7 - i % 8) & 1;
        for offset in 0..32u64 {
            for size in 1..=(32 - offset) {
                let data = vec![0x96u8; bytes_for(size) as usize];
                let after = modify(
                    3,
                    vec![int(offset as i64), int(size as i64), blob(&data)],
                    Some(&initial),
                )
                .expect("set applies")
                .expect("writes");
                for i in 0..32 {
                    let expected = if (offset..offset + size).contains(&i) {
                        bit(&data, i - offset)
                    } else {
                        bit(&initial, i)
                    };
                    assert_eq!(bit(&after, i), expected, "set {offset} {size} bit {i}");
                }
                let got = read_blob(vec![int(offset as i64), int(size as i64)], &after);
                assert_eq!(got, read_bits(&data, 0, size));
                let ones = (offset..offset + size)
                    .map(|i| u64::from(bit(&initial, i)))
                    .sum::<u64>();
                assert_eq!(
                    read_int(51, vec![int(offset as i64), int(size as i64)], &initial),
                    ones as i64
                );
                let flipped = modify(
                    7,
                    vec![int(offset as i64), int(size as i64)],
                    Some(&initial),
                )
                .expect("not applies")
                .expect("writes");
                for i in 0..32 {
                    let inside = (offset..offset + size).contains(&i);
                    assert_eq!(bit(&flipped, i), bit(&initial, i) ^ u8::from(inside));
                }
            }
        }
    }

    #[test]
    fn growth_past_the_callers_limit_is_refused_before_it_is_built() {
        let within = |code, args, bin: Option<&[u8]>, limit| {
            operate_within(
                &payload(code, args),
                bin.map(|b| (ParticleType::Blob as u8, b)),
                true,
                limit,
            )
        };
        // Resize (0) to 100 MiB with a 1 MiB limit: 13, not a 100 MiB blob.
        let big = 100 << 20;
        assert_eq!(
            within(0, vec![int(big), int(0), int(0)], None, 1 << 20).err(),
            Some(CdtError::TooBig)
        );
        // At the limit it is built.
        let outcome = within(0, vec![int(1 << 20), int(0), int(0)], None, 1 << 20).expect("fits");
        assert_eq!(outcome.bin.map(|(_, bytes)| bytes.len()), Some(1 << 20));
        // Insert past the end pads with zeros: the padded size counts.
        assert_eq!(
            within(1, vec![int(big), blob(b"x"), int(0)], Some(&[1]), 1 << 20).err(),
            Some(CdtError::TooBig)
        );
        // The reference's own bound still answers 4.
        assert_eq!(
            within(0, vec![int(128 << 20), int(0), int(0)], None, u64::MAX).err(),
            Some(CdtError::Parameter)
        );
        assert_eq!(CdtError::TooBig.result_code().code(), 13);
    }
}
