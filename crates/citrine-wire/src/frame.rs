//! The 8-byte proto header that starts every message in both directions, and
//! compressed (type 4) frames.
//!
//! Layout: version (1 byte, always 2), type (1 byte), body size (48-bit
//! big-endian). Invariant: a header this module accepts has version 2 (or 0
//! for security messages), a known type and a size ≤ [`PROTO_SIZE_MAX`].

use crate::DecodeError;
use std::io::Read;

/// Size of the proto header.
pub const PROTO_HEADER_SIZE: usize = 8;
/// Largest body a peer may announce (128 MiB); larger closes the connection.
pub const PROTO_SIZE_MAX: u64 = 128 * 1024 * 1024;
/// The only protocol version.
pub const PROTO_VERSION: u8 = 2;

/// Message types of the proto header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum MessageType {
    Info = 1,
    Admin = 2,
    Message = 3,
    Compressed = 4,
    InternalXdr = 5,
}

impl MessageType {
    fn from_u8(raw: u8) -> Option<MessageType> {
        Some(match raw {
            1 => MessageType::Info,
            2 => MessageType::Admin,
            3 => MessageType::Message,
            4 => MessageType::Compressed,
            5 => MessageType::InternalXdr,
            _ => return None,
        })
    }
}

/// A decoded proto header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ProtoHeader {
    pub version: u8,
    pub message_type: MessageType,
    pub size: u64,
}

impl ProtoHeader {
    /// Decodes and validates a header. An error here means the stream cannot
    /// be trusted any more and the connection must be closed.
    pub fn decode(bytes: &[u8; PROTO_HEADER_SIZE]) -> Result<ProtoHeader, DecodeError> {
        let message_type =
            MessageType::from_u8(bytes[1]).ok_or(DecodeError::Invalid("proto type"))?;
        let version = bytes[0];
        let version_ok =
            version == PROTO_VERSION || (version == 0 && message_type == MessageType::Admin);
        if !version_ok {
            return Err(DecodeError::Invalid("proto version"));
        }
        let mut size_bytes = [0u8; 8];
        size_bytes[2..].copy_from_slice(&bytes[2..]);
        let size = u64::from_be_bytes(size_bytes);
        if size > PROTO_SIZE_MAX {
            return Err(DecodeError::Invalid("proto size (over 128 MiB)"));
        }
        Ok(ProtoHeader {
            version,
            message_type,
            size,
        })
    }

    /// Encodes a header for a body of `size` bytes.
    #[inline]
    pub fn encode(message_type: MessageType, size: u64) -> [u8; PROTO_HEADER_SIZE] {
        debug_assert!(size <= PROTO_SIZE_MAX);
        let word = (u64::from(PROTO_VERSION) << 56)
            | ((message_type as u64) << 48)
            | (size & 0xFFFF_FFFF_FFFF);
        word.to_be_bytes()
    }

    /// Writes a header in place at the start of `buffer` for the bytes that follow it.
    #[inline]
    pub fn patch(buffer: &mut [u8], message_type: MessageType) {
        debug_assert!(buffer.len() >= PROTO_HEADER_SIZE);
        let size = (buffer.len() - PROTO_HEADER_SIZE) as u64;
        buffer[..PROTO_HEADER_SIZE].copy_from_slice(&ProtoHeader::encode(message_type, size));
    }
}

/// Inflates the body of a type-4 frame: an 8-byte big-endian original length
/// (counting the original proto header) followed by a zlib stream of the
/// original frame. Returns the original frame's header and body. The
/// original may be as large as an uncompressed frame may
/// ([`PROTO_SIZE_MAX`]); see [`inflate_within`].
pub fn inflate(body: &[u8]) -> Result<(ProtoHeader, Vec<u8>), DecodeError> {
    inflate_within(body, PROTO_SIZE_MAX)
}

/// [`inflate`] for a node that accepts messages of at most `limit` bytes
/// (the original frame's body). The work is bounded by what the frame
/// announces and by `limit`, never by what the zlib stream would expand to:
/// - an announced length over `limit` is refused before anything inflates;
/// - the original's proto header is inflated first and checked (version 2,
///   type 3, a size matching the announced length), so a stream of garbage
///   is refused after 8 bytes;
/// - the body is inflated into a buffer that grows with the bytes actually
///   produced, and inflation stops one byte past the announced size.
pub fn inflate_within(body: &[u8], limit: u64) -> Result<(ProtoHeader, Vec<u8>), DecodeError> {
    let original_length = announced_length(body, limit)?;
    let mut decoder = flate2::read::ZlibDecoder::new(&body[8..]);
    let header = inflate_header(&mut decoder, original_length)?;
    let size = original_length - PROTO_HEADER_SIZE as u64;
    // Fits: at most `limit`, which `announced_length` checked fits a usize.
    let wanted = size as usize;
    // A tiny frame announcing a huge length must not cost a large
    // allocation up front: start from what its compressed size makes likely.
    let mut original = Vec::with_capacity(
        wanted
            .min(body.len().saturating_mul(16).max(4096))
            .min(1 << 20),
    );
    // One byte past the announced size tells an overrun.
    decoder
        .take(size + 1)
        .read_to_end(&mut original)
        .map_err(|error| DecodeError::Compression(error.to_string()))?;
    if original.len() != wanted {
        return Err(DecodeError::Compression(format!(
            "inflated {} body bytes, announced {size}",
            original.len()
        )));
    }
    Ok((header, original))
}

