//! The admin protocol (proto type 2) over [`Security`]: one request in, one
//! reply frame out, and what the connection's login becomes.
//!
//! Invariants: an error reply is a single field-less record (16-byte body);
//! a LOGIN without fields (PKI) logs in as the user the connection's
//! verified client certificate names, with no password;
//! LOGIN and AUTHENTICATE are the only commands a connection may send
//! before it is logged in (else 80); user and role changes need the
//! user-admin privilege, except a user changing its own password or
//! querying itself or its own roles.

use crate::{Action, Entropy, Privilege, Role, Security};
use citrine_types::ResultCode;
use citrine_wire::admin::{self as wire, command, field, AdminReply, AdminRequest};
use std::net::IpAddr;

/// Where and when a request arrived, and random bytes it may use.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    pub from: Option<IpAddr>,
    pub now_ms: u64,
    pub entropy: Entropy,
    /// The common name of the client certificate the connection's TLS
    /// handshake verified, if any: a LOGIN without fields (the clients'
    /// PKI auth mode) logs in as the user it names.
    pub certificate: Option<&'a str>,
}

/// What handling one request did besides replying.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Users or roles changed (to persist and share with the cluster).
    pub changed: bool,
    /// The reply's result code (0: done), for the audit trail.
    pub result: u8,
}

/// Handles the admin request `body` from a connection logged in as
/// `login` (which LOGIN / AUTHENTICATE set), appending the reply to `out`.
pub fn execute(
    security: &mut Security,
    body: &[u8],
    login: &mut Option<String>,
    context: Context<'_>,
    out: &mut Vec<u8>,
) -> Outcome {
    let request = match AdminRequest::parse(body) {
        Ok(request) => request,
        Err(_) => {
            wire::write_reply(out, ResultCode::InvalidField.code());
            return Outcome {
                changed: false,
                result: ResultCode::InvalidField.code(),
            };
        }
    };
    let result = match request.header.command {
        command::LOGIN => login_command(security, &request, login, context, out),
        command::AUTHENTICATE => authenticate(security, &request, login, context),
        _ => match login.clone() {
            None => Err(ResultCode::NotAuthenticated),
            Some(user) => administer(security, &request, &user, context, out),
        },
    };
    match result {
        Ok(changed) => {
            if out.is_empty() {
                wire::write_reply(out, ResultCode::Ok.code());
            }
            Outcome { changed, result: 0 }
        }
        Err(code) => {
            out.clear();
            wire::write_reply(out, code.code());
            Outcome {
                changed: false,
                result: code.code(),
            }
        }
    }
}

type Handled = Result<bool, ResultCode>;

/// The user and clear password of an admin request that is a LOGIN in
/// the clients' EXTERNAL mode (it carries CLEAR_PASSWORD) by a user who
/// is not one of `security`'s own: one for the directory to check.
/// Internal users log in with their stored hash whatever the mode.
pub fn external_login<'a>(security: &Security, body: &'a [u8]) -> Option<(&'a str, &'a str)> {
    let request = AdminRequest::parse(body).ok()?;
    if request.header.command != command::LOGIN {
        return None;
    }
    let user = request.text(field::USER).ok()??;
    let password = request.text(field::CLEAR_PASSWORD).ok()??;
    (!security.users().contains_key(user)).then_some((user, password))
}

fn text<'a>(request: &AdminRequest<'a>, id: u8) -> Result<&'a str, ResultCode> {
    request
        .text(id)
        .map_err(|_| ResultCode::InvalidField)?
        .ok_or(ResultCode::InvalidField)
}

fn bytes<'a>(request: &AdminRequest<'a>, id: u8) -> Result<&'a [u8], ResultCode> {
    request.field(id).ok_or(ResultCode::InvalidField)
}

