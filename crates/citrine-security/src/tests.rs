//! Tests of the model and of the admin protocol handling, with requests
//! built as the clients build them.

use super::*;
use crate::admin::{execute, Context};
use citrine_wire::admin::{command, field, AdminRequest, WirePrivilege};

fn security() -> Security {
    let config = SecurityConfig {
        stored_cost: 4,
        enable_quotas: true,
        ..SecurityConfig::default()
    };
    Security::new(config, [1; 16])
}

fn context(now_ms: u64, token: u8) -> Context<'static> {
    Context {
        certificate: None,
        from: Some("127.0.0.1".parse().expect("ip")),
        now_ms,
        entropy: Entropy {
            salt: [token; 16],
            token: [token; 32],
        },
    }
}

fn request(command: u8, fields: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut body = vec![0, 0, command, fields.len() as u8];
    body.extend_from_slice(&[0; 12]);
    for (id, data) in fields {
        body.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
        body.push(*id);
        body.extend_from_slice(data);
    }
    body
}

fn hash(password: &str) -> Vec<u8> {
    password::client_hash(password).expect("hash").into_bytes()
}

fn roles(names: &[&str]) -> Vec<u8> {
    let mut data = vec![names.len() as u8];
    for name in names {
        data.push(name.len() as u8);
        data.extend_from_slice(name.as_bytes());
    }
    data
}

/// Runs one request; returns the reply's result code and body.
fn run(
    security: &mut Security,
    login: &mut Option<String>,
    body: &[u8],
    now_ms: u64,
) -> (u8, Vec<u8>) {
    let mut out = Vec::new();
    execute(security, body, login, context(now_ms, 9), &mut out);
    (out[9], out[8..].to_vec())
}

fn login_as(security: &mut Security, user: &str, password: &str) -> (u8, Option<String>, Vec<u8>) {
    let mut login = None;
    let body = request(
        command::LOGIN,
        &[
            (field::USER, user.into()),
            (field::CREDENTIAL, hash(password)),
        ],
    );
    let (code, reply) = run(security, &mut login, &body, 1_000);
    (code, login, reply)
}

#[test]
fn the_default_admin_logs_in_and_gets_a_token() {
    let mut security = security();
    let (code, login, reply) = login_as(&mut security, "admin", "admin");
    assert_eq!(code, 0);
    assert_eq!(login.as_deref(), Some("admin"));
    let parsed = AdminRequest::parse(&reply).expect("reply");
    let token = parsed.field(field::SESSION_TOKEN).expect("token");
    assert_eq!(token, &[9; 32]);
    let ttl = parsed.field(field::SESSION_TTL).expect("ttl");
    assert_eq!(ttl, &86_400u32.to_be_bytes());
    // The token authenticates another connection until it expires.
    let auth = request(
        command::AUTHENTICATE,
        &[
            (field::USER, b"admin".to_vec()),
            (field::SESSION_TOKEN, token.to_vec()),
        ],
    );
    let mut other = None;
    assert_eq!(run(&mut security, &mut other, &auth, 2_000).0, 0);
    assert_eq!(other.as_deref(), Some("admin"));
    let mut late = None;
    assert_eq!(
        run(&mut security, &mut late, &auth, 86_401_000).0,
        ResultCode::ExpiredSession.code()
    );
    assert_eq!(late, None);
}

#[test]
fn wrong_credentials_are_refused_in_sixteen_bytes() {
    let mut security = security();
    let (code, login, reply) = login_as(&mut security, "admin", "nope");
    assert_eq!(code, ResultCode::InvalidCredential.code());
    assert_eq!(login, None);
    assert_eq!(reply.len(), 16);
    assert_eq!(
        login_as(&mut security, "nobody", "admin").0,
        ResultCode::InvalidUser.code()
    );
    // Not logged in: nothing but login / authenticate.
    let mut none = None;
    let query = request(command::QUERY_USERS, &[]);
    assert_eq!(
        run(&mut security, &mut none, &query, 1).0,
        ResultCode::NotAuthenticated.code()
    );
    // Garbage is an invalid field, still 16 bytes.
    let (code, reply) = run(&mut security, &mut none, &[0, 0, 20, 3], 1);
    assert_eq!((code, reply.len()), (ResultCode::InvalidField.code(), 16));
}

