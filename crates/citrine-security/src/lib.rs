//! Access control of a Citrine node: the users and roles (built-in and
//! user-defined), their privileges and scopes, per-role allow-lists and
//! quotas, login sessions, and the permission check every request passes
//! ([`Security::may`]). Pure: no I/O, no clock, no randomness — the caller
//! passes the time (`now_ms`) and the random bytes (salts, tokens).
//!
//! The admin protocol (proto type 2) on top of this is [`admin`].
//!
//! Invariants:
//! - built-in roles (one per [`PrivilegeCode`], global scope) always exist
//!   and cannot be created, dropped or changed;
//! - dropping a role revokes it from every user; a user may still hold a
//!   role that does not exist only after a merge of concurrent changes
//!   ([`Security::replace`]), and such a role grants nothing;
//! - passwords are kept only as a bcrypt hash of the client's credential;
//! - a session is valid for `session_ttl` seconds from its login and only
//!   while its user exists; dropping a user or setting its password ends
//!   its sessions;
//! - an external (LDAP) user exists while a token issued to it may still
//!   be valid: its roles are the directory's group names, as of its last
//!   login or poll on any node ([`Security::set_external_roles`]), shared
//!   with the users and roles; it has no password here. Its tokens are
//!   signed ([`token`]) with the cluster's shared key, so every node
//!   accepts them; one is valid only while its user is external (creating
//!   an internal user of its name, or the directory dropping it, ends it).

pub mod admin;
pub mod allow;
pub mod password;
pub mod privilege;
mod quota;
pub mod token;

pub use privilege::{Action, Privilege, PrivilegeCode, QuotaKind};
pub use token::TokenHash;

use citrine_types::ResultCode;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

/// The user a node starts with, password `admin`, roles `user-admin` and
/// `read-write`. The reference gives it `user-admin` alone (its operators
/// create a data user first); Citrine's issue 41 asks that the first user
/// can also write and read, so a newcomer can try a secured node at once.
/// Revoking `read-write` from it gives the reference's setup.
pub const DEFAULT_USER: &str = "admin";
/// Longest user or role name.
pub const NAME_MAX: usize = 63;

/// How long a connection may stay open without logging in, by default:
/// every official client authenticates a new connection before its first
/// request, within its login timeout (`loginTimeout`, 5000 ms by default in the
/// C# client's documentation).
pub const LOGIN_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// Settings of the `security` context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecurityConfig {
    /// Seconds a login's token stays valid (`session-ttl`).
    pub session_ttl_s: u32,
    /// Whether roles' read/write quotas are enforced (`enable-quotas`).
    pub enable_quotas: bool,
    /// bcrypt cost of stored hashes (tests lower it).
    pub stored_cost: u32,
    /// Most sessions kept at once: past it a login ends the session
    /// closest to expiry (a client logs in again when told so).
    pub max_sessions: usize,
    /// Milliseconds a client connection may stay open without logging in
    /// (`login-timeout-ms`, Citrine's own: the reference has no such
    /// bound); past it the node closes the connection.
    pub login_timeout_ms: u64,
}

impl Default for SecurityConfig {
    fn default() -> SecurityConfig {
        SecurityConfig {
            session_ttl_s: 86_400,
            enable_quotas: false,
            stored_cost: password::STORED_COST,
            max_sessions: 100_000,
            login_timeout_ms: LOGIN_TIMEOUT_MS_DEFAULT,
        }
    }
}

/// A user: the stored hash of its credential and its roles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub password: String,
    pub roles: BTreeSet<String>,
}

/// A user-defined role.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Role {
    pub privileges: BTreeSet<Privilege>,
    pub whitelist: Vec<String>,
    pub read_quota: u32,
    pub write_quota: u32,
}

/// An external (LDAP) user: the directory's roles for it and when the
/// last token issued to it expires.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct External {
    pub roles: BTreeSet<String>,
    pub until_ms: u64,
}

/// A login: whose it is and until when it is valid.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Session {
    user: String,
    expires_ms: u64,
}

/// Random bytes the caller draws for one change: a salt for a stored hash
/// and a session token.
#[derive(Clone, Copy, Debug)]
pub struct Entropy {
    pub salt: [u8; 16],
    pub token: [u8; 32],
}

