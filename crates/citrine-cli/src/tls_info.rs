//! Info commands over TLS, for `citrine info --tls-name NAME`: one
//! blocking connection (rustls over a std socket, on a blocking-task
//! thread) that verifies the node's certificate for `NAME` against
//! `--tls-ca-file`, and presents a client certificate when one is given
//! (for nodes with `tls-authenticate-client`).

use citrine_wire::frame::{MessageType, ProtoHeader, PROTO_HEADER_SIZE};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How to reach a node's TLS port.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Talk TLS, checking the node's certificate for this name (the
    /// node's tls-name); -h then names its TLS port.
    #[arg(long = "tls-name", value_name = "NAME")]
    pub tls_name: Option<String>,
    /// CA certificates (PEM) the node's certificate must chain to.
    #[arg(long = "tls-ca-file", value_name = "FILE", requires = "tls_name")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM), for nodes that authenticate clients.
    #[arg(long = "tls-cert-file", value_name = "FILE", requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long = "tls-key-file", value_name = "FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
}

/// Runs `commands` on `host` over TLS, logged in first as `credentials`
/// when given; the answers in order.
pub async fn info(
    host: &str,
    commands: &[&str],
    timeout: Duration,
    tls: &TlsArgs,
    credentials: Option<&citrine_client::admin::Credentials>,
) -> Result<Vec<(String, String)>, String> {
    let config = client_config(tls)?;
    let name = tls.tls_name.clone().unwrap_or_default();
    let host = host.to_owned();
    let login = match credentials {
        Some(credentials) => Some(login_frame(credentials)?),
        None => None,
    };
    let request = citrine_wire::info::request_frame(commands);
    tokio::task::spawn_blocking(move || {
        exchange(&host, &name, config, (login.as_deref(), &request), timeout)
    })
    .await
    .map_err(|error| format!("TLS info task failed: {error}"))?
}

/// The LOGIN admin request for `credentials` (the password hashed as the
/// clients hash it).
fn login_frame(credentials: &citrine_client::admin::Credentials) -> Result<Vec<u8>, String> {
    use citrine_wire::admin::{command, field};
    let hash = citrine_client::admin::hash_password(&credentials.password)
        .map_err(|error| error.to_string())?;
    Ok(citrine_client::admin::request(
        command::LOGIN,
        &[
            (field::USER, credentials.user.as_bytes()),
            (field::CREDENTIAL, &hash),
        ],
    ))
}

fn client_config(tls: &TlsArgs) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    let Some(ca_file) = &tls.ca_file else {
        return Err(
            "--tls-name needs --tls-ca-file (the CA the node's certificate chains to)".into(),
        );
    };
    for cert in read_certs(ca_file)? {
        roots
            .add(cert)
            .map_err(|error| format!("{}: {error}", ca_file.display()))?;
    }
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots);
    let config = match (&tls.cert_file, &tls.key_file) {
        (Some(cert_file), Some(key_file)) => {
            let key = PrivateKeyDer::from_pem_file(key_file)
                .map_err(|error| format!("{}: {error}", key_file.display()))?;
            builder
                .with_client_auth_cert(read_certs(cert_file)?, key)
                .map_err(|error| format!("{}: {error}", cert_file.display()))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect())
        .map_err(|error| format!("{}: {error}", path.display()))
}

/// Connects, logs in when `login` is given, sends the info request and
/// reads its answer.
fn exchange(
    host: &str,
    name: &str,
    config: Arc<ClientConfig>,
    (login, request): (Option<&[u8]>, &[u8]),
    timeout: Duration,
) -> Result<Vec<(String, String)>, String> {
    let cannot = |error: std::io::Error| format!("cannot talk TLS to {host}: {error}");
    let address = address_of(host)?;
    let socket = TcpStream::connect_timeout(&address, timeout).map_err(cannot)?;
    socket.set_read_timeout(Some(timeout)).map_err(cannot)?;
    socket.set_write_timeout(Some(timeout)).map_err(cannot)?;
    let server_name = ServerName::try_from(name.to_owned())
        .map_err(|error| format!("--tls-name {name:?}: {error}"))?;
    let session = ClientConnection::new(config, server_name)
        .map_err(|error| format!("cannot start a TLS session: {error}"))?;
    let mut stream = StreamOwned::new(session, socket);
    if let Some(login) = login {
        logged_in(&mut stream, login, host)?;
    }
    stream.write_all(request).map_err(cannot)?;
    let mut header = [0u8; PROTO_HEADER_SIZE];
    stream.read_exact(&mut header).map_err(cannot)?;
    let header = ProtoHeader::decode(&header)
        .map_err(|error| format!("{host} answered a bad header: {error}"))?;
    if header.message_type != MessageType::Info {
        return Err(format!(
            "{host} answered with type {:?}",
            header.message_type
        ));
    }
    let size = usize::try_from(header.size).map_err(|_| format!("{host}: answer too large"))?;
    let mut body = vec![0u8; size];
    stream.read_exact(&mut body).map_err(cannot)?;
    // A refused request is answered by one bare error line (no command
    // echoed), e.g. `ERROR:80:not authenticated`.
    let text = String::from_utf8_lossy(&body);
    if text.starts_with("ERROR:") && !text.contains('\t') {
        return Err(format!("{host} refused the request: {}", text.trim()));
    }
    Ok(citrine_wire::info::parse_response(&body))
}

/// Sends LOGIN and reads its answer: the proto header and the 16-byte
/// admin header (result at its second byte), then the fields of a success
/// (the session token, not kept: one request follows). 52 (security not
/// enabled) counts as logged in, as the clients take it.
fn logged_in<S: Read + Write>(stream: &mut S, login: &[u8], host: &str) -> Result<(), String> {
    let cannot = |error: std::io::Error| format!("cannot log in over TLS to {host}: {error}");
    stream.write_all(login).map_err(cannot)?;
    let mut head = [0u8; PROTO_HEADER_SIZE + 16];
    stream.read_exact(&mut head).map_err(cannot)?;
    let header = ProtoHeader::decode(&head[..PROTO_HEADER_SIZE].try_into().unwrap_or([0; 8]))
        .map_err(|error| format!("{host} answered LOGIN with a bad header: {error}"))?;
    let result = head[PROTO_HEADER_SIZE + 1];
    if result != 0 && result != 52 {
        return Err(format!("{host} refused the login: result {result}"));
    }
    let rest = usize::try_from(header.size.saturating_sub(16))
        .ok()
        .filter(|rest| *rest <= 1 << 20)
        .ok_or_else(|| format!("{host}: LOGIN answer too large"))?;
    let mut fields = vec![0u8; rest];
    stream.read_exact(&mut fields).map_err(cannot)
}

/// `HOST[:PORT]` (default port 4333, the reference's TLS service port).
fn address_of(host: &str) -> Result<std::net::SocketAddr, String> {
    let (name, port) = citrine_client::peers::parse_host(host, 4333)?;
    (name.as_str(), port)
        .to_socket_addrs()
        .map_err(|error| format!("cannot resolve {host}: {error}"))?
        .next()
        .ok_or_else(|| format!("{host} resolves to no address"))
}
