//! The cluster runtime: runs the sans-I/O cluster state machine
//! ([`citrine_cluster::ClusterNode`]) over real sockets and a real clock, and
//! publishes every committed view to the service as a new
//! [`ClusterState`] (members, partition maps, generations).
//!
//! Channels (all TCP, frames of `u32 BE length | u8 kind | payload`):
//! - **heartbeat** (default port 3002): heartbeats and the Paxos messages of
//!   the state machine (kind [`KIND_CLUSTER`], an encoded `Envelope`);
//! - **fabric** (default port 3001): the node-to-node data channel; today it
//!   carries keepalives, and every frame that arrives counts as a surrogate
//!   heartbeat for its sender. Replication and migration (issue 5) ride here.
//!
//! Every connection starts with a [`KIND_HELLO`] frame naming the sender's
//! node id, rack, service address and fabric address: that is how a node
//! learns where clients reach its peers (`peers-clear-std`) and which rack
//! each peer is on (the partition map).
//!
//! One thread owns everything here: a current-thread event loop that ticks
//! the state machine every [`TICK_MS`], feeds it decoded messages, and
//! performs its effects. Sends never block the loop: each destination has a
//! bounded queue drained by its own connection task; a full queue or a dead
//! peer drops the message (heartbeats repeat, Paxos retransmits).
//!
//! Invariants:
//! - a view is published only when the rack and service address of every
//!   member are known, so every member of a view computes its partition map
//!   from identical input;
//! - `partition_generation` and `peers_generation` only grow;
//! - nothing this module receives can panic the node: bad frames close the
//!   connection that sent them.

use crate::config::ServerConfig;
use citrine_cluster::{ClusterConfig, ClusterNode, Effect, Envelope, PeerAddr};
use citrine_service::cluster_state::{ClusterMember, ClusterState};
use citrine_service::Service;
use citrine_types::NodeId;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Period of the state machine's clock ticks.
pub const TICK_MS: u64 = 10;
/// Frame kinds.
const KIND_HELLO: u8 = 1;
const KIND_CLUSTER: u8 = 2;
const KIND_KEEPALIVE: u8 = 3;
/// Largest frame accepted from a peer.
const FRAME_MAX: usize = 16 * 1024 * 1024;
/// Messages queued per destination before new ones are dropped.
const QUEUE_DEPTH: usize = 1024;
/// Period of fabric keepalives.
const KEEPALIVE_MS: u64 = 250;
/// How long to wait for a TCP connection to a peer.
const CONNECT_TIMEOUT_MS: u64 = 500;

/// What a node says about itself when it opens a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Hello {
    node_id: NodeId,
    rack_id: u32,
    service_address: String,
    fabric_address: String,
}

impl Hello {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&self.node_id.0.to_be_bytes());
        out.extend_from_slice(&self.rack_id.to_be_bytes());
        for text in [&self.service_address, &self.fabric_address] {
            let bytes = text.as_bytes();
            let length = u8::try_from(bytes.len()).unwrap_or(u8::MAX);
            out.push(length);
            out.extend_from_slice(&bytes[..usize::from(length)]);
        }
        out
    }

    fn decode(bytes: &[u8]) -> Option<Hello> {
        let node_id = NodeId(u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?));
        let rack_id = u32::from_be_bytes(bytes.get(8..12)?.try_into().ok()?);
        let mut at = 12;
        let mut texts = Vec::with_capacity(2);
        for _ in 0..2 {
            let length = usize::from(*bytes.get(at)?);
            let text = std::str::from_utf8(bytes.get(at + 1..at + 1 + length)?).ok()?;
            texts.push(text.to_owned());
            at += 1 + length;
        }
        if at != bytes.len() || node_id.0 == 0 {
            return None;
        }
        let fabric_address = texts.pop()?;
        let service_address = texts.pop()?;
        Some(Hello {
            node_id,
            rack_id,
            service_address,
            fabric_address,
        })
    }
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.extend_from_slice(&(payload.len() as u32 + 1).to_be_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
    out
}