fn login_command(
    security: &mut Security,
    request: &AdminRequest<'_>,
    login: &mut Option<String>,
    context: Context<'_>,
    out: &mut Vec<u8>,
) -> Handled {
    let (user, (token, ttl)) = if request.field(field::USER).is_none()
        && request.field(field::CREDENTIAL).is_none()
    {
        // PKI: the user is the verified certificate's common name.
        let user = context.certificate.ok_or(ResultCode::InvalidCredential)?;
        let opened =
            security.login_certified(user, context.from, context.now_ms, context.entropy.token)?;
        (user, opened)
    } else {
        let user = text(request, field::USER)?;
        let credential = bytes(request, field::CREDENTIAL)?;
        let opened = security.login(
            user,
            credential,
            context.from,
            context.now_ms,
            context.entropy.token,
        )?;
        (user, opened)
    };
    *login = Some(user.to_string());
    let mut reply = AdminReply::begin(out);
    reply
        .record(0)
        .field(field::SESSION_TOKEN, &token)
        .field_u32(field::SESSION_TTL, ttl);
    reply.finish();
    Ok(false)
}

fn authenticate(
    security: &Security,
    request: &AdminRequest<'_>,
    login: &mut Option<String>,
    context: Context<'_>,
) -> Handled {
    let user = request
        .text(field::USER)
        .map_err(|_| ResultCode::InvalidField)?;
    let token = bytes(request, field::SESSION_TOKEN)?;
    let user = security.authenticate(user, token, context.from, context.now_ms)?;
    *login = Some(user);
    Ok(false)
}

/// The user and role commands, for a logged-in `actor`.
fn administer(
    security: &mut Security,
    request: &AdminRequest<'_>,
    actor: &str,
    context: Context<'_>,
    out: &mut Vec<u8>,
) -> Handled {
    if !self_service(security, request, actor) {
        security.may(actor, Action::UserAdmin, None, None)?;
    }
    let salt = context.entropy.salt;
    match request.header.command {
        command::CREATE_USER => {
            let roles = roles_field(request)?;
            let credential = bytes(request, field::PASSWORD)?;
            security.create_user(text(request, field::USER)?, credential, &roles, salt)?;
        }
        command::DROP_USER => security.drop_user(text(request, field::USER)?)?,
        command::SET_PASSWORD => {
            let credential = bytes(request, field::PASSWORD)?;
            security.set_password(text(request, field::USER)?, credential, salt)?;
        }
        command::CHANGE_PASSWORD => {
            let old = bytes(request, field::OLD_PASSWORD)?;
            let credential = bytes(request, field::PASSWORD)?;
            security.change_password(text(request, field::USER)?, old, credential, salt)?;
        }
        command::GRANT_ROLES => {
            security.grant_roles(text(request, field::USER)?, &roles_field(request)?)?
        }
        command::REVOKE_ROLES => {
            security.revoke_roles(text(request, field::USER)?, &roles_field(request)?)?
        }
        command::QUERY_USERS => return query_users(security, request, out).map(|()| false),
        command::QUERY_ROLES => return query_roles(security, request, out).map(|()| false),
        _ => return administer_roles(security, request),
    }
    Ok(true)
}

/// Whether `actor` asks only about itself: its own password change, its
/// own user record, or one of its own roles.
fn self_service(security: &Security, request: &AdminRequest<'_>, actor: &str) -> bool {
    let user = request.text(field::USER).ok().flatten();
    match request.header.command {
        command::CHANGE_PASSWORD => user == Some(actor),
        command::QUERY_USERS => user == Some(actor),
        command::QUERY_ROLES => match request.text(field::ROLE).ok().flatten() {
            Some(role) => security
                .users()
                .get(actor)
                .is_some_and(|user| user.roles.contains(role)),
            None => false,
        },
        _ => false,
    }
}

fn administer_roles(security: &mut Security, request: &AdminRequest<'_>) -> Handled {
    let role = text(request, field::ROLE)?;
    match request.header.command {
        command::CREATE_ROLE => security.create_role(role, role_fields(request)?)?,
        command::DROP_ROLE => security.drop_role(role)?,
        command::GRANT_PRIVILEGES => {
            security.grant_privileges(role, &privileges_field(request)?)?
        }
        command::REVOKE_PRIVILEGES => {
            security.revoke_privileges(role, &privileges_field(request)?)?
        }
        command::SET_WHITELIST => security.set_whitelist(role, whitelist_field(request)?)?,
        command::SET_QUOTAS => {
            let (read, write) = quota_fields(request)?;
            security.set_quotas(role, read, write)?;
        }
        _ => return Err(ResultCode::InvalidCommand),
    }
    Ok(true)
}

