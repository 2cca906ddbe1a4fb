//! The `[security.ldap]` section (the reference's `security { ldap { } }`
//! context, same names) into [`citrine_ldap::LdapConfig`].
//!
//! Invariants: a setting out of the reference's range, or settings that
//! cannot work together, stop the node at start with the setting named;
//! the query user's password is read from its file here (relative paths
//! from the work directory), its trailing line end dropped.

use crate::config::{ConfigError, FileConfig};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// `[security.ldap]`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LdapSection {
    pub server: String,
    pub query_base_dn: String,
    pub disable_tls: Option<bool>,
    pub tls_ca_file: Option<PathBuf>,
    pub query_user_dn: Option<String>,
    pub query_user_password_file: Option<PathBuf>,
    pub user_dn_pattern: Option<String>,
    pub user_query_pattern: Option<String>,
    pub role_query_base_dn: Option<String>,
    /// One filter or several (the reference repeats the line).
    #[serde(default)]
    pub role_query_pattern: Patterns,
    pub role_query_search_ou: Option<bool>,
    pub polling_period: Option<u32>,
    pub session_ttl: Option<u32>,
    pub login_threads: Option<usize>,
    /// `sha-256` (the default) or `sha-512`: the HMAC of LDAP tokens.
    pub token_hash_method: Option<String>,
}

/// `role-query-pattern`: a string or a list of strings.
#[derive(Debug, Deserialize, Default)]
#[serde(untagged)]
pub enum Patterns {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

/// The LDAP settings, checked; `None` without `[security.ldap]`.
pub fn resolve(
    file: &FileConfig,
    origin: &str,
    work_directory: Option<&Path>,
) -> Result<Option<citrine_ldap::LdapConfig>, ConfigError> {
    let Some(section) = file.security.as_ref().and_then(|s| s.ldap.as_ref()) else {
        return Ok(None);
    };
    let refuse = |what: String| ConfigError(format!("{origin}: security.ldap.{what}"));
    let mut config = citrine_ldap::LdapConfig::new(&section.server, &section.query_base_dn);
    let within = |name: &str, value: u64, low: u64, high: u64| {
        if (low..=high).contains(&value) {
            Ok(())
        } else {
            Err(refuse(format!(
                "{name} = {value} is impossible ({low} to {high})"
            )))
        }
    };
    config.polling_period_s = section.polling_period.unwrap_or(config.polling_period_s);
    within("polling-period", config.polling_period_s.into(), 0, 86_400)?;
    config.session_ttl_s = section.session_ttl.unwrap_or(config.session_ttl_s);
    within("session-ttl", config.session_ttl_s.into(), 120, 864_000)?;
    config.login_threads = section.login_threads.unwrap_or(config.login_threads);
    within("login-threads", config.login_threads as u64, 1, 64)?;
    if let Some(method) = &section.token_hash_method {
        config.token_hash_method = method.clone();
    }
    let place = |path: &Path| match work_directory {
        Some(directory) if path.is_relative() => directory.join(path),
        _ => path.to_path_buf(),
    };
    config.disable_tls = section.disable_tls.unwrap_or(false);
    config.tls_ca_file = section.tls_ca_file.as_deref().map(place);
    config.query_user_dn = section.query_user_dn.clone();
    if let Some(path) = &section.query_user_password_file {
        let path = place(path);
        let text = std::fs::read_to_string(&path).map_err(|error| {
            refuse(format!(
                "query-user-password-file {}: {error}",
                path.display()
            ))
        })?;
        config.query_user_password = Some(text.trim_end_matches(['\r', '\n']).to_owned());
    }
    config.user_dn_pattern = section.user_dn_pattern.clone();
    config.user_query_pattern = section.user_query_pattern.clone();
    config.role_query_base_dn = section.role_query_base_dn.clone();
    config.role_query_patterns = match &section.role_query_pattern {
        Patterns::None => Vec::new(),
        Patterns::One(pattern) => vec![pattern.clone()],
        Patterns::Many(patterns) => patterns.clone(),
    };
    config.role_query_search_ou = section.role_query_search_ou.unwrap_or(false);
    config.check().map_err(|why| refuse(format!(": {why}")))?;
    Ok(Some(config))
}

#[cfg(test)]
mod tests {
    use crate::config::{parse_text, resolve, Overrides};

    fn with(ldap: &str) -> Result<Option<citrine_ldap::LdapConfig>, String> {
        let text = format!("[security]\n[security.ldap]\n{ldap}\n[[namespace]]\nname = \"test\"\n");
        let file = parse_text(&text, "t.toml").map_err(|e| e.0)?;
        resolve(file, "t.toml", &Overrides::default())
            .map(|config| config.ldap)
            .map_err(|e| e.0)
    }

    #[test]
    fn the_reference_names_set_the_ldap_settings() {
        let base = "server = \"ldap://127.0.0.1:389\"\nquery-base-dn = \"dc=x\"\n";
        let config = with(&format!(
            "{base}user-dn-pattern = \"uid=${{un}},dc=x\"\nrole-query-pattern = \"(member=${{dn}})\"\n\
             disable-tls = true\npolling-period = 10\nsession-ttl = 3600\nlogin-threads = 2\n\
             role-query-search-ou = true\ntoken-hash-method = \"sha-256\"\n"
        ))
        .expect("valid")
        .expect("on");
        assert_eq!(
            config.role_query_patterns,
            vec!["(member=${dn})".to_owned()]
        );
        assert_eq!(
            (
                config.polling_period_s,
                config.session_ttl_s,
                config.login_threads
            ),
            (10, 3600, 2)
        );
        assert!(config.disable_tls && config.role_query_search_ou);
        assert_eq!(config.token_hash_method, "sha-256");
        let sha512 = with(&format!(
            "{base}user-dn-pattern = \"u\"\ntoken-hash-method = \"sha-512\"\n"
        ))
        .expect("valid")
        .expect("on");
        assert_eq!(sha512.token_hash_method, "sha-512");
        let error = with(&format!(
            "{base}user-dn-pattern = \"u\"\ntoken-hash-method = \"md5\"\n"
        ))
        .expect_err("unknown hash");
        assert!(error.contains("token-hash-method"), "{error}");
        let many = with(&format!(
            "{base}user-dn-pattern = \"uid=${{un}}\"\nrole-query-pattern = [\"(a=${{un}})\", \"(b=${{dn}})\"]\n"
        ))
        .expect("valid")
        .expect("on");
        assert_eq!(many.role_query_patterns.len(), 2);
        assert_eq!((many.polling_period_s, many.session_ttl_s), (300, 86_400));
        let error = with(base).expect_err("no way to find the user");
        assert!(error.contains("user-dn-pattern"), "{error}");
        let error = with(&format!("{base}user-dn-pattern = \"u\"\nsession-ttl = 1\n"))
            .expect_err("too short");
        assert!(error.contains("security.ldap.session-ttl"), "{error}");
        let error = with(&format!(
            "{base}user-query-pattern = \"(uid=${{un}})\"\nquery-user-dn = \"cn=q\"\n\
             query-user-password-file = \"/nonexistent/pw\"\n"
        ))
        .expect_err("no password file");
        assert!(error.contains("query-user-password-file"), "{error}");
        assert!(with(&format!(
            "{base}user-dn-pattern = \"u\"\nenable-ldap = true\n"
        ))
        .is_err());
    }
}
