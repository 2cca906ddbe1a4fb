//! LDAP logins against a real citrined and a real slapd (the test starts
//! both, slapd on a loopback port with a throwaway configuration): a user
//! of the directory logs in through the wire protocol in the clients'
//! EXTERNAL mode with the roles its groups name; a wrong password is
//! refused (65); a group change takes effect after the next poll, both
//! ways; its token authenticates a new connection; with the directory
//! down an LDAP login gets 91 and the node's own users still log in.
//! On a two-node cluster, a token one node issued authenticates on the
//! other and a group change found by one node's poll reaches both.
//! Skipped, saying why, where slapd is not installed.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_client::admin::{hash_password, request};
use citrine_testsupport::slapd::{self, Slapd, SUFFIX};
use citrine_wire::admin::{command, field};
use common::cluster::Node;
use common::{
    connect, free_port, get_all_request, round_trip, workspace_root, write_request, Server,
};
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

/// The `[security.ldap]` section for the directory at `ldap_url`.
fn ldap_section(ldap_url: &str) -> String {
    format!(
        "[security.ldap]\nserver = \"{ldap_url}\"\ndisable-tls = true\n\
         query-base-dn = \"{SUFFIX}\"\nuser-dn-pattern = \"uid=${{un}},ou=users,{SUFFIX}\"\n\
         role-query-base-dn = \"ou=groups,{SUFFIX}\"\n\
         role-query-pattern = \"(&(objectClass=groupOfNames)(member=${{dn}}))\"\n\
         polling-period = 1\nsession-ttl = 600\n"
    )
}

