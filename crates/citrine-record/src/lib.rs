//! The record model: bins and their particle values, and the byte format of a
//! stored record body.
//!
//! A record is a set of bins (name → typed value) plus metadata kept in the
//! primary index (generation, void time, last-update time, set). The body is
//! what the storage engine keeps: the optional stored user key and the bins,
//! encoded by [`encode_body`] and read back without copying by [`BodyView`].
//!
//! Body format (version 1, all integers big-endian):
//! ```text
//! u8  format version (1)
//! u8  key particle type (0 = no stored key)
//! u32 key length, key bytes            (only when key particle type != 0)
//! u16 bin count
//! per bin: u8 name length (1..=15), name, u8 particle type, u32 value length, value
//! ```
//! Values are kept exactly as the wire carries them (integers 8-byte
//! big-endian, lists and maps as the clients' msgpack, GeoJSON with its cell
//! header, HLL raw), so a read copies stored bytes straight into the reply.
//!
//! Invariants: bin names are unique within a body and 1..=15 bytes; the bin
//! count fits in u16 and is at most `BINS_MAX`.

#![forbid(unsafe_code)]

use citrine_types::{ParticleType, BINS_MAX, BIN_NAME_MAX};
use std::borrow::Cow;

/// Current body format version.
pub const BODY_FORMAT_VERSION: u8 = 1;

/// A bin: name, particle type and value bytes (wire encoding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bin<'a> {
    pub name: Cow<'a, [u8]>,
    pub particle_type: u8,
    pub value: Cow<'a, [u8]>,
}

impl<'a> Bin<'a> {
    /// A bin borrowing its name and value.
    pub fn borrowed(name: &'a [u8], particle_type: u8, value: &'a [u8]) -> Bin<'a> {
        Bin {
            name: Cow::Borrowed(name),
            particle_type,
            value: Cow::Borrowed(value),
        }
    }

    /// The integer value if this is an integer bin.
    pub fn as_integer(&self) -> Option<i64> {
        (self.particle_type == ParticleType::Integer as u8)
            .then(|| integer_from_wire(&self.value))
            .flatten()
    }

    /// The float value if this is a float bin.
    pub fn as_float(&self) -> Option<f64> {
        (self.particle_type == ParticleType::Float as u8)
            .then(|| float_from_wire(&self.value))
            .flatten()
    }
}

/// Decodes a wire integer: 8 bytes big-endian, or 1, 2 or 4 bytes zero-extended
/// (the reference server accepts the short forms).
pub fn integer_from_wire(bytes: &[u8]) -> Option<i64> {
    match bytes.len() {
        8 => {
            let mut word = [0u8; 8];
            word.copy_from_slice(bytes);
            Some(i64::from_be_bytes(word))
        }
        1 | 2 | 4 => Some(
            bytes
                .iter()
                .fold(0i64, |acc, byte| (acc << 8) | i64::from(*byte)),
        ),
        _ => None,
    }
}

/// Decodes a wire float: 8 bytes big-endian IEEE-754.
pub fn float_from_wire(bytes: &[u8]) -> Option<f64> {
    let word: [u8; 8] = bytes.try_into().ok()?;
    Some(f64::from_bits(u64::from_be_bytes(word)))
}

/// Why a value or body is unacceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordError {
    /// Bin name longer than 15 bytes.
    BinName,
    /// More bins than a record may hold.
    TooManyBins,
    /// A value does not match its particle type's encoding.
    BadValue,
    /// A stored body failed to decode (corruption).
    CorruptBody,
}

/// Checks that a bin name is valid: at most 15 bytes. An empty name is a
/// bin like any other, as the reference server stores it (the official C
/// client's suite writes and reads one); only a READ op with an empty
/// name means "every bin" (see the service's transaction module).
#[inline]
pub fn valid_bin_name(name: &[u8]) -> bool {
    name.len() <= BIN_NAME_MAX
}

/// Checks that `value` is a well-formed encoding for `particle_type` (a type
/// the server accepts in a write).
pub fn validate_value(particle_type: u8, value: &[u8]) -> Result<(), RecordError> {
    let Some(kind) = ParticleType::from_u8(particle_type) else {
        return Err(RecordError::BadValue);
    };
    let ok = match kind {
        ParticleType::Null => value.is_empty(),
        ParticleType::Integer => matches!(value.len(), 1 | 2 | 4 | 8),
        ParticleType::Float => value.len() == 8,
        ParticleType::Bool => value.len() == 1 && value[0] <= 1,
        ParticleType::GeoJson => geojson_text(value).is_some(),
        ParticleType::String
        | ParticleType::Blob
        | ParticleType::JavaBlob
        | ParticleType::CsharpBlob
        | ParticleType::PythonBlob
        | ParticleType::RubyBlob
        | ParticleType::PhpBlob
        | ParticleType::ErlangBlob
        | ParticleType::Hll
        | ParticleType::Map
        | ParticleType::List => true,
    };
    if ok {
        Ok(())
    } else {
        Err(RecordError::BadValue)
    }
}

