//! The audit trail of a real citrined with access control on: a failed
//! and a good login, a user created, a write refused to a read-only user,
//! and a privileged info command, each found in the audit log file.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_client::admin::{hash_password, request, roles_data};
use citrine_wire::admin::{command, field};
use common::{connect, info, round_trip, start, statistic, write_request};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const CONFIG: &str = "[security]\n\
[security.log]\n\
file = \"audit.log\"\n\
report-authentication = true\n\
report-user-admin = true\n\
report-sys-admin = true\n\
report-violation = true\n\
[[namespace]]\nname = \"test\"\n";

/// The result code of an admin request.
fn admin(stream: &mut TcpStream, command: u8, fields: &[(u8, &[u8])]) -> u8 {
    let (_, body) = round_trip(stream, &request(command, fields)).unwrap();
    body[1]
}

fn login(stream: &mut TcpStream, user: &str, password: &str) -> u8 {
    let credential = hash_password(password).unwrap();
    admin(
        stream,
        command::LOGIN,
        &[
            (field::USER, user.as_bytes()),
            (field::CREDENTIAL, &credential),
        ],
    )
}

/// Waits (up to 10 s) until the audit file holds a line with every one
/// of `parts`; the file.
fn wait_for_line(path: &std::path::Path, parts: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text
            .lines()
            .any(|line| parts.iter().all(|part| line.contains(part)))
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no audit line with {parts:?} in:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn logins_user_changes_and_refusals_reach_the_audit_file() {
    let directory = std::env::temp_dir().join(format!(
        "citrine-audit-{}-{}",
        std::process::id(),
        common::free_port()
    ));
    std::fs::create_dir_all(&directory).unwrap();
    let config = directory.join("citrine.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let server = start(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        directory.to_str().unwrap(),
    ]);
    let audit = directory.join("audit.log");

    let mut stream = connect(server.port);
    let client = format!("client: {}", stream.local_addr().unwrap());
    assert_eq!(login(&mut stream, "admin", "wrong"), 65);
    assert_eq!(login(&mut stream, "admin", "admin"), 0);
    let roles = roles_data(&["read".to_owned()]);
    let password = hash_password("secret").unwrap();
    let created = admin(
        &mut stream,
        command::CREATE_USER,
        &[
            (field::USER, b"reader"),
            (field::PASSWORD, &password),
            (field::ROLES, &roles),
        ],
    );
    assert_eq!(created, 0);
    assert_eq!(statistic(&mut stream, "login_failures"), 1);
    let answer = info(&mut stream, &["truncate:namespace=test;set=demo"]);
    assert!(format!("{answer:?}").contains("ERROR:81"), "{answer:?}");

    let mut reader = connect(server.port);
    assert_eq!(login(&mut reader, "reader", "secret"), 0);
    let write = write_request("test", "k", &[(2, 3, "b", b"v".to_vec())]);
    let (_, body) = round_trip(&mut reader, &write).unwrap();
    assert_eq!(body[5], 81, "a read-only user's write");

    let failed = [
        "INFO (audit): authentication failed",
        "type: authentication",
        &client,
        "user: admin",
        "action: login",
        "failures=1",
    ];
    wait_for_line(&audit, &failed);
    wait_for_line(
        &audit,
        &["permitted", "user: admin", "action: login", &client],
    );
    wait_for_line(
        &audit,
        &[
            "permitted | type: user-admin",
            "action: create user",
            "user=reader;roles=read",
        ],
    );
    wait_for_line(
        &audit,
        &["not authorized", "user: admin", "action: truncate"],
    );
    let text = wait_for_line(
        &audit,
        &[
            "not authorized | type: violation",
            "user: reader",
            "action: write",
            "{test|demo}",
        ],
    );
    assert!(!text.contains("secret"), "a password in the audit log");
    assert!(text
        .lines()
        .all(|line| line.contains(" GMT: INFO (audit): ")));
    drop(server);
    let _ = std::fs::remove_dir_all(&directory);
}