fn roles_field(request: &AdminRequest<'_>) -> Result<Vec<String>, ResultCode> {
    wire::decode_roles(bytes(request, field::ROLES)?).map_err(|_| ResultCode::InvalidField)
}

fn privileges_field(request: &AdminRequest<'_>) -> Result<Vec<Privilege>, ResultCode> {
    let Some(data) = request.field(field::PRIVILEGES) else {
        return Ok(Vec::new());
    };
    let wire = wire::decode_privileges(data).map_err(|_| ResultCode::InvalidField)?;
    wire.iter()
        .map(|privilege| Privilege::from_wire(privilege).ok_or(ResultCode::InvalidPrivilege))
        .collect()
}

fn whitelist_field(request: &AdminRequest<'_>) -> Result<Vec<String>, ResultCode> {
    match request
        .text(field::WHITELIST)
        .map_err(|_| ResultCode::InvalidField)?
    {
        None => Ok(Vec::new()),
        Some(text) => crate::allow::parse_list(text).ok_or(ResultCode::InvalidWhitelist),
    }
}

fn quota_fields(request: &AdminRequest<'_>) -> Result<(u32, u32), ResultCode> {
    let quota = |id| {
        request
            .field(id)
            .map(|data| wire::decode_u32(data).map_err(|_| ResultCode::InvalidQuota))
            .transpose()
            .map(Option::unwrap_or_default)
    };
    Ok((quota(field::READ_QUOTA)?, quota(field::WRITE_QUOTA)?))
}

fn role_fields(request: &AdminRequest<'_>) -> Result<Role, ResultCode> {
    let (read_quota, write_quota) = quota_fields(request)?;
    Ok(Role {
        privileges: privileges_field(request)?.into_iter().collect(),
        whitelist: whitelist_field(request)?,
        read_quota,
        write_quota,
    })
}

/// One record per user (USER, ROLES), then the QUERY_END record.
fn query_users(
    security: &Security,
    request: &AdminRequest<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let wanted = request
        .text(field::USER)
        .map_err(|_| ResultCode::InvalidField)?;
    if wanted.is_some_and(|name| !security.users().contains_key(name)) {
        return Err(ResultCode::InvalidUser);
    }
    let mut reply = AdminReply::begin(out);
    for (name, user) in security.users() {
        if wanted.is_some_and(|wanted| wanted != name) {
            continue;
        }
        let roles: Vec<&String> = user.roles.iter().collect();
        reply
            .record(0)
            .field(field::USER, name.as_bytes())
            .field_roles(&roles);
    }
    reply.record(ResultCode::QueryEnd.code());
    reply.finish();
    Ok(())
}

/// One record per role (ROLE, PRIVILEGES, WHITELIST, quotas), built-in
/// roles first, then the QUERY_END record.
fn query_roles(
    security: &Security,
    request: &AdminRequest<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let wanted = request
        .text(field::ROLE)
        .map_err(|_| ResultCode::InvalidField)?;
    if wanted.is_some_and(|name| !security.role_exists(name)) {
        return Err(ResultCode::InvalidRole);
    }
    let mut reply = AdminReply::begin(out);
    for name in security.role_names() {
        if wanted.is_some_and(|wanted| wanted != name) {
            continue;
        }
        let privileges: Vec<_> = security
            .role_privileges(&name)
            .iter()
            .map(Privilege::to_wire)
            .collect();
        reply
            .record(0)
            .field(field::ROLE, name.as_bytes())
            .field_privileges(&privileges);
        if let Some(role) = security.roles().get(&name) {
            if !role.whitelist.is_empty() {
                reply.field(field::WHITELIST, role.whitelist.join(",").as_bytes());
            }
            reply
                .field_u32(field::READ_QUOTA, role.read_quota)
                .field_u32(field::WRITE_QUOTA, role.write_quota);
        }
    }
    reply.record(ResultCode::QueryEnd.code());
    reply.finish();
    Ok(())
}
