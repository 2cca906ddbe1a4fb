//! The TLS service port against a real citrined, with both socket I/O
//! backends: info over TLS verified against the node's CA, bad input on
//! either port closing only that connection, certificates reloaded when
//! their files change, and client certificates when the node asks for
//! them.

#![allow(clippy::unwrap_used)]

mod common;

use common::tls::write_certs;
use common::{free_port, Server};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A node with a TLS port whose files are `tls/` under its data
/// directory; `authenticate` is its `tls-authenticate-client`.
struct TlsNode {
    server: Server,
    tls_port: u16,
    data: tempdir::Dir,
}

mod tempdir {
    /// A directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(tag: &str) -> Dir {
            let path = std::env::temp_dir().join(format!(
                "citrine-tls-{tag}-{}-{}",
                std::process::id(),
                super::free_port()
            ));
            std::fs::create_dir_all(&path).unwrap();
            Dir(path)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn start_tls(io: &str, authenticate: &str) -> TlsNode {
    let data = tempdir::Dir::new(io);
    write_certs(&data.0.join("tls"));
    let config = data.0.join("citrine.toml");
    std::fs::write(
        &config,
        format!(
            "[service]\ntls-name = \"node\"\ntls-authenticate-client = \"{authenticate}\"\n\
             [[tls]]\nname = \"node\"\ncert-file = \"tls/node.pem\"\nkey-file = \"tls/node.key\"\n\
             ca-file = \"tls/ca.pem\"\n[[namespace]]\nname = \"test\"\n"
        ),
    )
    .unwrap();
    let (port, tls_port) = (free_port(), free_port());
    let child = Command::new(common::binary())
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(&data.0)
        .args(["--service-io", io, "--tls-port", &tls_port.to_string()])
        .args(["--port", &port.to_string()])
        .args(["--fabric-port", &free_port().to_string()])
        .args(["--heartbeat-port", &free_port().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut server = Server { child, port };
    common::wait_until_serving(&mut server.child, port, Duration::from_secs(20));
    TlsNode {
        server,
        tls_port,
        data,
    }
}

fn client_config(ca: &Path, client_cert: Option<&Path>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
    let config = match client_cert {
        Some(dir) => {
            let certs = CertificateDer::pem_file_iter(dir.join("client.pem"))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(dir.join("client.key")).unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// An info request over TLS to `port`; the answer's body, or the error
/// that ended the exchange.
fn tls_info(port: u16, config: Arc<ClientConfig>, command: &str) -> std::io::Result<String> {
    let socket = TcpStream::connect(("127.0.0.1", port))?;
    socket.set_read_timeout(Some(Duration::from_secs(10)))?;
    let name = ServerName::try_from("localhost").unwrap();
    let session = ClientConnection::new(config, name).unwrap();
    let mut stream = StreamOwned::new(session, socket);
    stream.write_all(&citrine_wire::info::request_frame(&[command]))?;
    let mut header = [0u8; 8];
    stream.read_exact(&mut header)?;
    let size = u64::from_be_bytes(header) & 0xFFFF_FFFF_FFFF;
    let mut body = vec![0u8; size as usize];
    stream.read_exact(&mut body)?;
    Ok(String::from_utf8(body).unwrap())
}

/// Several info requests written at once over TLS (they arrive in one
/// record): the answers' bodies, in order.
fn tls_info_pipelined(port: u16, config: Arc<ClientConfig>, commands: &[&str]) -> Vec<String> {
    let socket = TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut stream = StreamOwned::new(ClientConnection::new(config, name).unwrap(), socket);
    let requests: Vec<u8> = commands
        .iter()
        .flat_map(|command| citrine_wire::info::request_frame(&[command]))
        .collect();
    stream.write_all(&requests).unwrap();
    commands
        .iter()
        .map(|_| {
            let mut header = [0u8; 8];
            stream.read_exact(&mut header).unwrap();
            let size = u64::from_be_bytes(header) & 0xFFFF_FFFF_FFFF;
            let mut body = vec![0u8; size as usize];
            stream.read_exact(&mut body).unwrap();
            String::from_utf8(body).unwrap()
        })
        .collect()
}

/// A plain info request on `port`: its answer body.
fn plain_info(port: u16, command: &str) -> String {
    let mut stream = common::connect(port);
    stream
        .write_all(&citrine_wire::info::request_frame(&[command]))
        .unwrap();
    let mut header = [0u8; 8];
    stream.read_exact(&mut header).unwrap();
    let size = u64::from_be_bytes(header) & 0xFFFF_FFFF_FFFF;
    let mut body = vec![0u8; size as usize];
    stream.read_exact(&mut body).unwrap();
    String::from_utf8(body).unwrap()
}

/// Reads until the peer closes (Ok) or `within` passes (Err).
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut sink = [0u8; 4096];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) => return error.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

fn backends() -> [&'static str; 2] {
    ["epoll", common::io_uring_or_auto()]
}

#[test]
fn info_over_tls_is_answered_and_verified_against_the_ca() {
    for io in backends() {
        let node = start_tls(io, "false");
        let ca = node.data.0.join("tls/ca.pem");
        let answer = tls_info(node.tls_port, client_config(&ca, None), "service-tls-std").unwrap();
        assert_eq!(
            answer,
            format!("service-tls-std\t127.0.0.1:{}\n", node.tls_port)
        );
        let peers = tls_info(node.tls_port, client_config(&ca, None), "peers-tls-std").unwrap();
        assert!(
            peers.ends_with(&format!(",{},[]\n", node.tls_port)),
            "{io}: {peers}"
        );
        let commands = ["build", "node", "service-tls-std", "namespaces"];
        let answers = tls_info_pipelined(node.tls_port, client_config(&ca, None), &commands);
        for (command, answer) in commands.iter().zip(&answers) {
            assert!(
                answer.starts_with(&format!("{command}\t")),
                "{io}: {answer}"
            );
        }
        // A CA the node's certificate does not chain to: refused.
        let other = tempdir::Dir::new("other-ca");
        write_certs(&other.0);
        let wrong = client_config(&other.0.join("ca.pem"), None);
        assert!(tls_info(node.tls_port, wrong, "node").is_err(), "{io}");
        // The plain port still answers, and says where TLS is.
        let plain = plain_info(node.server.port, "service-tls-std");
        assert_eq!(
            plain,
            format!("service-tls-std\t127.0.0.1:{}\n", node.tls_port)
        );
    }
}

#[test]
fn bad_input_on_either_port_closes_only_that_connection() {
    for io in backends() {
        let node = start_tls(io, "false");
        let ca = node.data.0.join("tls/ca.pem");
        // Held open, half a handshake: it must not hold up anyone else.
        let mut stalled = TcpStream::connect(("127.0.0.1", node.tls_port)).unwrap();
        stalled
            .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
            .unwrap();
        // A TLS handshake on the plain port.
        let on_plain = tls_info(node.server.port, client_config(&ca, None), "node");
        assert!(on_plain.is_err(), "{io}: {on_plain:?}");
        // Plain bytes (an info request) on the TLS port.
        let mut plain_on_tls = TcpStream::connect(("127.0.0.1", node.tls_port)).unwrap();
        plain_on_tls
            .write_all(&citrine_wire::info::request_frame(&["node"]))
            .unwrap();
        assert!(
            closed_within(&mut plain_on_tls, Duration::from_secs(10)),
            "{io}: plain bytes on the TLS port are not closed"
        );
        // Everyone else is served, on both ports.
        let node_id = plain_info(node.server.port, "node");
        assert!(node_id.starts_with("node\t"), "{io}: {node_id}");
        let over_tls = tls_info(node.tls_port, client_config(&ca, None), "node").unwrap();
        assert_eq!(over_tls, node_id, "{io}");
        drop(stalled);
    }
}

#[test]
fn changed_certificate_files_are_used_for_new_connections() {
    let node = start_tls("epoll", "false");
    let tls_dir = node.data.0.join("tls");
    let old_ca = node.data.0.join("old-ca.pem");
    std::fs::copy(tls_dir.join("ca.pem"), &old_ca).unwrap();
    assert!(tls_info(node.tls_port, client_config(&old_ca, None), "node").is_ok());
    // New CA and node certificate in place of the old files.
    write_certs(&tls_dir);
    let new_ca = tls_dir.join("ca.pem");
    let deadline = Instant::now() + Duration::from_secs(10);
    while tls_info(node.tls_port, client_config(&new_ca, None), "node").is_err() {
        assert!(
            Instant::now() < deadline,
            "the new certificate was not loaded"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(tls_info(node.tls_port, client_config(&old_ca, None), "node").is_err());
}

#[test]
fn client_certificates_are_required_and_their_names_checked_when_asked() {
    for (authenticate, named_ok) in [("any", true), ("client", true), ("someone-else", false)] {
        let node = start_tls("epoll", authenticate);
        let tls_dir = node.data.0.join("tls");
        let ca = tls_dir.join("ca.pem");
        let without = tls_info(node.tls_port, client_config(&ca, None), "node");
        assert!(
            without.is_err(),
            "{authenticate}: served with no client certificate"
        );
        let with = tls_info(node.tls_port, client_config(&ca, Some(&tls_dir)), "node");
        assert_eq!(with.is_ok(), named_ok, "{authenticate}: {with:?}");
    }
}

/// In a cluster every node lists the others' TLS ports in `peers-tls-std`
/// (each says its own in its fabric hello), with their TLS names, so a TLS
/// client seeded with one node finds the rest.
#[test]
fn peers_tls_std_lists_the_other_nodes_tls_ports() {
    use common::cluster::{wait_for_cluster, Node};
    let mut nodes: Vec<Node> = (0x71..0x73).map(Node::new).collect();
    let mut tls_ports = Vec::new();
    for node in &mut nodes {
        let data = std::env::temp_dir().join(format!("citrine-tls-peers-{}", node.port));
        common::tls::write_certs(&data.join("tls"));
        let tls_port = free_port();
        let config = format!(
            "[service]\naddress = \"127.0.0.1\"\ntls-port = {tls_port}\ntls-name = \"localhost\"\n\n\
             [[tls]]\nname = \"localhost\"\ncert-file = \"tls/node.pem\"\nkey-file = \"tls/node.key\"\n\n\
             [[namespace]]\nname = \"test\"\nreplication-factor = 2\n"
        );
        let path = data.join("node.toml");
        std::fs::write(&path, config).unwrap();
        node.config = Some(path);
        node.data_dir = Some(data);
        tls_ports.push(tls_port);
    }
    let seed = nodes[0].heartbeat_address();
    nodes[0].start(&seed);
    nodes[1].start(&seed);
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&group, 2, std::time::Duration::from_secs(20));
    for (index, node) in nodes.iter().enumerate() {
        let other = 1 - index;
        let expected = format!(
            "[{},localhost,[127.0.0.1:{}]]",
            nodes[other].id, tls_ports[other]
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let answer = node.info_value("peers-tls-std").unwrap_or_default();
            if answer.contains(&expected) {
                assert!(
                    answer.contains(&format!(",{},[", tls_ports[index])),
                    "{answer}"
                );
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{answer} lacks {expected}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    for node in &nodes {
        if let Some(data) = &node.data_dir {
            let _ = std::fs::remove_dir_all(data);
        }
    }
}
