//! Cluster formation over real `citrined` processes: nodes started with each
//! other's heartbeat addresses form one cluster, re-form when one dies, take
//! it back when it restarts, and split and merge across a real network
//! partition made with network namespaces.

#![allow(clippy::unwrap_used)]

mod common;

use common::cluster::{wait_for_cluster, ViewProbe};
use common::*;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One node of a test cluster.
struct Node {
    child: Option<Child>,
    id: String,
    host: String,
    port: u16,
    fabric_port: u16,
    heartbeat_port: u16,
    /// Runs the node (and queries it) inside this network namespace.
    netns: Option<String>,
}

impl Node {
    fn new(index: usize, host: &str, netns: Option<&str>) -> Node {
        let (port, fabric_port, heartbeat_port) = if netns.is_some() {
            // Inside a fresh namespace every port is free.
            let base = 4000 + 10 * index as u16;
            (base, base + 1, base + 2)
        } else {
            (free_port(), free_port(), free_port())
        };
        Node {
            child: None,
            id: format!("{:X}", 0xC0 + index),
            host: host.to_owned(),
            port,
            fabric_port,
            heartbeat_port,
            netns: netns.map(str::to_owned),
        }
    }

    fn heartbeat_address(&self) -> String {
        format!("{}:{}", self.host, self.heartbeat_port)
    }

    fn start(&mut self, seeds: &[String]) {
        let config = workspace_root().join("examples/cluster.toml");
        let mut argv: Vec<String> = vec![
            binary().to_owned(),
            "--config".into(),
            config.to_str().unwrap().into(),
            "--address".into(),
            self.host.clone(),
            "--port".into(),
            self.port.to_string(),
            "--fabric-port".into(),
            self.fabric_port.to_string(),
            "--heartbeat-port".into(),
            self.heartbeat_port.to_string(),
            "--node-id".into(),
            self.id.clone(),
        ];
        for seed in seeds {
            argv.push("--seed".into());
            argv.push(seed.clone());
        }
        let mut command = match &self.netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns]).args(&argv);
                command
            }
            None => {
                let mut command = Command::new(&argv[0]);
                command.args(&argv[1..]);
                command
            }
        };
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `cluster-info` as (cluster key, size), or None when unreachable.
    fn cluster_info(&self) -> Option<(String, usize)> {
        let text = match &self.netns {
            Some(netns) => {
                let citrine = std::path::Path::new(binary()).with_file_name("citrine");
                assert!(citrine.is_file(), "{} is missing: the netns test queries nodes with the citrine CLI; run `cargo build -p citrine-cli` first", citrine.display());
                let output = Command::new("ip")
                    .args(["netns", "exec", netns])
                    .arg(citrine)
                    .args([
                        "info",
                        "-h",
                        &format!("{}:{}", self.host, self.port),
                        "-v",
                        "cluster-info",
                    ])
                    .output()
                    .ok()?;
                String::from_utf8_lossy(&output.stdout).trim().to_owned()
            }
            None => {
                let mut stream = TcpStream::connect_timeout(
                    &format!("{}:{}", self.host, self.port).parse().ok()?,
                    Duration::from_millis(300),
                )
                .ok()?;
                stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
                let answers = round_trip(
                    &mut stream,
                    &citrine_wire::info::request_frame(&["cluster-info"]),
                )
                .ok()?;
                citrine_wire::info::parse_response(&answers.1)
                    .into_iter()
                    .next()?
                    .1
            }
        };
        let field = |name: &str| {
            text.split(';')
                .find_map(|pair| pair.strip_prefix(name))
                .map(str::to_owned)
        };
        Some((
            field("cluster_key=")?,
            field("cluster_size=")?.parse().ok()?,
        ))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

impl ViewProbe for Node {
    fn view(&self) -> Option<(String, usize)> {
        self.cluster_info()
    }
}

#[test]
fn three_nodes_form_one_cluster() {
    let mut nodes: Vec<Node> = (0..3)
        .map(|index| Node::new(index, "127.0.0.1", None))
        .collect();
    let seed = nodes[0].heartbeat_address();
    for node in nodes.iter_mut() {
        node.start(std::slice::from_ref(&seed));
    }
    let took = wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(30),
    );
    println!("3 nodes formed one cluster in {took:?}");
    // Every node lists the other two as peers with their service addresses.
    let mut stream = connect(nodes[1].port);
    let peers = &info(&mut stream, &["peers-clear-std"])[0].1;
    for other in [&nodes[0], &nodes[2]] {
        assert!(
            peers.contains(&format!("[{},,[127.0.0.1:{}]]", other.id, other.port)),
            "{peers}"
        );
    }
}

