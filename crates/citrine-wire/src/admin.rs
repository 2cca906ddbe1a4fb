//! Security (admin, proto type 2) messages: a 16-byte header (scheme, result,
//! command, field count, 12 reserved bytes) followed by fields.
//!
//! A server without security answers every admin request with result 52
//! (security not enabled) and no fields, in exactly 16 bytes of body: clients
//! read 24 bytes first and only read further on success, so an error reply
//! must carry nothing more.

use crate::frame::{MessageType, ProtoHeader};
use crate::DecodeError;

/// Size of the security header.
pub const ADMIN_HEADER_SIZE: usize = 16;

/// Admin commands.
pub mod command {
    pub const AUTHENTICATE: u8 = 0;
    pub const CREATE_USER: u8 = 1;
    pub const QUERY_USERS: u8 = 9;
    pub const LOGIN: u8 = 20;
}

/// A decoded admin request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminHeader {
    pub scheme: u8,
    pub result: u8,
    pub command: u8,
    pub n_fields: u8,
}

impl AdminHeader {
    /// Decodes the 16-byte header at the start of `body`.
    pub fn decode(body: &[u8]) -> Result<AdminHeader, DecodeError> {
        if body.len() < ADMIN_HEADER_SIZE {
            return Err(DecodeError::Truncated {
                what: "admin header",
                needed: ADMIN_HEADER_SIZE,
                available: body.len(),
            });
        }
        Ok(AdminHeader {
            scheme: body[0],
            result: body[1],
            command: body[2],
            n_fields: body[3],
        })
    }
}

/// Writes a field-less admin reply carrying `result` (a 24-byte frame).
pub fn write_reply(out: &mut Vec<u8>, result: u8) {
    out.extend_from_slice(&ProtoHeader::encode(
        MessageType::Admin,
        ADMIN_HEADER_SIZE as u64,
    ));
    let mut header = [0u8; ADMIN_HEADER_SIZE];
    header[1] = result;
    out.extend_from_slice(&header);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_is_exactly_24_bytes() {
        let mut out = Vec::new();
        write_reply(&mut out, 52);
        assert_eq!(out.len(), 24);
        assert_eq!(&out[..8], &[2, 2, 0, 0, 0, 0, 0, 16]);
        assert_eq!(out[9], 52);
    }

    #[test]
    fn header_needs_sixteen_bytes() {
        assert!(AdminHeader::decode(&[0; 15]).is_err());
        let header =
            AdminHeader::decode(&[0, 0, 20, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).expect("valid");
        assert_eq!(header.command, command::LOGIN);
        assert_eq!(header.n_fields, 2);
    }
}
