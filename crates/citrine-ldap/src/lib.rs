//! External authentication against an LDAP directory, as the reference's
//! `security { ldap { ... } }` context does it: a user who is not one of
//! the node's own logs in with its clear password (the clients' EXTERNAL
//! auth mode); the node binds to the directory as that user's DN, then
//! asks for the groups it belongs to, whose names are its roles.
//!
//! [`Directory`] owns a small tokio runtime (`login-threads` workers) on
//! which every directory operation runs; callers on other executors (the
//! service threads' own) await a channel, so no service thread ever waits
//! for the directory.
//!
//! Invariants:
//! - an empty password is refused before any bind (an LDAP bind with a
//!   DN and no password is an unauthenticated bind, which servers accept);
//! - a user name is escaped for where it is substituted ([`pattern`]);
//! - every connection and operation has a deadline ([`OPERATION_TIMEOUT`]);
//! - at most `login-threads` logins and polls talk to the directory at
//!   once; the others wait their turn (a burst of logins cannot open a
//!   directory connection each);
//! - without `disable-tls`, an `ldap://` server is spoken to only after
//!   StartTLS, an `ldaps://` one over TLS, each verified against
//!   `tls-ca-file` when given.

pub mod pattern;
mod query;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long one connection attempt or one operation may take.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);

/// The `security.ldap` settings (the reference's names in comments).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LdapConfig {
    /// `server`: `ldap://host:port` or `ldaps://host:port`.
    pub server: String,
    /// `disable-tls`: speak plain LDAP (no StartTLS).
    pub disable_tls: bool,
    /// `tls-ca-file`: the CA the server's certificate must chain to.
    pub tls_ca_file: Option<PathBuf>,
    /// `query-base-dn`: where users are searched for.
    pub query_base_dn: String,
    /// `query-user-dn`: who the node binds as to search (none: the user
    /// itself at login, anonymous when polling).
    pub query_user_dn: Option<String>,
    /// The password read from `query-user-password-file`.
    pub query_user_password: Option<String>,
    /// `user-dn-pattern`: the user's DN from its name (`${un}`).
    pub user_dn_pattern: Option<String>,
    /// `user-query-pattern`: a filter finding the user's entry under
    /// `query-base-dn` (used when there is no `user-dn-pattern`).
    pub user_query_pattern: Option<String>,
    /// `role-query-base-dn`: where groups are searched for (default
    /// `query-base-dn`).
    pub role_query_base_dn: Option<String>,
    /// `role-query-pattern` (one or more): filters finding the user's
    /// groups (`${un}`, `${dn}`).
    pub role_query_patterns: Vec<String>,
    /// `role-query-search-ou`: the user DN's `ou` values are roles too.
    pub role_query_search_ou: bool,
    /// `polling-period`: seconds between re-reading every logged-in
    /// user's roles (0: never).
    pub polling_period_s: u32,
    /// `session-ttl`: seconds an LDAP login's session token is valid.
    pub session_ttl_s: u32,
    /// `login-threads`: threads doing directory operations.
    pub login_threads: usize,
    /// `token-hash-method`: the hash of the HMAC that signs LDAP users'
    /// tokens, `sha-256` or `sha-512`.
    pub token_hash_method: String,
}

impl LdapConfig {
    /// The settings' defaults around the required `server` and
    /// `query_base_dn` (the reference's: poll every 300 s, tokens valid a
    /// day, 8 login threads).
    pub fn new(server: &str, query_base_dn: &str) -> LdapConfig {
        LdapConfig {
            server: server.to_owned(),
            disable_tls: false,
            tls_ca_file: None,
            query_base_dn: query_base_dn.to_owned(),
            query_user_dn: None,
            query_user_password: None,
            user_dn_pattern: None,
            user_query_pattern: None,
            role_query_base_dn: None,
            role_query_patterns: Vec::new(),
            role_query_search_ou: false,
            polling_period_s: 300,
            session_ttl_s: 86_400,
            login_threads: 8,
            token_hash_method: "sha-256".to_owned(),
        }
    }

    /// Why these settings cannot work, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if !(self.server.starts_with("ldap://") || self.server.starts_with("ldaps://")) {
            return Err(format!(
                "server {:?} is not an ldap:// or ldaps:// URL",
                self.server
            ));
        }
        if self.user_dn_pattern.is_none() && self.user_query_pattern.is_none() {
            return Err("one of user-dn-pattern and user-query-pattern is needed".to_owned());
        }
        if self.user_dn_pattern.is_none() && self.query_user_dn.is_none() {
            return Err("user-query-pattern needs query-user-dn".to_owned());
        }
        if self.query_user_dn.is_some() != self.query_user_password.is_some() {
            return Err("query-user-dn and query-user-password-file go together".to_owned());
        }
        if !matches!(self.token_hash_method.as_str(), "sha-256" | "sha-512") {
            return Err(format!(
                "token-hash-method = {:?} is not sha-256 or sha-512",
                self.token_hash_method
            ));
        }
        if self.login_threads == 0 || self.login_threads > 64 {
            return Err(format!(
                "login-threads = {} is impossible (1 to 64)",
                self.login_threads
            ));
        }
        Ok(())
    }
}

