//! TLS on the cluster channels — the fabric (replica writes, migrations,
//! duplicate resolution, proxies) and the mesh heartbeat (heartbeats and
//! Paxos) — over the same rustls configuration code as the client TLS port
//! ([`crate::net::tls`]).
//!
//! A [`ChannelTlsContext`] is one channel's `[[tls]]` entry made usable:
//! the server side of its connections (the acceptor of the client port,
//! which re-reads changed certificate files) and the client side. Between
//! nodes TLS is always mutual: the accepting node requires a certificate
//! that chains to the entry's `ca-file` and is valid for the channel's
//! `tls-name`; the connecting node presents its own certificate and checks
//! the accepting node's against the same CA and name. So every node of a
//! cluster carries a certificate for the shared TLS name (with both the
//! serverAuth and clientAuth uses), and a node whose certificate comes from
//! another CA is refused on every connection it makes or receives.
//!
//! [`TlsStream`] runs a rustls session over a tokio socket: ciphertext is
//! read into `scratch`, handed to rustls, and the plaintext drained into
//! `plain`; writes go through rustls and out in records. [`PeerStream`] is
//! what the cluster runtime reads frames from and writes frames to: plain
//! TCP (reads through a [`PLAIN_READ_BUFFER`] buffer, so a stream of small
//! frames costs one `recv` per buffer, not two per frame) or TLS.
//!
//! Invariants:
//! - a session is used for frames only after its handshake completed
//!   within [`HANDSHAKE_TIMEOUT`] and, on the accepting side, the peer's
//!   certificate was found valid for the channel's name;
//! - `plain[plain_at..]` is plaintext received and not yet read; it is
//!   drained before more ciphertext is read, so it never holds more than
//!   one socket read's worth;
//! - a record rustls refuses ends the stream (its alert is sent first, on
//!   a best-effort basis); nothing a peer sends panics the node;
//! - repeated failures are logged once per [`LOG_WINDOW`] per site, with
//!   the count of the ones not written.

use crate::net::tls::{provider, read_certs, versions, TlsAcceptor};
use crate::tls_config::{ChannelTls, TlsSettings};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore};
use std::io::{self, ErrorKind, Read, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a handshake may take before the connection is dropped.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Repeated failures of one site are logged at most once per window.
pub(crate) const LOG_WINDOW: Duration = Duration::from_secs(10);
/// Bytes of ciphertext read from the socket at a time.
const SCRATCH_BYTES: usize = 64 * 1024;
/// Plaintext handed to rustls per record batch on writes.
const WRITE_CHUNK: usize = 64 * 1024;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One cluster channel's TLS: both sides of its connections.
pub(crate) struct ChannelTlsContext {
    /// "fabric" or "heartbeat".
    pub(crate) channel: &'static str,
    /// The name both sides' certificates must be valid for.
    name: String,
    acceptor: TlsAcceptor,
    settings: TlsSettings,
    client: Mutex<Arc<ClientConfig>>,
    /// Failed inbound handshakes, logged through one limit.
    pub(crate) accept_failures: RepeatLimit,
}

impl ChannelTlsContext {
    /// Reads the entry's files; the message names the channel and the
    /// file or setting at fault.
    pub(crate) fn new(
        channel: &'static str,
        tls: &ChannelTls,
    ) -> Result<ChannelTlsContext, String> {
        let settings = tls.settings.clone();
        let failed =
            |error: String| format!("{channel} TLS ([[tls]] {:?}): {error}", settings.name);
        let acceptor = TlsAcceptor::new(settings.clone()).map_err(failed)?;
        let client = client_config(&settings).map_err(failed)?;
        Ok(ChannelTlsContext {
            channel,
            name: settings.name.clone(),
            acceptor,
            settings,
            client: Mutex::new(client),
            accept_failures: RepeatLimit::default(),
        })
    }

    /// Picks up changed certificate files (for both sides).
    fn refresh(&self) {
        if !self.acceptor.refresh() {
            return;
        }
        match client_config(&self.settings) {
            Ok(client) => *lock(&self.client) = client,
            Err(error) => tracing::warn!(
                channel = self.channel,
                "TLS certificate files changed but cannot be loaded for outgoing connections ({error}); the previous ones stay in use"
            ),
        }
    }

    /// The accepting side's handshake; the peer's certificate must be
    /// valid for the channel's name.
    pub(crate) async fn accept(&self, tcp: TcpStream) -> Result<TlsStream, String> {
        self.refresh();
        let session = self.acceptor.session().map_err(|error| error.to_string())?;
        let mut stream = TlsStream::new(tcp, Connection::Server(session));
        handshake_within(&mut stream).await?;
        if !peer_valid_for(&stream.session, &self.name) {
            return Err(format!(
                "the peer's certificate is not valid for the TLS name {:?}",
                self.name
            ));
        }
        Ok(stream)
    }

    /// The connecting side's handshake: rustls checks the peer's
    /// certificate against the CA and the channel's name.
    pub(crate) async fn connect(&self, tcp: TcpStream) -> Result<TlsStream, String> {
        self.refresh();
        let name = ServerName::try_from(self.name.clone())
            .map_err(|error| format!("tls-name {:?}: {error}", self.name))?;
        let config = lock(&self.client).clone();
        let session = ClientConnection::new(config, name).map_err(|error| error.to_string())?;
        let mut stream = TlsStream::new(tcp, Connection::Client(session));
        handshake_within(&mut stream).await?;
        Ok(stream)
    }
}

async fn handshake_within(stream: &mut TlsStream) -> Result<(), String> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.handshake()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(explained(&error)),
        Err(_) => Err(format!(
            "no handshake within {} ms",
            HANDSHAKE_TIMEOUT.as_millis()
        )),
    }
}