fn create_reader(security: &mut Security, admin: &mut Option<String>) {
    let body = request(
        command::CREATE_USER,
        &[
            (field::USER, b"alice".to_vec()),
            (field::PASSWORD, hash("pw")),
            (field::ROLES, roles(&["read"])),
        ],
    );
    assert_eq!(run(security, admin, &body, 1).0, 0);
}

#[test]
fn user_admin_creates_a_reader_who_may_read_not_write() {
    let mut security = security();
    let (_, mut admin, _) = login_as(&mut security, "admin", "admin");
    create_reader(&mut security, &mut admin);
    let (code, alice, _) = login_as(&mut security, "alice", "pw");
    assert_eq!(code, 0);
    let alice = alice.expect("logged in");
    assert_eq!(
        security.may(&alice, Action::Read, Some("test"), Some("s")),
        Ok(())
    );
    assert_eq!(
        security.may(&alice, Action::Write, Some("test"), None),
        Err(ResultCode::RoleViolation)
    );
    // The default admin administers users and reads and writes data
    // (issue 41's check), but administers nothing else.
    assert_eq!(
        security.may("admin", Action::Read, Some("test"), None),
        Ok(())
    );
    assert_eq!(
        security.may("admin", Action::Write, Some("test"), None),
        Ok(())
    );
    assert_eq!(
        security.may("admin", Action::SysAdmin, None, None),
        Err(ResultCode::RoleViolation)
    );
    // alice may not create users.
    let mut alice_login = Some(alice);
    let body = request(command::DROP_USER, &[(field::USER, b"admin".to_vec())]);
    assert_eq!(
        run(&mut security, &mut alice_login, &body, 1).0,
        ResultCode::RoleViolation.code()
    );
    // Duplicate user.
    let body = request(
        command::CREATE_USER,
        &[
            (field::USER, b"alice".to_vec()),
            (field::PASSWORD, hash("pw")),
            (field::ROLES, roles(&["read"])),
        ],
    );
    assert_eq!(
        run(&mut security, &mut admin, &body, 1).0,
        ResultCode::UserExists.code()
    );
}

#[test]
fn a_user_changes_its_own_password_and_old_sessions_end() {
    let mut security = security();
    let (_, mut admin, reply) = login_as(&mut security, "admin", "admin");
    let token = AdminRequest::parse(&reply)
        .expect("r")
        .field(field::SESSION_TOKEN)
        .expect("t")
        .to_vec();
    let body = request(
        command::CHANGE_PASSWORD,
        &[
            (field::USER, b"admin".to_vec()),
            (field::OLD_PASSWORD, hash("admin")),
            (field::PASSWORD, hash("s3cret")),
        ],
    );
    assert_eq!(run(&mut security, &mut admin, &body, 1).0, 0);
    assert_eq!(
        security.authenticate(Some("admin"), &token, None, 2),
        Err(ResultCode::InvalidCredential)
    );
    assert_eq!(
        login_as(&mut security, "admin", "admin").0,
        ResultCode::InvalidCredential.code()
    );
    assert_eq!(login_as(&mut security, "admin", "s3cret").0, 0);
}

fn privilege(code: u8, ns: &str, set: &str) -> WirePrivilege {
    WirePrivilege {
        code,
        namespace: ns.into(),
        set: set.into(),
    }
}

fn privileges(list: &[WirePrivilege]) -> Vec<u8> {
    let mut data = vec![list.len() as u8];
    for p in list {
        data.push(p.code);
        if p.code >= 10 {
            data.push(p.namespace.len() as u8);
            data.extend_from_slice(p.namespace.as_bytes());
            data.push(p.set.len() as u8);
            data.extend_from_slice(p.set.as_bytes());
        }
    }
    data
}