/// The GeoJSON text of a GeoJSON particle (flags u8, cell count u16, cells, text).
pub fn geojson_text(value: &[u8]) -> Option<&[u8]> {
    let cells = usize::from(u16::from_be_bytes([*value.get(1)?, *value.get(2)?]));
    value.get(3 + cells * 8..)
}

/// Normalises a value for storage: short integers become 8 bytes.
pub fn normalise_value<'a>(particle_type: u8, value: &'a [u8]) -> Cow<'a, [u8]> {
    if particle_type == ParticleType::Integer as u8 && value.len() != 8 {
        let number = integer_from_wire(value).unwrap_or(0);
        return Cow::Owned(number.to_be_bytes().to_vec());
    }
    Cow::Borrowed(value)
}

/// Size of the body `encode_body` would produce.
pub fn body_size(key: Option<(u8, &[u8])>, bins: &[Bin<'_>]) -> usize {
    let key_size = key.map_or(0, |(_, bytes)| 4 + bytes.len());
    2 + key_size
        + 2
        + bins
            .iter()
            .map(|bin| 1 + bin.name.len() + 1 + 4 + bin.value.len())
            .sum::<usize>()
}

/// Encodes a body. The caller guarantees valid names and unique bins.
pub fn encode_body(key: Option<(u8, &[u8])>, bins: &[Bin<'_>]) -> Result<Vec<u8>, RecordError> {
    encode_body_reserving(key, bins, 0)
}

/// Encodes a body into a vector with exactly `spare` bytes of capacity
/// beyond the body, for the caller's own use (the memory engine turns a
/// body with room for its length prefix into the stored record without a
/// copy).
pub fn encode_body_reserving(
    key: Option<(u8, &[u8])>,
    bins: &[Bin<'_>],
    spare: usize,
) -> Result<Vec<u8>, RecordError> {
    if bins.len() > BINS_MAX {
        return Err(RecordError::TooManyBins);
    }
    let mut out = Vec::with_capacity(body_size(key, bins) + spare);
    out.push(BODY_FORMAT_VERSION);
    match key {
        Some((particle_type, bytes)) if particle_type != 0 => {
            out.push(particle_type);
            out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            out.extend_from_slice(bytes);
        }
        _ => out.push(0),
    }
    out.extend_from_slice(&(bins.len() as u16).to_be_bytes());
    for bin in bins {
        if !valid_bin_name(&bin.name) {
            return Err(RecordError::BinName);
        }
        out.push(bin.name.len() as u8);
        out.extend_from_slice(&bin.name);
        out.push(bin.particle_type);
        out.extend_from_slice(&(bin.value.len() as u32).to_be_bytes());
        out.extend_from_slice(&bin.value);
    }
    debug_assert_eq!(out.len(), body_size(key, bins));
    Ok(out)
}

/// A validated, zero-copy view of a stored body.
#[derive(Clone, Copy, Debug)]
pub struct BodyView<'a> {
    key: Option<(u8, &'a [u8])>,
    bin_count: u16,
    bins: &'a [u8],
}

impl<'a> BodyView<'a> {
    /// Parses and validates a body.
    pub fn parse(body: &'a [u8]) -> Result<BodyView<'a>, RecordError> {
        let version = *body.first().ok_or(RecordError::CorruptBody)?;
        if version != BODY_FORMAT_VERSION {
            return Err(RecordError::CorruptBody);
        }
        let key_type = *body.get(1).ok_or(RecordError::CorruptBody)?;
        let mut offset = 2;
        let key = if key_type != 0 {
            let length = read_u32(body, offset)? as usize;
            offset += 4;
            let bytes = body
                .get(offset..offset + length)
                .ok_or(RecordError::CorruptBody)?;
            offset += length;
            Some((key_type, bytes))
        } else {
            None
        };
        let count_bytes = body
            .get(offset..offset + 2)
            .ok_or(RecordError::CorruptBody)?;
        let bin_count = u16::from_be_bytes([count_bytes[0], count_bytes[1]]);
        offset += 2;
        let bins = &body[offset..];
        // Validate the bin area once so iteration cannot fail.
        let mut at = 0usize;
        for _ in 0..bin_count {
            let name_length = usize::from(*bins.get(at).ok_or(RecordError::CorruptBody)?);
            at += 1 + name_length + 1;
            let value_length = read_u32(bins, at)? as usize;
            at = at
                .checked_add(4 + value_length)
                .ok_or(RecordError::CorruptBody)?;
            if at > bins.len() {
                return Err(RecordError::CorruptBody);
            }
        }
        if at != bins.len() {
            return Err(RecordError::CorruptBody);
        }
        Ok(BodyView {
            key,
            bin_count,
            bins,
        })
    }

    /// The stored user key (particle type, bytes), if any.
    pub fn key(&self) -> Option<(u8, &'a [u8])> {
        self.key
    }

    /// Number of bins.
    pub fn bin_count(&self) -> usize {
        usize::from(self.bin_count)
    }

    /// Iterates bins in stored order.
    pub fn bins(&self) -> BinIter<'a> {
        BinIter { rest: self.bins }
    }

    /// Looks a bin up by name.
    pub fn bin(&self, name: &[u8]) -> Option<Bin<'a>> {
        self.bins().find(|bin| bin.name.as_ref() == name)
    }
}

fn read_u32(bytes: &[u8], offset: usize) -> Result<u32, RecordError> {
    let slice = bytes
        .get(offset..offset + 4)
        .ok_or(RecordError::CorruptBody)?;
    Ok(u32::from_be_bytes([slice[0], slice[1], slice[2], slice[3]]))
}

/// Iterator over the bins of a validated body.
pub struct BinIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for BinIter<'a> {
    type Item = Bin<'a>;
    fn next(&mut self) -> Option<Bin<'a>> {
        let name_length = usize::from(*self.rest.first()?);
        let name = self.rest.get(1..1 + name_length)?;
        let particle_type = *self.rest.get(1 + name_length)?;
        let at = 2 + name_length;
        let value_length = read_u32(self.rest, at).ok()? as usize;
        let value = self.rest.get(at + 4..at + 4 + value_length)?;
        self.rest = self.rest.get(at + 4 + value_length..)?;
        Some(Bin::borrowed(name, particle_type, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_round_trip() {
        let bins = vec![
            Bin::borrowed(b"a", ParticleType::Integer as u8, &[0, 0, 0, 0, 0, 0, 0, 7]),
            Bin::borrowed(b"name", ParticleType::String as u8, b"citrine"),
        ];
        let body =
            encode_body(Some((ParticleType::String as u8, b"key1")), &bins).expect("encodes");
        let view = BodyView::parse(&body).expect("parses");
        assert_eq!(view.key(), Some((ParticleType::String as u8, &b"key1"[..])));
        assert_eq!(view.bin_count(), 2);
        let decoded: Vec<Bin<'_>> = view.bins().collect();
        assert_eq!(decoded, bins);
        assert_eq!(view.bin(b"a").and_then(|bin| bin.as_integer()), Some(7));
        assert!(view.bin(b"missing").is_none());
    }

    #[test]
    fn corrupt_bodies_are_rejected() {
        let bins = vec![Bin::borrowed(b"a", 3, b"x")];
        let body = encode_body(None, &bins).expect("encodes");
        for cut in 0..body.len() {
            assert!(BodyView::parse(&body[..cut]).is_err(), "cut {cut}");
        }
        let mut longer = body.clone();
        longer.push(0);
        assert!(BodyView::parse(&longer).is_err());
    }

    #[test]
    fn integers_and_validation() {
        assert_eq!(integer_from_wire(&[1]), Some(1));
        assert_eq!(integer_from_wire(&[1, 0]), Some(256));
        assert_eq!(integer_from_wire(&[0xff; 8]), Some(-1));
        assert_eq!(integer_from_wire(&[1, 2, 3]), None);
        assert_eq!(normalise_value(1, &[5]).as_ref(), &5i64.to_be_bytes());
        assert!(validate_value(1, &[0; 3]).is_err());
        assert!(validate_value(17, &[2]).is_err());
        assert!(validate_value(99, &[]).is_err());
        assert!(validate_value(23, &[0, 0, 0, b'{']).is_ok());
        assert!(validate_value(23, &[0, 0, 9]).is_err());
        assert!(valid_bin_name(b""));
        assert!(valid_bin_name(b"fifteen-chars-x"));
        assert!(!valid_bin_name(b"sixteen-chars-xx"));
        assert!(encode_body(None, &[Bin::borrowed(b"sixteen-chars-xx", 3, b"")]).is_err());
    }
}
