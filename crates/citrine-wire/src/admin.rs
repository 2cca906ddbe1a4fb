//! Security (admin, proto type 2) messages: a 16-byte header (scheme, result,
//! command, field count, 12 reserved bytes) followed by fields, each a u32 BE
//! length (1 + data), a u8 field id and the data
//! (`shared/protocol/07-admin-security.md`).
//!
//! This module owns the byte layout only: [`AdminRequest::parse`] splits a
//! request into its fields (every length checked against the body, no field
//! read past its end), the `decode_*` functions read the structured field
//! values (role lists, privilege lists, u32s), and [`AdminReply`] builds
//! replies. What a command means is `citrine-security`'s.
//!
//! Invariant: an error reply (result ≠ 0) is exactly 16 bytes of body with
//! no fields: clients read 24 bytes first and only read further on success,
//! so an error reply must carry nothing more. A server without security
//! answers every admin request with result 52 (security not enabled).

use crate::frame::{MessageType, ProtoHeader};
use crate::DecodeError;

/// Size of the security header.
pub const ADMIN_HEADER_SIZE: usize = 16;

/// Admin commands.
pub mod command {
    pub const AUTHENTICATE: u8 = 0;
    pub const CREATE_USER: u8 = 1;
    pub const DROP_USER: u8 = 2;
    pub const SET_PASSWORD: u8 = 3;
    pub const CHANGE_PASSWORD: u8 = 4;
    pub const GRANT_ROLES: u8 = 5;
    pub const REVOKE_ROLES: u8 = 6;
    pub const QUERY_USERS: u8 = 9;
    pub const CREATE_ROLE: u8 = 10;
    pub const DROP_ROLE: u8 = 11;
    pub const GRANT_PRIVILEGES: u8 = 12;
    pub const REVOKE_PRIVILEGES: u8 = 13;
    pub const SET_WHITELIST: u8 = 14;
    pub const SET_QUOTAS: u8 = 15;
    pub const QUERY_ROLES: u8 = 16;
    pub const LOGIN: u8 = 20;
}

/// Admin field ids.
pub mod field {
    pub const USER: u8 = 0;
    pub const PASSWORD: u8 = 1;
    pub const OLD_PASSWORD: u8 = 2;
    pub const CREDENTIAL: u8 = 3;
    pub const CLEAR_PASSWORD: u8 = 4;
    pub const SESSION_TOKEN: u8 = 5;
    pub const SESSION_TTL: u8 = 6;
    pub const ROLES: u8 = 10;
    pub const ROLE: u8 = 11;
    pub const PRIVILEGES: u8 = 12;
    pub const WHITELIST: u8 = 13;
    pub const READ_QUOTA: u8 = 14;
    pub const WRITE_QUOTA: u8 = 15;
    pub const READ_INFO: u8 = 16;
    pub const WRITE_INFO: u8 = 17;
    pub const CONNECTIONS: u8 = 18;
}

/// Privilege codes below this are global-only (no namespace or set on the
/// wire); from it on they carry a namespace and a set.
pub const FIRST_SCOPED_PRIVILEGE: u8 = 10;

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

/// A request split into its header and fields (in the order sent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminRequest<'a> {
    pub header: AdminHeader,
    pub fields: Vec<(u8, &'a [u8])>,
}

impl<'a> AdminRequest<'a> {
    /// Splits `body` (the frame without its proto header): the header, then
    /// exactly as many fields as it announces, each inside the body.
    pub fn parse(body: &'a [u8]) -> Result<AdminRequest<'a>, DecodeError> {
        let header = AdminHeader::decode(body)?;
        let mut fields = Vec::with_capacity(usize::from(header.n_fields));
        let mut at = ADMIN_HEADER_SIZE;
        for _ in 0..header.n_fields {
            let length = crate::read_u32(body, at, "admin field length")? as usize;
            if length == 0 {
                return Err(DecodeError::Invalid("admin field length 0"));
            }
            let id = *body.get(at + 4).ok_or(DecodeError::Truncated {
                what: "admin field id",
                needed: at + 5,
                available: body.len(),
            })?;
            let start = at + 5;
            let end = (at + 4)
                .checked_add(length)
                .filter(|end| *end <= body.len());
            let end = end.ok_or(DecodeError::Truncated {
                what: "admin field",
                needed: (at + 4).saturating_add(length),
                available: body.len(),
            })?;
            fields.push((id, &body[start..end]));
            at = end;
        }
        Ok(AdminRequest { header, fields })
    }

    /// The data of the first field `id`, if sent.
    pub fn field(&self, id: u8) -> Option<&'a [u8]> {
        self.fields
            .iter()
            .find(|(field, _)| *field == id)
            .map(|(_, data)| *data)
    }

    /// The first field `id` as UTF-8 text.
    pub fn text(&self, id: u8) -> Result<Option<&'a str>, DecodeError> {
        self.field(id)
            .map(|data| {
                std::str::from_utf8(data).map_err(|_| DecodeError::Invalid("admin text field"))
            })
            .transpose()
    }
}

