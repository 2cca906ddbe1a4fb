//! PKI login against a real citrined with access control and TLS on, with
//! the certificates `citrine certs` writes: a client whose certificate's
//! common name (`client`) names a user logs in over TLS with a LOGIN
//! without fields (the clients' PKI auth mode), no password, and its
//! session token authenticates its next connection; the same LOGIN on the
//! plain port, with no certificate, is refused.
//!
//! The `citrine` CLI is found beside citrined (`cargo test --workspace`
//! builds both); missing = failure.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_client::admin::{hash_password, request, roles_data};
use citrine_wire::admin::{command, field};
use common::{connect, free_port, round_trip, write_request, Server};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

type TlsStream = StreamOwned<ClientConnection, TcpStream>;

/// Runs `citrine certs DIR`.
fn citrine_certs(dir: &Path) {
    let cli = Path::new(common::binary()).with_file_name("citrine");
    assert!(
        cli.exists(),
        "{} not built (cargo build -p citrine-cli)",
        cli.display()
    );
    let status = Command::new(&cli)
        .arg("certs")
        .arg(dir)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
}

fn start(dir: &Path, tls_port: u16) -> Server {
    let config = dir.join("citrine.toml");
    std::fs::write(
        &config,
        "[service]\ntls-name = \"localhost\"\ntls-authenticate-client = \"any\"\n\
         [[tls]]\nname = \"localhost\"\ncert-file = \"tls/node.pem\"\nkey-file = \"tls/node.key\"\n\
         ca-file = \"tls/ca.pem\"\n[security]\n[[namespace]]\nname = \"test\"\n",
    )
    .unwrap();
    let port = free_port();
    let child = Command::new(common::binary())
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir)
        .args([
            "--port",
            &port.to_string(),
            "--tls-port",
            &tls_port.to_string(),
        ])
        .args(["--fabric-port", &free_port().to_string()])
        .args(["--heartbeat-port", &free_port().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut server = Server { child, port };
    common::wait_until_serving(&mut server.child, port, Duration::from_secs(20));
    server
}

/// A TLS connection presenting `tls/client.pem`, verifying the node
/// against `tls/ca.pem` for the name `localhost`.
fn tls_connect(tls: &Path, port: u16) -> TlsStream {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(tls.join("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let certs = CertificateDer::pem_file_iter(tls.join("client.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(tls.join("client.key")).unwrap();
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .unwrap();
    let socket = TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    StreamOwned::new(
        ClientConnection::new(Arc::new(config), name).unwrap(),
        socket,
    )
}

/// Sends a frame over TLS; the reply's body.
fn tls_round_trip(stream: &mut TlsStream, frame: &[u8]) -> Vec<u8> {
    stream.write_all(frame).unwrap();
    let mut header = [0u8; 8];
    stream.read_exact(&mut header).unwrap();
    let size = u64::from_be_bytes(header) & 0xFFFF_FFFF_FFFF;
    let mut body = vec![0u8; size as usize];
    stream.read_exact(&mut body).unwrap();
    body
}

/// The value of field `id` in an admin reply's body (one record).
fn reply_field(body: &[u8], id: u8) -> Option<Vec<u8>> {
    let mut at = 16;
    while at + 5 <= body.len() {
        let size = u32::from_be_bytes(body[at..at + 4].try_into().unwrap()) as usize;
        let (kind, data) = (body[at + 4], &body[at + 5..at + 4 + size]);
        if kind == id {
            return Some(data.to_vec());
        }
        at += 4 + size;
    }
    None
}

#[test]
fn a_client_certificate_naming_a_user_logs_it_in_without_a_password() {
    let dir = std::env::temp_dir().join(format!(
        "citrine-pki-{}-{}",
        std::process::id(),
        free_port()
    ));
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    citrine_certs(&tls);
    let tls_port = free_port();
    let server = start(&dir, tls_port);

    // admin creates the user the client certificate names.
    let mut plain = connect(server.port);
    let credential = hash_password("admin").unwrap();
    let login = request(
        command::LOGIN,
        &[(field::USER, b"admin"), (field::CREDENTIAL, &credential)],
    );
    assert_eq!(round_trip(&mut plain, &login).unwrap().1[1], 0);
    let password = hash_password("never-used").unwrap();
    let roles = roles_data(&["read-write".to_owned()]);
    let create = request(
        command::CREATE_USER,
        &[
            (field::USER, b"client"),
            (field::PASSWORD, &password),
            (field::ROLES, &roles),
        ],
    );
    assert_eq!(round_trip(&mut plain, &create).unwrap().1[1], 0);

    // Without a certificate (the plain port) a LOGIN without fields fails.
    let pki_login = request(command::LOGIN, &[]);
    let mut other = connect(server.port);
    assert_eq!(round_trip(&mut other, &pki_login).unwrap().1[1], 65);

    // Over TLS with the client certificate: no password, a token.
    let write = write_request("test", "pki", &[(2, 3, "b", b"v".to_vec())]);
    let mut first = tls_connect(&tls, tls_port);
    assert_eq!(tls_round_trip(&mut first, &write)[5], 80);
    let reply = tls_round_trip(&mut first, &pki_login);
    assert_eq!(reply[1], 0);
    let token = reply_field(&reply, field::SESSION_TOKEN).expect("a session token");
    assert_eq!(tls_round_trip(&mut first, &write)[5], 0);

    // The token alone authenticates the next connection (PKI AUTHENTICATE).
    let mut second = tls_connect(&tls, tls_port);
    let authenticate = request(command::AUTHENTICATE, &[(field::SESSION_TOKEN, &token)]);
    assert_eq!(tls_round_trip(&mut second, &authenticate)[1], 0);
    assert_eq!(tls_round_trip(&mut second, &write)[5], 0);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
