//! The per-entry merge of the users-and-roles store, node by node without
//! a cluster: concurrent changes to different entries both survive, one
//! entry converges to the same winner everywhere, drops stay dropped.

#![allow(clippy::unwrap_used)]

use super::*;
use citrine_security::{password, SecurityConfig};

/// One member's state and entries, as the store keeps them.
struct Member {
    security: Security,
    entries: Entries,
    node: NodeId,
}

impl Member {
    fn new(node: u64) -> Member {
        let config = SecurityConfig {
            stored_cost: 4,
            ..SecurityConfig::default()
        };
        let security = Security::new(config, [node as u8; 16]);
        let entries = initial(&security);
        Member {
            security,
            entries,
            node: NodeId(node),
        }
    }

    /// A change made here at `now_ms`, committed as the admin path does.
    fn change(&mut self, now_ms: u64, f: impl FnOnce(&mut Security)) {
        f(&mut self.security);
        let current = lines_of(&self.security);
        assert!(stamp_changes(&mut self.entries, current, now_ms, self.node));
    }

    /// A peer's push taken as `Service::merge_security` takes it.
    fn merge(&mut self, peer: &Member) {
        if merge_into(&mut self.entries, parse(&text(&peer.entries), "test")) {
            self.security.replace(live(&self.entries).unwrap());
        }
    }

    fn users(&self) -> Vec<String> {
        self.security.users().keys().cloned().collect()
    }
}

fn create(security: &mut Security, name: &str, role: &str) {
    let credential = password::client_hash("pw").unwrap();
    security
        .create_user(name, credential.as_bytes(), &[role.to_owned()], [7; 16])
        .unwrap();
}

fn roles_of(member: &Member, user: &str) -> Vec<String> {
    member.security.users()[user]
        .roles
        .iter()
        .cloned()
        .collect()
}

/// Both members push to each other, in both orders of arrival.
fn exchange(a: &mut Member, b: &mut Member) {
    b.merge(a);
    a.merge(b);
    assert_eq!(text(&a.entries), text(&b.entries), "not converged");
}

#[test]
fn users_created_on_two_nodes_at_once_both_survive() {
    let (mut a, mut b) = (Member::new(1), Member::new(2));
    // The same millisecond on both: the old whole-store version kept one.
    a.change(1_000, |security| create(security, "alice", "read"));
    b.change(1_000, |security| create(security, "bob", "read-write"));
    exchange(&mut a, &mut b);
    assert_eq!(a.users(), ["admin", "alice", "bob"]);
    assert_eq!(b.users(), ["admin", "alice", "bob"]);
    assert_eq!(roles_of(&a, "bob"), ["read-write"]);
}

#[test]
fn one_entry_changed_on_two_nodes_ends_the_same_everywhere() {
    for (a_ms, b_ms, winner) in [(1_000, 1_000, "write"), (1_001, 1_000, "read")] {
        let (mut a, mut b) = (Member::new(1), Member::new(2));
        a.change(a_ms, |security| {
            security.grant_roles("admin", &["read".into()]).unwrap();
        });
        b.change(b_ms, |security| {
            security.grant_roles("admin", &["write".into()]).unwrap();
        });
        exchange(&mut a, &mut b);
        // The later change wins; in one millisecond the higher node id.
        for member in [&a, &b] {
            let roles = roles_of(member, "admin");
            assert!(roles.contains(&winner.to_owned()), "{roles:?}");
            assert_eq!(roles.len(), 3, "{roles:?}");
        }
    }
}

