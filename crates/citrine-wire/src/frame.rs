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
/// original frame. Returns the original frame's header and body.
pub fn inflate(body: &[u8]) -> Result<(ProtoHeader, Vec<u8>), DecodeError> {
    let announced = body.get(..8).ok_or(DecodeError::Truncated {
        what: "compressed frame length",
        needed: 8,
        available: body.len(),
    })?;
    let mut length_bytes = [0u8; 8];
    length_bytes.copy_from_slice(announced);
    let original_length = u64::from_be_bytes(length_bytes);
    if original_length < PROTO_HEADER_SIZE as u64
        || original_length > PROTO_SIZE_MAX + PROTO_HEADER_SIZE as u64
    {
        return Err(DecodeError::Invalid("compressed original length"));
    }
    let capacity = usize::try_from(original_length)
        .map_err(|_| DecodeError::Invalid("compressed original length"))?;
    let mut decoder = flate2::read::ZlibDecoder::new(&body[8..]);
    // Grow with the data actually inflated: a tiny frame announcing a huge
    // length must not cost a large allocation up front.
    let mut original = Vec::with_capacity(
        capacity
            .min(body.len().saturating_mul(16).max(4096))
            .min(1 << 20),
    );
    // Read at most one byte past the announced length to detect overruns
    // without inflating a zip bomb.
    decoder
        .by_ref()
        .take(original_length + 1)
        .read_to_end(&mut original)
        .map_err(|error| DecodeError::Compression(error.to_string()))?;
    if original.len() as u64 != original_length {
        return Err(DecodeError::Compression(format!(
            "inflated {} bytes, announced {original_length}",
            original.len()
        )));
    }
    let mut header_bytes = [0u8; PROTO_HEADER_SIZE];
    header_bytes.copy_from_slice(&original[..PROTO_HEADER_SIZE]);
    let header = ProtoHeader::decode(&header_bytes)?;
    if header.message_type != MessageType::Message {
        return Err(DecodeError::Invalid("compressed inner type (must be 3)"));
    }
    if header.size + PROTO_HEADER_SIZE as u64 != original_length {
        return Err(DecodeError::Invalid("compressed inner size"));
    }
    original.drain(..PROTO_HEADER_SIZE);
    Ok((header, original))
}

/// Compresses a complete frame (header and body) into a type-4 frame.
pub fn deflate(frame: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::with_capacity(frame.len() / 2 + 32);
    out.extend_from_slice(&[0u8; PROTO_HEADER_SIZE]);
    out.extend_from_slice(&(frame.len() as u64).to_be_bytes());
    let mut encoder = flate2::write::ZlibEncoder::new(out, flate2::Compression::fast());
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