/// A node's access-control state.
#[derive(Clone, Debug)]
pub struct Security {
    pub config: SecurityConfig,
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
    /// External (LDAP) users of the cluster (shared).
    external: BTreeMap<String, External>,
    /// The external users that logged in on this node (it polls them).
    logged_in_here: BTreeSet<String>,
    /// The key external users' tokens are signed with (shared).
    token_secret: Option<[u8; 32]>,
    /// Whether a token was ever signed with `token_secret` (on any node):
    /// a used key wins the cluster's agreement over any unused one.
    token_used: bool,
    /// The hash this node signs them with (`token-hash-method`), once
    /// LDAP is on here: only then are they issued or accepted.
    token_hash: Option<TokenHash>,
    sessions: HashMap<Vec<u8>, Session>,
    usage: quota::Usage,
}

impl Security {
    /// A node's first state: only [`DEFAULT_USER`] (password `admin`).
    pub fn new(config: SecurityConfig, salt: [u8; 16]) -> Security {
        let mut security = Security {
            config,
            users: BTreeMap::new(),
            roles: BTreeMap::new(),
            external: BTreeMap::new(),
            logged_in_here: BTreeSet::new(),
            token_secret: None,
            token_used: false,
            token_hash: None,
            sessions: HashMap::new(),
            usage: quota::Usage::default(),
        };
        let credential = password::client_hash("admin").unwrap_or_default();
        let stored =
            password::stored_hash(credential.as_bytes(), salt, security.config.stored_cost)
                .unwrap_or_default();
        let roles = BTreeSet::from([
            PrivilegeCode::UserAdmin.name().to_string(),
            PrivilegeCode::ReadWrite.name().to_string(),
        ]);
        security.users.insert(
            DEFAULT_USER.into(),
            User {
                password: stored,
                roles,
            },
        );
        security
    }

    /// The users, by name.
    pub fn users(&self) -> &BTreeMap<String, User> {
        &self.users
    }

    /// The user-defined roles, by name.
    pub fn roles(&self) -> &BTreeMap<String, Role> {
        &self.roles
    }

    /// Whether `name` is a role (built-in or user-defined).
    pub fn role_exists(&self, name: &str) -> bool {
        PrivilegeCode::from_name(name).is_some() || self.roles.contains_key(name)
    }

    /// The privileges of role `name` (a built-in one's is its code, global).
    pub fn role_privileges(&self, name: &str) -> Vec<Privilege> {
        match PrivilegeCode::from_name(name) {
            Some(code) => vec![Privilege::global(code)],
            None => self
                .roles
                .get(name)
                .map(|role| role.privileges.iter().cloned().collect())
                .unwrap_or_default(),
        }
    }

    /// Checks `credential` for `user` from `from` and opens a session;
    /// returns its token and TTL in seconds.
    pub fn login(
        &mut self,
        user: &str,
        credential: &[u8],
        from: Option<IpAddr>,
        now_ms: u64,
        token: [u8; 32],
    ) -> Result<(Vec<u8>, u32), ResultCode> {
        let stored = self.users.get(user).ok_or(ResultCode::InvalidUser)?;
        if !password::verify(credential, &stored.password) {
            return Err(ResultCode::InvalidCredential);
        }
        self.login_certified(user, from, now_ms, token)
    }

    /// Opens a session for `user` from `from` without a password: its
    /// identity was proven otherwise (a client certificate naming it,
    /// verified by the TLS handshake). 60 if there is no such user.
    pub fn login_certified(
        &mut self,
        user: &str,
        from: Option<IpAddr>,
        now_ms: u64,
        token: [u8; 32],
    ) -> Result<(Vec<u8>, u32), ResultCode> {
        if !self.users.contains_key(user) {
            return Err(ResultCode::InvalidUser);
        }
        let ttl = self.config.session_ttl_s;
        self.open_session(user, (from, now_ms), ttl, token)
    }

    /// Issues a token to the external user `user`, whose password the
    /// directory accepted and whose groups are `roles`, valid `ttl`
    /// seconds (the `security.ldap` session-ttl). 60 if an internal user
    /// has the name (it logs in with its own password) or LDAP is off.
    pub fn login_external(
        &mut self,
        user: &str,
        roles: &[String],
        (from, now_ms): (Option<IpAddr>, u64),
        ttl: u32,
    ) -> Result<(Vec<u8>, u32), ResultCode> {
        let (Some(secret), Some(hash)) = (self.token_secret, self.token_hash) else {
            return Err(ResultCode::InvalidUser);
        };
        if self.users.contains_key(user) {
            return Err(ResultCode::InvalidUser);
        }
        let roles: BTreeSet<String> = roles.iter().cloned().collect();
        self.check_roles_allow(roles.iter(), from)?;
        let expires_ms = now_ms.saturating_add(u64::from(ttl) * 1000);
        let token = token::sign(&secret, hash, user, expires_ms);
        self.token_used = true;
        let entry = self.external.entry(user.to_owned()).or_default();
        entry.roles = roles;
        entry.until_ms = entry.until_ms.max(expires_ms);
        self.logged_in_here.insert(user.to_owned());
        Ok((token, ttl))
    }

