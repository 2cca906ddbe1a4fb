//! The request path with security on: what a connection may do before and
//! after it logs in, request kind by request kind.

#![allow(clippy::unwrap_used)]

use super::Login;
use crate::batch::row_flags;
use crate::batch::tests::{batch_frame, decode_stream, digest, payload, service, Msg, RowSpec};
use crate::{Arrival, Service};
use citrine_security::SecurityConfig;
use citrine_types::ResultCode;
use citrine_wire::admin::{command, field, AdminReply};
use citrine_wire::frame::{MessageType, ProtoHeader};
use citrine_wire::msg::{field_type, info1, info2, op_type, MessageWriter, MsgHeader};

fn secure() -> Service {
    let (service, _clock) = service();
    service.enable_security(SecurityConfig {
        stored_cost: 4,
        ..SecurityConfig::default()
    });
    service
}

/// Runs one frame for a connection logged in as `login`; the raw reply.
fn send(service: &Service, login: &mut Login, frame: &[u8]) -> Vec<u8> {
    let header = ProtoHeader::decode(frame[..8].try_into().unwrap()).unwrap();
    let mut out = Vec::new();
    let arrival = Arrival {
        from: Some("127.0.0.1:5000".parse().unwrap()),
        ..Arrival::default()
    };
    let mut session = crate::session::Session::default();
    session.login = std::mem::take(login);
    service
        .handle_guarded(header, &frame[8..], &mut out, arrival, &mut session)
        .unwrap();
    *login = session.login;
    out
}

