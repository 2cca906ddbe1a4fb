//! TLS on the client service port, served by the same service threads as
//! plain connections.
//!
//! [`TlsAcceptor`] holds the node's TLS configuration (rustls with the ring
//! provider) built from the files `[[tls]]` names, and re-reads them when
//! they change: the listener checks their modification times every
//! [`REFRESH_PERIOD`]; a connection accepted afterwards gets the new
//! certificate, those already open keep theirs. A file that fails to load
//! is logged and the previous configuration stays in use.
//!
//! A TLS connection is the ordinary protocol state machine ([`super::conn`])
//! over [`TlsOver`], a transport that wraps the thread's backend: the
//! backend moves ciphertext between the socket and the session's
//! `cipher` buffers (its completions land there, see
//! [`super::service_thread::Connection::wire`]), and rustls
//! (`ServerConnection`, the standard API over those buffers) turns it into
//! the plaintext the state machine reads from `conn.input` and back.
//!
//! Invariants:
//! - `cipher.input[cipher.start..cipher.end]` is ciphertext received and
//!   not yet given to rustls; rustls is fed only non-empty slices (an empty
//!   read would tell it the peer closed);
//! - `cipher.out[cipher.written..]` is ciphertext taken from rustls and not
//!   yet sent; rustls's queue is drained into it only once the backend has
//!   sent all of it (and given it back, for io_uring);
//! - a reply is handed to rustls whole (no buffer limit), so `flush` never
//!   keeps plaintext back;
//! - a TLS connection stays on the thread that accepted it (its session
//!   does not move between threads);
//! - a handshake or record that rustls refuses closes the connection (its
//!   alert is sent on a best-effort basis); the thread serves the others;
//! - once the handshake is over, the common name of a client certificate
//!   rustls verified goes to the connection's session (a LOGIN without
//!   fields, the clients' PKI mode, logs in as that user); without
//!   `tls-authenticate-client` no certificate is asked for, so none is.

use super::conn::{Conn, Transport};
use crate::tls_config::{ClientAuth, Protocol, TlsSettings};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How often the listener looks for changed certificate files.
pub(super) const REFRESH_PERIOD: Duration = Duration::from_secs(1);

/// Bytes of ciphertext a TLS connection reads at a time (one TLS record
/// is at most 16 KiB of plaintext plus its overhead).
const CIPHER_BUFFER_BYTES: usize = 17 * 1024;

/// Makes the sessions of the TLS service port.
pub(crate) struct TlsAcceptor {
    settings: TlsSettings,
    /// The configuration new connections get, and the file times it was
    /// built from.
    current: Mutex<(Arc<ServerConfig>, Vec<Option<SystemTime>>)>,
}

impl TlsAcceptor {
    /// Reads the certificate, key and CA files and builds the
    /// configuration; the message names the file or setting at fault.
    pub(crate) fn new(settings: TlsSettings) -> Result<TlsAcceptor, String> {
        let stamps = file_times(&settings);
        let config = build_config(&settings)?;
        Ok(TlsAcceptor {
            settings,
            current: Mutex::new((config, stamps)),
        })
    }

    pub(super) fn port(&self) -> u16 {
        self.settings.port
    }

    /// A server session with the current configuration.
    pub(crate) fn session(&self) -> Result<ServerConnection, rustls::Error> {
        let config = super::lock(&self.current).0.clone();
        let mut session = ServerConnection::new(config)?;
        // Replies are handed over whole (see the module's invariants).
        session.set_buffer_limit(None);
        Ok(session)
    }

