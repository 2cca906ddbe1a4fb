//! LDAP logins on the request path (`[security.ldap]`): a LOGIN in the
//! clients' EXTERNAL mode by a user who is not one of the node's own goes
//! to the directory ([`citrine_ldap::Directory`]) as a continuation the
//! service thread's executor awaits ([`LdapLogin`]), never blocking a
//! service thread; the directory's groups become the user's roles, and
//! every `polling-period` the roles of the users logged in here are read
//! again (a user gone from the directory loses its tokens).
//!
//! Across the cluster: an external user, its roles and the key its tokens
//! are signed with are entries of the users-and-roles store, so a token
//! one node issued authenticates on every node, and a role change one
//! node's poll finds reaches every node with the store's push. A LOGIN is
//! answered once the other members have the user.
//!
//! Invariants:
//! - the connection's login is set ([`PendingLogin`]) before the LOGIN
//!   reply leaves, so the client's next request finds it;
//! - the clear password lives only in the pending login and the
//!   directory's bind; it never reaches a log or the audit trail;
//! - a directory that cannot be reached answers the login with its
//!   reference code (91 to 94) and a warning saying why; internal users
//!   log in as before.

use super::{entropy, store, Guard, Login};
use crate::{Continuation, Pending, Service};
use citrine_ldap::{Directory, Failure, LdapConfig, Roles};
use citrine_security::{admin, TokenHash};
use citrine_wire::admin::{field, write_reply, AdminReply};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;

/// The user an LDAP login of a connection logged in as, once the
/// directory said yes (shared by the connection's [`Login`] and the
/// login's continuation).
#[derive(Clone, Debug, Default)]
pub struct PendingLogin(Option<Arc<Mutex<Option<String>>>>);

impl PartialEq for PendingLogin {
    fn eq(&self, other: &PendingLogin) -> bool {
        match (&self.0, &other.0) {
            (Some(one), Some(other)) => Arc::ptr_eq(one, other),
            (None, None) => true,
            _ => false,
        }
    }
}

impl Eq for PendingLogin {}

impl Login {
    /// Takes the user of a finished LDAP login, if one finished.
    pub(super) fn settle(&mut self) {
        let Some(slot) = self.pending.0.take() else {
            return;
        };
        let user = slot.lock().take();
        match user {
            Some(user) => self.user = Some(user),
            // Still waiting for the directory (a refused login's slot,
            // which nothing else holds, is dropped).
            None if Arc::strong_count(&slot) > 1 => self.pending.0 = Some(slot),
            None => {}
        }
    }
}

/// An LDAP login waiting for the directory.
pub(crate) struct LdapLogin {
    /// The LOGIN request, for the audit trail.
    body: Vec<u8>,
    user: String,
    password: String,
    client: Option<SocketAddr>,
    slot: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for LdapLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LdapLogin")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// Turns LDAP logins on (once, after [`Service::enable_security`]):
    /// starts the login threads and the polling.
    pub fn enable_ldap(self: &Arc<Service>, config: LdapConfig) -> Result<(), String> {
        let guard = self.security.get().ok_or("LDAP needs [security]")?;
        let hash = TokenHash::from_name(&config.token_hash_method)
            .ok_or_else(|| format!("token-hash-method {:?}", config.token_hash_method))?;
        let directory = Directory::start(config)?;
        {
            let mut entries = guard.entries.lock();
            guard.with(|security| {
                security.enable_ldap_tokens(entropy().token, hash);
                store::add_initial(&mut entries, security);
            });
        }
        let users = Arc::downgrade(self);
        let apply = Arc::downgrade(self);
        directory.poll(
            move || {
                let service = users.upgrade()?;
                let now_ms = service.now().unix_ms;
                let guard = service.security.get()?;
                Some(service.change_security(guard, |s| s.external_users(now_ms)))
            },
            move |user, roles| {
                let Some(service) = apply.upgrade() else {
                    return;
                };
                if let Some(guard) = service.security.get() {
                    service.change_security(guard, |s| apply_poll(s, user, roles));
                }
            },
        );
        guard
            .ldap
            .set(directory)
            .map_err(|_| "LDAP is already on".to_owned())
    }

    /// The continuation that logs the admin request `body` in through the
    /// directory, when it is an EXTERNAL-mode LOGIN by a stranger and
    /// LDAP is on.
    pub(super) fn ldap_login(
        &self,
        guard: &Guard,
        body: &[u8],
        login: &mut Login,
        client: Option<SocketAddr>,
    ) -> Option<Continuation> {
        guard.ldap.get()?;
        let (user, password) = guard.with(|security| {
            admin::external_login(security, body)
                .map(|(user, password)| (user.to_owned(), password.to_owned()))
        })?;
        let slot = Arc::new(Mutex::new(None));
        login.pending = PendingLogin(Some(slot.clone()));
        let pending = LdapLogin {
            body: body.to_vec(),
            user,
            password,
            client,
            slot,
        };
        Some(Continuation(Pending::LdapLogin(Box::new(pending))))
    }

