//! Access control from the client's side: logging a connection in
//! (LOGIN with the password hashed as every Aerospike client hashes it)
//! and the user and role commands (admin messages, proto type 2).
//!
//! Invariant: a command's answer is read whole — a single record, or for
//! a query every frame up to the record with result 50 (QUERY_END) — so
//! the connection stays in step.

use crate::conn::Connection;
use crate::error::{Error, Result};
use citrine_wire::admin::{command, field, AdminReply, AdminRequest};
use citrine_wire::MessageType;
use std::time::Instant;

/// A user name and its clear password (hashed before it is sent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

/// One answer record: its result code and fields (id, data).
pub type AdminRecord = (u8, Vec<(u8, Vec<u8>)>);

/// The password as clients send it (bcrypt with the fixed salt).
pub fn hash_password(password: &str) -> Result<Vec<u8>> {
    citrine_security::password::client_hash(password)
        .map(String::into_bytes)
        .ok_or_else(|| Error::InvalidArgument("the password cannot be hashed".into()))
}

/// An admin request frame for `command` with `fields`.
pub fn request(command: u8, fields: &[(u8, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut frame = AdminReply::begin(&mut out);
    frame.request(command);
    for (id, data) in fields {
        frame.field(*id, data);
    }
    frame.finish();
    out
}

/// The ROLES field's data for `roles`.
pub fn roles_data(roles: &[String]) -> Vec<u8> {
    let mut data = vec![roles.len().min(255) as u8];
    for role in roles.iter().take(255) {
        let bytes = &role.as_bytes()[..role.len().min(255)];
        data.push(bytes.len() as u8);
        data.extend_from_slice(bytes);
    }
    data
}

/// Splits an answer frame's body into records.
fn records(address: &str, mut body: &[u8]) -> Result<Vec<AdminRecord>> {
    let mut records = Vec::new();
    while !body.is_empty() {
        let record = AdminRequest::parse(body).map_err(|error| Error::Protocol {
            address: address.to_string(),
            message: format!("bad admin answer: {error}"),
        })?;
        let used: usize = 16
            + record
                .fields
                .iter()
                .map(|(_, data)| 5 + data.len())
                .sum::<usize>();
        let fields = record
            .fields
            .iter()
            .map(|(id, data)| (*id, data.to_vec()))
            .collect();
        records.push((record.header.result, fields));
        body = body.get(used..).unwrap_or_default();
    }
    Ok(records)
}

impl Connection {
    /// Logs this connection in as `credentials.user` (LOGIN). A server
    /// without security (52) needs no login: that is success too.
    pub async fn login(
        &mut self,
        credentials: &Credentials,
        deadline: Option<Instant>,
    ) -> Result<()> {
        let hash = hash_password(&credentials.password)?;
        let frame = request(
            command::LOGIN,
            &[
                (field::USER, credentials.user.as_bytes()),
                (field::CREDENTIAL, &hash),
            ],
        );
        match self.admin(&frame, false, deadline).await {
            Ok(_) => Ok(()),
            Err(error) if error.raw_code() == Some(52) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Sends an admin request and reads its answer: one record, or with
    /// `query` every record up to QUERY_END (not returned). A record with
    /// another non-zero result is the server's error.
    pub async fn admin(
        &mut self,
        frame: &[u8],
        query: bool,
        deadline: Option<Instant>,
    ) -> Result<Vec<AdminRecord>> {
        let address = self.address().to_string();
        self.send(frame, deadline).await?;
        let mut answer = Vec::new();
        loop {
            let (message_type, body) = self.receive(deadline).await?;
            if message_type != MessageType::Admin {
                return Err(Error::Protocol {
                    address,
                    message: format!("admin request answered with type {message_type:?}"),
                });
            }
            for (result, fields) in records(&address, body)? {
                match result {
                    0 => answer.push((result, fields)),
                    50 if query => return Ok(answer),
                    code => return Err(Error::server(code, address.clone())),
                }
            }
            if !query {
                return Ok(answer);
            }
        }
    }
}