/// One privilege as the wire carries it; `namespace` and `set` are empty
/// for a global one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WirePrivilege {
    pub code: u8,
    pub namespace: String,
    pub set: String,
}

/// Reads a u8-length-prefixed string at `*at`, moving past it.
fn short_text(data: &[u8], at: &mut usize, what: &'static str) -> Result<String, DecodeError> {
    let length = usize::from(*data.get(*at).ok_or(DecodeError::Invalid(what))?);
    let bytes = data
        .get(*at + 1..*at + 1 + length)
        .ok_or(DecodeError::Invalid(what))?;
    *at += 1 + length;
    String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::Invalid(what))
}

/// The ROLES field: a u8 count, then per role a u8 length and the name.
pub fn decode_roles(data: &[u8]) -> Result<Vec<String>, DecodeError> {
    let count = *data.first().ok_or(DecodeError::Invalid("role count"))?;
    let mut at = 1;
    let roles = (0..count)
        .map(|_| short_text(data, &mut at, "role name"))
        .collect::<Result<Vec<_>, _>>()?;
    if at != data.len() {
        return Err(DecodeError::Invalid("bytes after the roles"));
    }
    Ok(roles)
}

/// The PRIVILEGES field: a u8 count, then per privilege its code and, for a
/// scoped code, a u8-length-prefixed namespace and set.
pub fn decode_privileges(data: &[u8]) -> Result<Vec<WirePrivilege>, DecodeError> {
    let count = *data
        .first()
        .ok_or(DecodeError::Invalid("privilege count"))?;
    let mut at = 1;
    let mut privileges = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let code = *data.get(at).ok_or(DecodeError::Invalid("privilege code"))?;
        at += 1;
        let (namespace, set) = if code >= FIRST_SCOPED_PRIVILEGE {
            let namespace = short_text(data, &mut at, "privilege namespace")?;
            (namespace, short_text(data, &mut at, "privilege set")?)
        } else {
            (String::new(), String::new())
        };
        privileges.push(WirePrivilege {
            code,
            namespace,
            set,
        });
    }
    if at != data.len() {
        return Err(DecodeError::Invalid("bytes after the privileges"));
    }
    Ok(privileges)
}

/// A u32 BE field (quotas, session TTL).
pub fn decode_u32(data: &[u8]) -> Result<u32, DecodeError> {
    let bytes: [u8; 4] = data
        .try_into()
        .map_err(|_| DecodeError::Invalid("admin u32 field"))?;
    Ok(u32::from_be_bytes(bytes))
}

/// Builds one admin reply frame holding one or more records (16-byte header
/// and fields each): `record` starts one, the `field*` methods add to it,
/// [`AdminReply::finish`] writes the proto header's size.
#[derive(Debug)]
pub struct AdminReply<'o> {
    out: &'o mut Vec<u8>,
    frame_start: usize,
    /// Where the current record's header is (its field count is bumped).
    record_start: Option<usize>,
}

