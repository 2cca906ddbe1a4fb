//! The TLS part of the configuration: `[[tls]]` sections (the reference's
//! named `tls <name>` stanzas: `cert-file`, `key-file`, `ca-file`,
//! `protocols`, `cipher-suite`) and the service's `tls-port`, `tls-name`
//! and `tls-authenticate-client`, resolved into [`TlsSettings`].
//!
//! Invariants: a resolved [`TlsSettings`] names files that were given
//! (relative paths are taken under the work directory, else the current
//! one), a port other than the plain service port, at least one protocol
//! version, and cipher suites all known to the TLS library; the files
//! themselves are read when the listener starts (and again when they
//! change), not here.

use crate::config::{ConfigError, FileConfig, Overrides};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// `[[tls]]`.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TlsSection {
    /// What `service.tls-name` refers to it by; also the name clients
    /// check the node's certificate against.
    pub name: String,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// CA certificates that client certificates must chain to (mutual
    /// TLS).
    pub ca_file: Option<PathBuf>,
    /// Space-separated: `TLSv1.2`, `TLSv1.3`, `all`, and `-X` to take one
    /// out (`-TLSv1`, `-TLSv1.1` and `-SSLv3` are accepted and change
    /// nothing: they are never offered). Default: TLSv1.2 and TLSv1.3.
    pub protocols: Option<String>,
    /// Colon-separated cipher suite names (OpenSSL's or IANA's spelling);
    /// TLS 1.3 suites stay offered unless one is named. Default: all.
    pub cipher_suite: Option<String>,
}

/// Who may connect to the TLS port (`tls-authenticate-client`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientAuth {
    /// "false": no client certificate is asked for.
    None,
    /// "any": a client certificate chaining to `ca-file` is required.
    Any,
    /// A certificate chaining to `ca-file` and valid for one of these
    /// names.
    Names(Vec<String>),
}

/// A TLS protocol version offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tls12,
    Tls13,
}

/// The TLS service port's resolved settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub port: u16,
    /// The `[[tls]]` name in use.
    pub name: String,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub ca_file: Option<PathBuf>,
    pub protocols: Vec<Protocol>,
    /// Cipher suite names as given; empty: the library's defaults.
    pub cipher_suites: Vec<String>,
    pub client_auth: ClientAuth,
}

/// The TLS port's settings, `None` when no TLS port is given.
pub fn resolve(
    file: &FileConfig,
    origin: &str,
    overrides: &Overrides,
    work_directory: Option<&Path>,
    plain_port: u16,
) -> Result<Option<TlsSettings>, ConfigError> {
    let service = &file.service;
    let Some(port) = overrides.tls_port.or(service.tls_port) else {
        return Ok(None);
    };
    if port == 0 || port == plain_port {
        return Err(ConfigError(format!(
            "{origin}: service.tls-port = {port} must be a fixed port other than the service port"
        )));
    }
    let Some(name) = service.tls_name.clone() else {
        return Err(ConfigError(format!(
            "{origin}: service.tls-port is set but service.tls-name is not: name the [[tls]] section to use"
        )));
    };
    let Some(section) = file.tls.iter().find(|tls| tls.name == name) else {
        return Err(ConfigError(format!(
            "{origin}: service.tls-name = {name:?} names no [[tls]] section"
        )));
    };
    let client_auth = client_auth(service.tls_authenticate_client.as_deref(), origin)?;
    if client_auth != ClientAuth::None && section.ca_file.is_none() {
        return Err(ConfigError(format!(
            "{origin}: service.tls-authenticate-client needs ca-file in [[tls]] {name:?}"
        )));
    }
    settings_of(section, port, client_auth, origin, work_directory).map(Some)
}