fn admin(command: u8, fields: &[(u8, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut frame = AdminReply::begin(&mut out);
    frame.request(command);
    for (id, data) in fields {
        frame.field(*id, data);
    }
    frame.finish();
    out
}

fn login(service: &Service, user: &str, password: &str) -> Login {
    let mut login = Login::default();
    let hash = citrine_security::password::client_hash(password).unwrap();
    let frame = admin(
        command::LOGIN,
        &[
            (field::USER, user.as_bytes()),
            (field::CREDENTIAL, hash.as_bytes()),
        ],
    );
    let reply = send(service, &mut login, &frame);
    assert_eq!(reply[9], 0, "login as {user}");
    login
}

fn record(info1_bits: u8, info2_bits: u8, set: &str) -> Vec<u8> {
    let header = MsgHeader {
        info1: info1_bits,
        info2: info2_bits,
        ..MsgHeader::default()
    };
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, set.as_bytes())
        .field(field_type::DIGEST, &digest(set, "k").0);
    if info2_bits & info2::WRITE != 0 {
        writer.op(op_type::WRITE, 1, b"b", &7i64.to_be_bytes());
    }
    writer.finish();
    out
}

fn result_of(reply: &[u8]) -> u8 {
    let (messages, _): (Vec<Msg>, usize) = decode_stream(reply);
    messages.last().unwrap().header.result_code
}

fn info(service: &Service, login: &mut Login, command: &str) -> String {
    let body = format!("{command}\n");
    let mut frame = ProtoHeader::encode(MessageType::Info, body.len() as u64).to_vec();
    frame.extend_from_slice(body.as_bytes());
    String::from_utf8(send(service, login, &frame)[8..].to_vec()).unwrap()
}

#[test]
fn nothing_runs_before_login() {
    let service = secure();
    let mut nobody = Login::default();
    let read = record(info1::READ, 0, "s");
    assert_eq!(
        result_of(&send(&service, &mut nobody, &read)),
        ResultCode::NotAuthenticated.code()
    );
    assert_eq!(
        info(&service, &mut nobody, "build"),
        "ERROR:80:not authenticated\n"
    );
    let query = admin(command::QUERY_USERS, &[]);
    assert_eq!(
        send(&service, &mut nobody, &query)[9],
        ResultCode::NotAuthenticated.code()
    );
}

#[test]
fn a_reader_reads_and_is_refused_writes_batches_and_admin_info() {
    let service = secure();
    let mut admin_login = login(&service, "admin", "admin");
    // The default admin writes (roles user-admin and read-write).
    let admin_write = record(0, info2::WRITE, "t");
    assert_eq!(
        result_of(&send(&service, &mut admin_login, &admin_write)),
        ResultCode::Ok.code()
    );
    let write = record(0, info2::WRITE, "s");
    let hash = citrine_security::password::client_hash("pw").unwrap();
    let roles = [1u8, 4, b'r', b'e', b'a', b'd'];
    let create = admin(
        command::CREATE_USER,
        &[
            (field::USER, b"r"),
            (field::PASSWORD, hash.as_bytes()),
            (field::ROLES, &roles),
        ],
    );
    assert_eq!(send(&service, &mut admin_login, &create)[9], 0);
    let mut reader = login(&service, "r", "pw");
    let read = record(info1::READ, 0, "s");
    assert_eq!(
        result_of(&send(&service, &mut reader, &read)),
        ResultCode::NotFound.code()
    );
    assert_eq!(
        result_of(&send(&service, &mut reader, &write)),
        ResultCode::RoleViolation.code()
    );
    // In a batch only the write row is refused; the read row runs.
    let rows = [
        RowSpec::full(0, "test", "s", "a", row_flags::INFO, [info1::READ, 0, 0, 0]),
        RowSpec::full(
            1,
            "test",
            "s",
            "b",
            row_flags::INFO,
            [0, info2::WRITE, 0, 0],
        )
        .op(op_type::WRITE, 1, "b", &[0; 8]),
    ];
    let batch = batch_frame(&payload(&rows, 0), false);
    let (messages, _) = decode_stream(&send(&service, &mut reader, &batch));
    let codes: Vec<(u32, u8)> = messages
        .iter()
        .map(|message| (message.header.transaction_ttl, message.header.result_code))
        .collect();
    let not_found = ResultCode::NotFound.code();
    assert_eq!(
        codes[..2],
        [(0, not_found), (1, ResultCode::RoleViolation.code())]
    );
    assert_eq!(messages.last().unwrap().header.result_code, 0);
    // A read-only batch runs.
    let reads = batch_frame(&payload(&rows[..1], 0), false);
    assert_eq!(result_of(&send(&service, &mut reader, &reads)), 0);
    // Info: ordinary commands run, truncate needs a privilege.
    assert!(!info(&service, &mut reader, "namespaces").contains("ERROR"));
    let context = info(&service, &mut reader, "get-config:context=security");
    assert_eq!(
        context,
        "get-config:context=security\tenable-security=true;enable-quotas=false;session-ttl=86400\n"
    );
    assert_eq!(
        info(&service, &mut reader, "truncate:namespace=test"),
        "ERROR:81:role violation\n"
    );
    // A compressed write is checked as the write inside it.
    let compressed = citrine_wire::frame::deflate(&write);
    assert_eq!(
        result_of(&send(&service, &mut reader, &compressed)),
        ResultCode::RoleViolation.code()
    );
}

fn create_user(service: &Service, name: &str) {
    let mut admin_login = login(service, "admin", "admin");
    let hash = citrine_security::password::client_hash("pw").unwrap();
    let roles = [1u8, 4, b'r', b'e', b'a', b'd'];
    let frame = admin(
        command::CREATE_USER,
        &[
            (field::USER, name.as_bytes()),
            (field::PASSWORD, hash.as_bytes()),
            (field::ROLES, &roles),
        ],
    );
    assert_eq!(send(service, &mut admin_login, &frame)[9], 0);
}

fn knows(service: &Service, name: &str) -> bool {
    service
        .security()
        .unwrap()
        .with(|security| security.users().contains_key(name))
}

#[test]
fn a_peer_takes_a_newer_store_and_ignores_an_older_one() {
    let first = secure();
    create_user(&first, "shared");
    let text = super::store_text(first.security().unwrap());
    let second = secure();
    assert!(!knows(&second, "shared"));
    second.merge_security(&text);
    assert!(knows(&second, "shared"));
    login(&second, "shared", "pw");
    // A later change there wins over the first node's older store.
    create_user(&second, "later");
    second.merge_security(&text);
    assert!(knows(&second, "later"));
}

#[test]
fn users_created_on_two_nodes_before_either_push_both_survive() {
    let (first, second) = (secure(), secure());
    create_user(&first, "left");
    create_user(&second, "right");
    let (first_text, second_text) = (
        super::store_text(first.security().unwrap()),
        super::store_text(second.security().unwrap()),
    );
    first.merge_security(&second_text);
    second.merge_security(&first_text);
    for service in [&first, &second] {
        assert!(knows(service, "left") && knows(service, "right"));
        login(service, "left", "pw");
        login(service, "right", "pw");
    }
    assert_eq!(
        super::store_text(first.security().unwrap()),
        super::store_text(second.security().unwrap())
    );
}

#[test]
fn a_file_in_the_earlier_whole_store_format_is_loaded_with_its_drops() {
    let directory =
        std::env::temp_dir().join(format!("citrine-security-old-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let mut security = citrine_security::Security::new(
        SecurityConfig {
            stored_cost: 4,
            ..SecurityConfig::default()
        },
        [9; 16],
    );
    let credential = citrine_security::password::client_hash("pw").unwrap();
    let roles = ["read".to_owned()];
    security
        .create_user("old", credential.as_bytes(), &roles, [8; 16])
        .unwrap();
    security.drop_user("admin").unwrap();
    let body = citrine_security::snapshot::to_text(&security);
    let file = directory.join(super::SECURITY_FILE);
    std::fs::write(&file, format!("version=5000.1\n{body}")).unwrap();
    let node = secure();
    node.keep_security(&directory).unwrap();
    assert!(knows(&node, "old") && !knows(&node, "admin"));
    login(&node, "old", "pw");
    // A peer that never changed its default user does not bring it back.
    node.merge_security(&super::store_text(secure().security().unwrap()));
    assert!(!knows(&node, "admin"));
    // The file is rewritten in the per-entry format.
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(";dropped;version=5000.1"), "{text}");
    std::fs::remove_dir_all(&directory).unwrap();
}

#[test]
fn users_survive_a_restart_in_the_work_directory() {
    let directory = std::env::temp_dir().join(format!("citrine-security-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let first = secure();
    first.keep_security(&directory).unwrap();
    create_user(&first, "kept");
    drop(first);
    let again = secure();
    again.keep_security(&directory).unwrap();
    assert!(knows(&again, "kept"));
    login(&again, "kept", "pw");
    std::fs::remove_dir_all(&directory).unwrap();
}

/// Keeps the audit lines it is sent.
#[derive(Default)]
struct Kept(parking_lot::Mutex<Vec<String>>);

impl super::audit::AuditSink for std::sync::Arc<Kept> {
    fn send(&self, line: super::audit::Line) {
        self.0.lock().push(line.text);
    }
    fn dropped(&self) -> u64 {
        0
    }
}

fn audited(reports: super::audit::Reports) -> (Service, std::sync::Arc<Kept>) {
    let service = secure();
    let kept = std::sync::Arc::new(Kept::default());
    let settings = super::audit::AuditSettings {
        log: reports,
        syslog: super::audit::Reports::default(),
    };
    service.set_audit(settings, Box::new(kept.clone()));
    (service, kept)
}

fn has(kept: &Kept, parts: &[&str]) -> bool {
    kept.0
        .lock()
        .iter()
        .any(|line| parts.iter().all(|part| line.contains(part)))
}

#[test]
fn logins_user_changes_refusals_and_admin_info_are_audited() {
    let (service, kept) = audited(super::audit::Reports {
        authentication: true,
        sys_admin: true,
        user_admin: true,
        violation: true,
        ..Default::default()
    });
    let mut nobody = Login::default();
    let wrong = citrine_security::password::client_hash("wrong").unwrap();
    let frame = admin(
        command::LOGIN,
        &[
            (field::USER, b"admin"),
            (field::CREDENTIAL, wrong.as_bytes()),
        ],
    );
    assert_ne!(send(&service, &mut nobody, &frame)[9], 0);
    assert_ne!(send(&service, &mut nobody, &frame)[9], 0);
    let failed = [
        "authentication failed",
        "action: login",
        "user: admin",
        "client: 127.0.0.1:5000",
    ];
    assert!(has(&kept, &[&failed[..], &["failures=2"]].concat()));
    let guard = service.security().unwrap();
    assert_eq!(
        guard
            .login_failures
            .total
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    assert!(crate::info::statistics(&service).contains("login_failures=2"));

    create_user(&service, "reader");
    assert!(has(
        &kept,
        &[
            "permitted | type: authentication",
            "action: login",
            "user: admin"
        ]
    ));
    assert!(has(
        &kept,
        &[
            "permitted | type: user-admin",
            "action: create user",
            "user=reader;roles=read"
        ]
    ));
    assert!(!kept.0.lock().iter().any(|line| line.contains("pw")));

    let mut reader = login(&service, "reader", "pw");
    let write = record(0, info2::WRITE, "s");
    assert_eq!(
        result_of(&send(&service, &mut reader, &write)),
        ResultCode::RoleViolation.code()
    );
    assert!(has(
        &kept,
        &[
            "not authorized | type: violation",
            "user: reader",
            "action: write",
            "{test|s} result=81"
        ]
    ));
    info(&service, &mut reader, "truncate:namespace=test;set=s");
    assert!(has(
        &kept,
        &[
            "not authorized",
            "action: truncate",
            "namespace=test;set=s;result=81"
        ]
    ));

    let mut admin_login = login(&service, "admin", "admin");
    let refused = info(
        &service,
        &mut admin_login,
        "set-config:context=security;log.report-violation=false",
    );
    assert_eq!(refused, "ERROR:81:role violation\n");
    let mut sys_admin = vec![1u8, 9];
    sys_admin.extend_from_slice(b"sys-admin");
    let grant = admin(
        command::GRANT_ROLES,
        &[(field::USER, b"admin"), (field::ROLES, &sys_admin)],
    );
    assert_eq!(send(&service, &mut admin_login, &grant)[9], 0);
    assert!(has(
        &kept,
        &["action: grant roles", "user=admin;roles=sys-admin"]
    ));
    let answer = info(
        &service,
        &mut admin_login,
        "set-config:context=security;log.report-data-op=true;namespace=test",
    );
    assert_eq!(
        answer.trim_end(),
        "set-config:context=security;log.report-data-op=true;namespace=test\tok"
    );
    assert!(has(
        &kept,
        &[
            "permitted | type: sys-admin",
            "action: set-config",
            "context=security;log.report-data-op=true"
        ]
    ));
    let read = record(info1::READ, 0, "s");
    send(&service, &mut reader, &read);
    assert!(has(
        &kept,
        &[
            "permitted | type: data-op",
            "user: reader",
            "action: read",
            "{test|s}"
        ]
    ));
}

#[test]
fn without_switches_nothing_is_audited_but_failures_are_counted() {
    let (service, kept) = audited(super::audit::Reports::default());
    let mut nobody = Login::default();
    let wrong = citrine_security::password::client_hash("wrong").unwrap();
    let frame = admin(
        command::LOGIN,
        &[
            (field::USER, b"ghost"),
            (field::CREDENTIAL, wrong.as_bytes()),
        ],
    );
    send(&service, &mut nobody, &frame);
    create_user(&service, "reader");
    assert!(kept.0.lock().is_empty());
    let guard = service.security().unwrap();
    assert_eq!(
        guard
            .login_failures
            .total
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn a_certificate_login_is_audited_with_the_certificates_user() {
    let (service, kept) = audited(super::audit::Reports {
        authentication: true,
        ..Default::default()
    });
    let mut session = crate::session::Session::default();
    session.set_certificate("admin".to_owned());
    let frame = admin(command::LOGIN, &[]);
    let header = ProtoHeader::decode(frame[..8].try_into().unwrap()).unwrap();
    let mut out = Vec::new();
    let arrival = Arrival {
        from: Some("127.0.0.1:5000".parse().unwrap()),
        ..Arrival::default()
    };
    service
        .handle_guarded(header, &frame[8..], &mut out, arrival, &mut session)
        .unwrap();
    assert_eq!(out[9], 0, "PKI login");
    assert!(
        has(
            &kept,
            &[
                "permitted | type: authentication",
                "action: login",
                "user: admin"
            ]
        ),
        "{:?}",
        kept.0.lock()
    );
}