    /// Rebuilds the configuration when a file changed since it was built;
    /// true when it did. A failed rebuild keeps the previous one.
    pub(crate) fn refresh(&self) -> bool {
        let stamps = file_times(&self.settings);
        if super::lock(&self.current).1 == stamps {
            return false;
        }
        match build_config(&self.settings) {
            Ok(config) => {
                *super::lock(&self.current) = (config, stamps);
                tracing::info!(tls_name = %self.settings.name, "TLS certificate files changed: reloaded");
                true
            }
            Err(error) => {
                // Not retried until the files change again.
                super::lock(&self.current).1 = stamps;
                tracing::warn!("TLS certificate files changed but cannot be loaded ({error}); the previous ones stay in use");
                false
            }
        }
    }
}

fn files(settings: &TlsSettings) -> Vec<&PathBuf> {
    let mut files = vec![&settings.cert_file, &settings.key_file];
    files.extend(settings.ca_file.as_ref());
    files
}

pub(crate) fn file_times(settings: &TlsSettings) -> Vec<Option<SystemTime>> {
    files(settings)
        .into_iter()
        .map(|path| {
            std::fs::metadata(path)
                .and_then(|meta| meta.modified())
                .ok()
        })
        .collect()
}

/// Builds the rustls configuration the settings describe.
fn build_config(settings: &TlsSettings) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(provider(&settings.cipher_suites)?);
    let versions = versions(settings);
    let certs = read_certs(&settings.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&settings.key_file)
        .map_err(|error| format!("key-file {}: {error}", settings.key_file.display()))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|error| format!("[[tls]] {:?}: {error}", settings.name))?;
    let builder = match (&settings.client_auth, &settings.ca_file) {
        (ClientAuth::None, _) | (_, None) => builder.with_no_client_auth(),
        (_, Some(ca_file)) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(ca_file)? {
                roots
                    .add(cert)
                    .map_err(|error| format!("ca-file {}: {error}", ca_file.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|error| format!("ca-file {}: {error}", ca_file.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|error| format!("cert-file/key-file of [[tls]] {:?}: {error}", settings.name))?;
    Ok(Arc::new(config))
}

/// The protocol versions the settings offer.
pub(crate) fn versions(settings: &TlsSettings) -> Vec<&'static rustls::SupportedProtocolVersion> {
    settings
        .protocols
        .iter()
        .map(|protocol| match protocol {
            Protocol::Tls12 => &rustls::version::TLS12,
            Protocol::Tls13 => &rustls::version::TLS13,
        })
        .collect()
}

pub(crate) fn read_certs(path: &PathBuf) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect())
        .map_err(|error| format!("{}: {error}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// OpenSSL's names of the cipher suites rustls offers, with the IANA names
/// rustls knows them by.
const OPENSSL_NAMES: [(&str, &str); 9] = [
    ("TLS_AES_128_GCM_SHA256", "TLS13_AES_128_GCM_SHA256"),
    ("TLS_AES_256_GCM_SHA384", "TLS13_AES_256_GCM_SHA384"),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        "TLS13_CHACHA20_POLY1305_SHA256",
    ),
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "ECDHE-RSA-AES128-GCM-SHA256",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-RSA-AES256-GCM-SHA384",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-RSA-CHACHA20-POLY1305",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
];

/// The ring provider, limited to the named cipher suites (none named: all
/// of them). As with OpenSSL's `cipher-suite`, naming only TLS 1.2 suites
/// leaves the TLS 1.3 ones offered.
pub(crate) fn provider(names: &[String]) -> Result<rustls::crypto::CryptoProvider, String> {
    let mut provider = rustls::crypto::ring::default_provider();
    if names.is_empty() {
        return Ok(provider);
    }
    let iana = |name: &str| -> String {
        OPENSSL_NAMES
            .iter()
            .find(|(openssl, _)| *openssl == name)
            .map_or(name, |(_, iana)| iana)
            .to_owned()
    };
    let wanted: Vec<String> = names.iter().map(|name| iana(name)).collect();
    let suite_name = |suite: &rustls::SupportedCipherSuite| format!("{:?}", suite.suite());
    for (name, wanted) in names.iter().zip(&wanted) {
        if !provider
            .cipher_suites
            .iter()
            .any(|suite| &suite_name(suite) == wanted)
        {
            return Err(format!(
                "cipher-suite: {name:?} is not a cipher suite this node offers"
            ));
        }
    }
    let names_tls13 = wanted.iter().any(|name| name.starts_with("TLS13_"));
    provider.cipher_suites.retain(|suite| {
        let is_tls13 = matches!(suite, rustls::SupportedCipherSuite::Tls13(_));
        wanted.contains(&suite_name(suite)) || (is_tls13 && !names_tls13)
    });
    Ok(provider)
}

/// A TLS connection's session state, beside its plaintext [`Conn`].
pub(super) struct TlsSession {
    server: ServerConnection,
    /// The ciphertext buffers the backend reads into and sends from.
    pub(super) cipher: Conn,
    /// Names the client certificate must carry, until it was checked.
    names_to_check: Option<Arc<[String]>>,
    /// Whether the client certificate's common name was handed to the
    /// connection's session (once, after the handshake).
    named: bool,
}

/// A session accepted, on its way to a service thread.
pub(super) struct TlsStart {
    pub(super) server: ServerConnection,
    /// The names its client certificate must carry, if any.
    pub(super) names: Option<Arc<[String]>>,
}

impl TlsSession {
    /// Made by the service thread that serves it.
    pub(super) fn new(start: TlsStart, peer: SocketAddr) -> TlsSession {
        TlsSession {
            server: start.server,
            cipher: Conn::new(
                peer,
                (vec![0; CIPHER_BUFFER_BYTES], 0, 0, Vec::new()),
                Default::default(),
            ),
            names_to_check: start.names,
            named: false,
        }
    }

    /// Once the handshake is over, the first time: the common name of the
    /// client certificate rustls verified against `ca-file` (for a PKI
    /// login), if the client sent one.
    fn take_common_name(&mut self) -> Option<String> {
        if self.named || self.server.is_handshaking() {
            return None;
        }
        self.named = true;
        let cert = self.server.peer_certificates()?.first()?;
        let (_, cert) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
        let name = cert.subject().iter_common_name().next()?;
        name.as_str().ok().map(str::to_owned)
    }

    /// After the handshake, whether the client certificate carries one of
    /// the names `tls-authenticate-client` lists (checked once).
    fn client_name_ok(&mut self) -> bool {
        if self.server.is_handshaking() {
            return true;
        }
        let Some(names) = self.names_to_check.take() else {
            return true;
        };
        let Some(cert) = self
            .server
            .peer_certificates()
            .and_then(|certs| certs.first())
        else {
            return false;
        };
        let Ok(cert) = webpki::EndEntityCert::try_from(cert) else {
            return false;
        };
        names.iter().any(|name| {
            ServerName::try_from(name.as_str())
                .is_ok_and(|name| cert.verify_is_valid_for_subject_name(&name).is_ok())
        })
    }
}

impl TlsAcceptor {
    /// The names client certificates are checked against, if any.
    pub(super) fn client_names(&self) -> Option<Arc<[String]>> {
        match &self.settings.client_auth {
            ClientAuth::Names(names) => Some(names.clone().into()),
            _ => None,
        }
    }
}

/// The transport of a TLS connection: rustls over the thread's backend.
pub(super) struct TlsOver<'a, B> {
    pub(super) backend: &'a mut B,
    pub(super) session: &'a mut TlsSession,
}

impl<B: Transport> TlsOver<'_, B> {
    /// Sends what rustls has queued: `Ok(true)` once all of it is sent.
    fn push(&mut self, socket: &mut B::Socket) -> Result<bool, ()> {
        let session = &mut *self.session;
        loop {
            if !self.backend.flush(socket, &mut session.cipher)? {
                return Ok(false);
            }
            if !session.server.wants_write() {
                return Ok(true);
            }
            let cipher = &mut session.cipher;
            cipher.out.clear();
            cipher.written = 0;
            if let Err(error) = session.server.write_tls(&mut cipher.out) {
                tracing::warn!(peer = %cipher.peer, "closing TLS connection: {error}");
                return Err(());
            }
        }
    }

    /// Gives rustls the ciphertext buffered; `Err` when it refuses it (the
    /// alert it queued is sent if the socket takes it now).
    fn absorb(&mut self, socket: &mut B::Socket) -> Result<(), ()> {
        let session = &mut *self.session;
        let cipher = &mut session.cipher;
        let mut buffered = &cipher.input[cipher.start..cipher.end];
        let taken = match session.server.read_tls(&mut buffered) {
            Ok(taken) => taken,
            Err(error) => {
                tracing::warn!(peer = %cipher.peer, "closing TLS connection: {error}");
                return Err(());
            }
        };
        cipher.start += taken;
        if cipher.start == cipher.end {
            cipher.start = 0;
            cipher.end = 0;
        }
        if let Err(error) = session.server.process_new_packets() {
            tracing::warn!(peer = %cipher.peer, "closing TLS connection: {error}");
            let _ = self.push(socket);
            return Err(());
        }
        if !session.client_name_ok() {
            tracing::warn!(peer = %session.cipher.peer, "closing TLS connection: the client certificate carries none of the names tls-authenticate-client lists");
            return Err(());
        }
        Ok(())
    }

    /// Makes room in the ciphertext buffer for a read.
    fn cipher_room(&mut self) {
        let cipher = &mut self.session.cipher;
        if cipher.end == cipher.input.len() {
            if cipher.start > 0 {
                cipher.input.copy_within(cipher.start..cipher.end, 0);
                cipher.end -= cipher.start;
                cipher.start = 0;
            } else {
                let grown = cipher.input.len() * 2;
                cipher.input.resize(grown, 0);
            }
        }
    }
}