/// The settings of one TLS listener: `section`'s files placed under the
/// work directory, its protocols and cipher suites parsed.
fn settings_of(
    section: &TlsSection,
    port: u16,
    client_auth: ClientAuth,
    origin: &str,
    work_directory: Option<&Path>,
) -> Result<TlsSettings, ConfigError> {
    let name = &section.name;
    let place = |path: &Option<PathBuf>, what: &str| match path {
        Some(path) => Ok(under(work_directory, path)),
        None => Err(ConfigError(format!(
            "{origin}: [[tls]] {name:?} needs {what}"
        ))),
    };
    Ok(TlsSettings {
        port,
        cert_file: place(&section.cert_file, "cert-file")?,
        key_file: place(&section.key_file, "key-file")?,
        ca_file: section
            .ca_file
            .as_ref()
            .map(|path| under(work_directory, path)),
        protocols: protocols(section.protocols.as_deref(), origin)?,
        cipher_suites: section
            .cipher_suite
            .as_deref()
            .map(|suites| {
                suites
                    .split(':')
                    .map(str::trim)
                    .filter(|suite| !suite.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        name: name.clone(),
        client_auth,
    })
}

/// TLS on a cluster channel (`fabric` or `heartbeat`): where it listens
/// and the `[[tls]]` entry it uses. It is always mutual: the entry's
/// `ca-file` is required, and each side checks that the other's
/// certificate chains to it and is valid for the channel's `tls-name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelTls {
    /// Listen host (`tls-address`, else the channel's `address`).
    pub address: String,
    pub settings: TlsSettings,
}

/// What a cluster channel's section says about TLS.
pub struct ChannelTlsOptions<'a> {
    /// "fabric" or "heartbeat", for messages.
    pub channel: &'static str,
    pub tls_port: Option<u16>,
    pub tls_name: Option<&'a str>,
    pub tls_address: Option<&'a str>,
    /// The channel's plain listen host, the default of `tls-address`.
    pub address: &'a str,
}

/// A cluster channel's TLS settings, `None` when it has no `tls-port`.
pub fn resolve_channel(
    file: &FileConfig,
    origin: &str,
    options: &ChannelTlsOptions,
    work_directory: Option<&Path>,
) -> Result<Option<ChannelTls>, ConfigError> {
    let channel = options.channel;
    let Some(port) = options.tls_port else {
        if options.tls_name.is_some() || options.tls_address.is_some() {
            return Err(ConfigError(format!(
                "{origin}: {channel}.tls-name / {channel}.tls-address need {channel}.tls-port"
            )));
        }
        return Ok(None);
    };
    if port == 0 {
        return Err(ConfigError(format!(
            "{origin}: {channel}.tls-port must be 1-65535"
        )));
    }
    let Some(name) = options.tls_name else {
        return Err(ConfigError(format!(
            "{origin}: {channel}.tls-port is set but {channel}.tls-name is not: name the [[tls]] section to use"
        )));
    };
    let Some(section) = file.tls.iter().find(|tls| tls.name == name) else {
        return Err(ConfigError(format!(
            "{origin}: {channel}.tls-name = {name:?} names no [[tls]] section"
        )));
    };
    if section.ca_file.is_none() {
        return Err(ConfigError(format!(
            "{origin}: {channel} TLS needs ca-file in [[tls]] {name:?}: nodes check each other's certificates against it"
        )));
    }
    let client_auth = ClientAuth::Names(vec![name.to_owned()]);
    let settings = settings_of(section, port, client_auth, origin, work_directory)?;
    Ok(Some(ChannelTls {
        address: options.tls_address.unwrap_or(options.address).to_owned(),
        settings,
    }))
}

/// A relative path is taken under the work directory when there is one.
fn under(work_directory: Option<&Path>, path: &Path) -> PathBuf {
    match work_directory {
        Some(directory) if path.is_relative() => directory.join(path),
        _ => path.to_owned(),
    }
}

fn client_auth(value: Option<&str>, origin: &str) -> Result<ClientAuth, ConfigError> {
    match value.map(str::trim) {
        None | Some("false") => Ok(ClientAuth::None),
        Some("any") => Ok(ClientAuth::Any),
        Some("") | Some("true") => Err(ConfigError(format!(
            "{origin}: service.tls-authenticate-client must be \"false\", \"any\" or the names a client certificate must carry"
        ))),
        Some(names) => Ok(ClientAuth::Names(
            names.split_whitespace().map(str::to_owned).collect(),
        )),
    }
}

/// Parses `protocols`: versions added in order, `-X` taking one out.
fn protocols(value: Option<&str>, origin: &str) -> Result<Vec<Protocol>, ConfigError> {
    let Some(value) = value else {
        return Ok(vec![Protocol::Tls12, Protocol::Tls13]);
    };
    let mut chosen: Vec<Protocol> = Vec::new();
    for word in value.split_whitespace() {
        let (remove, version) = match word.strip_prefix('-') {
            Some(version) => (true, version),
            None => (false, word.strip_prefix('+').unwrap_or(word)),
        };
        let versions: &[Protocol] = match version {
            "all" => &[Protocol::Tls12, Protocol::Tls13],
            "TLSv1.2" => &[Protocol::Tls12],
            "TLSv1.3" => &[Protocol::Tls13],
            "SSLv3" | "TLSv1" | "TLSv1.1" if remove => &[],
            _ => {
                return Err(ConfigError(format!(
                    "{origin}: [[tls]] protocols: {word:?} is not supported (TLSv1.2, TLSv1.3, all, -X)"
                )))
            }
        };
        for version in versions {
            chosen.retain(|have| have != version);
            if !remove {
                chosen.push(*version);
            }
        }
    }
    if chosen.is_empty() {
        return Err(ConfigError(format!(
            "{origin}: [[tls]] protocols = {value:?} leaves no protocol version"
        )));
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_text;

    fn resolved(text: &str, overrides: &Overrides) -> Result<Option<TlsSettings>, ConfigError> {
        let file = parse_text(text, "t.toml")?;
        resolve(&file, "t.toml", overrides, Some(Path::new("/data")), 3000)
    }

    #[test]
    fn the_tls_port_uses_the_named_section_with_paths_under_the_work_directory() {
        let text = r#"
            [service]
            tls-port = 4333
            tls-name = "node1"
            tls-authenticate-client = "any"
            [[tls]]
            name = "node1"
            cert-file = "tls/node.pem"
            key-file = "/etc/node.key"
            ca-file = "tls/ca.pem"
            protocols = "all -TLSv1.2 -TLSv1"
            cipher-suite = "TLS_AES_128_GCM_SHA256:ECDHE-RSA-AES128-GCM-SHA256"
        "#;
        let tls = resolved(text, &Overrides::default())
            .expect("valid")
            .expect("tls on");
        assert_eq!(tls.port, 4333);
        assert_eq!(tls.cert_file, PathBuf::from("/data/tls/node.pem"));
        assert_eq!(tls.key_file, PathBuf::from("/etc/node.key"));
        assert_eq!(tls.ca_file, Some(PathBuf::from("/data/tls/ca.pem")));
        assert_eq!(tls.protocols, vec![Protocol::Tls13]);
        assert_eq!(tls.cipher_suites.len(), 2);
        assert_eq!(tls.client_auth, ClientAuth::Any);
        // No port, no TLS; the flag gives one.
        let without = "[[tls]]\nname = \"a\"\ncert-file = \"c\"\nkey-file = \"k\"\n[service]\ntls-name = \"a\"\n";
        assert_eq!(resolved(without, &Overrides::default()).ok(), Some(None));
        let flag = Overrides {
            tls_port: Some(4400),
            ..Overrides::default()
        };
        let tls = resolved(without, &flag).expect("valid").expect("tls on");
        assert_eq!((tls.port, tls.client_auth), (4400, ClientAuth::None));
    }

    #[test]
    fn impossible_tls_settings_are_refused_with_the_option_named() {
        let base = "[[tls]]\nname = \"a\"\ncert-file = \"c\"\nkey-file = \"k\"\n";
        let cases = [
            ("[service]\ntls-port = 4333\n", "tls-name"),
            ("[service]\ntls-port = 4333\ntls-name = \"b\"\n", "names no"),
            ("[service]\ntls-port = 3000\ntls-name = \"a\"\n", "tls-port"),
            (
                "[service]\ntls-port = 4333\ntls-name = \"a\"\ntls-authenticate-client = \"any\"\n",
                "ca-file",
            ),
        ];
        for (service, expected) in cases {
            let error =
                resolved(&format!("{service}{base}"), &Overrides::default()).expect_err(service);
            assert!(error.0.contains(expected), "{service}: {}", error.0);
        }
        let bad_protocols =
            format!("[service]\ntls-port = 4333\ntls-name = \"a\"\n{base}protocols = \"SSLv3\"\n");
        assert!(resolved(&bad_protocols, &Overrides::default()).is_err());
        let none_left = format!(
            "[service]\ntls-port = 4333\ntls-name = \"a\"\n{base}protocols = \"TLSv1.2 -TLSv1.2\"\n"
        );
        assert!(resolved(&none_left, &Overrides::default()).is_err());
    }
}
