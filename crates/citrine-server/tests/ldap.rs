//! LDAP logins against a real citrined and a real slapd (the test starts
//! both, slapd on a loopback port with a throwaway configuration): a user
//! of the directory logs in through the wire protocol in the clients'
//! EXTERNAL mode with the roles its groups name; a wrong password is
//! refused (65); a group change takes effect after the next poll, both
//! ways; its token authenticates a new connection; with the directory
//! down an LDAP login gets 91 and the node's own users still log in.
//! Skipped, saying why, where slapd is not installed.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_client::admin::{hash_password, request};
use citrine_testsupport::slapd::{self, Slapd, SUFFIX};
use citrine_wire::admin::{command, field};
use common::{connect, free_port, get_all_request, round_trip, write_request, Server};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

fn directory_entries() -> String {
    format!(
        "dn: uid=alice,ou=users,{SUFFIX}\nobjectClass: inetOrgPerson\nuid: alice\ncn: alice\n\
         sn: alice\nuserPassword: wonderland\n\n\
         dn: cn=read,ou=groups,{SUFFIX}\nobjectClass: groupOfNames\ncn: read\n\
         member: uid=alice,ou=users,{SUFFIX}\n\n\
         dn: cn=read-write,ou=groups,{SUFFIX}\nobjectClass: groupOfNames\ncn: read-write\n\
         member: cn=nobody,{SUFFIX}\n"
    )
}

fn start_node(dir: &Path, ldap_url: &str) -> Server {
    let config = dir.join("citrine.toml");
    std::fs::write(
        &config,
        format!(
            "[security]\n[security.ldap]\nserver = \"{ldap_url}\"\ndisable-tls = true\n\
             query-base-dn = \"{SUFFIX}\"\nuser-dn-pattern = \"uid=${{un}},ou=users,{SUFFIX}\"\n\
             role-query-base-dn = \"ou=groups,{SUFFIX}\"\n\
             role-query-pattern = \"(&(objectClass=groupOfNames)(member=${{dn}}))\"\n\
             polling-period = 1\nsession-ttl = 600\n[[namespace]]\nname = \"test\"\n"
        ),
    )
    .unwrap();
    common::start(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
    ])
}

/// A LOGIN as the clients send it: EXTERNAL mode adds the clear password.
fn login(user: &str, password: &str, external: bool) -> Vec<u8> {
    let credential = hash_password(password).unwrap();
    let mut fields: Vec<(u8, &[u8])> = vec![
        (field::USER, user.as_bytes()),
        (field::CREDENTIAL, &credential),
    ];
    if external {
        fields.push((field::CLEAR_PASSWORD, password.as_bytes()));
    }
    request(command::LOGIN, &fields)
}

/// The value of field `id` in an admin reply's body (one record).
fn reply_field(body: &[u8], id: u8) -> Option<Vec<u8>> {
    let mut at = 16;
    while at + 5 <= body.len() {
        let size = u32::from_be_bytes(body[at..at + 4].try_into().unwrap()) as usize;
        if body[at + 4] == id {
            return Some(body[at + 5..at + 4 + size].to_vec());
        }
        at += 4 + size;
    }
    None
}

fn write_result(stream: &mut TcpStream) -> u8 {
    let write = write_request("test", "ldap", &[(2, 3, "b", b"v".to_vec())]);
    round_trip(stream, &write).unwrap().1[5]
}

/// Waits (polling-period is 1 s) until a write on `stream` answers `code`.
fn await_write_result(stream: &mut TcpStream, code: u8) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while write_result(stream) != code {
        assert!(Instant::now() < deadline, "writes never answered {code}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn directory_users_log_in_with_their_groups_as_roles() {
    if let Some(why) = slapd::missing() {
        eprintln!("skipping: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("citrine-ldap-node-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let directory = Slapd::start(&dir, free_port(), &directory_entries()).unwrap();
    let node = start_node(&dir, &directory.url);

    // get-config lists the LDAP settings under the reference's names.
    let mut admin = connect(node.port);
    assert_eq!(
        round_trip(&mut admin, &login("admin", "admin", false))
            .unwrap()
            .1[1],
        0
    );
    let security = common::info(&mut admin, &["get-config:context=security"]);
    for pair in [
        format!("ldap.server={}", directory.url),
        format!("ldap.query-base-dn={SUFFIX}"),
        "ldap.polling-period=1".to_owned(),
        "ldap.session-ttl=600".to_owned(),
        "ldap.disable-tls=true".to_owned(),
    ] {
        assert!(
            security[0].1.split(';').any(|listed| listed == pair),
            "{pair} not in {}",
            security[0].1
        );
    }

    let mut alice = connect(node.port);
    let reply = round_trip(&mut alice, &login("alice", "wonderland", true))
        .unwrap()
        .1;
    assert_eq!(reply[1], 0, "LDAP login");
    let token = reply_field(&reply, field::SESSION_TOKEN).expect("a session token");
    let ttl = reply_field(&reply, field::SESSION_TTL).expect("a session TTL");
    assert_eq!(u32::from_be_bytes(ttl[..4].try_into().unwrap()), 600);
    // Group `read`: reads run (the record is absent: 2), writes are refused.
    assert_eq!(
        round_trip(&mut alice, &get_all_request("test", "ldap"))
            .unwrap()
            .1[5],
        2
    );
    assert_eq!(write_result(&mut alice), 81);

    let mut wrong = connect(node.port);
    let refused = round_trip(&mut wrong, &login("alice", "rabbit", true))
        .unwrap()
        .1;
    assert_eq!(refused[1], 65);
    assert_eq!(refused.len(), 16);
    assert_eq!(write_result(&mut wrong), 80);

    // Into `read-write`: the next poll lets alice write; out again: refused.
    let membership = |change: &str| {
        format!(
            "dn: cn=read-write,ou=groups,{SUFFIX}\nchangetype: modify\n{change}: member\n\
             member: uid=alice,ou=users,{SUFFIX}\n"
        )
    };
    directory.modify(&membership("add")).unwrap();
    await_write_result(&mut alice, 0);
    let mut again = connect(node.port);
    let authenticate = request(
        command::AUTHENTICATE,
        &[(field::USER, b"alice"), (field::SESSION_TOKEN, &token)],
    );
    assert_eq!(round_trip(&mut again, &authenticate).unwrap().1[1], 0);
    assert_eq!(write_result(&mut again), 0);
    directory.modify(&membership("delete")).unwrap();
    await_write_result(&mut alice, 81);

    // Directory down: a clear refusal; the node's own users still log in,
    // in either mode.
    drop(directory);
    let mut down = connect(node.port);
    assert_eq!(
        round_trip(&mut down, &login("alice", "wonderland", true))
            .unwrap()
            .1[1],
        91
    );
    for external in [false, true] {
        let mut admin = connect(node.port);
        let reply = round_trip(&mut admin, &login("admin", "admin", external))
            .unwrap()
            .1;
        assert_eq!(reply[1], 0, "admin login, external mode {external}");
        assert_eq!(write_result(&mut admin), 0);
    }
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}