#[test]
fn five_nodes_reform_after_a_kill_and_take_it_back_after_a_restart() {
    let mut nodes: Vec<Node> = (0..5)
        .map(|index| Node::new(index, "127.0.0.1", None))
        .collect();
    let seeds: Vec<String> = nodes[..2].iter().map(Node::heartbeat_address).collect();
    for node in nodes.iter_mut() {
        node.start(&seeds);
    }
    wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        5,
        Duration::from_secs(40),
    );
    // Kill the principal (highest node id): the hardest departure.
    nodes[4].kill();
    let took = wait_for_cluster(
        &nodes[..4].iter().collect::<Vec<_>>(),
        4,
        Duration::from_secs(30),
    );
    println!("kill to new view on every remaining node: {took:?}");
    nodes[4].start(&seeds);
    let took = wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        5,
        Duration::from_secs(40),
    );
    println!("restart to rejoined view on every node: {took:?}");
}

/// Runs `ip` with arguments; panics with its stderr on failure.
fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().unwrap();
    assert!(
        output.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Two network namespaces joined by a veth pair, removed on drop.
struct SplitNetwork {
    names: [String; 2],
}

impl SplitNetwork {
    fn new() -> SplitNetwork {
        let tag = std::process::id() % 100_000;
        let names = [format!("citrine-a-{tag}"), format!("citrine-b-{tag}")];
        let network = SplitNetwork { names };
        let (a, b) = (&network.names[0], &network.names[1]);
        let (veth_a, veth_b) = (format!("cva{tag}"), format!("cvb{tag}"));
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        ip(&[
            "link", "add", &veth_a, "type", "veth", "peer", "name", &veth_b,
        ]);
        ip(&["link", "set", &veth_a, "netns", a]);
        ip(&["link", "set", &veth_b, "netns", b]);
        ip(&["-n", a, "addr", "add", "10.254.77.1/24", "dev", &veth_a]);
        ip(&["-n", b, "addr", "add", "10.254.77.2/24", "dev", &veth_b]);
        for (namespace, veth) in [(a, &veth_a), (b, &veth_b)] {
            ip(&["-n", namespace, "link", "set", "lo", "up"]);
            ip(&["-n", namespace, "link", "set", veth, "up"]);
        }
        network
    }

    fn veth(&self, side: usize) -> String {
        let tag = std::process::id() % 100_000;
        if side == 0 {
            format!("cva{tag}")
        } else {
            format!("cvb{tag}")
        }
    }

    /// Cuts (or restores) the link between the two namespaces.
    fn set_link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.names[0], "link", "set", &self.veth(0), state]);
        ip(&["-n", &self.names[1], "link", "set", &self.veth(1), state]);
    }
}

impl Drop for SplitNetwork {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

/// A real network split between two network namespaces yields two clusters
/// that merge again when the network heals. Needs root (`ip netns`); set
/// CITRINE_SKIP_NETNS=1 to skip it on a machine without.
#[test]
fn a_network_split_makes_two_clusters_that_merge_when_healed() {
    if std::env::var_os("CITRINE_SKIP_NETNS").is_some() {
        println!("skipped by CITRINE_SKIP_NETNS");
        return;
    }
    let network = SplitNetwork::new();
    let mut nodes: Vec<Node> = (0..4)
        .map(|index| {
            let (host, netns) = if index < 2 {
                ("10.254.77.1", &network.names[0])
            } else {
                ("10.254.77.2", &network.names[1])
            };
            Node::new(index, host, Some(netns))
        })
        .collect();
    let seeds = vec![nodes[0].heartbeat_address(), nodes[2].heartbeat_address()];
    for node in nodes.iter_mut() {
        node.start(&seeds);
    }
    let all: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&all, 4, Duration::from_secs(40));
    network.set_link(false);
    let took_a = wait_for_cluster(&all[..2], 2, Duration::from_secs(30));
    let took_b = wait_for_cluster(&all[2..], 2, Duration::from_secs(30));
    let key_a = nodes[0].cluster_info().unwrap().0;
    let key_b = nodes[2].cluster_info().unwrap().0;
    assert_ne!(key_a, key_b, "the two sides are distinct clusters");
    println!("split into two clusters in {took_a:?} / {took_b:?}");
    network.set_link(true);
    let took = wait_for_cluster(&all, 4, Duration::from_secs(40));
    println!("healed and merged in {took:?}");
    drop(nodes);
}