    /// Asks the directory, then answers the LOGIN into `out`: a session
    /// token and the LDAP session-ttl, or the failure's code.
    pub(crate) async fn complete_ldap_login(&self, login: LdapLogin, out: &mut Vec<u8>) {
        let Some((guard, directory)) = self
            .security
            .get()
            .and_then(|guard| Some((guard, guard.ldap.get()?)))
        else {
            return write_reply(out, citrine_types::ResultCode::InvalidUser.code());
        };
        let answer = directory.login(&login.user, &login.password).await;
        let now_ms = self.now().unix_ms;
        let from = login.client.map(|client| client.ip());
        let ttl = directory.config().session_ttl_s;
        let opened = answer
            .map_err(|failure| refused(&login, &failure))
            .and_then(|roles| {
                self.change_security(guard, |security| {
                    security.login_external(&login.user, &roles, (from, now_ms), ttl)
                })
                .map_err(|code| code.code())
            });
        // The other members get the user before the client its token.
        if opened.is_ok() && self.routes() && !self.dist.peers().0.is_empty() {
            self.sync_stores(&[crate::smd::Store::Security]).await;
        }
        let result = match opened {
            Ok((token, ttl)) => {
                *login.slot.lock() = Some(login.user.clone());
                let mut reply = AdminReply::begin(out);
                reply
                    .record(0)
                    .field(field::SESSION_TOKEN, &token)
                    .field_u32(field::SESSION_TTL, ttl);
                reply.finish();
                0
            }
            Err(code) => {
                write_reply(out, code);
                code
            }
        };
        self.audit_admin(guard, &login.body, (None, None), result, login.client);
    }
}

/// The `ldap.*` pairs of `get-config:context=security` when LDAP is on
/// (the reference's names; the query user's password is never listed).
pub(crate) fn config_pairs(guard: &Guard) -> Vec<(String, String)> {
    let Some(directory) = guard.ldap.get() else {
        return Vec::new();
    };
    let config = directory.config();
    let text = |value: &Option<String>| value.clone().unwrap_or_default();
    let pairs = [
        ("disable-tls", config.disable_tls.to_string()),
        ("login-threads", config.login_threads.to_string()),
        ("polling-period", config.polling_period_s.to_string()),
        ("query-base-dn", config.query_base_dn.clone()),
        ("query-user-dn", text(&config.query_user_dn)),
        ("role-query-base-dn", text(&config.role_query_base_dn)),
        ("role-query-pattern", config.role_query_patterns.join(",")),
        (
            "role-query-search-ou",
            config.role_query_search_ou.to_string(),
        ),
        ("server", config.server.clone()),
        ("session-ttl", config.session_ttl_s.to_string()),
        (
            "tls-ca-file",
            (config.tls_ca_file.as_ref())
                .map(|path| path.display().to_string())
                .unwrap_or_default(),
        ),
        ("token-hash-method", config.token_hash_method.clone()),
        ("user-dn-pattern", text(&config.user_dn_pattern)),
        ("user-query-pattern", text(&config.user_query_pattern)),
    ];
    pairs
        .into_iter()
        .map(|(name, value)| (format!("ldap.{name}"), value))
        .collect()
}

/// The code a failed LDAP login answers; a directory problem (not a
/// refused password, which the audit path counts) is logged.
fn refused(login: &LdapLogin, failure: &Failure) -> u8 {
    if !matches!(failure, Failure::Credential | Failure::NoUser) {
        tracing::warn!(
            "LDAP login of user {:?} failed ({}): {failure}",
            login.user,
            failure.code()
        );
    }
    failure.code()
}

impl Service {
    /// Runs `f` on the state and commits what it changed, under the
    /// entries' lock (as an admin command is).
    fn change_security<T>(
        &self,
        guard: &Guard,
        f: impl FnOnce(&mut citrine_security::Security) -> T,
    ) -> T {
        let mut entries = guard.entries.lock();
        let result = guard.with(f);
        self.commit_security(guard, &mut entries);
        result
    }
}

/// Applies one poll's answer about `user`.
fn apply_poll(
    security: &mut citrine_security::Security,
    user: &str,
    roles: Result<Roles, Failure>,
) {
    match roles {
        Ok(roles) => security.set_external_roles(user, Some(&roles)),
        Err(Failure::NoUser) => {
            tracing::info!("LDAP user {user:?} is gone from the directory: its tokens end");
            security.set_external_roles(user, None);
        }
        Err(failure) => {
            tracing::warn!("cannot read the LDAP roles of {user:?}, keeping them: {failure}")
        }
    }
}