/// Reads one frame: (kind, payload). `None` at a clean end of stream.
async fn read_frame(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> std::io::Result<Option<u8>> {
    let mut length_bytes = [0u8; 4];
    match stream.read_exact(&mut length_bytes).await {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error),
    }
    let length = u32::from_be_bytes(length_bytes) as usize;
    if length == 0 || length > FRAME_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame length {length}"),
        ));
    }
    buffer.resize(length, 0);
    stream.read_exact(buffer).await?;
    let kind = buffer.remove(0);
    Ok(Some(kind))
}

/// Something the connection tasks hand to the driver.
enum Inbound {
    Hello(Hello),
    Cluster(Envelope),
    Fabric(NodeId),
}

/// Starts the cluster runtime thread. Binding the heartbeat and fabric ports
/// happens before this returns, so a port in use stops the start.
pub fn start(
    service: Arc<Service>,
    config: &ServerConfig,
    stopping: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, String> {
    let settings = config.cluster.clone();
    let heartbeat_bind = format!("{}:{}", settings.heartbeat_address, settings.heartbeat_port);
    let fabric_bind = format!("{}:{}", settings.fabric_address, settings.fabric_port);
    let heartbeat_listener = std::net::TcpListener::bind(&heartbeat_bind)
        .map_err(|error| format!("cannot listen for heartbeats on {heartbeat_bind} (--heartbeat-port / heartbeat.port): {error}"))?;
    let fabric_listener = std::net::TcpListener::bind(&fabric_bind).map_err(|error| {
        format!("cannot listen for fabric on {fabric_bind} (--fabric-port / fabric.port): {error}")
    })?;
    for listener in [&heartbeat_listener, &fabric_listener] {
        listener
            .set_nonblocking(true)
            .map_err(|error| format!("cannot configure the cluster listeners: {error}"))?;
    }
    let node_id = service.node_id;
    let own_heartbeat = advertised(
        &settings.heartbeat_address,
        settings.heartbeat_port,
        &service.config.access_address,
    );
    let own_fabric = advertised(
        &settings.fabric_address,
        settings.fabric_port,
        &service.config.access_address,
    );
    let address = PeerAddr::new(own_heartbeat.clone())
        .ok_or_else(|| format!("bad heartbeat address {own_heartbeat:?}"))?;
    let seeds: Vec<PeerAddr> = settings
        .seeds
        .iter()
        .filter(|seed| **seed != own_heartbeat)
        .filter_map(|seed| PeerAddr::new(seed.clone()))
        .collect();
    let mut cluster_config = ClusterConfig::new(node_id, address, seeds);
    cluster_config.heartbeat.interval_ms = settings.heartbeat_interval_ms;
    cluster_config.heartbeat.timeout_ms = settings.heartbeat_timeout_ms;
    let timeout = settings.heartbeat_timeout_ms;
    cluster_config.quantum_ms = 2 * timeout;
    cluster_config.paxos_timeout_ms = (timeout / 3).max(1);
    cluster_config.resend_ms = (timeout / 15).max(1);
    cluster_config.retry_delay_ms = timeout;
    cluster_config.sync_grace_ms = timeout;
    let hello = Hello {
        node_id,
        rack_id: settings.rack_id,
        service_address: service.config.access_address.clone(),
        fabric_address: own_fabric,
    };
    tracing::info!(
        heartbeat = %heartbeat_bind,
        fabric = %fabric_bind,
        seeds = ?settings.seeds,
        rack = settings.rack_id,
        "cluster channels listening"
    );
    std::thread::Builder::new()
        .name("citrine-cluster".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    tracing::error!("cannot start the cluster runtime: {error}");
                    return;
                }
            };
            runtime.block_on(async move {
                let (heartbeat_listener, fabric_listener) = match (
                    TcpListener::from_std(heartbeat_listener),
                    TcpListener::from_std(fabric_listener),
                ) {
                    (Ok(heartbeat), Ok(fabric)) => (heartbeat, fabric),
                    _ => {
                        tracing::error!("cannot register the cluster listeners");
                        return;
                    }
                };
                let started = Instant::now();
                let node = match ClusterNode::new(cluster_config, 1) {
                    Ok(node) => node,
                    Err(error) => {
                        tracing::error!("bad cluster timing settings: {error}");
                        return;
                    }
                };
                let driver = Driver::new(service, node, hello, started);
                driver
                    .run(heartbeat_listener, fabric_listener, stopping)
                    .await;
            });
        })
        .map_err(|error| format!("cannot start the cluster thread: {error}"))
}

