//! Little-endian byte writer and bounds-checked reader used by the cluster
//! message format.
//!
//! Owns: the primitive encodings (fixed-width little-endian integers,
//! `u16`-counted byte strings and lists) and [`DecodeError`].
//!
//! Invariants:
//! - [`Reader`] never reads past the end of its input and never panics: every
//!   accessor returns `Err(DecodeError::Truncated)` instead;
//! - list counts are checked against a caller-supplied maximum *before* any
//!   allocation, so garbage input cannot make the decoder allocate much.

use std::fmt;

/// Why a byte string could not be decoded into a cluster message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ended in the middle of a field.
    Truncated,
    /// The format version byte is not one this code understands.
    UnsupportedVersion(u8),
    /// The message type tag is unknown.
    UnknownTag(u8),
    /// A list or string is longer than the format allows.
    TooLong,
    /// A field holds a value the format forbids (for example an unsorted
    /// succession list or a zero cluster key).
    Invalid(&'static str),
    /// Bytes were left over after a complete message.
    TrailingBytes,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "message truncated"),
            DecodeError::UnsupportedVersion(v) => write!(f, "unsupported format version {v}"),
            DecodeError::UnknownTag(t) => write!(f, "unknown message tag {t}"),
            DecodeError::TooLong => write!(f, "list or string too long"),
            DecodeError::Invalid(what) => write!(f, "invalid field: {what}"),
            DecodeError::TrailingBytes => write!(f, "trailing bytes after message"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Appends primitive values to a byte vector.
#[derive(Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn new() -> Writer {
        Writer {
            buf: Vec::with_capacity(64),
        }
    }

    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub(crate) fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Writes a `u16` count. Callers guarantee `n <= u16::MAX`; the message
    /// constructors enforce far smaller limits.
    pub(crate) fn count(&mut self, n: usize) {
        debug_assert!(n <= usize::from(u16::MAX));
        self.u16(u16::try_from(n).unwrap_or(u16::MAX));
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.count(b.len());
        self.buf.extend_from_slice(b);
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads primitive values from a byte slice, failing instead of panicking.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(input: &'a [u8]) -> Reader<'a> {
        Reader { rest: input }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// Reads a `u16` count and rejects it when above `max`.
    pub(crate) fn count(&mut self, max: usize) -> Result<usize, DecodeError> {
        let n = usize::from(self.u16()?);
        if n > max {
            return Err(DecodeError::TooLong);
        }
        Ok(n)
    }

    pub(crate) fn bytes(&mut self, max: usize) -> Result<&'a [u8], DecodeError> {
        let n = self.count(max)?;
        self.take(n)
    }

    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primitives_roundtrip() {
        let mut w = Writer::new();
        w.u8(7);
        w.u16(0xBEEF);
        w.u64(u64::MAX - 3);
        w.bytes(b"abc");
        let buf = w.finish();
        let mut r = Reader::new(&buf);
        assert_eq!(r.u8(), Ok(7));
        assert_eq!(r.u16(), Ok(0xBEEF));
        assert_eq!(r.u64(), Ok(u64::MAX - 3));
        assert_eq!(r.bytes(10), Ok(&b"abc"[..]));
        assert_eq!(r.finish(), Ok(()));
    }

    #[test]
    fn reader_fails_cleanly() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u64(), Err(DecodeError::Truncated));
        let mut r = Reader::new(&[5, 0, b'a']);
        assert_eq!(r.bytes(4), Err(DecodeError::TooLong));
        let mut r = Reader::new(&[3, 0, b'a']);
        assert_eq!(r.bytes(4), Err(DecodeError::Truncated));
        let r = Reader::new(&[0]);
        assert_eq!(r.finish(), Err(DecodeError::TrailingBytes));
    }
}