#[test]
fn user_defined_roles_scope_privileges_and_query_back() {
    let mut security = security();
    let (_, mut admin, _) = login_as(&mut security, "admin", "admin");
    let body = request(
        command::CREATE_ROLE,
        &[
            (field::ROLE, b"demo-writer".to_vec()),
            (
                field::PRIVILEGES,
                privileges(&[privilege(11, "test", "demo")]),
            ),
            (field::WHITELIST, b"127.0.0.0/8".to_vec()),
            (field::WRITE_QUOTA, 2u32.to_be_bytes().to_vec()),
        ],
    );
    assert_eq!(run(&mut security, &mut admin, &body, 1).0, 0);
    create_reader(&mut security, &mut admin);
    let grant = request(
        command::GRANT_ROLES,
        &[
            (field::USER, b"alice".to_vec()),
            (field::ROLES, roles(&["demo-writer"])),
        ],
    );
    assert_eq!(run(&mut security, &mut admin, &grant, 1).0, 0);
    assert_eq!(
        security.may("alice", Action::Write, Some("test"), Some("demo")),
        Ok(())
    );
    assert_eq!(
        security.may("alice", Action::Write, Some("test"), Some("x")),
        Err(ResultCode::RoleViolation)
    );
    // Quota: two writes a second.
    let scope = (Some("test"), Some("demo"));
    assert_eq!(security.admit("alice", Action::Write, scope, 5_000), Ok(()));
    assert_eq!(security.admit("alice", Action::Write, scope, 5_100), Ok(()));
    assert_eq!(
        security.admit("alice", Action::Write, scope, 5_900),
        Err(ResultCode::QuotaExceeded)
    );
    assert_eq!(security.admit("alice", Action::Write, scope, 6_000), Ok(()));
    // Allow-list: from elsewhere refused.
    let elsewhere = Some("10.0.0.1".parse().expect("ip"));
    assert_eq!(
        security.login("alice", &hash("pw"), elsewhere, 1, [3; 32]),
        Err(ResultCode::NotWhitelisted)
    );
    // Query the role back.
    let query = request(
        command::QUERY_ROLES,
        &[(field::ROLE, b"demo-writer".to_vec())],
    );
    let (code, reply) = run(&mut security, &mut admin, &query, 1);
    assert_eq!(code, 0);
    let first = AdminRequest::parse(&reply).expect("record");
    assert_eq!(first.text(field::ROLE).expect("utf8"), Some("demo-writer"));
    let wire = citrine_wire::admin::decode_privileges(first.field(field::PRIVILEGES).expect("p"))
        .expect("p");
    assert_eq!(wire, vec![privilege(11, "test", "demo")]);
    assert_eq!(
        first.text(field::WHITELIST).expect("utf8"),
        Some("127.0.0.0/8")
    );
    // Dropping the role revokes it.
    let drop = request(
        command::DROP_ROLE,
        &[(field::ROLE, b"demo-writer".to_vec())],
    );
    assert_eq!(run(&mut security, &mut admin, &drop, 1).0, 0);
    assert!(!security.users()["alice"].roles.contains("demo-writer"));
    // Built-in roles cannot be dropped or recreated; bad privileges refused.
    let drop = request(command::DROP_ROLE, &[(field::ROLE, b"read".to_vec())]);
    assert_eq!(
        run(&mut security, &mut admin, &drop, 1).0,
        ResultCode::InvalidRole.code()
    );
    let bad = request(
        command::CREATE_ROLE,
        &[
            (field::ROLE, b"x".to_vec()),
            (field::PRIVILEGES, privileges(&[privilege(9, "", "")])),
        ],
    );
    assert_eq!(
        run(&mut security, &mut admin, &bad, 1).0,
        ResultCode::InvalidPrivilege.code()
    );
}

#[test]
fn query_users_lists_every_user_then_ends_with_fifty() {
    let mut security = security();
    let (_, mut admin, _) = login_as(&mut security, "admin", "admin");
    create_reader(&mut security, &mut admin);
    let (code, reply) = run(
        &mut security,
        &mut admin,
        &request(command::QUERY_USERS, &[]),
        1,
    );
    assert_eq!(code, 0);
    // Records back to back: admin, alice, end.
    let mut names = Vec::new();
    let mut rest = &reply[..];
    loop {
        let record = AdminRequest::parse(rest).expect("record");
        if record.header.result == ResultCode::QueryEnd.code() {
            break;
        }
        names.push(
            record
                .text(field::USER)
                .expect("utf8")
                .expect("user")
                .to_string(),
        );
        let used: usize = 16
            + record
                .fields
                .iter()
                .map(|(_, d)| 5 + d.len())
                .sum::<usize>();
        rest = &rest[used..];
    }
    assert_eq!(names, vec!["admin", "alice"]);
    let missing = request(command::QUERY_USERS, &[(field::USER, b"bob".to_vec())]);
    assert_eq!(
        run(&mut security, &mut admin, &missing, 1).0,
        ResultCode::InvalidUser.code()
    );
}

