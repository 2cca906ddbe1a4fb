//! A test cluster of real `citrined` processes, each started with
//! `examples/cluster.toml` and seeded from the first node: start, kill,
//! restart, and ask nodes about the view and their partition copies. Nodes
//! run on loopback, or inside a network namespace ([`super::netns`]) on
//! an address the test process reaches through a route.

use super::*;
use base64::Engine as _;
use citrine_wire::msg::{info1, info2, op_type};
use std::collections::BTreeMap;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One node of a test cluster.
pub struct Node {
    pub child: Option<Child>,
    pub id: String,
    /// The address it listens on (service, fabric and heartbeat).
    pub host: String,
    pub port: u16,
    pub fabric_port: u16,
    pub heartbeat_port: u16,
    /// Runs the node inside this network namespace.
    pub netns: Option<String>,
    /// Its configuration file (else `examples/cluster.toml`).
    pub config: Option<std::path::PathBuf>,
    /// Its work directory (`--data-dir`), if any.
    pub data_dir: Option<std::path::PathBuf>,
    /// Its rack (`--rack-id`), if any.
    pub rack_id: Option<u32>,
    /// Another `citrined` than this build's (an older version).
    pub binary: Option<std::path::PathBuf>,
    /// More command-line arguments.
    pub extra_args: Vec<String>,
    /// Where its standard error (its log) goes, if kept.
    pub log_file: Option<std::path::PathBuf>,
}

impl Node {
    /// A node on loopback, on free ports.
    pub fn new(index: usize) -> Node {
        Node {
            child: None,
            id: format!("{:X}", 0xA0 + index),
            host: "127.0.0.1".to_owned(),
            port: free_port(),
            fabric_port: free_port(),
            heartbeat_port: free_port(),
            netns: None,
            config: None,
            data_dir: None,
            rack_id: None,
            binary: None,
            extra_args: Vec::new(),
            log_file: None,
        }
    }

    /// A node inside network namespace `netns`, listening on `host`
    /// (every port is free in a fresh namespace).
    pub fn in_netns(index: usize, host: &str, netns: &str) -> Node {
        let base = 4000 + 10 * index as u16;
        Node {
            child: None,
            id: format!("{:X}", 0xA0 + index),
            host: host.to_owned(),
            port: base,
            fabric_port: base + 1,
            heartbeat_port: base + 2,
            netns: Some(netns.to_owned()),
            config: None,
            data_dir: None,
            rack_id: None,
            binary: None,
            extra_args: Vec::new(),
            log_file: None,
        }
    }

    pub fn heartbeat_address(&self) -> String {
        format!("{}:{}", self.host, self.heartbeat_port)
    }

    pub fn service_address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Starts the node seeded from one node; see [`Node::start_seeds`].
    pub fn start(&mut self, seed: &str) {
        self.start_seeds(&[seed.to_owned()]);
    }