    /// Issues and accepts external users' tokens from now on, signed with
    /// `hash` and the cluster's key: `secret` until another node's wins,
    /// unless the node has the key already.
    pub fn enable_ldap_tokens(&mut self, secret: [u8; 32], hash: TokenHash) {
        self.token_secret.get_or_insert(secret);
        self.token_hash = Some(hash);
    }

    /// The key external users' tokens are signed with.
    pub fn token_secret(&self) -> Option<&[u8; 32]> {
        self.token_secret.as_ref()
    }

    /// Whether a token was ever signed with [`Security::token_secret`].
    pub fn token_used(&self) -> bool {
        self.token_used
    }

    /// The external users of the cluster.
    pub fn external(&self) -> &BTreeMap<String, External> {
        &self.external
    }

    /// Forgets the external users whose tokens have all expired at
    /// `now_ms`; returns those that logged in here and remain (the ones
    /// this node re-reads from the directory).
    pub fn external_users(&mut self, now_ms: u64) -> Vec<String> {
        self.external
            .retain(|_, external| external.until_ms > now_ms);
        let external = &self.external;
        self.logged_in_here
            .retain(|user| external.contains_key(user));
        self.logged_in_here.iter().cloned().collect()
    }

    /// What the directory now says about external user `user`: its roles,
    /// or (`None`) that it is gone, which ends its tokens.
    pub fn set_external_roles(&mut self, user: &str, roles: Option<&[String]>) {
        match roles {
            Some(roles) => {
                if let Some(held) = self.external.get_mut(user) {
                    held.roles = roles.iter().cloned().collect();
                }
            }
            None => {
                self.external.remove(user);
                self.logged_in_here.remove(user);
            }
        }
    }

    /// Whether `user` is known here: an internal user or a logged-in
    /// external one.
    fn known(&self, user: &str) -> bool {
        self.users.contains_key(user) || self.external.contains_key(user)
    }

    fn open_session(
        &mut self,
        user: &str,
        (from, now_ms): (Option<IpAddr>, u64),
        ttl: u32,
        token: [u8; 32],
    ) -> Result<(Vec<u8>, u32), ResultCode> {
        self.check_allowed(user, from)?;
        self.make_room_for_a_session(now_ms);
        let session = Session {
            user: user.to_string(),
            expires_ms: now_ms.saturating_add(u64::from(ttl) * 1000),
        };
        self.sessions.insert(token.to_vec(), session);
        Ok((token.to_vec(), ttl))
    }

    /// Drops expired sessions, then, while at the limit, the one closest
    /// to expiry.
    fn make_room_for_a_session(&mut self, now_ms: u64) {
        self.sessions
            .retain(|_, session| session.expires_ms > now_ms);
        while self.sessions.len() >= self.config.max_sessions.max(1) {
            let oldest = self
                .sessions
                .iter()
                .min_by_key(|(_, session)| session.expires_ms)
                .map(|(token, _)| token.clone());
            match oldest {
                Some(token) => self.sessions.remove(&token),
                None => break,
            };
        }
    }

    /// The user a session `token` belongs to, if it is valid now for `user`
    /// (when named) connecting from `from`.
    pub fn authenticate(
        &self,
        user: Option<&str>,
        token: &[u8],
        from: Option<IpAddr>,
        now_ms: u64,
    ) -> Result<String, ResultCode> {
        let Some(session) = self.sessions.get(token) else {
            return self.authenticate_external(user, token, from, now_ms);
        };
        check_holder(user, &session.user, session.expires_ms, now_ms)?;
        if !self.known(&session.user) {
            return Err(ResultCode::InvalidUser);
        }
        self.check_allowed(&session.user, from)?;
        Ok(session.user.clone())
    }