/// The address peers should use: the listen host, unless it is a wildcard,
/// in which case the host clients use.
fn advertised(listen_host: &str, port: u16, access_address: &str) -> String {
    let host = if listen_host == "0.0.0.0" || listen_host == "::" {
        access_address
            .rsplit_once(':')
            .map_or("127.0.0.1", |(host, _)| host)
            .trim_matches(['[', ']'])
    } else {
        listen_host
    };
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Owns the state machine and the outbound queues.
struct Driver {
    service: Arc<Service>,
    node: ClusterNode,
    hello: Hello,
    started: Instant,
    inbound_sender: mpsc::Sender<Inbound>,
    inbound: mpsc::Receiver<Inbound>,
    /// Heartbeat-channel queues by destination address.
    heartbeat_queues: HashMap<String, mpsc::Sender<Vec<u8>>>,
    /// Fabric queues by node.
    fabric_queues: HashMap<NodeId, mpsc::Sender<Vec<u8>>>,
    /// What each peer said about itself.
    peers: BTreeMap<NodeId, Hello>,
    /// The committed view waiting to be published (key, members).
    view: Option<(u64, Vec<NodeId>)>,
    published: Option<(u64, Vec<ClusterMember>)>,
    partition_generation: u64,
    peers_generation: u64,
    dropped_messages: u64,
}

impl Driver {
    fn new(service: Arc<Service>, node: ClusterNode, hello: Hello, started: Instant) -> Driver {
        let (inbound_sender, inbound) = mpsc::channel(4096);
        let initial = service.cluster();
        Driver {
            node,
            hello,
            started,
            inbound_sender,
            inbound,
            heartbeat_queues: HashMap::new(),
            fabric_queues: HashMap::new(),
            peers: BTreeMap::new(),
            view: None,
            published: None,
            partition_generation: initial.partition_generation,
            peers_generation: initial.peers_generation,
            dropped_messages: 0,
            service,
        }
    }

    /// Milliseconds since start, plus one so the state machine never sees 0.
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64 + 1
    }

    async fn run(mut self, heartbeat: TcpListener, fabric: TcpListener, stopping: Arc<AtomicBool>) {
        tokio::spawn(accept(heartbeat, self.inbound_sender.clone(), false));
        tokio::spawn(accept(fabric, self.inbound_sender.clone(), true));
        let mut ticker = tokio::time::interval(Duration::from_millis(TICK_MS));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last_keepalive = Instant::now();
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    if stopping.load(Ordering::Relaxed) {
                        return;
                    }
                    let effects = self.node.tick(self.now());
                    self.perform(effects);
                    if last_keepalive.elapsed() >= Duration::from_millis(KEEPALIVE_MS) {
                        last_keepalive = Instant::now();
                        self.keepalive();
                    }
                }
                message = self.inbound.recv() => {
                    let Some(message) = message else { return };
                    self.receive(message);
                }
            }
        }
    }

    fn receive(&mut self, message: Inbound) {
        let now = self.now();
        match message {
            Inbound::Hello(hello) => {
                if hello.node_id == self.hello.node_id {
                    return;
                }
                let changed = self.peers.get(&hello.node_id) != Some(&hello);
                self.peers.insert(hello.node_id, hello);
                if changed {
                    self.try_publish();
                }
            }
            Inbound::Cluster(envelope) => {
                let effects = self.node.on_message(envelope.from, envelope.msg, now);
                self.perform(effects);
            }
            Inbound::Fabric(from) => self.node.on_fabric_message(from, now),
        }
    }

    fn perform(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Send { to, msg } => {
                    let envelope = Envelope {
                        from: self.hello.node_id,
                        msg,
                    };
                    let bytes = frame(KIND_CLUSTER, &envelope.encode());
                    self.send_heartbeat_channel(to.as_str(), bytes);
                }
                Effect::ViewChanged {
                    cluster_key,
                    succession,
                } => {
                    tracing::info!(cluster_key = format!("{cluster_key:X}"), size = succession.len(), members = ?succession.iter().map(ToString::to_string).collect::<Vec<_>>(), "cluster view changed");
                    self.view = Some((cluster_key, succession));
                    self.try_publish();
                }
                Effect::Orphaned => {
                    tracing::warn!("left the cluster view; serving alone until admitted again");
                    let key = self.hello.node_id.0.rotate_left(29) ^ self.now();
                    self.view = Some((key.max(1), vec![self.hello.node_id]));
                    self.try_publish();
                }
            }
        }
    }

    fn send_heartbeat_channel(&mut self, address: &str, bytes: Vec<u8>) {
        let queue = self
            .heartbeat_queues
            .entry(address.to_owned())
            .or_insert_with(|| {
                let (sender, receiver) = mpsc::channel(QUEUE_DEPTH);
                tokio::spawn(outbound(
                    address.to_owned(),
                    receiver,
                    frame(KIND_HELLO, &self.hello.encode()),
                ));
                sender
            });
        if queue.try_send(bytes).is_err() {
            self.dropped_messages += 1;
        }
    }

    /// Fabric keepalives to every member of the view: they keep the fabric
    /// connections up and count as surrogate heartbeats at the receiver.
    fn keepalive(&mut self) {
        let Some((_, members)) = &self.view else {
            return;
        };
        for member in members.clone() {
            if member == self.hello.node_id {
                continue;
            }
            let Some(address) = self
                .peers
                .get(&member)
                .map(|hello| hello.fabric_address.clone())
            else {
                continue;
            };
            let queue = self.fabric_queues.entry(member).or_insert_with(|| {
                let (sender, receiver) = mpsc::channel(QUEUE_DEPTH);
                tokio::spawn(outbound(
                    address,
                    receiver,
                    frame(KIND_HELLO, &self.hello.encode()),
                ));
                sender
            });
            if queue.try_send(frame(KIND_KEEPALIVE, &[])).is_err() {
                self.dropped_messages += 1;
            }
        }
        // Queues of nodes no longer in the view close with their senders.
        if let Some((_, members)) = &self.view {
            self.fabric_queues.retain(|node, _| members.contains(node));
        }
    }

    /// Publishes the pending view once every member's hello is known.
    fn try_publish(&mut self) {
        let Some((key, succession)) = &self.view else {
            return;
        };
        let mut members = Vec::with_capacity(succession.len());
        for node in succession {
            let hello = if *node == self.hello.node_id {
                Some(&self.hello)
            } else {
                self.peers.get(node)
            };
            let Some(hello) = hello else {
                tracing::debug!(node = %node, "view waits for a member's hello");
                return;
            };
            members.push(ClusterMember {
                node_id: *node,
                rack_id: hello.rack_id,
                service_address: hello.service_address.clone(),
            });
        }
        if self
            .published
            .as_ref()
            .is_some_and(|(published_key, published_members)| {
                published_key == key && *published_members == members
            })
        {
            return;
        }
        let peers_changed = self.published.as_ref().is_none_or(|(_, old)| {
            old.iter()
                .map(|member| (member.node_id, &member.service_address))
                .ne(members
                    .iter()
                    .map(|member| (member.node_id, &member.service_address)))
        });
        self.partition_generation += 1;
        if peers_changed {
            self.peers_generation += 1;
        }
        let namespaces = Service::namespace_factors(&self.service.config);
        let state = ClusterState::new(
            self.hello.node_id,
            *key,
            members.clone(),
            &namespaces,
            self.partition_generation,
            self.peers_generation,
        );
        tracing::info!(
            cluster_key = format!("{key:X}"),
            size = members.len(),
            partition_generation = self.partition_generation,
            "published partition map"
        );
        self.service.publish_cluster(state);
        self.published = Some((*key, members));
    }
}