    /// Starts the node and waits until it answers; a node on loopback that
    /// exits at once (a port taken since `free_port` chose it) is started
    /// again on fresh ports.
    pub fn start_seeds(&mut self, seeds: &[String]) {
        for _ in 0..5 {
            self.spawn(seeds);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                    break;
                }
                // On loopback the listener must be this node's, not another
                // process's that holds the port (a namespace's sockets are
                // not in this namespace's /proc/net/tcp).
                let ours = self.netns.is_some()
                    || self.child.as_ref().is_some_and(|child| {
                        citrine_testsupport::listener_is(self.port, child.id())
                    });
                if ours && TcpStream::connect(self.service_address()).is_ok() {
                    return;
                }
                assert!(Instant::now() < deadline, "node {} did not start", self.id);
                std::thread::sleep(Duration::from_millis(20));
            }
            self.child = None;
            assert!(self.netns.is_none(), "node {} exits at start", self.id);
            self.port = free_port();
            self.fabric_port = free_port();
            self.heartbeat_port = free_port();
        }
        panic!("node {} exits at start", self.id);
    }

    pub fn spawn(&mut self, seeds: &[String]) {
        let config = self
            .config
            .clone()
            .unwrap_or_else(|| workspace_root().join("examples/cluster.toml"));
        let mut command = match &self.netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns, binary()]);
                command
            }
            None => match &self.binary {
                Some(path) => Command::new(path),
                None => Command::new(binary()),
            },
        };
        command.args([
            "--config",
            config.to_str().unwrap(),
            "--address",
            &self.host,
            "--port",
            &self.port.to_string(),
            "--fabric-port",
            &self.fabric_port.to_string(),
            "--heartbeat-port",
            &self.heartbeat_port.to_string(),
            "--node-id",
            &self.id,
        ]);
        for seed in seeds {
            command.args(["--seed", seed]);
        }
        if let Some(directory) = &self.data_dir {
            command.arg("--data-dir").arg(directory);
        }
        if let Some(rack) = self.rack_id {
            command.args(["--rack-id", &rack.to_string()]);
        }
        command.args(&self.extra_args);
        // CITRINE_TEST_LOG_DIR=DIR keeps each node's log in DIR/<id>.log.
        let kept = std::env::var_os("CITRINE_TEST_LOG_DIR")
            .map(|directory| std::path::Path::new(&directory).join(format!("{}.log", self.id)));
        let log = self.log_file.clone().or(kept).map(|path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap()
        });
        let stderr = match log {
            Some(file) => Stdio::from(file),
            None => Stdio::null(),
        };
        let child = command
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP (`stop`) or SIGCONT: the process freezes whole — its
    /// heartbeats, its timers, its sockets' readers — as in a long stall
    /// of its machine, and later carries on where it stopped.
    pub fn freeze(&self, stop: bool) {
        let child = self.child.as_ref().expect("a running node");
        super::freeze_process(child.id(), stop);
    }

    /// A connection to the node's client port.
    pub fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.service_address()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        stream
    }

    pub fn info_value(&self, command: &str) -> Option<String> {
        let mut stream = TcpStream::connect_timeout(
            &self.service_address().parse().ok()?,
            Duration::from_millis(300),
        )
        .ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let answers =
            round_trip(&mut stream, &citrine_wire::info::request_frame(&[command])).ok()?;
        citrine_wire::info::parse_response(&answers.1)
            .into_iter()
            .next()
            .map(|(_, value)| value)
    }

    /// (cluster key, size) from `cluster-info`.
    pub fn cluster_info(&self) -> Option<(String, usize)> {
        let text = self.info_value("cluster-info")?;
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

    /// partition id → "count:checksum" of this node's copies.
    pub fn checksums(&self) -> BTreeMap<u16, String> {
        let text = self
            .info_value("partition-checksums:namespace=test")
            .unwrap();
        text.split(';')
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                let (pid, rest) = entry.split_once(':').unwrap();
                (pid.parse().unwrap(), rest.to_owned())
            })
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Strong consistency: `recluster:` asked of every node of `nodes` (one
/// view), as operators do: the principal (the highest node id) answers
/// `ok`, every other node `ignored-by-non-principal`.
pub fn recluster(nodes: &[&Node]) {
    let principal = nodes
        .iter()
        .map(|node| u64::from_str_radix(&node.id, 16).expect("hexadecimal id"))
        .max();
    for node in nodes {
        let expected = match u64::from_str_radix(&node.id, 16).ok() == principal {
            true => "ok",
            false => "ignored-by-non-principal",
        };
        assert_eq!(
            node.info_value("recluster:").as_deref(),
            Some(expected),
            "node {}",
            node.id
        );
    }
}

/// Strong consistency: sets `namespace`'s roster to the nodes the first of
/// `nodes` observes (`roster-set:`) and applies it (`recluster:` on every
/// node; the principal acts).
pub fn set_roster_to_observed(nodes: &[Node], namespace: &str) {
    let node = &nodes[0];
    let roster = node
        .info_value(&format!("roster:namespace={namespace}"))
        .expect("roster answer");
    let observed = roster
        .split(':')
        .find_map(|pair| pair.strip_prefix("observed_nodes="))
        .expect("observed_nodes in the roster answer")
        .to_owned();
    let staged = format!("roster-set:namespace={namespace};nodes={observed}");
    assert_eq!(node.info_value(&staged).as_deref(), Some("ok"));
    recluster(&nodes.iter().collect::<Vec<_>>());
}

/// Polls `cluster-info` until every node of `group` reports the same
/// cluster of `size` nodes; returns how long it took.
pub fn wait_for_cluster(group: &[&Node], size: usize, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let infos: Vec<Option<(String, usize)>> =
            group.iter().map(|node| node.cluster_info()).collect();
        let agreed = infos.iter().all(|info| {
            info.as_ref().is_some_and(|(key, found)| {
                *found == size && Some(key) == infos[0].as_ref().map(|(first, _)| first)
            })
        });
        if agreed {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "no agreement on a cluster of {size} within {limit:?}: {infos:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Three nodes with ids `first`, `first + 1`, `first + 2` (distinct per
/// test: tests run in parallel).
pub fn start_cluster(first: usize) -> Vec<Node> {
    let mut nodes: Vec<Node> = (first..first + 3).map(Node::new).collect();
    let seed = nodes[0].heartbeat_address();
    nodes[0].start(&seed);
    // The first node may have moved to other ports.
    let seed = nodes[0].heartbeat_address();
    for node in nodes.iter_mut() {
        if node.child.is_none() {
            node.start(&seed);
        }
    }
    let took = wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(30),
    );
    println!("3 nodes formed one cluster in {took:?}");
    // Until every node resolved the view's exchange, a write may be
    // refused (11) for a client to retry; these tests' raw requests do not.
    wait_for_stable(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(30));
    nodes
}

/// The partitions this node holds (any column) by its `replicas` answer.
/// Per column of `node`'s `replicas` answer for namespace `test` (master
/// first), which of the 4096 partitions it holds.
pub fn replica_columns(node: &Node) -> Vec<Vec<bool>> {
    let text = node.info_value("replicas").unwrap();
    let entry = text
        .split(';')
        .find_map(|entry| entry.strip_prefix("test:"))
        .unwrap();
    // regime, column count, then one bitmap per column.
    entry
        .split(',')
        .skip(2)
        .map(|bitmap| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(bitmap)
                .unwrap();
            assert_eq!(bytes.len(), 512);
            (0..4096)
                .map(|pid| bytes[pid >> 3] & (0x80 >> (pid & 7)) != 0)
                .collect()
        })
        .collect()
}

/// The partitions `node` masters.
pub fn mastered_partitions(node: &Node) -> Vec<bool> {
    replica_columns(node).swap_remove(0)
}

/// The partitions `node` holds in any column.
pub fn held_partitions(node: &Node) -> Vec<bool> {
    let mut held = vec![false; 4096];
    for column in replica_columns(node) {
        for (slot, holds) in held.iter_mut().zip(column) {
            *slot |= holds;
        }
    }
    held
}

/// Polls `cluster-stable` on every node until all answer the same cluster
/// key (no migration pending anywhere); returns how long it took.
pub fn wait_for_stable(group: &[&Node], limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let answers: Vec<Option<String>> = group
            .iter()
            .map(|node| node.info_value(&format!("cluster-stable:size={}", group.len())))
            .collect();
        let stable = answers.iter().all(|answer| {
            answer
                .as_ref()
                .is_some_and(|key| !key.starts_with("ERROR") && Some(key) == answers[0].as_ref())
        });
        if stable {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "migrations did not settle within {limit:?}: {answers:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every partition's two replica-list nodes hold identical copies (count
/// and checksum) and no other node holds any copy of it (copies a node no
/// longer holds a place for are dropped before `cluster-stable`); returns
/// the records the list holders' copies add up to.
pub fn copies_matching_the_map(group: &[&Node]) -> u64 {
    let held: Vec<Vec<bool>> = group.iter().map(|node| held_partitions(node)).collect();
    let sums: Vec<BTreeMap<u16, String>> = group.iter().map(|node| node.checksums()).collect();
    let mut total = 0;
    for pid in 0..4096u16 {
        let holders: Vec<usize> = (0..group.len())
            .filter(|node| held[*node][usize::from(pid)])
            .collect();
        assert_eq!(holders.len(), 2, "partition {pid}: holders {holders:?}");
        let strays: Vec<&String> = (0..group.len())
            .filter(|node| !holders.contains(node) && sums[*node].contains_key(&pid))
            .map(|node| &group[node].id)
            .collect();
        assert!(
            strays.is_empty(),
            "partition {pid}: nodes {strays:?} hold a copy outside the replica list"
        );
        let copies: Vec<Option<&String>> =
            holders.iter().map(|node| sums[*node].get(&pid)).collect();
        assert_eq!(
            copies[0], copies[1],
            "partition {pid}: the copies of nodes {holders:?} differ"
        );
        if let Some(sum) = copies[0] {
            total += sum.split(':').next().unwrap().parse::<u64>().unwrap();
        } else if sums.iter().any(|sums| sums.contains_key(&pid)) {
            println!(
                "partition {pid}: holders {holders:?}, copies {:?}",
                sums.iter().map(|sums| sums.get(&pid)).collect::<Vec<_>>()
            );
        }
    }
    total
}

pub fn put(stream: &mut TcpStream, key: &str, value: &str) -> u8 {
    let request = record_request(
        "test",
        key,
        MsgHeader {
            info2: info2::WRITE,
            transaction_ttl: 5000,
            ..MsgHeader::default()
        },
        &[(op_type::WRITE, 3, "v", value.as_bytes().to_vec())],
    );
    let (_, body) = round_trip(stream, &request).unwrap();
    decode_reply(&body).0.result_code
}

/// Deletes `key`; the result code.
pub fn delete(stream: &mut TcpStream, key: &str) -> u8 {
    let request = record_request(
        "test",
        key,
        MsgHeader {
            info2: info2::WRITE | info2::DELETE,
            transaction_ttl: 5000,
            ..MsgHeader::default()
        },
        &[],
    );
    let (_, body) = round_trip(stream, &request).unwrap();
    decode_reply(&body).0.result_code
}

/// (result code, value of bin "v").
pub fn get(stream: &mut TcpStream, key: &str) -> (u8, Option<Vec<u8>>) {
    get_bin(stream, key, "v")
}

/// (result code, value of bin `bin`).
pub fn get_bin(stream: &mut TcpStream, key: &str, bin: &str) -> (u8, Option<Vec<u8>>) {
    let request = record_request(
        "test",
        key,
        MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            transaction_ttl: 5000,
            ..MsgHeader::default()
        },
        &[],
    );
    let (_, body) = round_trip(stream, &request).unwrap();
    let (header, bins) = decode_reply(&body);
    let value = bins
        .into_iter()
        .find(|(name, _, _)| name == bin.as_bytes())
        .map(|(_, _, value)| value);
    (header.result_code, value)
}