#[test]
fn a_drop_is_not_undone_by_an_older_copy_and_other_changes_stay() {
    let (mut a, mut b) = (Member::new(1), Member::new(2));
    a.change(1_000, |security| create(security, "carol", "read"));
    exchange(&mut a, &mut b);
    // A drops carol while B creates dave and grants carol nothing new.
    a.change(2_000, |security| security.drop_user("carol").unwrap());
    b.change(2_000, |security| create(security, "dave", "read"));
    exchange(&mut a, &mut b);
    assert_eq!(a.users(), ["admin", "dave"]);
    assert_eq!(b.users(), ["admin", "dave"]);
    // A member that missed everything takes the tombstone, not carol.
    let mut late = Member::new(3);
    late.change(1_500, |security| create(security, "carol", "write"));
    late.merge(&a);
    assert_eq!(late.users(), ["admin", "dave"]);
}

#[test]
fn the_earlier_whole_store_text_is_read_with_its_version() {
    let mut a = Member::new(1);
    a.change(5_000, |security| create(security, "erin", "read"));
    let body = snapshot::to_text(&a.security);
    let old = format!("version=5000.1\n{body}");
    let parsed = parse(&old, "test");
    assert_eq!(parsed.len(), 2);
    let version = Version { ms: 5_000, node: 1 };
    assert!(parsed.iter().all(|(_, stamped)| stamped.version == version));
    assert!(parsed.iter().all(|(_, stamped)| stamped.line.is_some()));
    // A line that does not parse is skipped, the others are taken.
    let mixed = format!(
        "{}nonsense\nuser:!!;password=x;roles=;version=1.1\n",
        text(&a.entries)
    );
    assert_eq!(parse(&mixed, "test").len(), 2);
}

/// Member `node` with LDAP on and a token key of its own (`[node; 32]`),
/// unused, as a node starts.
fn ldap_member(node: u8) -> Member {
    let mut member = Member::new(u64::from(node));
    let hash = citrine_security::TokenHash::Sha256;
    member.security.enable_ldap_tokens([node; 32], hash);
    add_initial(&mut member.entries, &member.security);
    member
}

/// LDAP user erin logs in on `member` at 1 000 ms: the token.
fn erin_logs_in(member: &mut Member) -> Vec<u8> {
    let mut token = Vec::new();
    member.change(1_000, |security| {
        let read = ["read".to_owned()];
        token = security
            .login_external("erin", &read, (None, 1_000), 120)
            .unwrap()
            .0;
    });
    token
}

/// A node that signed a token with its key before it heard from the
/// others (the first LDAP login on a new cluster): its key wins over the
/// unused ones, whatever their bytes, so the token holds everywhere.
#[test]
fn a_key_that_signed_a_token_wins_over_unused_ones() {
    let (mut a, mut b) = (ldap_member(1), ldap_member(2));
    let token = erin_logs_in(&mut a);
    exchange(&mut a, &mut b);
    assert_eq!(a.security.token_secret(), Some(&[1; 32]));
    assert_eq!(b.security.token_secret(), Some(&[1; 32]));
    for member in [&a, &b] {
        let holder = member
            .security
            .authenticate(Some("erin"), &token, None, 2_000);
        assert_eq!(holder, Ok("erin".to_owned()));
    }
    // A blank node joining later does not replace the used key.
    let mut c = ldap_member(3);
    exchange(&mut c, &mut b);
    assert_eq!(c.security.token_secret(), Some(&[1; 32]));
    assert_eq!(b.security.token_secret(), Some(&[1; 32]));
}

#[test]
fn two_nodes_own_token_keys_end_as_one_and_ldap_users_travel() {
    let (mut a, mut b) = (ldap_member(1), ldap_member(2));
    exchange(&mut a, &mut b);
    assert_eq!(a.security.token_secret(), Some(&[2; 32]));
    assert_eq!(b.security.token_secret(), Some(&[2; 32]));
    // A login on one node: its token and roles hold on the other.
    let token = erin_logs_in(&mut a);
    b.merge(&a);
    assert_eq!(
        b.security.authenticate(Some("erin"), &token, None, 2_000),
        Ok("erin".to_owned())
    );
    // Expired everywhere: the node that prunes it drops it for all.
    b.change(200_000, |security| {
        security.external_users(200_000);
    });
    a.merge(&b);
    assert!(a.security.external().is_empty());
}
