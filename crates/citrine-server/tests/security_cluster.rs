//! Users and roles shared by a real two-node cluster with access control
//! on: a user created on each node at the same moment ends up on both
//! (each user is versioned on its own, so neither change replaces the
//! other), and a user dropped on one node is gone from the other.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_client::admin::{hash_password, request, roles_data};
use citrine_wire::admin::{command, field};
use common::cluster::Node;
use common::{info, round_trip, workspace_root};
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The result code of an admin request.
fn admin(stream: &mut TcpStream, command: u8, fields: &[(u8, &[u8])]) -> u8 {
    round_trip(stream, &request(command, fields)).unwrap().1[1]
}

fn login(stream: &mut TcpStream, user: &str, password: &str) -> u8 {
    let credential = hash_password(password).unwrap();
    admin(
        stream,
        command::LOGIN,
        &[
            (field::USER, user.as_bytes()),
            (field::CREDENTIAL, &credential),
        ],
    )
}

/// A connection to `node` logged in as admin.
fn admin_connection(node: &Node) -> TcpStream {
    let mut stream = node.connect();
    assert_eq!(login(&mut stream, "admin", "admin"), 0);
    stream
}

/// Waits until both nodes see a cluster of two.
fn wait_for_two(nodes: &[&Node]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut streams: Vec<TcpStream> = nodes.iter().map(|node| admin_connection(node)).collect();
    loop {
        let sizes: Vec<String> = streams
            .iter_mut()
            .map(|stream| info(stream, &["cluster-info"])[0].1.clone())
            .collect();
        if sizes.iter().all(|text| text.contains("cluster_size=2")) {
            return;
        }
        assert!(Instant::now() < deadline, "no cluster of two: {sizes:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (up to 10 s) until logging in as `user` on `node` answers `code`.
fn wait_for_login(node: &Node, user: &str, code: u8) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut stream = node.connect();
        let answer = login(&mut stream, user, "pw");
        if answer == code {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "login of {user} on node {} answers {answer}, not {code}",
            node.id
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn users_created_on_two_nodes_at_once_both_reach_both() {
    let directory =
        std::env::temp_dir().join(format!("citrine-security-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let base = std::fs::read_to_string(workspace_root().join("examples/cluster.toml")).unwrap();
    let config = directory.join("citrine.toml");
    std::fs::write(&config, format!("[security]\n{base}")).unwrap();
    let mut nodes: Vec<Node> = (0..2).map(|index| Node::new(0x50 + index)).collect();
    for (index, node) in nodes.iter_mut().enumerate() {
        node.config = Some(config.clone());
        let data = directory.join(format!("node{index}"));
        std::fs::create_dir_all(&data).unwrap();
        node.data_dir = Some(data);
    }
    let seed = nodes[0].heartbeat_address();
    nodes[0].start(&seed);
    let seed = nodes[0].heartbeat_address();
    nodes[1].start(&seed);
    wait_for_two(&[&nodes[0], &nodes[1]]);

    // One user created on each node, both requests sent at once.
    let barrier = Arc::new(Barrier::new(2));
    let created: Vec<u8> = std::thread::scope(|scope| {
        let handles: Vec<_> = nodes
            .iter()
            .zip(["left", "right"])
            .map(|(node, user)| {
                let barrier = barrier.clone();
                let mut stream = admin_connection(node);
                let password = hash_password("pw").unwrap();
                let roles = roles_data(&["read".to_owned()]);
                scope.spawn(move || {
                    let fields: [(u8, &[u8]); 3] = [
                        (field::USER, user.as_bytes()),
                        (field::PASSWORD, &password),
                        (field::ROLES, &roles),
                    ];
                    barrier.wait();
                    admin(&mut stream, command::CREATE_USER, &fields)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .collect()
    });
    assert_eq!(created, [0, 0]);
    for node in &nodes {
        wait_for_login(node, "left", 0);
        wait_for_login(node, "right", 0);
    }

    // A drop on one node reaches the other (60: no such user).
    let mut stream = admin_connection(&nodes[1]);
    assert_eq!(
        admin(&mut stream, command::DROP_USER, &[(field::USER, b"left")]),
        0
    );
    wait_for_login(&nodes[0], "left", 60);
    wait_for_login(&nodes[0], "right", 0);
    for node in nodes.iter_mut() {
        node.kill();
    }
    let _ = std::fs::remove_dir_all(&directory);
}

/// One GET on an HTTP port, with `authorization` (a header value) when
/// given: (status, head, body).
fn http_get(port: u16, path: &str, authorization: Option<&str>) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let extra = authorization.map_or(String::new(), |value| format!("Authorization: {value}\r\n"));
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

/// The console and `/metrics` of a node with security on answer only a
/// user's credentials (HTTP basic), and gather every node's figures
/// logged in as that user: without credentials, or with a wrong password,
/// 401 with a challenge and no figures; as `admin`, both nodes up.
#[test]
fn the_console_with_security_on_answers_only_a_signed_in_user() {
    let directory =
        std::env::temp_dir().join(format!("citrine-secure-console-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let base = std::fs::read_to_string(workspace_root().join("examples/cluster.toml")).unwrap();
    let http_port = citrine_testsupport::free_port();
    let with_http = base.replace(
        "[heartbeat]",
        &format!("[http]\nport = {http_port}\n\n[heartbeat]"),
    );
    let mut nodes: Vec<Node> = (0..2).map(|index| Node::new(0x54 + index)).collect();
    for (index, node) in nodes.iter_mut().enumerate() {
        let config = directory.join(format!("citrine{index}.toml"));
        let text = if index == 0 { &with_http } else { &base };
        std::fs::write(&config, format!("[security]\n{text}")).unwrap();
        node.config = Some(config);
        let data = directory.join(format!("node{index}"));
        std::fs::create_dir_all(&data).unwrap();
        node.data_dir = Some(data);
    }
    let seed = nodes[0].heartbeat_address();
    nodes[0].start(&seed);
    nodes[1].start(&seed);
    wait_for_two(&[&nodes[0], &nodes[1]]);

    for path in ["/console/state.json", "/console", "/metrics"] {
        let (status, head, body) = http_get(http_port, path, None);
        assert_eq!(status, 401, "{path}: {body}");
        assert!(head.contains("WWW-Authenticate: Basic"), "{path}: {head}");
        assert!(body.contains("security on"), "{path}: {body}");
        assert!(!body.contains("cluster_key"), "{path}: {body}");
    }
    // admin:wrong, then admin:admin.
    let (status, _, body) = http_get(
        http_port,
        "/console/state.json",
        Some("Basic YWRtaW46d3Jvbmc="),
    );
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("login refused"), "{body}");
    let admin = Some("Basic YWRtaW46YWRtaW4=");
    let (status, _, body) = http_get(http_port, "/metrics", admin);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("aerospike_node_up{"), "{body}");
    let (status, _, body) = http_get(http_port, "/console", admin);
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = http_get(http_port, "/console/state.json", admin);
    assert_eq!(status, 200, "{body}");
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    let nodes_json = state["nodes"].as_array().unwrap();
    assert_eq!(nodes_json.len(), 2, "{body}");
    for node in nodes_json {
        assert_eq!(node["health"], "up", "{node}");
        assert!(node["statistics"]["cluster_size"] == "2", "{node}");
    }
    for node in nodes.iter_mut() {
        node.kill();
    }
    let _ = std::fs::remove_dir_all(&directory);
}