/// A handshake error, with what an alert from the peer most likely means.
fn explained(error: &io::Error) -> String {
    let text = error.to_string();
    if text.starts_with("received fatal alert") {
        format!("{text} (the peer refused this node's certificate: most likely it trusts another CA, or the certificate is not valid for the TLS name)")
    } else {
        text
    }
}

/// Whether the session's peer certificate is valid for `name`.
fn peer_valid_for(session: &Connection, name: &str) -> bool {
    let Some(cert) = session.peer_certificates().and_then(|certs| certs.first()) else {
        return false;
    };
    let Ok(cert) = webpki::EndEntityCert::try_from(cert) else {
        return false;
    };
    ServerName::try_from(name)
        .is_ok_and(|name| cert.verify_is_valid_for_subject_name(&name).is_ok())
}

/// The connecting side's configuration: the entry's CA as the only roots,
/// its certificate and key as the client certificate.
fn client_config(settings: &TlsSettings) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(provider(&settings.cipher_suites)?);
    let Some(ca_file) = &settings.ca_file else {
        return Err("ca-file is required between nodes".to_owned());
    };
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca_file)? {
        roots
            .add(cert)
            .map_err(|error| format!("ca-file {}: {error}", ca_file.display()))?;
    }
    let certs = read_certs(&settings.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&settings.key_file)
        .map_err(|error| format!("key-file {}: {error}", settings.key_file.display()))?;
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions(settings))
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|error| format!("cert-file/key-file: {error}"))?;
    Ok(Arc::new(config))
}

/// A rustls session over a tokio socket.
pub(crate) struct TlsStream {
    tcp: TcpStream,
    session: Connection,
    scratch: Box<[u8]>,
    plain: Vec<u8>,
    plain_at: usize,
    /// The peer sent close_notify.
    closed: bool,
    /// Ciphertext on its way out.
    out: Vec<u8>,
}

impl TlsStream {
    fn new(tcp: TcpStream, mut session: Connection) -> TlsStream {
        // Writes are handed over in bounded chunks and flushed at once.
        session.set_buffer_limit(None);
        TlsStream {
            tcp,
            session,
            scratch: vec![0; SCRATCH_BYTES].into_boxed_slice(),
            plain: Vec::new(),
            plain_at: 0,
            closed: false,
            out: Vec::new(),
        }
    }

    async fn handshake(&mut self) -> io::Result<()> {
        while self.session.is_handshaking() {
            self.flush().await?;
            if self.session.is_handshaking() {
                self.receive().await?;
            }
        }
        self.flush().await
    }