/// Accepts peer connections on one channel and reads their frames.
async fn accept(listener: TcpListener, inbound: mpsc::Sender<Inbound>, fabric: bool) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(read_peer(stream, peer, inbound.clone(), fabric));
            }
            Err(error) => {
                tracing::warn!("cluster accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Reads frames from one inbound peer connection until it closes or sends
/// something malformed.
async fn read_peer(
    mut stream: TcpStream,
    peer: std::net::SocketAddr,
    inbound: mpsc::Sender<Inbound>,
    fabric: bool,
) {
    let mut buffer = Vec::new();
    let mut sender: Option<NodeId> = None;
    loop {
        let kind = match read_frame(&mut stream, &mut buffer).await {
            Ok(Some(kind)) => kind,
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(%peer, "cluster connection closed: {error}");
                return;
            }
        };
        let message = match kind {
            KIND_HELLO => match Hello::decode(&buffer) {
                Some(hello) => {
                    sender = Some(hello.node_id);
                    Inbound::Hello(hello)
                }
                None => {
                    tracing::warn!(%peer, "closing cluster connection: malformed hello");
                    return;
                }
            },
            KIND_CLUSTER if !fabric => match Envelope::decode(&buffer) {
                Ok(envelope) => Inbound::Cluster(envelope),
                Err(error) => {
                    tracing::warn!(%peer, "closing cluster connection: malformed message: {error}");
                    return;
                }
            },
            KIND_KEEPALIVE if fabric => match sender {
                Some(node) => Inbound::Fabric(node),
                None => {
                    tracing::warn!(%peer, "closing fabric connection: keepalive before hello");
                    return;
                }
            },
            other => {
                tracing::warn!(%peer, kind = other, fabric, "closing cluster connection: unexpected frame kind");
                return;
            }
        };
        // A full driver queue drops the message: heartbeats repeat and
        // Paxos retransmits, so the loop must never block on it.
        if inbound.try_send(message).is_err() && inbound.is_closed() {
            return;
        }
    }
}

/// Drains one destination's queue into a connection, reconnecting as needed.
/// Messages queued while the peer is unreachable are dropped.
async fn outbound(address: String, mut queue: mpsc::Receiver<Vec<u8>>, hello: Vec<u8>) {
    let mut connection: Option<TcpStream> = None;
    let mut retry_at = Instant::now();
    while let Some(bytes) = queue.recv().await {
        if connection.is_none() {
            if Instant::now() < retry_at {
                continue;
            }
            match tokio::time::timeout(
                Duration::from_millis(CONNECT_TIMEOUT_MS),
                TcpStream::connect(&address),
            )
            .await
            {
                Ok(Ok(mut stream)) => {
                    let _ = stream.set_nodelay(true);
                    if stream.write_all(&hello).await.is_ok() {
                        connection = Some(stream);
                    }
                }
                Ok(Err(error)) => tracing::trace!(%address, "cannot connect to peer: {error}"),
                Err(_) => tracing::trace!(%address, "connecting to peer timed out"),
            }
            if connection.is_none() {
                retry_at = Instant::now() + Duration::from_millis(100);
                continue;
            }
        }
        if let Some(stream) = connection.as_mut() {
            if stream.write_all(&bytes).await.is_err() {
                connection = None;
                retry_at = Instant::now() + Duration::from_millis(100);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip_and_garbage() {
        let hello = Hello {
            node_id: NodeId(0xBB9),
            rack_id: 2,
            service_address: "127.0.0.1:3000".into(),
            fabric_address: "127.0.0.1:3001".into(),
        };
        let bytes = hello.encode();
        assert_eq!(Hello::decode(&bytes), Some(hello));
        for cut in 0..bytes.len() {
            assert_eq!(Hello::decode(&bytes[..cut]), None);
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Hello::decode(&longer), None);
    }

    #[test]
    fn advertised_addresses() {
        assert_eq!(
            advertised("127.0.0.1", 3002, "127.0.0.1:3000"),
            "127.0.0.1:3002"
        );
        assert_eq!(
            advertised("0.0.0.0", 3002, "10.0.0.5:3000"),
            "10.0.0.5:3002"
        );
        assert_eq!(advertised("::1", 3002, "[::1]:3000"), "[::1]:3002");
    }
}
