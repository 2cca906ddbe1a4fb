//! A test cluster of real `citrined` processes on loopback, each started
//! with `examples/cluster.toml` and seeded from the first node: start, kill,
//! restart, and ask nodes about the view and their partition copies.

use super::*;
use std::collections::BTreeMap;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One node of a test cluster.
pub struct Node {
    pub child: Option<Child>,
    pub id: String,
    pub port: u16,
    pub fabric_port: u16,
    pub heartbeat_port: u16,
}

impl Node {
    pub fn new(index: usize) -> Node {
        Node {
            child: None,
            id: format!("{:X}", 0xA0 + index),
            port: free_port(),
            fabric_port: free_port(),
            heartbeat_port: free_port(),
        }
    }

    pub fn heartbeat_address(&self) -> String {
        format!("127.0.0.1:{}", self.heartbeat_port)
    }

    /// Starts the node and waits until it answers; a node that exits at
    /// once (a port taken since `free_port` chose it) is started again on
    /// fresh ports.
    pub fn start(&mut self, seed: &str) {
        for _ in 0..5 {
            self.spawn(seed);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                    break;
                }
                if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                    return;
                }
                assert!(Instant::now() < deadline, "node {} did not start", self.id);
                std::thread::sleep(Duration::from_millis(20));
            }
            self.child = None;
            self.port = free_port();
            self.fabric_port = free_port();
            self.heartbeat_port = free_port();
        }
        panic!("node {} exits at start", self.id);
    }

    pub fn spawn(&mut self, seed: &str) {
        let config = workspace_root().join("examples/cluster.toml");
        let child = Command::new(binary())
            .args([
                "--config",
                config.to_str().unwrap(),
                "--port",
                &self.port.to_string(),
                "--fabric-port",
                &self.fabric_port.to_string(),
                "--heartbeat-port",
                &self.heartbeat_port.to_string(),
                "--node-id",
                &self.id,
                "--seed",
                seed,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
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

    pub fn info_value(&self, command: &str) -> Option<String> {
        let mut stream = TcpStream::connect_timeout(
            &format!("127.0.0.1:{}", self.port).parse().ok()?,
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
    nodes
}