impl<'o> AdminReply<'o> {
    /// Starts a frame at the end of `out`.
    pub fn begin(out: &'o mut Vec<u8>) -> AdminReply<'o> {
        let frame_start = out.len();
        out.extend_from_slice(&ProtoHeader::encode(MessageType::Admin, 0));
        AdminReply {
            out,
            frame_start,
            record_start: None,
        }
    }

    /// Starts a request record for `command` (the same layout as a reply
    /// record: clients' requests are built with this too).
    pub fn request(&mut self, command: u8) -> &mut Self {
        self.record(0);
        if let Some(record) = self.record_start {
            self.out[record + 2] = command;
        }
        self
    }

    /// Starts a record with `result`.
    pub fn record(&mut self, result: u8) -> &mut Self {
        self.record_start = Some(self.out.len());
        let mut header = [0u8; ADMIN_HEADER_SIZE];
        header[1] = result;
        self.out.extend_from_slice(&header);
        self
    }

    fn field_header(&mut self, id: u8, data_len: usize) {
        if let Some(record) = self.record_start {
            self.out[record + 3] = self.out[record + 3].wrapping_add(1);
        }
        let length = u32::try_from(data_len + 1).unwrap_or(u32::MAX);
        self.out.extend_from_slice(&length.to_be_bytes());
        self.out.push(id);
    }

    /// Adds a field holding `data`.
    pub fn field(&mut self, id: u8, data: &[u8]) -> &mut Self {
        self.field_header(id, data.len());
        self.out.extend_from_slice(data);
        self
    }

    /// Adds a u32 BE field.
    pub fn field_u32(&mut self, id: u8, value: u32) -> &mut Self {
        self.field(id, &value.to_be_bytes())
    }

    /// Adds a ROLES field (names longer than 255 bytes are cut, at most 255 names).
    pub fn field_roles<S: AsRef<str>>(&mut self, roles: &[S]) -> &mut Self {
        let mut data = vec![roles.len().min(255) as u8];
        for role in roles.iter().take(255) {
            push_short(&mut data, role.as_ref());
        }
        self.field(field::ROLES, &data)
    }

    /// Adds a PRIVILEGES field (at most 255 privileges).
    pub fn field_privileges(&mut self, privileges: &[WirePrivilege]) -> &mut Self {
        let mut data = vec![privileges.len().min(255) as u8];
        for privilege in privileges.iter().take(255) {
            data.push(privilege.code);
            if privilege.code >= FIRST_SCOPED_PRIVILEGE {
                push_short(&mut data, &privilege.namespace);
                push_short(&mut data, &privilege.set);
            }
        }
        self.field(field::PRIVILEGES, &data)
    }

    /// Writes the frame's size into its proto header.
    pub fn finish(self) {
        let size = (self.out.len() - self.frame_start - crate::frame::PROTO_HEADER_SIZE) as u64;
        let header = ProtoHeader::encode(MessageType::Admin, size);
        self.out[self.frame_start..self.frame_start + header.len()].copy_from_slice(&header);
    }
}

/// Appends a u8-length-prefixed string (cut at 255 bytes).
fn push_short(data: &mut Vec<u8>, text: &str) {
    let bytes = &text.as_bytes()[..text.len().min(255)];
    data.push(bytes.len() as u8);
    data.extend_from_slice(bytes);
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

    fn request(command: u8, fields: &[(u8, &[u8])]) -> Vec<u8> {
        let mut body = vec![
            0,
            0,
            command,
            fields.len() as u8,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ];
        for (id, data) in fields {
            body.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
            body.push(*id);
            body.extend_from_slice(data);
        }
        body
    }

    #[test]
    fn login_fields_are_split() {
        let body = request(
            command::LOGIN,
            &[(field::USER, b"admin"), (field::CREDENTIAL, b"$2a$")],
        );
        let parsed = AdminRequest::parse(&body).expect("valid");
        assert_eq!(parsed.header.command, command::LOGIN);
        assert_eq!(parsed.text(field::USER).expect("utf8"), Some("admin"));
        assert_eq!(parsed.field(field::CREDENTIAL), Some(&b"$2a$"[..]));
        assert_eq!(parsed.field(field::ROLE), None);
    }

    #[test]
    fn fields_past_the_body_or_of_length_zero_are_refused() {
        let mut body = request(command::LOGIN, &[(field::USER, b"admin")]);
        body.pop();
        assert!(AdminRequest::parse(&body).is_err());
        let mut body = request(command::LOGIN, &[]);
        body[3] = 1;
        body.extend_from_slice(&[0, 0, 0, 0, 0]);
        assert!(AdminRequest::parse(&body).is_err());
        // A huge announced length does not overflow.
        let mut body = request(command::LOGIN, &[]);
        body[3] = 1;
        body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0]);
        assert!(AdminRequest::parse(&body).is_err());
    }

    #[test]
    fn roles_and_privileges_round_trip() {
        let privileges = vec![
            WirePrivilege {
                code: 1,
                namespace: String::new(),
                set: String::new(),
            },
            WirePrivilege {
                code: 10,
                namespace: "test".into(),
                set: "demo".into(),
            },
        ];
        let mut out = Vec::new();
        let mut reply = AdminReply::begin(&mut out);
        reply
            .record(0)
            .field_roles(&["read", "sys-admin"])
            .field_privileges(&privileges);
        reply.finish();
        let body = &out[8..];
        assert_eq!(
            ProtoHeader::decode(out[..8].try_into().expect("8"))
                .expect("h")
                .size as usize,
            body.len()
        );
        let parsed = AdminRequest::parse(body).expect("valid");
        assert_eq!(parsed.header.n_fields, 2);
        let mut request = Vec::new();
        let mut frame = AdminReply::begin(&mut request);
        frame.request(command::DROP_USER).field(field::USER, b"bob");
        frame.finish();
        let dropped = AdminRequest::parse(&request[8..]).expect("request");
        assert_eq!(
            (dropped.header.command, dropped.field(field::USER)),
            (command::DROP_USER, Some(&b"bob"[..]))
        );
        let roles = decode_roles(parsed.field(field::ROLES).expect("roles")).expect("roles");
        assert_eq!(roles, vec!["read".to_string(), "sys-admin".to_string()]);
        let decoded = decode_privileges(parsed.field(field::PRIVILEGES).expect("p")).expect("p");
        assert_eq!(decoded, privileges);
        assert!(decode_roles(&[2, 1, b'a']).is_err());
        assert!(decode_privileges(&[1, 10, 4, b't']).is_err());
        assert_eq!(decode_u32(&[0, 0, 1, 0]).expect("u32"), 256);
        assert!(decode_u32(&[0, 1]).is_err());
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
