//! The directory operations of one login or one poll, each on a
//! connection of its own: connect (StartTLS unless disabled), find the
//! user's DN, bind as the user, read its groups.
//!
//! Invariants: every operation carries [`OPERATION_TIMEOUT`]; a
//! connection is unbound when its work is done; an entry the server sends
//! that cannot be read is skipped, never a panic.

use crate::{pattern, Failure, LdapConfig, Roles, OPERATION_TIMEOUT};
use ldap3::{Ldap, LdapConnAsync, LdapConnSettings, LdapError, ResultEntry, Scope};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

/// LDAP's result code for a refused password.
const INVALID_CREDENTIALS: u32 = 49;
/// LDAP's result code for a search base that does not exist.
const NO_SUCH_OBJECT: u32 = 32;

/// The TLS client settings trusting the CAs in the PEM file at `path`.
pub(crate) fn tls_config(path: &Path) -> Result<Arc<rustls::ClientConfig>, String> {
    let unreadable = |error: &dyn std::fmt::Display| {
        format!("cannot read tls-ca-file {}: {error}", path.display())
    };
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(path).map_err(|e| unreadable(&e))? {
        let certificate = certificate.map_err(|e| unreadable(&e))?;
        roots.add(certificate).map_err(|e| unreadable(&e))?;
    }
    if roots.is_empty() {
        return Err(unreadable(&"no certificate in it"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| unreadable(&e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// What one login or poll works with.
pub(crate) struct Session {
    config: Arc<LdapConfig>,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Session {
    pub(crate) fn new(config: Arc<LdapConfig>, tls: Option<Arc<rustls::ClientConfig>>) -> Session {
        Session { config, tls }
    }

    /// Binds as `user` with `password`, then reads its roles.
    pub(crate) async fn login(&self, user: &str, password: &str) -> Result<Roles, Failure> {
        if password.is_empty() {
            return Err(Failure::Credential);
        }
        let mut ldap = self.connect().await?;
        let result = async {
            let dn = self.user_dn(&mut ldap, user).await?;
            bind(&mut ldap, &dn, password).await?;
            if self.config.query_user_dn.is_some() {
                self.bind_query_user(&mut ldap).await?;
            }
            self.roles_of(&mut ldap, user, &dn).await
        }
        .await;
        let _ = ldap.unbind().await;
        result
    }

    /// Reads `user`'s roles bound as the query user (or anonymously).
    pub(crate) async fn roles(&self, user: &str) -> Result<Roles, Failure> {
        let mut ldap = self.connect().await?;
        let result = async {
            if self.config.query_user_dn.is_some() {
                self.bind_query_user(&mut ldap).await?;
            }
            let dn = self.user_dn(&mut ldap, user).await?;
            self.roles_of(&mut ldap, user, &dn).await
        }
        .await;
        let _ = ldap.unbind().await;
        result
    }

    async fn connect(&self) -> Result<Ldap, Failure> {
        let ldaps = self.config.server.starts_with("ldaps://");
        let mut settings = LdapConnSettings::new()
            .set_conn_timeout(OPERATION_TIMEOUT)
            .set_starttls(!ldaps && !self.config.disable_tls);
        if let Some(tls) = &self.tls {
            settings = settings.set_config(tls.clone());
        }
        let (connection, ldap) = LdapConnAsync::with_settings(settings, &self.config.server)
            .await
            .map_err(connect_failure)?;
        ldap3::drive!(connection);
        Ok(ldap)
    }

    async fn bind_query_user(&self, ldap: &mut Ldap) -> Result<(), Failure> {
        let (Some(dn), Some(password)) =
            (&self.config.query_user_dn, &self.config.query_user_password)
        else {
            return Ok(());
        };
        bind(ldap, dn, password)
            .await
            .map_err(|failure| match failure {
                Failure::Credential => {
                    Failure::Authentication("the directory refused query-user-dn's password".into())
                }
                other => other,
            })
    }

    /// The user's DN: from `user-dn-pattern`, else the one entry
    /// `user-query-pattern` finds (bound as the query user).
    async fn user_dn(&self, ldap: &mut Ldap, user: &str) -> Result<String, Failure> {
        if let Some(dn_pattern) = &self.config.user_dn_pattern {
            return Ok(pattern::user_dn(dn_pattern, user));
        }
        let Some(query) = &self.config.user_query_pattern else {
            return Err(Failure::NoUser);
        };
        self.bind_query_user(ldap).await?;
        let filter = pattern::filter(query, user, "");
        let mut found = search(ldap, &self.config.query_base_dn, &filter).await?;
        match found.len() {
            0 => Err(Failure::NoUser),
            1 => Ok(found.remove(0)),
            n => Err(Failure::Query(format!("{n} entries match user {user:?}"))),
        }
    }

    /// The names of the groups every role query finds, and with
    /// `role-query-search-ou` the `ou` values of the user's DN.
    async fn roles_of(&self, ldap: &mut Ldap, user: &str, dn: &str) -> Result<Roles, Failure> {
        let base = (self.config.role_query_base_dn.as_deref())
            .unwrap_or(&self.config.query_base_dn)
            .to_owned();
        let mut roles = BTreeSet::new();
        for query in &self.config.role_query_patterns {
            let filter = pattern::filter(query, user, dn);
            let groups = search(ldap, &base, &filter).await?;
            roles.extend(
                groups
                    .iter()
                    .filter_map(|group| pattern::role_of_group(group)),
            );
        }
        if self.config.role_query_search_ou {
            roles.extend(pattern::units_of(dn));
        }
        Ok(roles.into_iter().collect())
    }
}

/// A simple bind as `dn`: 49 is a refused password.
async fn bind(ldap: &mut Ldap, dn: &str, password: &str) -> Result<(), Failure> {
    let result = ldap
        .with_timeout(OPERATION_TIMEOUT)
        .simple_bind(dn, password)
        .await
        .map_err(operation_failure)?;
    match result.rc {
        0 => Ok(()),
        INVALID_CREDENTIALS => Err(Failure::Credential),
        _ => Err(Failure::Authentication(result.to_string())),
    }
}

/// The DNs of the entries under `base` that `filter` matches (none when
/// `base` does not exist).
async fn search(ldap: &mut Ldap, base: &str, filter: &str) -> Result<Vec<String>, Failure> {
    let ldap3::SearchResult(entries, result) = ldap
        .with_timeout(OPERATION_TIMEOUT)
        .search(base, Scope::Subtree, filter, vec!["1.1"])
        .await
        .map_err(|error| Failure::Query(error.to_string()))?;
    match result.rc {
        0 => Ok(entries.into_iter().filter_map(dn_of).collect()),
        NO_SUCH_OBJECT => Ok(Vec::new()),
        _ => Err(Failure::Query(result.to_string())),
    }
}

/// The DN of a search result entry (`None` for a referral or an entry
/// that cannot be read).
fn dn_of(entry: ResultEntry) -> Option<String> {
    let mut parts = entry.0.match_id(4)?.expect_constructed()?.into_iter();
    String::from_utf8(parts.next()?.expect_primitive()?).ok()
}

/// A failed connection: 92 for TLS (the handshake's failure arrives as
/// an I/O error carrying the rustls one), 91 otherwise.
fn connect_failure(error: LdapError) -> Failure {
    match error {
        LdapError::Rustls { .. } | LdapError::DNSName { .. } => Failure::Tls(error.to_string()),
        LdapError::Io { ref source }
            if source
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>()) =>
        {
            Failure::Tls(error.to_string())
        }
        LdapError::LdapResult { ref result } if result.rc != 0 => Failure::Tls(error.to_string()),
        _ => Failure::Setup(error.to_string()),
    }
}

fn operation_failure(error: LdapError) -> Failure {
    Failure::Setup(error.to_string())
}
