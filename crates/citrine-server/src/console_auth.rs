//! Who may read the HTTP endpoint when security is on: the console
//! (`/console`, `/console/state.json`) and `/metrics` answer only a
//! request carrying HTTP basic credentials (`Authorization: Basic …`) of
//! a user of the cluster, and act as that user.
//!
//! Design: the endpoint holds no credentials of its own. A request's user
//! and password are checked by logging in with them (the admin LOGIN
//! command, the password hashed as every client hashes it) on this node's
//! client port, and the console gathers every node's answers — its own
//! included — over connections logged in as that user, so each node
//! applies its own checks (password, the user's roles and allow-lists,
//! the audit trail) exactly as for a client. A request without
//! credentials, or whose login is refused, is answered 401 with a
//! `WWW-Authenticate: Basic` challenge and a page saying why, never with
//! figures.
//!
//! Invariants: nothing a node answers is sent before the request's login
//! on this node succeeded; the clear password is kept only as the client
//! hash of the last one seen ([`Hashes`]), to spare a bcrypt per poll.

use base64::Engine as _;
use citrine_wire::admin::{command, field, AdminRequest};
use std::io::{Read, Write};
use std::net::TcpStream;

/// The user a request acts as, and its client credential (the password's
/// client hash).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Login {
    pub user: String,
    pub credential: Vec<u8>,
}

/// Why a node's answers could not be had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AskError {
    /// The node refused the login with this result code.
    Refused(u8),
    /// No answer: connection, protocol or time.
    Failed(String),
}

impl std::fmt::Display for AskError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskError::Refused(code) => write!(formatter, "login refused (result code {code})"),
            AskError::Failed(error) => formatter.write_str(error),
        }
    }
}

/// The user and password of a request head's `Authorization: Basic`
/// header, if it has a well-formed one.
pub fn basic_credentials(head: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(head).ok()?;
    let value = text.lines().skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("authorization")
            .then_some(value.trim())
    })?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let (user, password) = String::from_utf8(decoded)
        .ok()?
        .split_once(':')
        .map(|(user, password)| (user.to_owned(), password.to_owned()))?;
    (!user.is_empty()).then_some((user, password))
}

/// The client hash of the last password seen (bcrypt: too slow to redo
/// on every poll).
#[derive(Default)]
pub struct Hashes {
    last: Option<(String, Vec<u8>)>,
}

impl Hashes {
    /// The login of `user` with `password`; `None` if it cannot be hashed.
    pub fn login(&mut self, user: &str, password: &str) -> Option<Login> {
        let cached = self
            .last
            .as_ref()
            .filter(|(seen, _)| seen == password)
            .map(|(_, hash)| hash.clone());
        let credential = match cached {
            Some(hash) => hash,
            None => {
                let hash = citrine_security::password::client_hash(password)?.into_bytes();
                self.last = Some((password.to_owned(), hash.clone()));
                hash
            }
        };
        Some(Login {
            user: user.to_owned(),
            credential,
        })
    }
}

/// Logs the connection `stream` in as `login` (LOGIN); the node's refusal
/// code, or why there is no answer.
pub fn log_in(stream: &mut TcpStream, login: &Login) -> Result<(), AskError> {
    let frame = citrine_client::admin::request(
        command::LOGIN,
        &[
            (field::USER, login.user.as_bytes()),
            (field::CREDENTIAL, &login.credential),
        ],
    );
    let failed = |error: std::io::Error| AskError::Failed(format!("login failed: {error}"));
    stream.write_all(&frame).map_err(failed)?;
    let mut header = [0u8; 8];
    stream.read_exact(&mut header).map_err(failed)?;
    let size = u64::from_be_bytes(header) & ((1 << 48) - 1);
    if header[0] != 2 || header[1] != 2 || size > 64 * 1024 {
        return Err(AskError::Failed(format!(
            "not an admin answer (header {header:02x?})"
        )));
    }
    let mut body = Vec::new();
    stream.take(size).read_to_end(&mut body).map_err(failed)?;
    let reply = AdminRequest::parse(&body)
        .map_err(|error| AskError::Failed(format!("bad admin answer: {error}")))?;
    match reply.header.result {
        0 => Ok(()),
        code => Err(AskError::Refused(code)),
    }
}

/// The page of a 401: what to do to see the console.
pub fn denied_text(reason: &str) -> String {
    format!(
        "This Citrine node has security on: sign in with the user name and password of a \
         user of the cluster (HTTP basic authentication; the console acts as that user).\n\
         {reason}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_read_from_the_head() {
        let head = b"GET /console HTTP/1.1\r\nHost: x\r\nauthorization: Basic YWRtaW46YTpi\r\n";
        assert_eq!(
            basic_credentials(head),
            Some(("admin".to_owned(), "a:b".to_owned()))
        );
        for bad in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n"[..],
            b"GET / HTTP/1.1\r\nAuthorization: Bearer YWRtaW46YQ==\r\n",
            b"GET / HTTP/1.1\r\nAuthorization: Basic !!!\r\n",
            b"GET / HTTP/1.1\r\nAuthorization: Basic OmE=\r\n",
            b"GET / HTTP/1.1\r\nAuthorization: Basic YWRtaW4=\r\n",
        ] {
            assert_eq!(basic_credentials(bad), None);
        }
    }
}