    /// Fills `buf` with plaintext.
    pub(crate) async fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let mut filled = 0;
        loop {
            let available = &self.plain[self.plain_at..];
            let taken = available.len().min(buf.len() - filled);
            buf[filled..filled + taken].copy_from_slice(&available[..taken]);
            filled += taken;
            self.plain_at += taken;
            if self.plain_at == self.plain.len() {
                self.plain.clear();
                self.plain_at = 0;
            }
            if filled == buf.len() {
                return Ok(());
            }
            if self.closed {
                return Err(ErrorKind::UnexpectedEof.into());
            }
            self.receive().await?;
        }
    }

    /// Sends `bytes` as TLS records.
    pub(crate) async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        for chunk in bytes.chunks(WRITE_CHUNK) {
            self.session.writer().write_all(chunk)?;
            self.flush().await?;
        }
        Ok(())
    }

    /// Sends whatever rustls has queued.
    async fn flush(&mut self) -> io::Result<()> {
        while self.session.wants_write() {
            self.out.clear();
            self.session.write_tls(&mut self.out)?;
            self.tcp.write_all(&self.out).await?;
        }
        Ok(())
    }

    /// Reads one batch of ciphertext, processes it, and keeps the
    /// plaintext it carried.
    async fn receive(&mut self) -> io::Result<()> {
        let read = self.tcp.read(&mut self.scratch).await?;
        if read == 0 {
            return Err(io::Error::new(
                ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ));
        }
        let mut offset = 0;
        while offset < read {
            let mut incoming = &self.scratch[offset..read];
            let taken = self.session.read_tls(&mut incoming)?;
            if taken == 0 {
                // Never expected with the plaintext drained: a guard
                // against spinning.
                return Err(io::Error::new(
                    ErrorKind::InvalidData,
                    "TLS input not taken",
                ));
            }
            offset += taken;
            if let Err(error) = self.session.process_new_packets() {
                // The alert rustls queued tells the peer why.
                let _ = self.flush().await;
                return Err(io::Error::new(ErrorKind::InvalidData, error));
            }
            self.drain_plaintext()?;
        }
        Ok(())
    }

    /// Moves the plaintext rustls holds into `plain`.
    fn drain_plaintext(&mut self) -> io::Result<()> {
        loop {
            let start = self.plain.len();
            self.plain.resize(start + 16 * 1024, 0);
            let result = self.session.reader().read(&mut self.plain[start..]);
            let read = match result {
                Ok(read) => read,
                Err(error) => {
                    self.plain.truncate(start);
                    return match error.kind() {
                        ErrorKind::WouldBlock => Ok(()),
                        _ => Err(error),
                    };
                }
            };
            self.plain.truncate(start + read);
            if read == 0 {
                self.closed = true;
                return Ok(());
            }
        }
    }
}

/// The read buffer of a plain cluster connection (the TLS stream reads as
/// much per socket read).
pub(crate) const PLAIN_READ_BUFFER: usize = 64 * 1024;

/// A cluster connection: plain TCP or TLS.
pub(crate) enum PeerStream {
    Plain(tokio::io::BufReader<TcpStream>),
    Tls(Box<TlsStream>),
}

impl PeerStream {
    /// A plain connection, its reads buffered.
    pub(crate) fn plain(stream: TcpStream) -> PeerStream {
        PeerStream::Plain(tokio::io::BufReader::with_capacity(
            PLAIN_READ_BUFFER,
            stream,
        ))
    }

    pub(crate) async fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        match self {
            PeerStream::Plain(stream) => stream.read_exact(buf).await.map(|_| ()),
            PeerStream::Tls(stream) => stream.read_exact(buf).await,
        }
    }

    pub(crate) async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            PeerStream::Plain(stream) => stream.write_all(bytes).await,
            PeerStream::Tls(stream) => stream.write_all(bytes).await,
        }
    }
}

/// Limits one log site's repeated lines: a line is written when its text
/// differs from the last written one or [`LOG_WINDOW`] has passed since;
/// the others are counted and the count goes with the next line written.
#[derive(Default)]
pub(crate) struct RepeatLimit {
    state: Mutex<Option<(String, Instant, u64)>>,
}

