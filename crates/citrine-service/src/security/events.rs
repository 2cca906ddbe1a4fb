//! What the request path tells the audit trail ([`super::audit`]): the
//! event of an admin request (login, user and role changes), of a
//! privileged info command, of a refused or reported data operation.
//!
//! Invariants: passwords and credentials never reach an event (only
//! names, roles, scopes and result codes do); queries of users and roles
//! are not events.

use super::audit::{Event, Report, Verdict};
use citrine_security::Action;
use citrine_types::ResultCode;
use citrine_wire::admin::{command, field, AdminRequest};
use std::net::SocketAddr;

/// The event of an admin request that got `result` (0: done), sent by a
/// connection logged in as `actor` whose TLS handshake verified a client
/// certificate naming `certificate` (a LOGIN without a user field, PKI,
/// logs in as it); `None` for queries and unparsable requests.
pub fn admin_event(
    body: &[u8],
    actor: Option<&str>,
    certificate: Option<&str>,
    result: u8,
    client: Option<SocketAddr>,
) -> Option<Event> {
    let request = AdminRequest::parse(body).ok()?;
    let named = |id| request.text(id).ok().flatten();
    let (report, action, user) = match request.header.command {
        command::LOGIN => (
            Report::Authentication,
            "login",
            named(field::USER).or(certificate),
        ),
        command::AUTHENTICATE => (
            Report::Authentication,
            "authenticate",
            named(field::USER).or(actor),
        ),
        command::QUERY_USERS | command::QUERY_ROLES => return None,
        other => (Report::UserAdmin, admin_action(other)?, actor),
    };
    let verdict = match (report, result) {
        (_, 0) => Verdict::Permitted,
        (Report::Authentication, _) => Verdict::AuthenticationFailed,
        (_, code) if is_violation(code) => Verdict::NotAuthorized,
        _ => Verdict::Permitted,
    };
    let report = match verdict {
        Verdict::NotAuthorized => Report::Violation,
        _ => report,
    };
    let mut detail = admin_detail(&request);
    if result != 0 {
        push_pair(&mut detail, "result", &result.to_string());
    }
    Some(Event {
        verdict,
        report,
        user: user.map(str::to_owned),
        roles: Vec::new(),
        client,
        action: action.to_owned(),
        detail,
        scope: None,
    })
}

/// Whether an answer `code` is a refusal of access (80 to 83).
pub fn is_violation(code: u8) -> bool {
    [
        ResultCode::NotAuthenticated,
        ResultCode::RoleViolation,
        ResultCode::NotWhitelisted,
        ResultCode::QuotaExceeded,
    ]
    .iter()
    .any(|refusal| refusal.code() == code)
}

fn admin_action(command: u8) -> Option<&'static str> {
    Some(match command {
        command::CREATE_USER => "create user",
        command::DROP_USER => "drop user",
        command::SET_PASSWORD => "set password",
        command::CHANGE_PASSWORD => "change password",
        command::GRANT_ROLES => "grant roles",
        command::REVOKE_ROLES => "revoke roles",
        command::CREATE_ROLE => "create role",
        command::DROP_ROLE => "drop role",
        command::GRANT_PRIVILEGES => "grant privileges",
        command::REVOKE_PRIVILEGES => "revoke privileges",
        command::SET_WHITELIST => "set whitelist",
        command::SET_QUOTAS => "set quotas",
        _ => return None,
    })
}

/// `user=U;role=R;roles=A,B;whitelist=…;read-quota=N;write-quota=N;
/// privileges=N`, as far as the request carries them.
fn admin_detail(request: &AdminRequest<'_>) -> String {
    let mut detail = String::new();
    let named = |id| request.text(id).ok().flatten();
    if let Some(user) = named(field::USER) {
        push_pair(&mut detail, "user", user);
    }
    if let Some(role) = named(field::ROLE) {
        push_pair(&mut detail, "role", role);
    }
    if let Some(roles) = request.field(field::ROLES) {
        let roles = citrine_wire::admin::decode_roles(roles).unwrap_or_default();
        push_pair(&mut detail, "roles", &roles.join(","));
    }
    if let Some(privileges) = request.field(field::PRIVILEGES) {
        let count = citrine_wire::admin::decode_privileges(privileges).map_or(0, |p| p.len());
        push_pair(&mut detail, "privileges", &count.to_string());
    }
    if let Some(whitelist) = named(field::WHITELIST) {
        push_pair(&mut detail, "whitelist", whitelist);
    }
    for (id, name) in [
        (field::READ_QUOTA, "read-quota"),
        (field::WRITE_QUOTA, "write-quota"),
    ] {
        if let Some(Ok(quota)) = request.field(id).map(citrine_wire::admin::decode_u32) {
            push_pair(&mut detail, name, &quota.to_string());
        }
    }
    detail
}

fn push_pair(detail: &mut String, name: &str, value: &str) {
    if !detail.is_empty() {
        detail.push(';');
    }
    detail.push_str(name);
    detail.push('=');
    detail.push_str(value);
}

/// The event of a privileged info command `line` (`NAME:PARAMS`) that
/// was permitted or refused `refusal`.
pub fn info_event(
    line: &str,
    user: &str,
    refusal: Option<ResultCode>,
    client: Option<SocketAddr>,
) -> Event {
    let (name, params) = line.split_once(':').unwrap_or((line, ""));
    let (verdict, report, detail) = match refusal {
        None => (Verdict::Permitted, Report::SysAdmin, params.to_owned()),
        Some(code) => {
            let mut detail = params.to_owned();
            push_pair(&mut detail, "result", &code.code().to_string());
            (Verdict::NotAuthorized, Report::Violation, detail)
        }
    };
    Event {
        verdict,
        report,
        user: Some(user.to_owned()),
        roles: Vec::new(),
        client,
        action: name.to_owned(),
        detail,
        scope: None,
    }
}

/// The event of a data operation `action` on `ns`/`set` by `user` (with
/// `roles`): refused `refusal`, or permitted (reported by `report-data-op*`).
pub fn data_event(
    action: Action,
    scope: (Option<&str>, Option<&str>),
    user: &str,
    roles: Vec<String>,
    refusal: Option<ResultCode>,
    client: Option<SocketAddr>,
) -> Event {
    let (ns, set) = scope;
    let mut detail = format!("{{{}|{}}}", ns.unwrap_or(""), set.unwrap_or(""));
    let (verdict, report) = match refusal {
        None => (Verdict::Permitted, Report::DataOp),
        Some(code) => {
            detail.push_str(&format!(" result={}", code.code()));
            (Verdict::NotAuthorized, Report::Violation)
        }
    };
    Event {
        verdict,
        report,
        user: Some(user.to_owned()),
        roles,
        client,
        action: action_name(action).to_owned(),
        detail,
        scope: ns.map(|ns| (ns.to_owned(), set.map(str::to_owned))),
    }
}

/// The privilege an action needs, by its reference name.
fn action_name(action: Action) -> &'static str {
    match action {
        Action::Read => "read",
        Action::Write => "write",
        Action::UdfApply => "udf",
        Action::Truncate => "truncate",
        Action::SindexAdmin => "sindex-admin",
        Action::UdfAdmin => "udf-admin",
        Action::SysAdmin => "sys-admin",
        Action::UserAdmin => "user-admin",
    }
}

/// The login-failure count joined to a failed login's detail.
pub fn with_failures(mut event: Event, failures: u64) -> Event {
    push_pair(&mut event.detail, "failures", &failures.to_string());
    event
}
