//! The directory operations against a real slapd (started by the test on
//! a loopback port with a throwaway configuration): a login binds as the
//! user and reads its groups as roles, a wrong or empty password is
//! refused, a user query finds the DN, a group change shows in the next
//! role query, polling hands the roles over, and a directory that is
//! down is a setup failure. Skipped, saying why, without slapd.

#![allow(clippy::unwrap_used)]

use citrine_ldap::{Directory, Failure, LdapConfig};
use citrine_testsupport::slapd::{self, Slapd, ROOT_DN, ROOT_PASSWORD, SUFFIX};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn people() -> String {
    let mut ldif = String::new();
    for (user, password) in [("alice", "wonderland"), ("bob", "builder")] {
        ldif += &format!(
            "dn: uid={user},ou=users,{SUFFIX}\nobjectClass: inetOrgPerson\nuid: {user}\n\
             cn: {user}\nsn: {user}\nuserPassword: {password}\n\n"
        );
    }
    ldif += &format!(
        "dn: cn=read-write,ou=groups,{SUFFIX}\nobjectClass: groupOfNames\ncn: read-write\n\
         member: uid=alice,ou=users,{SUFFIX}\n\n\
         dn: cn=sys-admin,ou=groups,{SUFFIX}\nobjectClass: groupOfNames\ncn: sys-admin\n\
         member: uid=bob,ou=users,{SUFFIX}\n"
    );
    ldif
}

fn config(url: &str) -> LdapConfig {
    let mut config = LdapConfig::new(url, SUFFIX);
    config.disable_tls = true;
    config.user_dn_pattern = Some(format!("uid=${{un}},ou=users,{SUFFIX}"));
    config.role_query_base_dn = Some(format!("ou=groups,{SUFFIX}"));
    config.role_query_patterns = vec!["(&(objectClass=groupOfNames)(member=${dn}))".into()];
    config.login_threads = 2;
    config
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

fn started(name: &str) -> Option<(Slapd, std::path::PathBuf)> {
    if let Some(why) = slapd::missing() {
        eprintln!("skipping: {why}");
        return None;
    }
    let dir = std::env::temp_dir().join(format!("citrine-ldap-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let port = citrine_testsupport::free_port();
    Some((Slapd::start(&dir, port, &people()).unwrap(), dir))
}

#[test]
fn logins_bind_as_the_user_and_read_its_groups() {
    let Some((server, dir)) = started("login") else {
        return;
    };
    let directory = Directory::start(config(&server.url)).unwrap();
    let roles = block_on(directory.login("alice", "wonderland")).unwrap();
    assert_eq!(roles, vec!["read-write".to_owned()]);
    assert_eq!(
        block_on(directory.login("alice", "wrong")),
        Err(Failure::Credential)
    );
    assert_eq!(
        block_on(directory.login("alice", "")),
        Err(Failure::Credential)
    );
    assert_eq!(
        block_on(directory.login("nobody", "x")),
        Err(Failure::Credential)
    );
    // A name that would widen the filter is escaped.
    assert_eq!(
        block_on(directory.login("*", "x")),
        Err(Failure::Credential)
    );

    // Found by a user query, bound as the query user; search-ou adds `users`.
    let mut by_query = config(&server.url);
    by_query.user_dn_pattern = None;
    by_query.user_query_pattern = Some("(&(objectClass=inetOrgPerson)(uid=${un}))".into());
    by_query.query_user_dn = Some(ROOT_DN.into());
    by_query.query_user_password = Some(ROOT_PASSWORD.into());
    by_query.role_query_search_ou = true;
    let queried = Directory::start(by_query).unwrap();
    assert_eq!(
        block_on(queried.login("bob", "builder")).unwrap(),
        vec!["sys-admin".to_owned(), "users".to_owned()]
    );
    assert_eq!(block_on(queried.login("nobody", "x")), Err(Failure::NoUser));
    assert_eq!(block_on(queried.roles("nobody")), Err(Failure::NoUser));

    // A group change shows in the next role query, and polling hands it on.
    server
        .modify(&format!(
            "dn: cn=sys-admin,ou=groups,{SUFFIX}\nchangetype: modify\nadd: member\n\
             member: uid=alice,ou=users,{SUFFIX}\n"
        ))
        .unwrap();
    assert_eq!(
        block_on(directory.roles("alice")).unwrap(),
        vec!["read-write".to_owned(), "sys-admin".to_owned()]
    );
    let mut polled = config(&server.url);
    polled.polling_period_s = 1;
    let polled = Directory::start(polled).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    polled.poll(
        || Some(vec!["alice".to_owned()]),
        move |user, roles| kept.lock().unwrap().push((user.to_owned(), roles)),
    );
    std::thread::sleep(Duration::from_millis(1_500));
    let first = seen.lock().unwrap().first().cloned();
    assert_eq!(
        first,
        Some((
            "alice".to_owned(),
            Ok(vec!["read-write".to_owned(), "sys-admin".to_owned()])
        ))
    );

    // Down: a setup failure (91), quickly.
    drop(server);
    let began = std::time::Instant::now();
    let down = block_on(directory.login("alice", "wonderland"));
    assert!(matches!(down, Err(Failure::Setup(_))), "{down:?}");
    assert_eq!(down.unwrap_err().code(), 91);
    assert!(began.elapsed() < Duration::from_secs(6));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn settings_that_cannot_work_are_refused() {
    let mut bad = LdapConfig::new("http://x", SUFFIX);
    bad.user_dn_pattern = Some("uid=${un}".into());
    assert!(Directory::start(bad).unwrap_err().contains("ldap://"));
    let none = LdapConfig::new("ldap://127.0.0.1:1", SUFFIX);
    assert!(Directory::start(none)
        .unwrap_err()
        .contains("user-dn-pattern"));
    let mut query = LdapConfig::new("ldap://127.0.0.1:1", SUFFIX);
    query.user_query_pattern = Some("(uid=${un})".into());
    assert!(Directory::start(query)
        .unwrap_err()
        .contains("query-user-dn"));
}

#[test]
fn at_most_login_threads_logins_talk_to_the_directory_at_once() {
    // A directory that accepts connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("ldap://{}", listener.local_addr().unwrap());
    listener.set_nonblocking(true).unwrap();
    let mut one = config(&url);
    one.login_threads = 1;
    let directory = Directory::start(one).unwrap();
    let waiting: Vec<_> = (0..3)
        .map(|_| directory.login("alice", "wonderland"))
        .collect();
    let mut held = Vec::new();
    let until = std::time::Instant::now() + Duration::from_millis(800);
    while std::time::Instant::now() < until {
        if let Ok((socket, _)) = listener.accept() {
            held.push(socket);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(held.len(), 1, "connections while one login waits");
    drop(waiting);
    drop(directory);
}