impl RepeatLimit {
    /// `Some(suppressed since the last line)` when `text` is to be
    /// written now.
    pub(crate) fn admit(&self, text: &str) -> Option<u64> {
        let mut state = lock(&self.state);
        let now = Instant::now();
        match state.as_mut() {
            Some((last, at, suppressed))
                if last == text && now.duration_since(*at) < LOG_WINDOW =>
            {
                *suppressed += 1;
                None
            }
            _ => {
                let suppressed = state.as_ref().map_or(0, |(_, _, count)| *count);
                *state = Some((text.to_owned(), now, 0));
                Some(suppressed)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls_config::{ClientAuth, Protocol};
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    use std::path::Path;

    /// A CA and a node certificate for "localhost" (both uses) in `dir`,
    /// and one for "other" from the same CA in `dir/other`.
    #[allow(clippy::unwrap_used)]
    fn write_node_certs(dir: &Path) {
        std::fs::create_dir_all(dir.join("other")).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        for (name, place) in [("localhost", dir.to_owned()), ("other", dir.join("other"))] {
            let key = KeyPair::generate().unwrap();
            let mut node = CertificateParams::new(vec![name.to_owned()]).unwrap();
            node.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let node = node.signed_by(&key, &issuer).unwrap();
            std::fs::write(place.join("ca.pem"), ca_cert.pem()).unwrap();
            std::fs::write(place.join("node.pem"), node.pem()).unwrap();
            std::fs::write(place.join("node.key"), key.serialize_pem()).unwrap();
        }
    }

    fn context(dir: &Path) -> Result<ChannelTlsContext, String> {
        let settings = TlsSettings {
            port: 1,
            name: "localhost".to_owned(),
            cert_file: dir.join("node.pem"),
            key_file: dir.join("node.key"),
            ca_file: Some(dir.join("ca.pem")),
            protocols: vec![Protocol::Tls12, Protocol::Tls13],
            cipher_suites: Vec::new(),
            client_auth: ClientAuth::Names(vec!["localhost".to_owned()]),
        };
        let tls = ChannelTls {
            address: "127.0.0.1".to_owned(),
            settings,
        };
        ChannelTlsContext::new("fabric", &tls)
    }

    /// Connects a `client` context to an `server` one over loopback:
    /// (the connecting side's result, the accepting side's).
    async fn pair(
        client: &ChannelTlsContext,
        server: &ChannelTlsContext,
    ) -> (Result<TlsStream, String>, Result<TlsStream, String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|error| panic!("{error}"));
        let address = listener
            .local_addr()
            .unwrap_or_else(|error| panic!("{error}"));
        let accepting = async {
            let (tcp, _) = listener
                .accept()
                .await
                .unwrap_or_else(|error| panic!("{error}"));
            server.accept(tcp).await
        };
        let connecting = async {
            let tcp = TcpStream::connect(address)
                .await
                .unwrap_or_else(|error| panic!("{error}"));
            client.connect(tcp).await
        };
        tokio::join!(connecting, accepting)
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn frames_of_any_size_cross_and_a_stranger_is_refused() {
        let dir =
            std::env::temp_dir().join(format!("citrine-cluster-tls-unit-{}", std::process::id()));
        write_node_certs(&dir.join("a"));
        write_node_certs(&dir.join("b"));
        let (a, b) = (
            context(&dir.join("a")).unwrap(),
            context(&dir.join("b")).unwrap(),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (client, server) = pair(&a, &a).await;
            let (mut client, mut server) = (client.unwrap(), server.unwrap());
            // Larger than a record, a write chunk and a socket read.
            let big: Vec<u8> = (0..3_000_017u32).map(|at| (at % 251) as u8).collect();
            let sending = async {
                client.write_all(b"small").await.unwrap();
                client.write_all(&big).await.unwrap();
                client.write_all(b"!").await.unwrap();
            };
            let receiving = async {
                let mut small = [0u8; 5];
                server.read_exact(&mut small).await.unwrap();
                let mut received = vec![0u8; big.len() + 1];
                server.read_exact(&mut received).await.unwrap();
                (small, received)
            };
            let ((), (small, received)) = tokio::join!(sending, receiving);
            assert_eq!(&small, b"small");
            assert_eq!(&received[..big.len()], &big[..]);
            assert_eq!(received[big.len()], b'!');
            // Certificates of another CA: refused by both sides.
            let (client, server) = pair(&b, &a).await;
            assert!(client.is_err(), "the connecting stranger trusted the node");
            let error = server.err().expect("the node accepted a stranger");
            assert!(error.contains("alert"), "{error}");
            // The right CA but a certificate for another name: the
            // accepting side refuses it.
            let other = context(&dir.join("a/other")).unwrap();
            let (_, server) = pair(&other, &a).await;
            let error = server.err().expect("the node accepted another name");
            assert!(error.contains("not valid for the TLS name"), "{error}");
            // Plain bytes on the TLS port: refused, nothing else happens.
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let mut plain = TcpStream::connect(address).await.unwrap();
            plain
                .write_all(&[0, 0, 0, 9, 1, 0, 0, 0, 0, 0, 0, 0, 1])
                .await
                .unwrap();
            let (tcp, _) = listener.accept().await.unwrap();
            assert!(a.accept(tcp).await.is_err());
            // Files replaced (here by the other CA's): the next connection
            // uses them, on both sides of it.
            for name in ["ca.pem", "node.pem", "node.key"] {
                let staged = dir.join("a").join(format!("{name}.new"));
                std::fs::copy(dir.join("b").join(name), &staged).unwrap();
                std::fs::rename(&staged, dir.join("a").join(name)).unwrap();
            }
            let (client, server) = pair(&a, &b).await;
            assert!(client.is_ok() && server.is_ok(), "{:?}", client.err());
            let (client, server) = pair(&b, &a).await;
            assert!(client.is_ok() && server.is_ok(), "{:?}", server.err());
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn repeated_lines_are_counted_not_written() {
        let limit = RepeatLimit::default();
        assert_eq!(limit.admit("a"), Some(0));
        assert_eq!(limit.admit("a"), None);
        assert_eq!(limit.admit("a"), None);
        // A different text is written at once, with the count.
        assert_eq!(limit.admit("b"), Some(2));
        assert_eq!(limit.admit("b"), None);
    }
}
