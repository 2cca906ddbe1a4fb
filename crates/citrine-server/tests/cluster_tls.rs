//! TLS on the fabric and heartbeat channels over real `citrined`
//! processes that have no plain fabric or heartbeat port at all: a cluster
//! forms over TLS, replicates, migrates to a node that joins, and keeps
//! every acknowledged write after a node dies; a node whose certificate
//! comes from another CA is kept out, and both sides' logs say why;
//! certificates rotated to a new CA are taken without a restart; a
//! certificate file that cannot be read stops the start with a message
//! naming the channel and the file.

#![allow(clippy::unwrap_used)]

mod common;

use common::cluster::*;
use common::tls::write_certs;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A directory removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let path = std::env::temp_dir().join(format!(
            "citrine-cluster-tls-{tag}-{}-{}",
            std::process::id(),
            free_port()
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

/// A node on loopback whose fabric and heartbeat are TLS only, with the
/// certificates of `certs` (ca.pem, node.pem, node.key); its log goes to
/// `<id>.log` in `logs`.
struct TlsNode {
    node: Node,
    certs: PathBuf,
    log: PathBuf,
}

impl TlsNode {
    fn new(index: usize, certs: &Path, logs: &Path) -> TlsNode {
        let node = Node::new(index);
        let log = logs.join(format!("{}.log", node.id));
        TlsNode {
            node,
            certs: certs.to_owned(),
            log,
        }
    }

    /// Its TLS heartbeat address, the seed of the others.
    fn seed(&self) -> String {
        self.node.heartbeat_address()
    }

    fn config(&self, seeds: &[String]) -> String {
        let seeds: Vec<String> = seeds.iter().map(|seed| format!("{seed:?}")).collect();
        let file = |name: &str| self.certs.join(name).display().to_string();
        format!(
            "[service]\naddress = \"127.0.0.1\"\nport = {port}\ncluster-name = \"tls\"\n\
             [heartbeat]\ninterval = 150\ntimeout = 10\ntls-port = {heartbeat}\n\
             tls-name = \"localhost\"\ntls-mesh-seed-address-port = [{seeds}]\n\
             [fabric]\ntls-port = {fabric}\ntls-name = \"localhost\"\n\
             [[tls]]\nname = \"localhost\"\ncert-file = {cert:?}\nkey-file = {key:?}\nca-file = {ca:?}\n\
             [[namespace]]\nname = \"test\"\nreplication-factor = 2\n\
             [namespace.storage-engine]\ntype = \"memory\"\ndata-size = \"64M\"\n",
            port = self.node.port,
            heartbeat = self.node.heartbeat_port,
            fabric = self.node.fabric_port,
            seeds = seeds.join(", "),
            cert = file("node.pem"),
            key = file("node.key"),
            ca = file("ca.pem"),
        )
    }

    /// Starts it seeded from `seeds` and waits until it answers.
    fn start(&mut self, seeds: &[String]) {
        let config = self.log.with_extension("toml");
        std::fs::write(&config, self.config(seeds)).unwrap();
        let log = std::fs::File::create(&self.log).unwrap();
        let child = Command::new(binary())
            .args(["--config", config.to_str().unwrap(), "--node-id"])
            .arg(&self.node.id)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let port = self.node.port;
        let child = self.node.child.insert(child);
        citrine_testsupport::wait_until_serving(child, port, Duration::from_secs(20));
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Reads `key` from `node`, retrying while the cluster settles.
fn read_back(node: &Node, key: &str, within: Duration) -> Option<Vec<u8>> {
    let started = Instant::now();
    loop {
        let mut stream = node.connect();
        let (code, value) = get(&mut stream, key);
        if code == 0 || started.elapsed() > within {
            return value;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_tls_only_cluster_forms_replicates_migrates_and_survives_a_death() {
    let dir = Dir::new("form");
    write_certs(&dir.0.join("certs"));
    let certs = dir.0.join("certs");
    let mut nodes: Vec<TlsNode> = (0..3)
        .map(|index| TlsNode::new(0x40 + index, &certs, &dir.0))
        .collect();
    nodes[0].start(&[]);
    let seed = nodes[0].seed();
    nodes[1].start(std::slice::from_ref(&seed));
    wait_for_cluster(
        &[&nodes[0].node, &nodes[1].node],
        2,
        Duration::from_secs(20),
    );
    wait_for_stable(&[&nodes[0].node, &nodes[1].node], Duration::from_secs(20));
    // Writes through both nodes: half are proxied, all are replicated.
    let records = 200;
    let mut streams = [nodes[0].node.connect(), nodes[1].node.connect()];
    for index in 0..records {
        let code = put(
            &mut streams[index % 2],
            &format!("k{index}"),
            &format!("v{index}"),
        );
        assert_eq!(code, 0, "put k{index}");
    }
    // A third node joins: partitions migrate to it over the TLS fabric.
    nodes[2].start(&[seed]);
    let group: Vec<&Node> = nodes.iter().map(|tls| &tls.node).collect();
    wait_for_cluster(&group, 3, Duration::from_secs(20));
    wait_for_stable(&group, Duration::from_secs(30));
    assert_eq!(copies_matching_the_map(&group), records as u64);
    assert!(
        held_partitions(&nodes[2].node).iter().any(|held| *held),
        "the new node received no partition"
    );
    // The first node dies: every write reads back from the others.
    nodes[0].node.kill();
    let survivors = [&nodes[1].node, &nodes[2].node];
    wait_for_cluster(&survivors, 2, Duration::from_secs(20));
    for node in survivors {
        for index in 0..records {
            let value = read_back(node, &format!("k{index}"), Duration::from_secs(10));
            assert_eq!(value, Some(format!("v{index}").into_bytes()), "k{index}");
        }
    }
    for tls in &nodes {
        let log = tls.log_text();
        assert!(!log.contains("TLS handshake"), "{}: {log}", tls.node.id);
    }
}

#[test]
fn a_node_with_a_certificate_from_another_ca_does_not_join() {
    let dir = Dir::new("other-ca");
    write_certs(&dir.0.join("good"));
    write_certs(&dir.0.join("other"));
    let mut member = TlsNode::new(0x50, &dir.0.join("good"), &dir.0);
    let mut stranger = TlsNode::new(0x51, &dir.0.join("other"), &dir.0);
    member.start(&[]);
    // `get-config:context=network` lists the TLS-only channels as the
    // reference names them: no plain port (0), the TLS ports and names.
    let network = info(&mut member.node.connect(), &["get-config:context=network"]);
    let node = &member.node;
    for pair in [
        "heartbeat.mode=mesh".to_owned(),
        "heartbeat.address=127.0.0.1".to_owned(),
        "heartbeat.port=0".to_owned(),
        format!("heartbeat.tls-port={}", node.heartbeat_port),
        "heartbeat.tls-name=localhost".to_owned(),
        "heartbeat.interval=150".to_owned(),
        "heartbeat.timeout=10".to_owned(),
        "fabric.address=127.0.0.1".to_owned(),
        format!("fabric.tls-port={}", node.fabric_port),
        "fabric.tls-name=localhost".to_owned(),
        "fabric.port=0".to_owned(),
        format!("service.port={}", node.port),
        "service.tls-port=0".to_owned(),
    ] {
        assert!(
            network[0].1.split(';').any(|listed| listed == pair),
            "{pair} not in {}",
            network[0].1
        );
    }
    stranger.start(&[member.seed()]);
    // Several heartbeat timeouts (1.5 s each): it never joins.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        let info = member.node.cluster_info();
        assert_eq!(info.map(|(_, size)| size), Some(1), "the stranger joined");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_ne!(
        stranger.node.cluster_info().map(|(_, size)| size),
        Some(2),
        "the stranger sees a cluster of two"
    );
    // Both logs say why: the stranger does not trust the member's
    // certificate, and the member hears that its own was refused.
    let why = [
        (&stranger, "stranger", "invalid peer certificate"),
        (&member, "member", "refused this node's certificate"),
    ];
    for (tls, who, reason) in why {
        let log = tls.log_text();
        let line = log
            .lines()
            .find(|line| line.contains("heartbeat TLS handshake"))
            .unwrap_or_else(|| panic!("{who} logs no failed handshake: {log}"));
        println!("{who}: {line}");
        assert!(
            line.contains(reason) && line.contains("cannot take part in the cluster"),
            "{who}: {line}"
        );
        // One line per failure and window, not one per retry.
        let lines = log
            .lines()
            .filter(|line| line.contains("TLS handshake"))
            .count();
        assert!(lines <= 8, "{who} logged {lines} handshake lines: {log}");
    }
}

/// Copies `from`'s certificate files over `to`'s, each by a rename (so a
/// node never reads half a file), the CA first as an operator rotating to a
/// new CA would.
fn rotate(from: &Path, to: &Path) {
    for name in ["ca.pem", "node.pem", "node.key"] {
        let staged = to.join(format!("{name}.new"));
        std::fs::copy(from.join(name), &staged).unwrap();
        std::fs::rename(&staged, to.join(name)).unwrap();
    }
}

#[test]
fn rotated_certificates_are_taken_on_both_channels_without_a_restart() {
    let dir = Dir::new("rotate");
    for set in ["old", "new"] {
        write_certs(&dir.0.join(set));
    }
    let mut nodes: Vec<TlsNode> = (0..2)
        .map(|index| {
            let certs = dir.0.join(format!("node{index}"));
            std::fs::create_dir_all(&certs).unwrap();
            rotate(&dir.0.join("old"), &certs);
            TlsNode::new(0x5a + index, &certs, &dir.0)
        })
        .collect();
    nodes[0].start(&[]);
    let seed = nodes[0].seed();
    nodes[1].start(std::slice::from_ref(&seed));
    let pair = [&nodes[0].node, &nodes[1].node];
    wait_for_cluster(&pair, 2, Duration::from_secs(20));
    // Both members move to the new CA while running; a node that only
    // knows the new CA joins through them: they accept its connections
    // and connect to it with the new certificates.
    for tls in &nodes {
        rotate(&dir.0.join("new"), &tls.certs);
    }
    let mut newcomer = TlsNode::new(0x5c, &dir.0.join("new"), &dir.0);
    newcomer.start(&[seed]);
    let all = [&nodes[0].node, &nodes[1].node, &newcomer.node];
    wait_for_cluster(&all, 3, Duration::from_secs(20));
    for tls in &nodes {
        let log = tls.log_text();
        assert!(
            log.contains("TLS certificate files changed: reloaded"),
            "{}: {log}",
            tls.node.id
        );
    }
}

#[test]
fn an_unreadable_certificate_stops_the_start_naming_the_channel_and_file() {
    let dir = Dir::new("bad-file");
    write_certs(&dir.0.join("certs"));
    let mut node = TlsNode::new(0x58, &dir.0.join("certs"), &dir.0);
    std::fs::remove_file(dir.0.join("certs/node.key")).unwrap();
    let config = dir.0.join("node.toml");
    std::fs::write(&config, node.config(&[])).unwrap();
    let output = Command::new(binary())
        .args(["--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("TLS ([[tls]] \"localhost\")") && stderr.contains("node.key"),
        "{stderr}"
    );
    node.node.child = None;
}