/// Why an LDAP login or query failed, with the reference's result code.
/// 60 and 65 mean in the official clients' tables (Java, Go, C/Python)
/// what they mean here: INVALID_USER, INVALID_CREDENTIAL. 91-94 are in
/// no client's table (they print the number); their meaning is the
/// reference server's names, `AS_SEC_ERR_LDAP_SETUP`, `_TLS_SETUP`,
/// `_AUTHENTICATION`, `_QUERY`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The directory refused the password (LDAP result 49), or it was
    /// empty: 65, as a wrong internal password.
    Credential,
    /// No entry for the user (user query found none): 60.
    NoUser,
    /// The directory could not be reached or spoken to: 91.
    Setup(String),
    /// TLS with the directory failed: 92.
    Tls(String),
    /// The bind failed otherwise: 93.
    Authentication(String),
    /// A search failed: 94.
    Query(String),
}

impl Failure {
    /// The result code the client gets.
    pub fn code(&self) -> u8 {
        match self {
            Failure::Credential => 65,
            Failure::NoUser => 60,
            Failure::Setup(_) => 91,
            Failure::Tls(_) => 92,
            Failure::Authentication(_) => 93,
            Failure::Query(_) => 94,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Credential => write!(f, "the directory refused the password"),
            Failure::NoUser => write!(f, "the directory has no such user"),
            Failure::Setup(why) => write!(f, "cannot reach the LDAP server: {why}"),
            Failure::Tls(why) => write!(f, "TLS with the LDAP server failed: {why}"),
            Failure::Authentication(why) => write!(f, "LDAP bind failed: {why}"),
            Failure::Query(why) => write!(f, "LDAP query failed: {why}"),
        }
    }
}

/// A user's roles as the directory has them now.
pub type Roles = Vec<String>;

/// The directory a node authenticates external users against.
pub struct Directory {
    config: Arc<LdapConfig>,
    tls: Option<Arc<rustls::ClientConfig>>,
    runtime: tokio::runtime::Runtime,
    /// One permit per login thread: a directory operation holds one.
    turns: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory")
            .field("server", &self.config.server)
            .finish_non_exhaustive()
    }
}

impl Directory {
    /// Checks `config`, reads its CA file and starts the login threads.
    pub fn start(config: LdapConfig) -> Result<Directory, String> {
        config.check()?;
        let tls = match &config.tls_ca_file {
            Some(path) => Some(query::tls_config(path)?),
            None => None,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.login_threads)
            .thread_name("citrine-ldap")
            .enable_all()
            .build()
            .map_err(|error| format!("cannot start the LDAP login threads: {error}"))?;
        let turns = Arc::new(tokio::sync::Semaphore::new(config.login_threads));
        Ok(Directory {
            config: Arc::new(config),
            tls,
            runtime,
            turns,
        })
    }

    /// The settings.
    pub fn config(&self) -> &LdapConfig {
        &self.config
    }

    /// Checks `user`'s `password` with the directory and reads its roles;
    /// the future may be awaited on any executor.
    pub fn login(
        &self,
        user: &str,
        password: &str,
    ) -> impl std::future::Future<Output = Result<Roles, Failure>> + Send + 'static {
        let session = query::Session::new(self.config.clone(), self.tls.clone());
        let (user, password) = (user.to_owned(), password.to_owned());
        self.run(async move { session.login(&user, &password).await })
    }

    /// Reads `user`'s roles again, bound as the query user (or
    /// anonymously): [`Failure::NoUser`] once the directory no longer has
    /// it (known only with `user-query-pattern`).
    pub fn roles(
        &self,
        user: &str,
    ) -> impl std::future::Future<Output = Result<Roles, Failure>> + Send + 'static {
        let session = query::Session::new(self.config.clone(), self.tls.clone());
        let user = user.to_owned();
        self.run(async move { session.roles(&user).await })
    }

    /// Runs `work` on the login threads; its result comes back through a
    /// channel (a dropped runtime answers [`Failure::Setup`]).
    fn run<F>(&self, work: F) -> impl std::future::Future<Output = Result<Roles, Failure>>
    where
        F: std::future::Future<Output = Result<Roles, Failure>> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let turns = self.turns.clone();
        self.runtime.spawn(async move {
            let Ok(_turn) = turns.acquire_owned().await else {
                return;
            };
            let _ = answer.send(work.await);
        });
        async move {
            answered
                .await
                .unwrap_or_else(|_| Err(Failure::Setup("the LDAP login threads stopped".into())))
        }
    }

    /// Every `polling-period`, on a login thread, calls `users` for the
    /// external users to re-read and hands each one's [`Directory::roles`]
    /// answer to `apply`; stops once `users` returns `None`.
    pub fn poll(
        &self,
        users: impl Fn() -> Option<Vec<String>> + Send + Sync + 'static,
        apply: impl Fn(&str, Result<Roles, Failure>) + Send + Sync + 'static,
    ) {
        let period = u64::from(self.config.polling_period_s);
        if period == 0 {
            return;
        }
        let session = query::Session::new(self.config.clone(), self.tls.clone());
        let turns = self.turns.clone();
        self.runtime.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(period)).await;
                let Some(users) = users() else { return };
                for user in users {
                    let Ok(_turn) = turns.acquire().await else {
                        return;
                    };
                    apply(&user, session.roles(&user).await);
                }
            }
        });
    }
}