/// The original length a type-4 body announces (its first 8 bytes): a
/// whole proto header, and a body of at most `limit` bytes.
fn announced_length(body: &[u8], limit: u64) -> Result<u64, DecodeError> {
    let announced = body.get(..8).ok_or(DecodeError::Truncated {
        what: "compressed frame length",
        needed: 8,
        available: body.len(),
    })?;
    let mut length_bytes = [0u8; 8];
    length_bytes.copy_from_slice(announced);
    let original_length = u64::from_be_bytes(length_bytes);
    let limit = limit.min(PROTO_SIZE_MAX);
    if original_length < PROTO_HEADER_SIZE as u64 {
        return Err(DecodeError::Invalid("compressed original length"));
    }
    if original_length - PROTO_HEADER_SIZE as u64 > limit {
        return Err(DecodeError::Invalid(
            "compressed original length (over the largest message accepted)",
        ));
    }
    usize::try_from(original_length)
        .map_err(|_| DecodeError::Invalid("compressed original length"))?;
    Ok(original_length)
}

/// Inflates and checks the original frame's proto header: an AS_MSG whose
/// size is what the compressed frame announced.
fn inflate_header(
    decoder: &mut impl Read,
    original_length: u64,
) -> Result<ProtoHeader, DecodeError> {
    let mut header_bytes = [0u8; PROTO_HEADER_SIZE];
    decoder
        .read_exact(&mut header_bytes)
        .map_err(|error| DecodeError::Compression(error.to_string()))?;
    let header = ProtoHeader::decode(&header_bytes)
        .map_err(|_| DecodeError::Invalid("compressed inner proto header"))?;
    if header.message_type != MessageType::Message {
        return Err(DecodeError::Invalid("compressed inner type (must be 3)"));
    }
    if header.size + PROTO_HEADER_SIZE as u64 != original_length {
        return Err(DecodeError::Invalid("compressed inner size"));
    }
    Ok(header)
}

/// Compresses a complete frame (header and body) into a type-4 frame.
pub fn deflate(frame: &[u8]) -> Vec<u8> {
    deflate_at(frame, 1)
}

/// [`deflate`] at zlib level `level` (1 fastest to 9 smallest).
pub fn deflate_at(frame: &[u8], level: u32) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::with_capacity(frame.len() / 2 + 32);
    out.extend_from_slice(&[0u8; PROTO_HEADER_SIZE]);
    out.extend_from_slice(&(frame.len() as u64).to_be_bytes());
    let mut encoder = flate2::write::ZlibEncoder::new(out, flate2::Compression::new(level.min(9)));
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(frame);
    let mut out = encoder.finish().unwrap_or_default();
    ProtoHeader::patch(&mut out, MessageType::Compressed);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let bytes = ProtoHeader::encode(MessageType::Message, 82);
        assert_eq!(bytes, [2, 3, 0, 0, 0, 0, 0, 0x52]);
        let header = ProtoHeader::decode(&bytes).expect("valid");
        assert_eq!(header.size, 82);
        assert_eq!(header.message_type, MessageType::Message);
    }

    #[test]
    fn header_rejects_bad_input() {
        assert!(ProtoHeader::decode(&[3, 3, 0, 0, 0, 0, 0, 1]).is_err());
        assert!(ProtoHeader::decode(&[2, 9, 0, 0, 0, 0, 0, 1]).is_err());
        assert!(ProtoHeader::decode(&[2, 3, 0, 0, 8, 0, 0, 1]).is_err());
        assert!(ProtoHeader::decode(&[0, 2, 0, 0, 0, 0, 0, 16]).is_ok());
        assert!(ProtoHeader::decode(&[0, 3, 0, 0, 0, 0, 0, 16]).is_err());
    }

    #[test]
    fn compression_round_trip() {
        let mut frame = ProtoHeader::encode(MessageType::Message, 300).to_vec();
        frame.extend(std::iter::repeat_n(7u8, 300));
        let compressed = deflate(&frame);
        assert_eq!(compressed[1], 4);
        let (header, body) = inflate(&compressed[8..]).expect("inflates");
        assert_eq!(header.size, 300);
        assert_eq!(body, vec![7u8; 300]);
        assert!(inflate(&compressed[8..20]).is_err());
        assert!(inflate(&[0, 0, 0, 0, 0, 0, 1, 0, 1, 2, 3]).is_err());
    }
}
