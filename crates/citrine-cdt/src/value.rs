//! The value model of list and map bins, and its codec: Aerospike's msgpack
//! dialect (protocol 05 §1) to [`Value`] and back, and the total order the
//! reference server sorts and compares elements by.
//!
//! Dialect: strings are msgpack `str` whose first byte is the particle type
//! 3 (blobs: 4 or another blob subtype; GeoJSON: 23); an ordered list or
//! map carries its flags in a zero-length ext (`0xc7 0x00 flags`) as its
//! first element (a map: as the first key, with a nil value; a map's header
//! ext may also carry the reference's persisted offset index, which is
//! dropped on decoding, the flags kept). The wildcard
//! and infinity helpers of range arguments are `fixext1` of type 0xff.
//!
//! Order (the reference's msgpack compare): nil < false < true < negative
//! integers < non-negative integers < strings < lists < maps < bytes <
//! doubles < GeoJSON < other ext < wildcard < infinity. Strings and bytes
//! compare bytewise (particle byte first), then by length; lists element by
//! element, then the shorter first; maps by entry count first, then entry
//! by entry in stored order. A wildcard equals anything, and ends the
//! comparison of the containers it is in.
//!
//! Invariants: [`decode`] never panics and refuses trailing bytes, depth
//! beyond [`MAX_DEPTH`] and counts the input cannot hold; [`encode`] writes
//! the smallest form of every header and integer, so decoding and encoding
//! a stored value gives back the same bytes.

use std::cmp::Ordering;

/// Deepest nesting accepted (the reference refuses deeper contexts too).
pub const MAX_DEPTH: usize = 64;

/// Most elements a header's count reserves room for before they are read:
/// nested headers each claiming the rest of the input must not reserve
/// that much at every level.
const PREALLOCATE_MAX: usize = 1024;

/// Particle type byte that starts a msgpack string.
pub const STRING_PREFIX: u8 = 3;
/// Particle type byte that starts GeoJSON text.
pub const GEOJSON_PREFIX: u8 = 23;

/// Ext type of the wildcard / infinity helpers.
const CMP_EXT_TYPE: u8 = 0xff;
const CMP_WILDCARD: u8 = 0x00;
const CMP_INF: u8 = 0x01;

/// List flag: the list is kept sorted.
pub const LIST_ORDERED: u8 = 0x01;
/// Map flag: kept sorted by key.
pub const MAP_KEY_ORDERED: u8 = 0x01;
/// Map flag: value-ordered as well (only with [`MAP_KEY_ORDERED`]).
pub const MAP_VALUE_ORDERED: u8 = 0x02;
/// Map flag of results: an ordered list of pairs, not a lookup map.
pub const MAP_PRESERVE_ORDER: u8 = 0x08;
/// Flag: the server keeps an index for the collection (accepted, not used).
pub const PERSIST_INDEX: u8 = 0x10;

/// A decoded element of a list or map bin, an op argument or a result.
#[derive(Clone, Debug)]
pub enum Value {
    Nil,
    Bool(bool),
    /// Any integer that fits `i64`.
    Int(i64),
    /// A positive integer above `i64::MAX` (msgpack uint64).
    UInt(u64),
    Double(f64),
    /// UTF-8 text (particle prefix removed).
    Str(Vec<u8>),
    /// Bytes with their particle subtype (4, or 7..=12; 0 for an empty or
    /// plain msgpack `bin`).
    Blob(u8, Vec<u8>),
    /// GeoJSON text (prefix removed).
    Geo(Vec<u8>),
    List(List),
    Map(Map),
    /// An ext other than the collection flags and helpers, kept verbatim.
    Ext(u8, Vec<u8>),
    /// Range helper: equal to anything.
    Wildcard,
    /// Range helper: greater than anything.
    Infinity,
}

/// A list and its flags ([`LIST_ORDERED`], [`PERSIST_INDEX`]).
#[derive(Clone, Debug, Default)]
pub struct List {
    pub flags: u8,
    pub items: Vec<Value>,
}

/// A map and its flags ([`MAP_KEY_ORDERED`] ...). Entries are in stored
/// order: sorted by key when key-ordered, insertion order otherwise.
#[derive(Clone, Debug, Default)]
pub struct Map {
    pub flags: u8,
    pub entries: Vec<(Value, Value)>,
}

impl List {
    /// Whether the list is kept sorted.
    pub fn is_ordered(&self) -> bool {
        self.flags & LIST_ORDERED != 0
    }
}

impl Map {
    /// Whether the map is kept sorted by key.
    pub fn is_key_ordered(&self) -> bool {
        self.flags & MAP_KEY_ORDERED != 0
    }
}

/// Why bytes are not a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ends inside a value.
    Truncated,
    /// A byte that starts no msgpack value (0xc1), or a malformed ext.
    Invalid,
    /// Nesting deeper than [`MAX_DEPTH`].
    TooDeep,
    /// Bytes after the value.
    Trailing,
}

/// Decodes exactly one value filling `bytes`: an op's payload, where the
/// wildcard and infinity helpers mean what they say.
pub fn decode(bytes: &[u8]) -> Result<Value, DecodeError> {
    decode_as(bytes, true)
}

/// Decodes a stored bin: the helpers' bytes there are plain exts (a client
/// may write anything), so that the order stays total on stored values.
pub fn decode_stored(bytes: &[u8]) -> Result<Value, DecodeError> {
    decode_as(bytes, false)
}