    /// The external user a signed `token` names, if it is valid now for
    /// `user` (when named) connecting from `from`.
    fn authenticate_external(
        &self,
        user: Option<&str>,
        token: &[u8],
        from: Option<IpAddr>,
        now_ms: u64,
    ) -> Result<String, ResultCode> {
        let secret = (self.token_secret.as_ref())
            .filter(|_| self.token_hash.is_some())
            .ok_or(ResultCode::InvalidCredential)?;
        let (holder, expires_ms) =
            token::open(secret, token).ok_or(ResultCode::InvalidCredential)?;
        check_holder(user, &holder, expires_ms, now_ms)?;
        // Ended: the directory dropped the user, or it is internal now.
        if self.users.contains_key(&holder) || !self.external.contains_key(&holder) {
            return Err(ResultCode::InvalidCredential);
        }
        self.check_allowed(&holder, from)?;
        Ok(holder)
    }

    /// 82 unless `from` is allowed for `user` by its roles' allow-lists.
    pub fn check_allowed(&self, user: &str, from: Option<IpAddr>) -> Result<(), ResultCode> {
        self.check_roles_allow(self.user_roles(user), from)
    }

    /// 82 unless `from` is allowed by the allow-lists of `roles`.
    fn check_roles_allow<'r>(
        &self,
        roles: impl Iterator<Item = &'r String>,
        from: Option<IpAddr>,
    ) -> Result<(), ResultCode> {
        let lists: Vec<&Role> = roles.filter_map(|role| self.roles.get(role)).collect();
        let restricted = lists.iter().any(|role| !role.whitelist.is_empty());
        let Some(from) = from.filter(|_| restricted) else {
            return Ok(());
        };
        if lists
            .iter()
            .any(|role| allow::allowed(&role.whitelist, from))
        {
            Ok(())
        } else {
            Err(ResultCode::NotWhitelisted)
        }
    }

    fn user_roles<'s>(&'s self, user: &str) -> impl Iterator<Item = &'s String> + 's {
        self.users
            .get(user)
            .map(|user| &user.roles)
            .or_else(|| self.external.get(user).map(|external| &external.roles))
            .into_iter()
            .flat_map(|roles| roles.iter())
    }

    /// Whether `user` may do `action` on namespace `ns` / set `set`: 81 if no
    /// privilege of its roles covers it, 80 if the user no longer exists.
    pub fn may(
        &self,
        user: &str,
        action: Action,
        ns: Option<&str>,
        set: Option<&str>,
    ) -> Result<(), ResultCode> {
        if !self.known(user) {
            return Err(ResultCode::NotAuthenticated);
        }
        let covered = self.user_roles(user).any(|role| {
            self.role_privileges(role)
                .iter()
                .any(|privilege| privilege.covers(action, ns, set))
        });
        if covered {
            Ok(())
        } else {
            Err(ResultCode::RoleViolation)
        }
    }

    /// [`Security::may`], then counts the request against `user`'s quota
    /// for `action` (83 once the second's allowance is used).
    pub fn admit(
        &mut self,
        user: &str,
        action: Action,
        (ns, set): (Option<&str>, Option<&str>),
        now_ms: u64,
    ) -> Result<(), ResultCode> {
        self.may(user, action, ns, set)?;
        let Some(kind) = action.quota().filter(|_| self.config.enable_quotas) else {
            return Ok(());
        };
        let limit = self.quota_of(user, kind);
        self.usage.charge(user, kind, limit, now_ms)
    }

    /// The largest non-zero quota of `kind` among `user`'s roles (0: none).
    pub fn quota_of(&self, user: &str, kind: QuotaKind) -> u32 {
        self.user_roles(user)
            .filter_map(|role| self.roles.get(role))
            .map(|role| match kind {
                QuotaKind::Read => role.read_quota,
                QuotaKind::Write => role.write_quota,
            })
            .max()
            .unwrap_or(0)
    }
}

mod manage;
pub mod snapshot;
pub use manage::valid_name;

/// A token's holder and expiry checked against the user the client names
/// (when it names one) and the time: 65 for another user, 66 once expired.
fn check_holder(
    user: Option<&str>,
    holder: &str,
    expires_ms: u64,
    now_ms: u64,
) -> Result<(), ResultCode> {
    if user.is_some_and(|user| user != holder) {
        return Err(ResultCode::InvalidCredential);
    }
    if expires_ms <= now_ms {
        return Err(ResultCode::ExpiredSession);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