impl<B: Transport> Transport for TlsOver<'_, B> {
    type Socket = B::Socket;

    fn flush(&mut self, socket: &mut B::Socket, conn: &mut Conn) -> Result<bool, ()> {
        if conn.written < conn.out.len() {
            if let Err(error) = self
                .session
                .server
                .writer()
                .write_all(&conn.out[conn.written..])
            {
                tracing::warn!(peer = %conn.peer, "closing TLS connection: {error}");
                return Err(());
            }
            conn.written = conn.out.len();
        }
        self.push(socket)
    }

    fn fill(&mut self, socket: &mut B::Socket, conn: &mut Conn) -> Result<bool, ()> {
        // An empty slice would read as the peer's close_notify.
        debug_assert!(conn.has_room(), "next_frame makes room before a fill");
        loop {
            match self
                .session
                .server
                .reader()
                .read(&mut conn.input[conn.end..])
            {
                Ok(0) => {
                    // The peer's close_notify.
                    conn.eof = true;
                    conn.log_eof();
                    return Err(());
                }
                Ok(read) => {
                    conn.end += read;
                    return Ok(true);
                }
                Err(error) if error.kind() == ErrorKind::WouldBlock => {}
                Err(error) => {
                    tracing::debug!(peer = %conn.peer, "TLS connection read error: {error}");
                    return Err(());
                }
            }
            // Handshake messages (and any other record rustls answers).
            if self.session.server.wants_write() {
                self.push(socket)?;
            }
            if self.backend.input_here(socket) {
                let cipher = &self.session.cipher;
                if cipher.start < cipher.end {
                    self.absorb(socket)?;
                    if let Some(name) = self.session.take_common_name() {
                        conn.session.set_certificate(name);
                    }
                    continue;
                }
                self.cipher_room();
            }
            if !self.backend.fill(socket, &mut self.session.cipher)? {
                return Ok(false);
            }
        }
    }

    fn input_here(&self, _socket: &B::Socket) -> bool {
        // The plaintext input is never lent to the kernel.
        true
    }
}