fn start_node(dir: &Path, ldap_url: &str) -> Server {
    let config = dir.join("citrine.toml");
    std::fs::write(
        &config,
        format!(
            "[security]\n{}[[namespace]]\nname = \"test\"\n",
            ldap_section(ldap_url)
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
        "ldap.token-hash-method=sha-256".to_owned(),
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

/// An AUTHENTICATE with `token` as `user`.
fn authenticate(stream: &mut TcpStream, user: &str, token: &[u8]) -> u8 {
    let request = request(
        command::AUTHENTICATE,
        &[
            (field::USER, user.as_bytes()),
            (field::SESSION_TOKEN, token),
        ],
    );
    round_trip(stream, &request).unwrap().1[1]
}

/// Waits until both nodes, asked as admin, see a cluster of two (one
/// login each: the client's bcrypt is slow in a debug build).
fn wait_for_two(nodes: &[Node]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let admin = login("admin", "admin", false);
    let mut streams: Vec<TcpStream> = nodes
        .iter()
        .map(|node| {
            let mut stream = node.connect();
            assert_eq!(round_trip(&mut stream, &admin).unwrap().1[1], 0);
            stream
        })
        .collect();
    loop {
        let sizes: Vec<String> = streams
            .iter_mut()
            .map(|stream| common::info(stream, &["cluster-info"])[0].1.clone())
            .collect();
        if sizes.iter().all(|text| text.contains("cluster_size=2")) {
            return;
        }
        assert!(Instant::now() < deadline, "no cluster of two: {sizes:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_directory_users_token_and_role_changes_hold_on_every_node() {
    if let Some(why) = slapd::missing() {
        eprintln!("skipping: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("citrine-ldap-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let directory = Slapd::start(&dir, free_port(), &directory_entries()).unwrap();
    let base = std::fs::read_to_string(workspace_root().join("examples/cluster.toml")).unwrap();
    let config = dir.join("citrine.toml");
    let section = ldap_section(&directory.url);
    std::fs::write(&config, format!("[security]\n{section}{base}")).unwrap();
    let mut nodes: Vec<Node> = (0..2).map(|index| Node::new(0x60 + index)).collect();
    for (index, node) in nodes.iter_mut().enumerate() {
        node.config = Some(config.clone());
        let data = dir.join(format!("node{index}"));
        std::fs::create_dir_all(&data).unwrap();
        node.data_dir = Some(data);
    }
    let seed = nodes[0].heartbeat_address();
    nodes[0].start(&seed);
    nodes[1].start(&seed);
    wait_for_two(&nodes);

    // alice logs in on the first node only; its token opens the second.
    let alice = login("alice", "wonderland", true);
    let mut first = nodes[0].connect();
    let reply = round_trip(&mut first, &alice).unwrap().1;
    assert_eq!(reply[1], 0, "LDAP login");
    let token = reply_field(&reply, field::SESSION_TOKEN).expect("a session token");
    let mut second = nodes[1].connect();
    assert_eq!(authenticate(&mut second, "alice", &token), 0);
    assert_eq!(write_result(&mut second), 81, "group read only");
    // Not another user's, and not with a changed byte.
    let mut forged = token.clone();
    let last = forged.len() - 1;
    forged[last] ^= 1;
    assert_eq!(authenticate(&mut nodes[1].connect(), "alice", &forged), 65);
    assert_eq!(authenticate(&mut nodes[1].connect(), "admin", &token), 65);

    // The first node's poll finds alice in read-write: both nodes let her
    // write (the second does not poll her: she never logged in there).
    let membership = |change: &str| {
        format!(
            "dn: cn=read-write,ou=groups,{SUFFIX}\nchangetype: modify\n{change}: member\n\
             member: uid=alice,ou=users,{SUFFIX}\n"
        )
    };
    directory.modify(&membership("add")).unwrap();
    await_write_result(&mut first, 0);
    await_write_result(&mut second, 0);
    directory.modify(&membership("delete")).unwrap();
    await_write_result(&mut first, 81);
    await_write_result(&mut second, 81);

    // The official clients log in to every node: the second binds too.
    let mut own = nodes[1].connect();
    assert_eq!(round_trip(&mut own, &alice).unwrap().1[1], 0);
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One LDAP login straight through [`citrine_ldap::Directory`].
fn directory_login(config: citrine_ldap::LdapConfig) -> Result<Vec<String>, u8> {
    let directory = citrine_ldap::Directory::start(config).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    (runtime.block_on(directory.login("alice", "wonderland"))).map_err(|failure| failure.code())
}

#[test]
fn the_directory_is_spoken_to_over_starttls_verified_against_tls_ca_file() {
    if let Some(why) = slapd::missing() {
        eprintln!("skipping: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("citrine-ldap-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (tls, other) = (dir.join("tls"), dir.join("other-ca"));
    common::tls::write_certs(&tls);
    common::tls::write_certs(&other);
    let keys = (tls.join("node.pem"), tls.join("node.key"));
    let directory =
        Slapd::start_tls(&dir, free_port(), &directory_entries(), (&keys.0, &keys.1)).unwrap();

    // A node: disable-tls off, the directory's CA as tls-ca-file.
    let config = dir.join("citrine.toml");
    let section = ldap_section(&directory.url).replace(
        "disable-tls = true\n",
        &format!("tls-ca-file = \"{}\"\n", tls.join("ca.pem").display()),
    );
    std::fs::write(
        &config,
        format!("[security]\n{section}[[namespace]]\nname = \"test\"\n"),
    )
    .unwrap();
    let node = common::start(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
    ]);
    let mut alice = connect(node.port);
    let reply = round_trip(&mut alice, &login("alice", "wonderland", true))
        .unwrap()
        .1;
    assert_eq!(reply[1], 0, "LDAP login over StartTLS");
    assert_eq!(write_result(&mut alice), 81, "group read only");

    // The same settings straight to the directory; then a certificate
    // from another CA is refused (92), and plain LDAP is refused by a
    // directory that requires TLS (its bind fails: 93).
    let mut settings = citrine_ldap::LdapConfig::new(&directory.url, SUFFIX);
    settings.user_dn_pattern = Some(format!("uid=${{un}},ou=users,{SUFFIX}"));
    settings.tls_ca_file = Some(tls.join("ca.pem"));
    assert_eq!(directory_login(settings.clone()), Ok(Vec::new()));
    let mut wrong_ca = settings.clone();
    wrong_ca.tls_ca_file = Some(other.join("ca.pem"));
    assert_eq!(directory_login(wrong_ca), Err(92));
    let mut plain = settings;
    plain.disable_tls = true;
    assert_eq!(directory_login(plain), Err(93));
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}