#[test]
fn quotas_need_enable_quotas() {
    let mut security = Security::new(
        SecurityConfig {
            stored_cost: 4,
            ..SecurityConfig::default()
        },
        [0; 16],
    );
    let role = Role {
        read_quota: 5,
        ..Role::default()
    };
    assert_eq!(
        security.create_role("r", role),
        Err(ResultCode::QuotasNotEnabled)
    );
}

#[test]
fn sessions_are_bounded_and_the_closest_to_expiry_goes() {
    let config = SecurityConfig {
        stored_cost: 4,
        max_sessions: 2,
        ..SecurityConfig::default()
    };
    let mut security = Security::new(config, [1; 16]);
    let credential = hash("admin");
    for (now_ms, token) in [(1, 1u8), (2, 2), (3, 3)] {
        security
            .login("admin", &credential, None, now_ms, [token; 32])
            .expect("login");
    }
    assert_eq!(
        security.authenticate(None, &[1; 32], None, 10),
        Err(ResultCode::InvalidCredential)
    );
    assert_eq!(
        security.authenticate(None, &[2; 32], None, 10).as_deref(),
        Ok("admin")
    );
    assert_eq!(
        security.authenticate(None, &[3; 32], None, 10).as_deref(),
        Ok("admin")
    );
}

#[test]
fn a_login_without_fields_is_the_verified_certificate_s_user() {
    let mut security = security();
    let body = request(command::LOGIN, &[]);
    let pki = |security: &mut Security, certificate: Option<&str>| {
        let (mut login, mut out) = (None, Vec::new());
        let context = Context {
            certificate,
            ..context(1_000, 5)
        };
        execute(security, &body, &mut login, context, &mut out);
        (out[9], login)
    };
    // No certificate (plain port, or none asked for): no login.
    assert_eq!(pki(&mut security, None), (65, None));
    // A certificate naming no user.
    assert_eq!(pki(&mut security, Some("nobody")), (60, None));
    let (code, login) = pki(&mut security, Some("admin"));
    assert_eq!((code, login.as_deref()), (0, Some("admin")));
    // The session it opened authenticates the user's next connections.
    let mut next = None;
    let token = [5u8; 32].to_vec();
    let body = request(command::AUTHENTICATE, &[(field::SESSION_TOKEN, token)]);
    assert_eq!(run(&mut security, &mut next, &body, 2_000).0, 0);
    assert_eq!(next.as_deref(), Some("admin"));
}

#[test]
fn external_users_hold_the_directorys_roles_while_they_have_sessions() {
    let mut security = with_token_key(security(), [1; 32]);
    let from = Some("127.0.0.1".parse().expect("ip"));
    let readers = ["read".to_owned()];
    let (token, ttl) = security
        .login_external("carol", &readers, (from, 1_000), 120)
        .expect("login");
    assert_eq!(ttl, 120);
    assert_eq!(
        security.authenticate(Some("carol"), &token, from, 2_000),
        Ok("carol".to_owned())
    );
    assert_eq!(
        security.may("carol", Action::Read, Some("test"), None),
        Ok(())
    );
    assert_eq!(
        security.may("carol", Action::Write, Some("test"), None),
        Err(ResultCode::RoleViolation)
    );
    // A poll that finds new groups changes what the user may do.
    security.set_external_roles("carol", Some(&["read-write".to_owned()]));
    assert_eq!(
        security.may("carol", Action::Write, Some("test"), None),
        Ok(())
    );
    assert_eq!(security.external_users(2_000), vec!["carol".to_owned()]);
    // The token expires with the LDAP session-ttl, and the user is forgotten.
    assert_eq!(
        security.authenticate(None, &token, from, 121_000),
        Err(ResultCode::ExpiredSession)
    );
    assert!(security.external_users(121_000).is_empty());
    assert_eq!(
        security.may("carol", Action::Read, Some("test"), None),
        Err(ResultCode::NotAuthenticated)
    );
    // An internal user's name is not the directory's to log in.
    assert_eq!(
        security.login_external("admin", &readers, (from, 1_000), 120),
        Err(ResultCode::InvalidUser)
    );
}