fn decode_as(bytes: &[u8], helpers: bool) -> Result<Value, DecodeError> {
    let mut reader = Reader {
        bytes,
        at: 0,
        helpers,
    };
    let value = reader.value(0)?;
    if reader.at != bytes.len() {
        return Err(DecodeError::Trailing);
    }
    Ok(value)
}

/// The length in bytes of the one msgpack value that starts `bytes` (which
/// may go on past it), without decoding it: what a caller needs to slice a
/// value out of a larger message (expressions carry op payloads and
/// literals inline). Refuses what [`decode`] refuses for the shape of the
/// bytes (0xc1, truncation, counts the input cannot hold); contents such
/// as particle prefixes and zero-length exts are not looked at. Does not
/// allocate; nesting costs no stack (an iterative count of pending values).
pub fn skip(bytes: &[u8]) -> Result<usize, DecodeError> {
    let mut at = 0usize;
    // Values still to step over; a header adds its elements.
    let mut pending: u64 = 1;
    while pending > 0 {
        pending -= 1;
        let b = *bytes.get(at).ok_or(DecodeError::Truncated)?;
        at += 1;
        let width = |n: usize, at: usize| -> Result<u64, DecodeError> {
            let end = at.checked_add(n).ok_or(DecodeError::Truncated)?;
            let field = bytes.get(at..end).ok_or(DecodeError::Truncated)?;
            Ok(field.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
        };
        // (payload bytes to step over, elements the header announces)
        let (data, elements): (u64, u64) = match b {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0xc1 => return Err(DecodeError::Invalid),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xce | 0xd2 | 0xca => (4, 0),
            0xcf | 0xd3 | 0xcb => (8, 0),
            0xa0..=0xbf => (u64::from(b & 0x1f), 0),
            0xd9 | 0xc4 => (1 + width(1, at)?, 0),
            0xda | 0xc5 => (2 + width(2, at)?, 0),
            0xdb | 0xc6 => (4 + width(4, at)?, 0),
            0x90..=0x9f => (0, u64::from(b & 0x0f)),
            0xdc => (2, width(2, at)?),
            0xdd => (4, width(4, at)?),
            0x80..=0x8f => (0, 2 * u64::from(b & 0x0f)),
            0xde => (2, 2 * width(2, at)?),
            0xdf => (4, 2 * width(4, at)?),
            0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xd6 => (5, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            0xc7 => (2 + width(1, at)?, 0),
            0xc8 => (3 + width(2, at)?, 0),
            0xc9 => (5 + width(4, at)?, 0),
        };
        let data = usize::try_from(data).map_err(|_| DecodeError::Truncated)?;
        at = at
            .checked_add(data)
            .filter(|&end| end <= bytes.len())
            .ok_or(DecodeError::Truncated)?;
        // Every element takes at least one byte.
        let remaining = (bytes.len() - at) as u64;
        pending = pending
            .checked_add(elements)
            .filter(|&n| n <= remaining)
            .ok_or(DecodeError::Truncated)?;
    }
    Ok(at)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Whether `0xff`-type exts decode as [`Value::Wildcard`] /
    /// [`Value::Infinity`] (op payloads) or as plain exts (stored bins).
    helpers: bool,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).ok_or(DecodeError::Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(DecodeError::Truncated)?;
        self.at = end;
        Ok(slice)
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn uint(&mut self, n: usize) -> Result<u64, DecodeError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn value(&mut self, depth: usize) -> Result<Value, DecodeError> {
        if depth > MAX_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        let b = self.byte()?;
        Ok(match b {
            0x00..=0x7f => Value::Int(i64::from(b)),
            0xe0..=0xff => Value::Int(i64::from(b as i8)),
            0xc0 => Value::Nil,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xcc => Value::Int(self.uint(1)? as i64),
            0xcd => Value::Int(self.uint(2)? as i64),
            0xce => Value::Int(self.uint(4)? as i64),
            0xcf => {
                let raw = self.uint(8)?;
                match i64::try_from(raw) {
                    Ok(small) => Value::Int(small),
                    Err(_) => Value::UInt(raw),
                }
            }
            0xd0 => Value::Int(i64::from(self.uint(1)? as u8 as i8)),
            0xd1 => Value::Int(i64::from(self.uint(2)? as u16 as i16)),
            0xd2 => Value::Int(i64::from(self.uint(4)? as u32 as i32)),
            0xd3 => Value::Int(self.uint(8)? as i64),
            0xca => Value::Double(f64::from(f32::from_bits(self.uint(4)? as u32))),
            0xcb => Value::Double(f64::from_bits(self.uint(8)?)),
            0xa0..=0xbf => self.text(usize::from(b & 0x1f))?,
            // str/bin, array and map headers with a 1-, 2- or 4-byte length.
            0xd9 | 0xc4 | 0xda | 0xc5 | 0xdb | 0xc6 => {
                let n = self.length(b)?;
                self.bytes_of(b, n)?
            }
            0x90..=0x9f => self.list(usize::from(b & 0x0f), depth)?,
            0xdc | 0xdd => {
                let n = self.length(b)?;
                self.list(n, depth)?
            }
            0x80..=0x8f => self.map(usize::from(b & 0x0f), depth)?,
            0xde | 0xdf => {
                let n = self.length(b)?;
                self.map(n, depth)?
            }
            0xd4 => self.ext(1)?,
            0xd5 => self.ext(2)?,
            0xd6 => self.ext(4)?,
            0xd7 => self.ext(8)?,
            0xd8 => self.ext(16)?,
            0xc7 => {
                let n = self.uint(1)? as usize;
                self.ext(n)?
            }
            0xc8 => {
                let n = self.uint(2)? as usize;
                self.ext(n)?
            }
            0xc9 => {
                let n = self.uint(4)? as usize;
                self.ext(n)?
            }
            0xc1 => return Err(DecodeError::Invalid),
        })
    }

    /// The length that follows a header byte with a wide length field
    /// (1 byte for str8/bin8, 2 for the 16-bit forms, 4 for the 32-bit).
    fn length(&mut self, header: u8) -> Result<usize, DecodeError> {
        let width = match header {
            0xd9 | 0xc4 => 1,
            0xda | 0xc5 | 0xdc | 0xde => 2,
            _ => 4,
        };
        Ok(self.uint(width)? as usize)
    }

    fn bytes_of(&mut self, header: u8, n: usize) -> Result<Value, DecodeError> {
        if matches!(header, 0xc4..=0xc6) {
            // A plain msgpack `bin`: raw bytes with no particle prefix.
            return Ok(Value::Blob(0, self.take(n)?.to_vec()));
        }
        self.text(n)
    }

    /// A `str`-family payload of `n` bytes: particle prefix, then content.
    fn text(&mut self, n: usize) -> Result<Value, DecodeError> {
        let payload = self.take(n)?;
        Ok(match payload.split_first() {
            None => Value::Blob(0, Vec::new()),
            Some((&STRING_PREFIX, rest)) => Value::Str(rest.to_vec()),
            Some((&GEOJSON_PREFIX, rest)) => Value::Geo(rest.to_vec()),
            Some((&prefix, rest)) => Value::Blob(prefix, rest.to_vec()),
        })
    }

    /// The ext type byte and `n` data bytes.
    fn ext(&mut self, n: usize) -> Result<Value, DecodeError> {
        if n == 0 {
            // Zero-length exts are collection flags, valid only as the
            // first element (taken by `flags`); anywhere else they would
            // turn into flags when the element moves first.
            return Err(DecodeError::Invalid);
        }
        let kind = self.byte()?;
        let data = self.take(n)?;
        if self.helpers && kind == CMP_EXT_TYPE && n == 1 {
            match data[0] {
                CMP_WILDCARD => return Ok(Value::Wildcard),
                CMP_INF => return Ok(Value::Infinity),
                _ => {}
            }
        }
        Ok(Value::Ext(kind, data.to_vec()))
    }

    /// If the next value is a zero-length ext, consumes it: its type byte
    /// is the collection's flags.
    fn flags(&mut self) -> Option<u8> {
        match self.bytes.get(self.at..self.at + 3) {
            Some([0xc7, 0x00, flags]) => {
                let flags = *flags;
                self.at += 3;
                Some(flags)
            }
            _ => None,
        }
    }

    /// If the next pair is a map header that carries the reference's
    /// persisted offset index (an ext of any length, its type byte the
    /// flags, with a nil value), consumes it: the flags are kept, the index
    /// is dropped (Citrine keeps none in the value; the reference answers
    /// such a map re-packed without it).
    fn indexed_map_header(&mut self) -> Option<u8> {
        let rest = self.bytes.get(self.at..)?;
        let (header, len) = match *rest.first()? {
            0xd4 => (2, 1),
            0xd5 => (2, 2),
            0xd6 => (2, 4),
            0xd7 => (2, 8),
            0xd8 => (2, 16),
            0xc7 => (3, usize::from(*rest.get(1)?)),
            0xc8 => (
                4,
                usize::from(u16::from_be_bytes([*rest.get(1)?, *rest.get(2)?])),
            ),
            0xc9 => (
                6,
                usize::try_from(u32::from_be_bytes([
                    *rest.get(1)?,
                    *rest.get(2)?,
                    *rest.get(3)?,
                    *rest.get(4)?,
                ]))
                .ok()?,
            ),
            _ => return None,
        };
        let flags = *rest.get(header - 1)?;
        if flags & !0x1f != 0 {
            // Not map flags (the helpers' type 0xff, a client's own ext).
            return None;
        }
        let end = header.checked_add(len)?;
        if rest.get(end) != Some(&0xc0) {
            return None;
        }
        self.at += end + 1;
        Some(flags)
    }

    fn list(&mut self, mut n: usize, depth: usize) -> Result<Value, DecodeError> {
        // Every element takes at least one byte.
        if n > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        let mut flags = 0;
        if n > 0 {
            if let Some(f) = self.flags() {
                flags = f;
                n -= 1;
            }
        }
        let mut items = Vec::with_capacity(n.min(PREALLOCATE_MAX));
        for _ in 0..n {
            items.push(self.value(depth + 1)?);
        }
        Ok(Value::List(List { flags, items }))
    }

    fn map(&mut self, mut n: usize, depth: usize) -> Result<Value, DecodeError> {
        if n > self.remaining() / 2 {
            return Err(DecodeError::Truncated);
        }
        let mut flags = 0;
        if n > 0 {
            if let Some(f) = self.flags() {
                flags = f;
                n -= 1;
                // The flags key's value (nil).
                self.value(depth + 1)?;
            } else if let Some(f) = self.indexed_map_header() {
                flags = f;
                n -= 1;
            }
        }
        let mut entries = Vec::with_capacity(n.min(PREALLOCATE_MAX));
        for _ in 0..n {
            let key = self.value(depth + 1)?;
            let value = self.value(depth + 1)?;
            entries.push((key, value));
        }
        Ok(Value::Map(Map { flags, entries }))
    }
}

/// Encodes `value` in the dialect, appending to `out`.
pub fn encode(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Nil => out.push(0xc0),
        Value::Bool(false) => out.push(0xc2),
        Value::Bool(true) => out.push(0xc3),
        Value::Int(i) => encode_int(*i, out),
        Value::UInt(u) => {
            out.push(0xcf);
            out.extend_from_slice(&u.to_be_bytes());
        }
        Value::Double(d) => {
            out.push(0xcb);
            out.extend_from_slice(&d.to_bits().to_be_bytes());
        }
        Value::Str(s) => encode_prefixed(STRING_PREFIX, s, out),
        Value::Geo(s) => encode_prefixed(GEOJSON_PREFIX, s, out),
        Value::Blob(0, b) if b.is_empty() => encode_str_header(0, out),
        Value::Blob(0, b) => {
            // Plain msgpack bin, as it came.
            match u32::try_from(b.len()) {
                Ok(n) if n < 0x100 => out.extend_from_slice(&[0xc4, n as u8]),
                Ok(n) if n < 0x1_0000 => {
                    out.push(0xc5);
                    out.extend_from_slice(&(n as u16).to_be_bytes());
                }
                _ => {
                    out.push(0xc6);
                    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
                }
            }
            out.extend_from_slice(b);
        }
        Value::Blob(prefix, b) => encode_prefixed(*prefix, b, out),
        Value::List(list) => {
            let flagged = list.flags != 0;
            encode_count(0x90, 0xdc, list.items.len() + usize::from(flagged), out);
            if flagged {
                out.extend_from_slice(&[0xc7, 0x00, list.flags]);
            }
            for item in &list.items {
                encode(item, out);
            }
        }
        Value::Map(map) => {
            let flagged = map.flags != 0;
            encode_count(0x80, 0xde, map.entries.len() + usize::from(flagged), out);
            if flagged {
                out.extend_from_slice(&[0xc7, 0x00, map.flags, 0xc0]);
            }
            for (key, value) in &map.entries {
                encode(key, out);
                encode(value, out);
            }
        }
        Value::Ext(kind, data) => {
            match data.len() {
                1 => out.push(0xd4),
                2 => out.push(0xd5),
                4 => out.push(0xd6),
                8 => out.push(0xd7),
                16 => out.push(0xd8),
                n if n < 0x100 => out.extend_from_slice(&[0xc7, n as u8]),
                n if n < 0x1_0000 => {
                    out.push(0xc8);
                    out.extend_from_slice(&(n as u16).to_be_bytes());
                }
                n => {
                    out.push(0xc9);
                    out.extend_from_slice(&(n as u32).to_be_bytes());
                }
            }
            out.push(*kind);
            out.extend_from_slice(data);
        }
        Value::Wildcard => out.extend_from_slice(&[0xd4, CMP_EXT_TYPE, CMP_WILDCARD]),
        Value::Infinity => out.extend_from_slice(&[0xd4, CMP_EXT_TYPE, CMP_INF]),
    }
}

/// Encodes `value` into a new buffer.
pub fn to_bytes(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    encode(value, &mut out);
    out
}

fn encode_int(i: i64, out: &mut Vec<u8>) {
    if (0..=0x7f).contains(&i) || (-32..0).contains(&i) {
        out.push(i as u8);
    } else if i >= 0 {
        if i <= 0xff {
            out.extend_from_slice(&[0xcc, i as u8]);
        } else if i <= 0xffff {
            out.push(0xcd);
            out.extend_from_slice(&(i as u16).to_be_bytes());
        } else if i <= 0xffff_ffff {
            out.push(0xce);
            out.extend_from_slice(&(i as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&(i as u64).to_be_bytes());
        }
    } else if i >= i64::from(i8::MIN) {
        out.extend_from_slice(&[0xd0, i as i8 as u8]);
    } else if i >= i64::from(i16::MIN) {
        out.push(0xd1);
        out.extend_from_slice(&(i as i16).to_be_bytes());
    } else if i >= i64::from(i32::MIN) {
        out.push(0xd2);
        out.extend_from_slice(&(i as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&i.to_be_bytes());
    }
}

fn encode_str_header(n: usize, out: &mut Vec<u8>) {
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n < 0x100 {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n < 0x1_0000 {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

fn encode_prefixed(prefix: u8, content: &[u8], out: &mut Vec<u8>) {
    encode_str_header(content.len() + 1, out);
    out.push(prefix);
    out.extend_from_slice(content);
}

fn encode_count(fix: u8, wide16: u8, n: usize, out: &mut Vec<u8>) {
    if n < 16 {
        out.push(fix | n as u8);
    } else if n < 0x1_0000 {
        out.push(wide16);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(wide16 + 1);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

/// Nesting depth: 0 for a scalar, 1 for a flat collection, and so on.
pub fn depth(value: &Value) -> usize {
    match value {
        Value::List(list) => 1 + list.items.iter().map(depth).max().unwrap_or(0),
        Value::Map(map) => {
            1 + map
                .entries
                .iter()
                .map(|(key, item)| depth(key).max(depth(item)))
                .max()
                .unwrap_or(0)
        }
        _ => 0,
    }
}

/// Puts every collection inside `value` in canonical order: ordered lists
/// sorted, and every map — key-ordered or not — sorted by key with unique
/// keys (the last of equal keys kept). The reference stores all maps in
/// key order since its 7.0 whatever their flags (an unordered map keeps
/// flags 0, so it still reads back as unordered). Values already in order
/// are only checked. Answers whether anything moved.
pub fn canonicalize(value: &mut Value) -> bool {
    match value {
        Value::List(list) => {
            let mut changed = false;
            for item in list.items.iter_mut() {
                changed |= canonicalize(item);
            }
            let sorted = list
                .items
                .windows(2)
                .all(|pair| compare_total(&pair[0], &pair[1]) != Ordering::Greater);
            if list.is_ordered() && !sorted {
                list.items.sort_by(compare_total);
                changed = true;
            }
            changed
        }
        Value::Map(map) => {
            let mut changed = false;
            for (_, item) in map.entries.iter_mut() {
                changed |= canonicalize(item);
            }
            let strictly_sorted = map
                .entries
                .windows(2)
                .all(|pair| compare_total(&pair[0].0, &pair[1].0) == Ordering::Less);
            if !strictly_sorted {
                sort_unique_keys(&mut map.entries);
                changed = true;
            }
            changed
        }
        _ => false,
    }
}

/// Whether any map inside `value` (itself included) holds a key twice.
pub fn has_duplicate_keys(value: &Value) -> bool {
    match value {
        Value::List(list) => list.items.iter().any(has_duplicate_keys),
        Value::Map(map) => {
            // Strictly ascending keys (what is stored) are unique: no sort.
            let repeated = !map
                .entries
                .windows(2)
                .all(|pair| compare_total(&pair[0].0, &pair[1].0) == Ordering::Less)
                && {
                    let mut keys: Vec<&Value> = map.entries.iter().map(|(key, _)| key).collect();
                    keys.sort_by(|a, b| compare_total(a, b));
                    keys.windows(2)
                        .any(|pair| compare_total(pair[0], pair[1]) == Ordering::Equal)
                };
            repeated
                || map
                    .entries
                    .iter()
                    .any(|(key, item)| has_duplicate_keys(key) || has_duplicate_keys(item))
        }
        _ => false,
    }
}

/// Sorts map entries by key and keeps one entry per key, the last of equal
/// keys (as putting the entries one by one would): what a map holds.
pub(crate) fn sort_unique_keys(entries: &mut Vec<(Value, Value)>) {
    // Stable: equal keys keep their order, and the last wins.
    entries.sort_by(|a, b| compare_total(&a.0, &b.0));
    let mut unique: Vec<(Value, Value)> = Vec::with_capacity(entries.len());
    for entry in entries.drain(..) {
        match unique.last_mut() {
            Some(last) if compare_total(&last.0, &entry.0) == Ordering::Equal => *last = entry,
            _ => unique.push(entry),
        }
    }
    *entries = unique;
}

/// Rank of a value's type in the reference order.
fn type_rank(value: &Value) -> u8 {
    match value {
        Value::Nil => 1,
        Value::Bool(false) => 2,
        Value::Bool(true) => 3,
        Value::Int(i) if *i < 0 => 4,
        Value::Int(_) | Value::UInt(_) => 5,
        Value::Str(_) => 6,
        Value::List(_) => 7,
        Value::Map(_) => 8,
        Value::Blob(..) => 9,
        Value::Double(_) => 10,
        Value::Geo(_) => 11,
        Value::Ext(..) => 12,
        Value::Wildcard => 13,
        Value::Infinity => 14,
    }
}

/// The result of comparing two values: `None` when a wildcard decided it
/// (equal, and nothing after it in the enclosing containers counts).
fn compare_inner(a: &Value, b: &Value, unordered: &mut bool, matching: bool) -> (Ordering, bool) {
    if matching && (matches!(a, Value::Wildcard) || matches!(b, Value::Wildcard)) {
        return (Ordering::Equal, true);
    }
    if is_unordered_map(a) || is_unordered_map(b) {
        *unordered = true;
    }
    let (ra, rb) = (type_rank(a), type_rank(b));
    if ra != rb {
        return (ra.cmp(&rb), false);
    }
    let ordering = match (a, b) {
        (Value::Int(x), Value::Int(y)) => x.cmp(y),
        (Value::Int(_), Value::UInt(_)) => Ordering::Less,
        (Value::UInt(_), Value::Int(_)) => Ordering::Greater,
        (Value::UInt(x), Value::UInt(y)) => x.cmp(y),
        (Value::Double(x), Value::Double(y)) => {
            // NaN after every number and equal to itself, so sorting sees a
            // total order (-0.0 and 0.0 stay equal, as in the reference).
            x.partial_cmp(y)
                .unwrap_or_else(|| x.is_nan().cmp(&y.is_nan()))
        }
        (Value::Str(x), Value::Str(y)) | (Value::Geo(x), Value::Geo(y)) => x.cmp(y),
        (Value::Blob(px, x), Value::Blob(py, y)) => {
            // Bytewise over the particle byte and content, as stored.
            (*px, x.as_slice()).cmp(&(*py, y.as_slice()))
        }
        (Value::Ext(kx, x), Value::Ext(ky, y)) => (*kx, x.as_slice()).cmp(&(*ky, y.as_slice())),
        (Value::List(x), Value::List(y)) => {
            for (p, q) in x.items.iter().zip(&y.items) {
                let (ordering, wild) = compare_inner(p, q, unordered, matching);
                if wild {
                    return (Ordering::Equal, true);
                }
                if ordering != Ordering::Equal {
                    return (ordering, false);
                }
            }
            x.items.len().cmp(&y.items.len())
        }
        (Value::Map(x), Value::Map(y)) => {
            let by_count = x.entries.len().cmp(&y.entries.len());
            if by_count != Ordering::Equal {
                return (by_count, false);
            }
            for ((kx, vx), (ky, vy)) in x.entries.iter().zip(&y.entries) {
                for (p, q) in [(kx, ky), (vx, vy)] {
                    let (ordering, wild) = compare_inner(p, q, unordered, matching);
                    if wild {
                        return (Ordering::Equal, true);
                    }
                    if ordering != Ordering::Equal {
                        return (ordering, false);
                    }
                }
            }
            Ordering::Equal
        }
        _ => Ordering::Equal,
    };
    (ordering, false)
}

/// Compares two values in the reference order (module doc).
pub fn compare(a: &Value, b: &Value) -> Ordering {
    compare_inner(a, b, &mut false, true).0
}

/// [`compare`] as a total order, for sorting what is stored: a wildcard is
/// a value of its own (after every other type but infinity), not a match
/// for anything. `compare`'s wildcard equals everything, so it is no order
/// to sort by — a map or ordered list holding one (an expression literal
/// may) would make the sort panic.
pub fn compare_total(a: &Value, b: &Value) -> Ordering {
    compare_inner(a, b, &mut false, false).0
}

/// [`compare`], and whether the walk met a non-empty map without key order
/// (the reference's expression comparisons answer "unknown" then: such a
/// map has no order of its own).
pub fn compare_noting_unordered(a: &Value, b: &Value) -> (Ordering, bool) {
    let mut unordered = false;
    let ordering = compare_inner(a, b, &mut unordered, true).0;
    (ordering, unordered)
}

fn is_unordered_map(value: &Value) -> bool {
    matches!(value, Value::Map(map) if !map.entries.is_empty() && !map.is_key_ordered())
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        compare(self, other) == Ordering::Equal
    }
}

impl Value {
    /// A string value from text.
    pub fn str(text: &str) -> Value {
        Value::Str(text.as_bytes().to_vec())
    }

    /// The integer, if this is one that fits `i64`.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// Whether this is a list or a map.
    pub fn is_collection(&self) -> bool {
        matches!(self, Value::List(_) | Value::Map(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(bytes: &[u8]) {
        let value = decode(bytes).expect("decodes");
        assert_eq!(to_bytes(&value), bytes, "{value:?}");
    }

    #[test]
    fn dialect_round_trips() {
        round_trip(&[0x93, 0x01, 0x02, 0x03]);
        round_trip(&[0x92, 0xa2, 0x03, b'x', 0xd0, 0x80]);
        round_trip(&[0x94, 0xc7, 0x00, 0x01, 0x01, 0x02, 0x03]);
        round_trip(&[0x82, 0xc7, 0x00, 0x01, 0xc0, 0xa2, 0x03, b'k', 0x05]);
        round_trip(&[0x81, 0x01, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0]);
        round_trip(&[0x91, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        round_trip(&[0x92, 0xd4, 0xff, 0x00, 0xd4, 0xff, 0x01]);
        round_trip(&[0x91, 0xc4, 0x02, 0xab, 0xcd]);
    }

    #[test]
    fn a_map_header_with_a_persisted_index_keeps_its_flags_and_drops_the_index() {
        // The official C client's "incorrect offset index": a key-ordered
        // map whose header ext carries 10 bytes of (wrong) offset index.
        let mut bytes = vec![0x83, 0xc7, 0x0a, 0x01];
        bytes.extend(55u8..65);
        bytes.extend_from_slice(&[0xc0, 0x01, 0x01, 0x02, 0x02]);
        let Value::Map(map) = decode_stored(&bytes).expect("decodes") else {
            panic!("a map");
        };
        assert_eq!(map.flags, MAP_KEY_ORDERED);
        assert_eq!(map.entries.len(), 2);
        assert_eq!(
            to_bytes(&Value::Map(map)),
            [0x83, 0xc7, 0x00, 0x01, 0xc0, 0x01, 0x01, 0x02, 0x02]
        );
        // An ext key whose value is not nil, or whose type is no flags,
        // stays an entry.
        let bytes = [0x81, 0xd4, 0xff, 0x00, 0xc0];
        let Value::Map(map) = decode_stored(&bytes).expect("decodes") else {
            panic!("a map");
        };
        assert_eq!((map.flags, map.entries.len()), (0, 1));
        let bytes = [0x81, 0xd4, 0x05, 0x00, 0x01];
        let Value::Map(map) = decode_stored(&bytes).expect("decodes") else {
            panic!("a map");
        };
        assert_eq!((map.flags, map.entries.len()), (0, 1));
    }

    #[test]
    fn skip_measures_one_value_without_decoding() {
        for bytes in [
            &[0x93, 0x01, 0x02, 0x03][..],
            &[0x82, 0xc7, 0x00, 0x01, 0xc0, 0xa2, 0x03, b'k', 0x05],
            &[0x81, 0x01, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0],
            &[0x91, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            &[0x92, 0xd4, 0xff, 0x00, 0xd4, 0xff, 0x01],
            &[0xdc, 0x00, 0x02, 0xc4, 0x02, 0xab, 0xcd, 0xc0],
            &[0xc0],
        ] {
            assert_eq!(skip(bytes), Ok(bytes.len()), "{bytes:x?}");
            let mut longer = bytes.to_vec();
            longer.extend_from_slice(&[0x01, 0x02]);
            assert_eq!(skip(&longer), Ok(bytes.len()), "{bytes:x?}");
            for end in 0..bytes.len() {
                assert!(skip(&bytes[..end]).is_err(), "{:x?}", &bytes[..end]);
            }
        }
        assert_eq!(skip(&[0xc1]), Err(DecodeError::Invalid));
        assert_eq!(
            skip(&[0xdd, 0xff, 0xff, 0xff, 0xff]),
            Err(DecodeError::Truncated)
        );
        // Deep nesting costs no stack.
        let mut deep = vec![0x91; 100_000];
        deep.push(0xc0);
        assert_eq!(skip(&deep), Ok(deep.len()));
    }

    #[test]
    fn integers_use_the_smallest_form() {
        for (i, len) in [
            (0i64, 1),
            (127, 1),
            (-32, 1),
            (-33, 2),
            (128, 2),
            (255, 2),
            (256, 3),
            (-129, 3),
            (65_536, 5),
            (-40_000, 5),
            (1 << 40, 9),
            (i64::MIN, 9),
        ] {
            let bytes = to_bytes(&Value::Int(i));
            assert_eq!(bytes.len(), len, "{i}");
            assert_eq!(decode(&bytes).expect("decodes").as_int(), Some(i));
        }
    }

    #[test]
    fn malformed_input_is_refused_without_panic() {
        assert_eq!(decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(decode(&[0xc1]), Err(DecodeError::Invalid));
        assert_eq!(decode(&[0x01, 0x02]), Err(DecodeError::Trailing));
        assert_eq!(
            decode(&[0xdd, 0xff, 0xff, 0xff, 0xff]),
            Err(DecodeError::Truncated)
        );
        assert_eq!(
            decode(&[0xdf, 0xff, 0xff, 0xff, 0xff, 0]),
            Err(DecodeError::Truncated)
        );
        assert_eq!(
            decode(&[0xdb, 0xff, 0xff, 0xff, 0xff]),
            Err(DecodeError::Truncated)
        );
        // A flags ext anywhere but first.
        assert_eq!(
            decode(&[0x92, 0x01, 0xc7, 0x00, 0x00]),
            Err(DecodeError::Invalid)
        );
        let deep = vec![0x91; MAX_DEPTH + 2];
        assert!(decode(&deep).is_err());
        // Every prefix of a valid value fails cleanly.
        let valid = [
            0x82, 0xa2, 0x03, b'k', 0x93, 1, 2, 3, 0x01, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        for end in 0..valid.len() {
            assert!(decode(&valid[..end]).is_err());
        }
        assert!(decode(&valid).is_ok());
    }

    #[test]
    fn order_follows_the_reference() {
        let ascending = [
            Value::Nil,
            Value::Bool(false),
            Value::Bool(true),
            Value::Int(-5),
            Value::Int(-1),
            Value::Int(0),
            Value::Int(7),
            Value::UInt(u64::MAX),
            Value::str("a"),
            Value::str("ab"),
            Value::str("b"),
            Value::List(List {
                flags: 0,
                items: vec![Value::Int(1)],
            }),
            Value::List(List {
                flags: 0,
                items: vec![Value::Int(1), Value::Int(0)],
            }),
            Value::List(List {
                flags: 0,
                items: vec![Value::Int(2)],
            }),
            Value::Map(Map {
                flags: 0,
                entries: vec![(Value::Int(9), Value::Int(9))],
            }),
            Value::Map(Map {
                flags: 0,
                entries: vec![
                    (Value::Int(1), Value::Int(1)),
                    (Value::Int(2), Value::Int(2)),
                ],
            }),
            Value::Blob(4, vec![0]),
            Value::Double(-1.0),
            Value::Double(2.5),
            Value::Geo(b"{}".to_vec()),
            Value::Infinity,
        ];
        for (i, a) in ascending.iter().enumerate() {
            for (j, b) in ascending.iter().enumerate() {
                assert_eq!(compare(a, b), i.cmp(&j), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn nan_sorts_after_every_number_without_breaking_the_order() {
        let mut items: Vec<Value> = (0..200)
            .map(|i| match i % 3 {
                0 => Value::Double(f64::NAN),
                1 => Value::Double(f64::from(i) * -1.5),
                _ => Value::Double(f64::from(i)),
            })
            .collect();
        items.sort_by(compare);
        let first_nan = items
            .iter()
            .position(|v| matches!(v, Value::Double(d) if d.is_nan()))
            .expect("NaNs are kept");
        assert!(items[first_nan..]
            .iter()
            .all(|v| matches!(v, Value::Double(d) if d.is_nan())));
        assert!(items[..first_nan]
            .windows(2)
            .all(|w| compare(&w[0], &w[1]) != Ordering::Greater));
        assert_eq!(
            compare(&Value::Double(-0.0), &Value::Double(0.0)),
            Ordering::Equal
        );
    }

    #[test]
    fn stored_bins_read_the_helpers_as_plain_exts() {
        let bytes = [0x92, 0xd4, 0xff, 0x00, 0xd4, 0xff, 0x01];
        let stored = decode_stored(&bytes).expect("decodes");
        let Value::List(list) = &stored else {
            panic!("a list")
        };
        assert!(list
            .items
            .iter()
            .all(|item| matches!(item, Value::Ext(0xff, _))));
        assert_eq!(to_bytes(&stored), bytes);
        let payload = decode(&bytes).expect("decodes");
        let Value::List(list) = &payload else {
            panic!("a list")
        };
        assert!(matches!(list.items[..], [Value::Wildcard, Value::Infinity]));
    }

    #[test]
    fn wildcards_sort_as_values_of_their_own_never_panic() {
        // An expression literal may hold wildcards where keys and ordered
        // items go; `compare` matches a wildcard with anything, which is no
        // order to sort by (the sort panicked on such a map, found by the
        // exp_parse_eval fuzz target).
        let mixed: Vec<Value> = (0..48)
            .map(|i| match i % 3 {
                0 => Value::Wildcard,
                1 => Value::Int((i * 7919) % 31),
                _ => Value::str(&format!("k{}", (i * 104_729) % 17)),
            })
            .collect();
        let mut map = Value::Map(Map {
            flags: 0,
            entries: mixed.iter().cloned().map(|key| (key, Value::Nil)).collect(),
        });
        canonicalize(&mut map);
        let Value::Map(sorted) = &map else {
            panic!("{map:?}")
        };
        assert!(sorted
            .entries
            .windows(2)
            .all(|pair| compare_total(&pair[0].0, &pair[1].0) == Ordering::Less));
        assert!(matches!(sorted.entries.last(), Some((Value::Wildcard, _))));
        let mut list = Value::List(List {
            flags: LIST_ORDERED,
            items: mixed,
        });
        canonicalize(&mut list);
        assert!(!canonicalize(&mut list), "sorted once, stays sorted");
    }

    #[test]
    fn every_map_is_stored_in_key_order_and_keeps_its_flags() {
        // Keys of the three kinds a map key may be, out of order.
        let keys = [
            Value::Int(7),
            Value::Int(-5),
            Value::str("b"),
            Value::str(""),
            Value::Blob(0, vec![1]),
            Value::Blob(0, vec![]),
        ];
        let mut value = Value::Map(Map {
            flags: 0,
            entries: keys.iter().cloned().map(|key| (key, Value::Nil)).collect(),
        });
        assert!(canonicalize(&mut value));
        let Value::Map(map) = &value else {
            panic!("{value:?}")
        };
        assert_eq!(map.flags, 0, "an unordered map stays unordered");
        let order: Vec<&Value> = map.entries.iter().map(|(key, _)| key).collect();
        assert_eq!(
            order,
            [&keys[1], &keys[0], &keys[3], &keys[2], &keys[5], &keys[4]]
        );
        assert!(!canonicalize(&mut value), "already in order: untouched");
        assert!(!has_duplicate_keys(&value));
        let nested = Value::List(List {
            flags: 0,
            items: vec![Value::Map(Map {
                flags: 0,
                entries: vec![
                    (Value::str("a"), Value::Int(1)),
                    (Value::str("b"), Value::Int(2)),
                    (Value::str("a"), Value::Int(3)),
                ],
            })],
        });
        assert!(has_duplicate_keys(&nested));
    }

    #[test]
    fn canonicalize_sorts_nested_ordered_collections() {
        let mut value = Value::List(List {
            flags: 0,
            items: vec![
                Value::List(List {
                    flags: LIST_ORDERED,
                    items: vec![Value::Int(3), Value::Int(1)],
                }),
                Value::Map(Map {
                    flags: MAP_KEY_ORDERED,
                    entries: vec![
                        (Value::str("b"), Value::Int(1)),
                        (Value::str("a"), Value::Int(2)),
                        (Value::str("b"), Value::Int(3)),
                    ],
                }),
                Value::List(List {
                    flags: 0,
                    items: vec![Value::Int(3), Value::Int(1)],
                }),
            ],
        });
        canonicalize(&mut value);
        let expected = Value::List(List {
            flags: 0,
            items: vec![
                Value::List(List {
                    flags: LIST_ORDERED,
                    items: vec![Value::Int(1), Value::Int(3)],
                }),
                Value::Map(Map {
                    flags: MAP_KEY_ORDERED,
                    entries: vec![
                        (Value::str("a"), Value::Int(2)),
                        (Value::str("b"), Value::Int(3)),
                    ],
                }),
                Value::List(List {
                    flags: 0,
                    items: vec![Value::Int(3), Value::Int(1)],
                }),
            ],
        });
        assert_eq!(to_bytes(&value), to_bytes(&expected));
        assert_eq!(depth(&value), 2);
        assert_eq!(depth(&Value::Int(1)), 0);
    }

    #[test]
    fn wildcard_equals_anything_and_ends_the_comparison() {
        let pattern = Value::List(List {
            flags: 0,
            items: vec![Value::str("a"), Value::Wildcard],
        });
        let longer = Value::List(List {
            flags: 0,
            items: vec![Value::str("a"), Value::Int(1), Value::Int(2)],
        });
        let other = Value::List(List {
            flags: 0,
            items: vec![Value::str("b"), Value::Int(1)],
        });
        assert_eq!(compare(&pattern, &longer), Ordering::Equal);
        assert_eq!(compare(&pattern, &other), Ordering::Less);
    }
}
