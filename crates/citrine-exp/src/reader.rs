//! A token-level cursor over msgpack bytes: what the expression parser
//! needs to walk an expression tree (array headers, op codes, integers,
//! plain strings) and to slice out whole values by their byte ranges.
//!
//! Values themselves (list and map literals, op payload arguments) are
//! decoded by `citrine_cdt::value`; this module only reads headers and
//! scalars, and measures values with [`citrine_cdt::value::skip`].
//!
//! Invariants: no method panics on any input; a method that fails leaves
//! the cursor where it was.

use citrine_cdt::value;

/// Where the parser is in the expression's bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// What a value's first byte says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Nil,
    Bool,
    Int,
    Float,
    /// The str and bin families (particle-prefixed in Aerospike's dialect).
    Bytes,
    Array,
    Map,
    /// Exts and the one invalid byte.
    Other,
}

/// The kind of a value from its first byte.
pub(crate) fn kind_of(first: u8) -> Kind {
    match first {
        0x00..=0x7f | 0xcc..=0xd3 | 0xe0..=0xff => Kind::Int,
        0xc0 => Kind::Nil,
        0xc2 | 0xc3 => Kind::Bool,
        0xca | 0xcb => Kind::Float,
        0xa0..=0xbf | 0xd9..=0xdb | 0xc4..=0xc6 => Kind::Bytes,
        0x90..=0x9f | 0xdc | 0xdd => Kind::Array,
        0x80..=0x8f | 0xde | 0xdf => Kind::Map,
        _ => Kind::Other,
    }
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { bytes, at: 0 }
    }

    /// Offset of the next byte.
    pub(crate) fn at(&self) -> usize {
        self.at
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.at >= self.bytes.len()
    }

    /// The kind of the next value, `None` at the end.
    pub(crate) fn peek(&self) -> Option<Kind> {
        self.bytes.get(self.at).map(|&b| kind_of(b))
    }

    fn uint_at(&self, from: usize, n: usize) -> Option<u64> {
        let end = from.checked_add(n)?;
        let field = self.bytes.get(from..end)?;
        Some(field.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// Consumes an array header; answers its element count.
    pub(crate) fn array(&mut self) -> Option<usize> {
        let b = *self.bytes.get(self.at)?;
        let (count, header) = match b {
            0x90..=0x9f => (u64::from(b & 0x0f), 1),
            0xdc => (self.uint_at(self.at + 1, 2)?, 3),
            0xdd => (self.uint_at(self.at + 1, 4)?, 5),
            _ => return None,
        };
        let count = usize::try_from(count).ok()?;
        self.at += header;
        Some(count)
    }

    /// Consumes an integer of any width; a uint64 above `i64::MAX` wraps,
    /// as the reference's `msgpack_get_int64` does.
    pub(crate) fn int(&mut self) -> Option<i64> {
        let b = *self.bytes.get(self.at)?;
        let (value, len) = match b {
            0x00..=0x7f => (i64::from(b), 1),
            0xe0..=0xff => (i64::from(b as i8), 1),
            0xcc => (self.uint_at(self.at + 1, 1)? as i64, 2),
            0xcd => (self.uint_at(self.at + 1, 2)? as i64, 3),
            0xce => (self.uint_at(self.at + 1, 4)? as i64, 5),
            0xcf => (self.uint_at(self.at + 1, 8)? as i64, 9),
            0xd0 => (i64::from(self.uint_at(self.at + 1, 1)? as u8 as i8), 2),
            0xd1 => (i64::from(self.uint_at(self.at + 1, 2)? as u16 as i16), 3),
            0xd2 => (i64::from(self.uint_at(self.at + 1, 4)? as u32 as i32), 5),
            0xd3 => (self.uint_at(self.at + 1, 8)? as i64, 9),
            _ => return None,
        };
        self.at += len;
        Some(value)
    }

    /// Consumes a non-negative integer (the reference's
    /// `msgpack_get_uint64`: op codes, types, flags).
    pub(crate) fn uint(&mut self) -> Option<u64> {
        let b = *self.bytes.get(self.at)?;
        let (value, len) = match b {
            0x00..=0x7f => (u64::from(b), 1),
            0xcc => (self.uint_at(self.at + 1, 1)?, 2),
            0xcd => (self.uint_at(self.at + 1, 2)?, 3),
            0xce => (self.uint_at(self.at + 1, 4)?, 5),
            0xcf => (self.uint_at(self.at + 1, 8)?, 9),
            // Signed forms holding a non-negative number.
            0xd0..=0xd3 => {
                let mut probe = *self;
                let value = u64::try_from(probe.int()?).ok()?;
                (value, probe.at - self.at)
            }
            _ => return None,
        };
        self.at += len;
        Some(value)
    }

    /// Consumes a float32 or float64.
    pub(crate) fn float(&mut self) -> Option<f64> {
        let b = *self.bytes.get(self.at)?;
        let (value, len) = match b {
            0xca => (
                f64::from(f32::from_bits(self.uint_at(self.at + 1, 4)? as u32)),
                5,
            ),
            0xcb => (f64::from_bits(self.uint_at(self.at + 1, 8)?), 9),
            _ => return None,
        };
        self.at += len;
        Some(value)
    }

    /// Consumes a boolean.
    pub(crate) fn boolean(&mut self) -> Option<bool> {
        let value = match *self.bytes.get(self.at)? {
            0xc2 => false,
            0xc3 => true,
            _ => return None,
        };
        self.at += 1;
        Some(value)
    }

    /// Consumes a str- or bin-family value; answers its payload (particle
    /// prefix included, when the dialect has one).
    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let b = *self.bytes.get(self.at)?;
        let (len, header) = match b {
            0xa0..=0xbf => (u64::from(b & 0x1f), 1),
            0xd9 | 0xc4 => (self.uint_at(self.at + 1, 1)?, 2),
            0xda | 0xc5 => (self.uint_at(self.at + 1, 2)?, 3),
            0xdb | 0xc6 => (self.uint_at(self.at + 1, 4)?, 5),
            _ => return None,
        };
        let start = self.at + header;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        let payload = self.bytes.get(start..end)?;
        self.at = end;
        Some(payload)
    }

    /// Consumes one whole value of any kind; answers its bytes.
    pub(crate) fn value(&mut self) -> Option<&'a [u8]> {
        let rest = self.bytes.get(self.at..)?;
        let len = value::skip(rest).ok()?;
        let slice = rest.get(..len)?;
        self.at += len;
        Some(slice)
    }

    /// The bytes from `from` to the cursor.
    pub(crate) fn since(&self, from: usize) -> &'a [u8] {
        self.bytes.get(from..self.at).unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_scalars_and_headers() {
        let bytes = [
            0x93, 0xcd, 0x01, 0x00, 0xd0, 0x80, 0xa2, 0x03, b'x', 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0,
            0, 0xc3,
        ];
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.peek(), Some(Kind::Array));
        assert_eq!(c.array(), Some(3));
        assert_eq!(c.uint(), Some(256));
        assert_eq!(c.uint(), None, "negative is no uint");
        assert_eq!(c.int(), Some(-128));
        assert_eq!(c.bytes(), Some(&[0x03, b'x'][..]));
        assert_eq!(c.float(), Some(1.0));
        assert_eq!(c.boolean(), Some(true));
        assert!(c.is_empty());
        assert_eq!(c.int(), None);
    }

    #[test]
    fn uint64_wraps_into_i64() {
        let bytes = [0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(Cursor::new(&bytes).int(), Some(-1));
        assert_eq!(Cursor::new(&bytes).uint(), Some(u64::MAX));
    }

    #[test]
    fn truncated_reads_fail_in_place() {
        let bytes = [0xda, 0x00, 0x05, 0x03, b'a'];
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.bytes(), None);
        assert_eq!(c.at(), 0);
        assert_eq!(c.value(), None);
        let bytes = [0xdc, 0x00];
        assert_eq!(Cursor::new(&bytes).array(), None);
    }
}