#[test]
fn a_user_gone_from_the_directory_or_made_internal_loses_its_sessions() {
    let mut security = with_token_key(security(), [1; 32]);
    let from = None;
    let (token, _) = security
        .login_external("dave", &["read".to_owned()], (from, 0), 120)
        .expect("login");
    security.set_external_roles("dave", None);
    assert_eq!(
        security.authenticate(None, &token, from, 1),
        Err(ResultCode::InvalidCredential)
    );
    let (token, _) = security
        .login_external("dave", &["read".to_owned()], (from, 0), 120)
        .expect("login again");
    security
        .create_user("dave", &hash("pw"), &["sys-admin".to_owned()], [5; 16])
        .expect("internal dave");
    assert_eq!(
        security.authenticate(None, &token, from, 1),
        Err(ResultCode::InvalidCredential)
    );
    // A poll about a name that is internal now changes nothing.
    security.set_external_roles("dave", None);
    assert!(security.users().contains_key("dave"));
}

fn with_token_key(mut security: Security, secret: [u8; 32]) -> Security {
    security.enable_ldap_tokens(secret, crate::TokenHash::Sha256);
    security
}

#[test]
fn an_external_token_from_one_node_is_accepted_by_every_node_sharing_the_key() {
    let mut issuer = with_token_key(security(), [1; 32]);
    let mut other = with_token_key(security(), [1; 32]);
    let (token, _) = issuer
        .login_external("erin", &["read".to_owned()], (None, 1_000), 120)
        .expect("login");
    // Before the users and roles reach it, the other node knows no erin.
    assert_eq!(
        other.authenticate(Some("erin"), &token, None, 2_000),
        Err(ResultCode::InvalidCredential)
    );
    other.replace(crate::snapshot::from_text(&crate::snapshot::to_text(&issuer)).expect("text"));
    assert_eq!(
        other.authenticate(Some("erin"), &token, None, 2_000),
        Ok("erin".to_owned())
    );
    assert_eq!(other.may("erin", Action::Read, Some("test"), None), Ok(()));
    // Only the issuing node polls erin; the others take its answers.
    assert!(other.external_users(2_000).is_empty());
    assert_eq!(issuer.external_users(2_000), vec!["erin".to_owned()]);
    // Another key (another cluster) does not open it; nor another name.
    let stranger = with_token_key(security(), [2; 32]);
    assert_eq!(
        stranger.authenticate(None, &token, None, 2_000),
        Err(ResultCode::InvalidCredential)
    );
    assert_eq!(
        other.authenticate(Some("admin"), &token, None, 2_000),
        Err(ResultCode::InvalidCredential)
    );
    // Without LDAP (no key) there are no external logins.
    assert_eq!(
        security().login_external("erin", &[], (None, 0), 120),
        Err(ResultCode::InvalidUser)
    );
}

#[test]
fn only_an_external_login_by_a_stranger_goes_to_the_directory() {
    let security = security();
    let external = |user: &str| {
        request(
            command::LOGIN,
            &[
                (field::USER, user.as_bytes().to_vec()),
                (field::CREDENTIAL, hash("pw")),
                (field::CLEAR_PASSWORD, b"pw".to_vec()),
            ],
        )
    };
    let erin = external("erin");
    assert_eq!(
        admin::external_login(&security, &erin),
        Some(("erin", "pw"))
    );
    assert_eq!(admin::external_login(&security, &external("admin")), None);
    let internal = request(
        command::LOGIN,
        &[
            (field::USER, b"erin".to_vec()),
            (field::CREDENTIAL, hash("pw")),
        ],
    );
    assert_eq!(admin::external_login(&security, &internal), None);
}
