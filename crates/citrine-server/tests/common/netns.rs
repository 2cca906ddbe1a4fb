//! Two network namespaces, side A and side B, joined by a veth pair that a
//! test can cut and restore (a real network split), each also linked to the
//! test's own namespace so the test reaches the nodes of both sides (until
//! it takes its own route to a side away: [`SplitNetwork::set_reach`]).
//! Needs root (`ip netns`); tests honour `CITRINE_SKIP_NETNS=1`.
//!
//! Addresses (`b` from the process id, so that runs in other worktrees do
//! not collide): the split link is 10.b.1.0/24 (A = .1, B = .2, the
//! addresses nodes listen on); the test reaches A through 10.b.2.0/24 and
//! B through 10.b.3.0/24, with a host route to each side's node address.
//! The sides have no route to each other except the split link: the test's
//! namespace does not forward between them.

use super::cluster::{wait_for_cluster, Node};
use std::process::Command;
use std::time::Duration;

/// Runs `ip` with arguments; panics with its stderr on failure.
pub fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().unwrap();
    assert!(
        output.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// True when the environment asks to skip the network-namespace tests.
pub fn skipped() -> bool {
    if std::env::var_os("CITRINE_SKIP_NETNS").is_some() {
        println!("skipped by CITRINE_SKIP_NETNS");
        return true;
    }
    false
}

/// The two sides, removed (with their links and routes) on drop.
pub struct SplitNetwork {
    /// Namespace names of side A and side B.
    pub names: [String; 2],
    /// The address nodes of each side listen on.
    pub hosts: [String; 2],
    tag: u32,
}

impl SplitNetwork {
    pub fn new() -> SplitNetwork {
        let tag = std::process::id() % 100_000;
        let octet = 64 + tag % 128;
        let names = [format!("citrine-a-{tag}"), format!("citrine-b-{tag}")];
        let hosts = [format!("10.{octet}.1.1"), format!("10.{octet}.1.2")];
        let network = SplitNetwork { names, hosts, tag };
        let (a, b) = (&network.names[0], &network.names[1]);
        let (veth_a, veth_b) = (network.veth(0), network.veth(1));
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        ip(&[
            "link", "add", &veth_a, "type", "veth", "peer", "name", &veth_b,
        ]);
        ip(&["link", "set", &veth_a, "netns", a]);
        ip(&["link", "set", &veth_b, "netns", b]);
        ip(&[
            "-n",
            a,
            "addr",
            "add",
            &format!("{}/24", network.hosts[0]),
            "dev",
            &veth_a,
        ]);
        ip(&[
            "-n",
            b,
            "addr",
            "add",
            &format!("{}/24", network.hosts[1]),
            "dev",
            &veth_b,
        ]);
        for (namespace, veth) in [(a, &veth_a), (b, &veth_b)] {
            ip(&["-n", namespace, "link", "set", "lo", "up"]);
            ip(&["-n", namespace, "link", "set", veth, "up"]);
        }
        // The test's links: root end 10.b.{2,3}.1, side end .2.
        for side in 0..2 {
            let subnet = 2 + side;
            let (outer, inner) = (format!("cr{side}{tag}"), format!("cs{side}{tag}"));
            let namespace = &network.names[side];
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ]);
            ip(&["link", "set", &inner, "netns", namespace]);
            ip(&[
                "addr",
                "add",
                &format!("10.{octet}.{subnet}.1/24"),
                "dev",
                &outer,
            ]);
            ip(&[
                "-n",
                namespace,
                "addr",
                "add",
                &format!("10.{octet}.{subnet}.2/24"),
                "dev",
                &inner,
            ]);
            ip(&["link", "set", &outer, "up"]);
            ip(&["-n", namespace, "link", "set", &inner, "up"]);
            network.set_reach(side, true);
        }
        network
    }

    fn veth(&self, side: usize) -> String {
        if side == 0 {
            format!("cva{}", self.tag)
        } else {
            format!("cvb{}", self.tag)
        }
    }

    /// The address on side `side`'s end of the test's link to it: the
    /// gateway of the test's host route to that side's node address.
    fn gateway(&self, side: usize) -> String {
        let octet = 64 + self.tag % 128;
        format!("10.{octet}.{}.2", 2 + side)
    }

    /// Takes away (or gives back) the test's route to side `side`: the test
    /// process can no longer reach that side's nodes, while the two sides
    /// still reach each other over the split link. The route taken away
    /// becomes an `unreachable` route, not none: without a route of its own
    /// the node's address would follow the machine's default route out of
    /// it, to whatever answers there.
    pub fn set_reach(&self, side: usize, reachable: bool) {
        let host = format!("{}/32", self.hosts[side]);
        if reachable {
            ip(&["route", "replace", &host, "via", &self.gateway(side)]);
        } else {
            ip(&["route", "replace", "unreachable", &host]);
        }
    }

    /// Cuts (or restores) the link between the two sides.
    pub fn set_link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.names[0], "link", "set", &self.veth(0), state]);
        ip(&["-n", &self.names[1], "link", "set", &self.veth(1), state]);
    }
}

impl SplitNetwork {
    /// Four nodes, two per side (ids `first`..`first + 3`), seeded from the
    /// first node of each side, started and agreed on a cluster of four.
    pub fn start_cluster(&self, first: usize) -> Vec<Node> {
        let mut nodes: Vec<Node> = (0..4)
            .map(|index| {
                let side = index / 2;
                Node::in_netns(first + index, &self.hosts[side], &self.names[side])
            })
            .collect();
        let seeds = vec![nodes[0].heartbeat_address(), nodes[2].heartbeat_address()];
        for node in nodes.iter_mut() {
            node.start_seeds(&seeds);
        }
        let all: Vec<&Node> = nodes.iter().collect();
        wait_for_cluster(&all, 4, Duration::from_secs(40));
        nodes
    }
}

impl SplitNetwork {
    /// Two nodes, one per side (ids `first` and `first + 1`), each seeded
    /// from both, started and agreed on a cluster of two.
    pub fn start_pair(&self, first: usize) -> Vec<Node> {
        let mut nodes: Vec<Node> = (0..2)
            .map(|side| Node::in_netns(first + side, &self.hosts[side], &self.names[side]))
            .collect();
        let seeds: Vec<String> = nodes.iter().map(Node::heartbeat_address).collect();
        for node in nodes.iter_mut() {
            node.start_seeds(&seeds);
        }
        let all: Vec<&Node> = nodes.iter().collect();
        wait_for_cluster(&all, 2, Duration::from_secs(40));
        nodes
    }
}

impl Drop for SplitNetwork {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth ends, their peers in the
        // test's namespace, and the routes through them; an unreachable
        // route goes through none, so it is deleted here.
        for host in &self.hosts {
            let host = format!("{host}/32");
            let _ = Command::new("ip").args(["route", "del", &host]).output();
        }
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}
