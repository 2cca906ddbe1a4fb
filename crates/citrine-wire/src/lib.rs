//! The Aerospike client wire protocol, as a pure codec.
//!
//! This crate owns the byte layouts of everything a client and a server
//! exchange (`shared/protocol/`, summarised byte by byte in `docs/wire.md`):
//! - [`frame`]: the 8-byte proto header and its limits, compressed (type 4) frames;
//! - [`msg`]: AS_MSG requests (header, fields, ops) decoded as borrowed views,
//!   and the [`msg::MessageWriter`] that encodes AS_MSG responses and requests;
//! - [`info`]: the newline-separated info protocol;
//! - [`admin`]: security (type 2) messages;
//! - [`digest`]: the key → RIPEMD-160 digest the clients compute;
//! - [`txn`]: the transaction fields (id, deadline, record version) and `info4` bits.
//!
//! Architecture invariant: this crate never touches a socket, a file or a
//! clock. It takes byte slices and returns values or errors; every decoder
//! bounds-checks every length and never panics on any input (it is fuzzed).

#![forbid(unsafe_code)]

pub mod admin;
pub mod digest;
pub mod frame;
pub mod info;
pub mod msg;
pub mod txn;

pub use frame::{MessageType, ProtoHeader, PROTO_HEADER_SIZE, PROTO_SIZE_MAX};

/// Why a byte sequence could not be decoded. The server answers a decodable
/// frame with a bad body with result code 4 (parameter error) and closes the
/// connection only when the framing itself is broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the layout requires.
    Truncated {
        what: &'static str,
        needed: usize,
        available: usize,
    },
    /// A structurally invalid value (bad version, bad size, bad count...).
    Invalid(&'static str),
    /// Compressed data that did not inflate to a valid frame.
    Compression(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated {
                what,
                needed,
                available,
            } => {
                write!(
                    f,
                    "truncated {what}: needed {needed} bytes, {available} available"
                )
            }
            DecodeError::Invalid(what) => write!(f, "invalid {what}"),
            DecodeError::Compression(why) => write!(f, "bad compressed frame: {why}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Reads a big-endian u32 at `offset`, bounds-checked.
#[inline]
pub(crate) fn read_u32(
    bytes: &[u8],
    offset: usize,
    what: &'static str,
) -> Result<u32, DecodeError> {
    match bytes.get(offset..offset + 4) {
        Some(slice) => Ok(u32::from_be_bytes([slice[0], slice[1], slice[2], slice[3]])),
        None => Err(DecodeError::Truncated {
            what,
            needed: offset + 4,
            available: bytes.len(),
        }),
    }
}

/// Reads a big-endian u16 at `offset`, bounds-checked.
#[inline]
pub(crate) fn read_u16(
    bytes: &[u8],
    offset: usize,
    what: &'static str,
) -> Result<u16, DecodeError> {
    match bytes.get(offset..offset + 2) {
        Some(slice) => Ok(u16::from_be_bytes([slice[0], slice[1]])),
        None => Err(DecodeError::Truncated {
            what,
            needed: offset + 2,
            available: bytes.len(),
        }),
    }
}
