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
//!   heartbeat for its sender. It also carries the service's fabric calls
//!   (proxied requests and replica writes): a [`KIND_REQUEST`] frame is
//!   `u64 BE correlation id | u8 call kind | payload`, and its answer comes
//!   back as a [`KIND_RESPONSE`] frame `u64 BE correlation id | answer` on
//!   the answering node's own outbound connection to the caller. The
//!   [`FabricHub`] owns the per-peer fabric queues and the table of calls
//!   awaiting an answer; it implements the service's
//!   [`citrine_service::replication::Fabric`] trait, so service threads send
//!   through the same queues and await the answer on their own event loop.
//!   A request is served as its own task on the `citrine-fabric` thread's
//!   event loop, so neither storage writes nor waiting for replicas ever
//!   delay heartbeats and Paxos on the cluster thread.
//!
//! Either channel can also listen on a TLS port (`fabric.tls-port`,
//! `heartbeat.tls-port`; [`crate::cluster_tls`], mutual between nodes):
//! with heartbeat TLS every heartbeat connection this node opens is TLS;
//! a fabric connection is TLS when both nodes offer fabric TLS (the hello
//! carries the TLS fabric address), else plain. Frames are the same on
//! both.
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
//!   connection that sent them;
//! - every fabric call is removed from the pending table when it is
//!   answered or times out, so answers that arrive late are dropped.

use crate::cluster_tls::{ChannelTlsContext, PeerStream, RepeatLimit};
use crate::config::ServerConfig;
use citrine_cluster::partition_map::agreement::{self, Agreement};
use citrine_cluster::partition_map::{NodeEntry, PartitionMap};
use citrine_cluster::{ClusterConfig, ClusterNode, Effect, Envelope, PeerAddr};
use citrine_service::cluster_state::{ClusterMember, ClusterState, TlsEndpoint};
use citrine_service::replication::{Fabric, FabricError, FabricFuture};
use citrine_service::Service;
use citrine_types::NodeId;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Period of the state machine's clock ticks.
pub const TICK_MS: u64 = 10;
/// Frame kinds.
const KIND_HELLO: u8 = 1;
const KIND_CLUSTER: u8 = 2;
const KIND_KEEPALIVE: u8 = 3;
const KIND_REQUEST: u8 = 4;
const KIND_RESPONSE: u8 = 5;
/// A frame of the stable-placement agreement
/// (`citrine_cluster::partition_map::agreement`), on the fabric channel.
/// Sent only by nodes with `prefer-minimal-migration` on, and only to the
/// view's principal or to the members that offered.
const KIND_PLACEMENT: u8 = 6;
/// Largest frame accepted from a peer: a replica write or a migration
/// batch carrying the largest record a client can send (its message is at
/// most `PROTO_SIZE_MAX`, 128 MiB, as `max-record-size` is), plus the other
/// records of a migration batch (closed once past `BATCH_BYTES`) and the
/// framing. A frame above it closes the connection, so a smaller limit
/// silently failed the replication of every record above it (writes of 16
/// MiB and more timed out).
const FRAME_MAX: usize =
    citrine_wire::PROTO_SIZE_MAX as usize + citrine_service::migration::BATCH_BYTES + 1024 * 1024;
/// Messages queued per destination before new ones are dropped.
const QUEUE_DEPTH: usize = 1024;
/// Period of fabric keepalives.
const KEEPALIVE_MS: u64 = 250;
/// How long to wait for a TCP connection to a peer.
const CONNECT_TIMEOUT_MS: u64 = 500;

/// What a node says about itself when it opens a connection: its id,
/// rack, client service and plain fabric addresses (empty when its fabric
/// is TLS only), and — only when it has a TLS service port — that port's
/// address and TLS name (two more texts, so a node without TLS says
/// exactly what nodes before TLS said), then — only with fabric TLS — its
/// TLS fabric address (a fifth text; the two before it are empty when it
/// has no TLS service port).
///
/// A node without a TLS service port fills the TLS-name text (after an
/// empty TLS address) with its `cluster-name`: builds before it read an
/// empty TLS address as "no TLS port" and ignore the name beside it, so
/// mixed builds still join; a node that reads a cluster name other than
/// its own closes the connection and logs it, as the reference ignores a
/// heartbeat of another cluster name. A node with a TLS service port has
/// no free text and says no cluster name (it cannot be checked).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Hello {
    node_id: NodeId,
    rack_id: u32,
    service_address: String,
    fabric_address: String,
    tls: Option<TlsEndpoint>,
    fabric_tls_address: Option<String>,
    /// Its `cluster-name` (`None`: not said — an older build, or a node
    /// with a TLS service port).
    cluster_name: Option<String>,
}

impl Hello {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&self.node_id.0.to_be_bytes());
        out.extend_from_slice(&self.rack_id.to_be_bytes());
        let none = String::new();
        let mut texts = vec![&self.service_address, &self.fabric_address];
        match (&self.tls, &self.fabric_tls_address, &self.cluster_name) {
            (Some(tls), _, _) => texts.extend([&tls.address, &tls.name]),
            (None, _, Some(name)) => texts.extend([&none, name]),
            (None, Some(_), None) => texts.extend([&none, &none]),
            (None, None, None) => {}
        }
        texts.extend(&self.fabric_tls_address);
        for text in texts {
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
        let mut texts = Vec::with_capacity(5);
        while at < bytes.len() && texts.len() < 5 {
            let length = usize::from(*bytes.get(at)?);
            let text = std::str::from_utf8(bytes.get(at + 1..at + 1 + length)?).ok()?;
            texts.push(text.to_owned());
            at += 1 + length;
        }
        if at != bytes.len() || node_id.0 == 0 || ![2, 4, 5].contains(&texts.len()) {
            return None;
        }
        let mut texts = texts.into_iter();
        let service_address = texts.next()?;
        let fabric_address = texts.next()?;
        let (tls, cluster_name) = match (texts.next(), texts.next()) {
            (Some(address), Some(name)) if !address.is_empty() => {
                (Some(TlsEndpoint { address, name }), None)
            }
            (Some(_), Some(name)) if !name.is_empty() => (None, Some(name)),
            _ => (None, None),
        };
        let fabric_tls_address = texts.next();
        if fabric_tls_address.as_ref().is_some_and(String::is_empty) {
            return None;
        }
        Some(Hello {
            node_id,
            rack_id,
            service_address,
            fabric_address,
            tls,
            fabric_tls_address,
            cluster_name,
        })
    }
}

/// Whether `hello` may be from a member of this node's cluster, named
/// `own`: it names the same cluster, or none (an older build, or a node
/// with a TLS service port, which cannot say it).
fn same_cluster(hello: &Hello, own: &str) -> bool {
    hello.cluster_name.as_deref().is_none_or(|name| name == own)
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.extend_from_slice(&(payload.len() as u32 + 1).to_be_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
    out
}

/// Reads one frame into `buffer`: its kind byte then its payload
/// (`buffer[1..]`); answers the kind. `None` at a clean end of stream. The
/// length is checked before anything more is read, so an empty or huge
/// frame closes the connection at once.
async fn read_frame(stream: &mut PeerStream, buffer: &mut Vec<u8>) -> std::io::Result<Option<u8>> {
    let mut length_bytes = [0u8; 4];
    match stream.read_exact(&mut length_bytes).await {
        Ok(()) => {}
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
    Ok(Some(buffer[0]))
}

/// Encodes a fabric request frame: `id | call kind | payload`.
fn request_frame(id: u64, call_kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(14 + payload.len());
    out.extend_from_slice(&(payload.len() as u32 + 10).to_be_bytes());
    out.push(KIND_REQUEST);
    out.extend_from_slice(&id.to_be_bytes());
    out.push(call_kind);
    out.extend_from_slice(payload);
    out
}

/// Encodes a fabric response frame: `id | answer`.
fn response_frame(id: u64, answer: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(13 + answer.len());
    out.extend_from_slice(&(answer.len() as u32 + 9).to_be_bytes());
    out.push(KIND_RESPONSE);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(answer);
    out
}

/// Splits a request payload (after the kind byte) into (id, call kind, payload).
fn decode_request(bytes: &[u8]) -> Option<(u64, u8, &[u8])> {
    let id = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
    let call_kind = *bytes.get(8)?;
    Some((id, call_kind, bytes.get(9..)?))
}

/// Splits a response payload into (id, answer).
fn decode_response(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let id = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
    Some((id, bytes.get(8..)?))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The fabric as the rest of the node uses it: per-peer outbound queues
/// (drained by connection tasks on the cluster runtime) and the calls
/// awaiting answers.
pub struct FabricHub {
    /// The cluster runtime, where outbound connection tasks run.
    runtime: tokio::runtime::Handle,
    /// This node's hello frame, sent first on every connection.
    hello: Vec<u8>,
    /// Where every peer that said hello is reached: its fabric address,
    /// and whether over TLS.
    addresses: Mutex<HashMap<NodeId, (String, bool)>>,
    /// Fabric TLS, when this node offers it.
    tls: Option<Arc<ChannelTlsContext>>,
    queues: Mutex<HashMap<NodeId, mpsc::Sender<Vec<u8>>>>,
    pending: Mutex<HashMap<u64, tokio::sync::oneshot::Sender<Vec<u8>>>>,
    next_id: AtomicU64,
    dropped: AtomicU64,
}

impl FabricHub {
    fn new(
        runtime: tokio::runtime::Handle,
        hello: &Hello,
        tls: Option<Arc<ChannelTlsContext>>,
    ) -> FabricHub {
        FabricHub {
            runtime,
            tls,
            hello: frame(KIND_HELLO, &hello.encode()),
            addresses: Mutex::new(HashMap::new()),
            queues: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            dropped: AtomicU64::new(0),
        }
    }

    /// Notes where a peer's fabric is reached: over TLS when both offer
    /// it (as the reference: a node that offers no TLS connects in plain),
    /// else its plain address (none: unreachable, logged).
    fn learn(&self, hello: &Hello) {
        let route = match (&self.tls, &hello.fabric_tls_address) {
            (Some(_), Some(address)) => (address.clone(), true),
            _ if !hello.fabric_address.is_empty() => (hello.fabric_address.clone(), false),
            _ => {
                tracing::warn!(node = %hello.node_id, "the node's fabric is TLS only and this node offers no fabric TLS (fabric.tls-port): it cannot reach it");
                return;
            }
        };
        // Lock order: queues before addresses (as `send`).
        let mut queues = lock(&self.queues);
        let mut addresses = lock(&self.addresses);
        if addresses.get(&hello.node_id) != Some(&route) {
            addresses.insert(hello.node_id, route);
            // A new address: the next send reconnects there.
            queues.remove(&hello.node_id);
        }
    }

    /// Queues a frame to `to`, opening its connection task if needed.
    /// False when the peer's address is unknown or its queue is full.
    fn send(&self, to: NodeId, bytes: Vec<u8>) -> bool {
        let mut queues = lock(&self.queues);
        let queue = match queues.entry(to) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let Some((address, tls)) = lock(&self.addresses).get(&to).cloned() else {
                    return false;
                };
                let (sender, receiver) = mpsc::channel(QUEUE_DEPTH);
                let tls = if tls { self.tls.clone() } else { None };
                self.runtime.spawn(outbound(
                    Destination { address, tls },
                    receiver,
                    self.hello.clone(),
                ));
                entry.insert(sender)
            }
        };
        let sent = queue.try_send(bytes).is_ok();
        if !sent {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }

    /// Closes the queues of nodes not in `members`.
    fn retain(&self, members: &[NodeId]) {
        lock(&self.queues).retain(|node, _| members.contains(node));
    }

    /// Hands an answer to the call waiting for it (if it still waits).
    fn answer(&self, id: u64, answer: Vec<u8>) {
        if let Some(waiter) = lock(&self.pending).remove(&id) {
            let _ = waiter.send(answer);
        }
    }
}

/// The service's handle on the fabric.
pub struct FabricClient(pub Arc<FabricHub>);

impl Fabric for FabricClient {
    fn call(&self, to: NodeId, kind: u8, payload: Vec<u8>, timeout: Duration) -> FabricFuture {
        let hub = self.0.clone();
        let id = hub.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = tokio::sync::oneshot::channel();
        lock(&hub.pending).insert(id, sender);
        let sent = hub.send(to, request_frame(id, kind, &payload));
        // Forgets the waiter however the call ends — answered, timed out,
        // or dropped unfinished by a caller that wants no answer.
        let forget = ForgetCall { hub, id };
        Box::pin(async move {
            let answer = if sent {
                match tokio::time::timeout(timeout, receiver).await {
                    Ok(Ok(answer)) => Ok(answer),
                    _ => Err(FabricError::Timeout),
                }
            } else {
                Err(FabricError::Unreachable)
            };
            drop(forget);
            answer
        })
    }
}

/// Removes a fabric call's waiter from the hub when dropped.
struct ForgetCall {
    hub: Arc<FabricHub>,
    id: u64,
}

impl Drop for ForgetCall {
    fn drop(&mut self) {
        lock(&self.hub.pending).remove(&self.id);
    }
}

/// Something the connection tasks hand to the driver.
enum Inbound {
    Hello(Hello),
    Cluster(Envelope),
    Fabric(NodeId),
    Placement(NodeId, Vec<u8>),
    /// The placements the agreement asked for, computed off this thread.
    Computed(
        u64,
        Vec<(String, citrine_cluster::partition_map::Placement)>,
    ),
}

/// Starts the cluster runtime thread. Binding the heartbeat and fabric ports
/// and reading their TLS certificates happen before this returns, so a port
/// in use or a bad certificate file stops the start.
///
/// Steps: bind the channels, work out this node's advertised addresses
/// and the state machine's settings (a node given seeds is an orphan until
/// its first view), start the fabric runtime, then run the driver on its
/// own event loop.
pub fn start(
    service: Arc<Service>,
    config: &ServerConfig,
    stopping: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, String> {
    let settings = &config.cluster;
    let listeners = Listeners::bind(settings)?;
    let access = &service.config.access_address;
    // Heartbeats go over TLS only when the node offers TLS heartbeats.
    let own_heartbeat = match (&settings.heartbeat_tls, settings.heartbeat_port) {
        (Some(tls), _) => advertised(&tls.address, tls.settings.port, access),
        (None, Some(port)) => advertised(&settings.heartbeat_address, port, access),
        (None, None) => return Err("no heartbeat port".to_owned()),
    };
    let own_fabric = settings.fabric_port.map_or_else(String::new, |port| {
        advertised(&settings.fabric_address, port, access)
    });
    let cluster_config = cluster_config(service.node_id, settings, own_heartbeat)?;
    if !cluster_config.heartbeat.seeds.is_empty() {
        // Joining others: serve nothing until the first view is published.
        service.set_orphan();
    }
    let hello = Hello {
        node_id: service.node_id,
        rack_id: settings.rack_id,
        service_address: service.config.access_address.clone(),
        fabric_address: own_fabric,
        tls: config.tls.as_ref().map(|tls| TlsEndpoint {
            address: service.config.tls_access_address.clone(),
            name: tls.name.clone(),
        }),
        fabric_tls_address: settings
            .fabric_tls
            .as_ref()
            .map(|tls| advertised(&tls.address, tls.settings.port, access)),
        cluster_name: Some(service.config.cluster_name.clone()),
    };
    tracing::info!(
        listening = ?listeners.binds,
        seeds = ?settings.seeds,
        rack = settings.rack_id,
        "cluster channels listening"
    );
    let fabric_runtime = start_fabric_runtime()?;
    crate::event_loop::spawn("citrine-cluster", move || async move {
        let start = ClusterStart {
            service,
            cluster_config,
            hello,
            stopping,
            fabric_runtime,
        };
        start.run(listeners).await;
    })
}

/// One listening channel: plain or TLS, heartbeat or fabric.
struct Channel {
    listener: std::net::TcpListener,
    fabric: bool,
    tls: Option<Arc<ChannelTlsContext>>,
}

/// The heartbeat and fabric listeners (plain and TLS), bound and
/// non-blocking, and the TLS contexts of the channels that have one.
struct Listeners {
    channels: Vec<Channel>,
    heartbeat_tls: Option<Arc<ChannelTlsContext>>,
    fabric_tls: Option<Arc<ChannelTlsContext>>,
    /// What each listener is, for the log.
    binds: Vec<String>,
}

impl Listeners {
    fn bind(settings: &crate::config::ClusterSettings) -> Result<Listeners, String> {
        let context = |channel: &'static str, tls: &Option<crate::tls_config::ChannelTls>| {
            tls.as_ref()
                .map(|tls| ChannelTlsContext::new(channel, tls).map(Arc::new))
                .transpose()
        };
        let heartbeat_tls = context("heartbeat", &settings.heartbeat_tls)?;
        let fabric_tls = context("fabric", &settings.fabric_tls)?;
        let mut wanted = Vec::with_capacity(4);
        let plain = [
            (
                false,
                &settings.heartbeat_address,
                settings.heartbeat_port,
                &heartbeat_tls,
                &settings.heartbeat_tls,
            ),
            (
                true,
                &settings.fabric_address,
                settings.fabric_port,
                &fabric_tls,
                &settings.fabric_tls,
            ),
        ];
        for (fabric, address, port, context, tls) in plain {
            if let Some(port) = port {
                wanted.push((fabric, format!("{address}:{port}"), None));
            }
            if let (Some(context), Some(tls)) = (context, tls) {
                let bind = format!("{}:{}", tls.address, tls.settings.port);
                wanted.push((fabric, bind, Some(context.clone())));
            }
        }
        let mut listeners = Listeners {
            channels: Vec::with_capacity(wanted.len()),
            heartbeat_tls,
            fabric_tls,
            binds: Vec::with_capacity(wanted.len()),
        };
        for (fabric, bind, tls) in wanted {
            let listener = std::net::TcpListener::bind(&bind).map_err(|error| {
                format!(
                    "cannot listen for {} on {bind}: {error}",
                    channel_name(fabric, tls.is_some())
                )
            })?;
            listener
                .set_nonblocking(true)
                .map_err(|error| format!("cannot configure the cluster listeners: {error}"))?;
            listeners
                .binds
                .push(format!("{} {bind}", channel_name(fabric, tls.is_some())));
            listeners.channels.push(Channel {
                listener,
                fabric,
                tls,
            });
        }
        Ok(listeners)
    }
}

/// How a channel is named in messages (with the options that set it).
fn channel_name(fabric: bool, tls: bool) -> &'static str {
    match (fabric, tls) {
        (false, false) => "heartbeats (--heartbeat-port / heartbeat.port)",
        (false, true) => "TLS heartbeats (heartbeat.tls-port)",
        (true, false) => "fabric (--fabric-port / fabric.port)",
        (true, true) => "TLS fabric (fabric.tls-port)",
    }
}

/// The state machine's settings: this node at `own_heartbeat`, its seeds
/// (itself left out), and every timing derived from the heartbeat
/// timeout.
fn cluster_config(
    node_id: NodeId,
    settings: &crate::config::ClusterSettings,
    own_heartbeat: String,
) -> Result<ClusterConfig, String> {
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
    Ok(cluster_config)
}

/// Starts the `citrine-fabric` thread, whose event loop serves fabric
/// requests for the life of the process; its handle.
fn start_fabric_runtime() -> Result<tokio::runtime::Handle, String> {
    let (fabric_sender, fabric_receiver) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("citrine-fabric".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = fabric_sender.send(Err(error.to_string()));
                    return;
                }
            };
            let _ = fabric_sender.send(Ok(runtime.handle().clone()));
            // Serves the tasks spawned on it for the life of the process.
            runtime.block_on(std::future::pending::<()>());
        })
        .map_err(|error| format!("cannot start the fabric thread: {error}"))?;
    fabric_receiver
        .recv()
        .map_err(|_| "the fabric thread died at start".to_owned())?
        .map_err(|error| format!("cannot start the fabric runtime: {error}"))
}

/// What the cluster thread starts from.
struct ClusterStart {
    service: Arc<Service>,
    cluster_config: ClusterConfig,
    hello: Hello,
    stopping: Arc<AtomicBool>,
    fabric_runtime: tokio::runtime::Handle,
}

impl ClusterStart {
    /// On the cluster thread: registers the listeners, builds the state
    /// machine, installs the fabric in the service and drives it all until
    /// the node stops (logged and ended at once if a step fails).
    async fn run(self, listeners: Listeners) {
        let mut channels = Vec::with_capacity(listeners.channels.len());
        for channel in listeners.channels {
            let Ok(listener) = TcpListener::from_std(channel.listener) else {
                tracing::error!("cannot register the cluster listeners");
                return;
            };
            channels.push((listener, channel.fabric, channel.tls));
        }
        let started = Instant::now();
        let boot_ms = boot_clock_ms();
        let agreement = placement_agreement(&self.service, &self.cluster_config);
        let node = match ClusterNode::new(self.cluster_config, boot_ms) {
            Ok(node) => node,
            Err(error) => {
                tracing::error!("bad cluster timing settings: {error}");
                return;
            }
        };
        let hub = Arc::new(FabricHub::new(
            tokio::runtime::Handle::current(),
            &self.hello,
            listeners.fabric_tls,
        ));
        self.service.set_fabric(Arc::new(FabricClient(hub.clone())));
        let mut driver = Driver::new(self.service, hub, node, self.hello, started, boot_ms);
        driver.heartbeat_tls = listeners.heartbeat_tls;
        driver.agreement = agreement;
        driver
            .run(channels, self.stopping, self.fabric_runtime)
            .await;
    }
}

/// The stable-placement agreement of this node: its namespaces with
/// `prefer-minimal-migration` on; a principal waits for the other
/// members' offers up to the heartbeat timeout.
fn placement_agreement(service: &Service, cluster_config: &ClusterConfig) -> Agreement {
    let stable: Vec<(String, usize)> = service
        .config
        .namespaces
        .iter()
        .filter(|namespace| namespace.prefer_minimal_migration && !namespace.sc.strong_consistency)
        .map(|namespace| {
            (
                namespace.name.clone(),
                usize::from(namespace.replication_factor),
            )
        })
        .collect();
    Agreement::new(service.node_id, stable, cluster_config.heartbeat.timeout_ms)
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
    /// `now()` at `started`.
    boot_ms: u64,
    inbound_sender: mpsc::Sender<Inbound>,
    inbound: mpsc::Receiver<Inbound>,
    /// Heartbeat-channel queues by destination address.
    heartbeat_queues: HashMap<String, mpsc::Sender<Vec<u8>>>,
    /// Heartbeat TLS: when set, every heartbeat connection is TLS.
    heartbeat_tls: Option<Arc<ChannelTlsContext>>,
    /// Fabric queues by node, shared with the service.
    fabric: Arc<FabricHub>,
    /// What each peer said about itself.
    peers: BTreeMap<NodeId, Hello>,
    /// The committed view waiting to be published (key, members).
    view: Option<(u64, Vec<NodeId>)>,
    /// The view whose members are all known, waiting for its maps (the
    /// agreement's decision).
    pending: Option<(u64, Vec<ClusterMember>)>,
    /// Decides the maps of namespaces with `prefer-minimal-migration`.
    agreement: Agreement,
    published: Option<(u64, Vec<ClusterMember>)>,
    partition_generation: u64,
    peers_generation: u64,
    dropped_messages: u64,
}

impl Driver {
    fn new(
        service: Arc<Service>,
        fabric: Arc<FabricHub>,
        node: ClusterNode,
        hello: Hello,
        started: Instant,
        boot_ms: u64,
    ) -> Driver {
        let (inbound_sender, inbound) = mpsc::channel(4096);
        let initial = service.cluster();
        Driver {
            node,
            hello,
            started,
            boot_ms,
            inbound_sender,
            inbound,
            heartbeat_queues: HashMap::new(),
            heartbeat_tls: None,
            fabric,
            peers: BTreeMap::new(),
            view: None,
            pending: None,
            agreement: Agreement::new(service.node_id, Vec::new(), 1),
            published: None,
            partition_generation: initial.partition_generation,
            peers_generation: initial.peers_generation,
            dropped_messages: 0,
            service,
        }
    }

    /// The state machine's clock: the Unix time of the boot (milliseconds)
    /// advanced by the monotonic clock. It is also the heartbeat
    /// incarnation and goes into cluster keys, so a node restarted at once
    /// under the same id is a *later* incarnation (its peers take its
    /// heartbeats, see it orphaned and form a new view) and never derives
    /// the keys of its previous life.
    fn now(&self) -> u64 {
        self.boot_ms + self.started.elapsed().as_millis() as u64
    }

    async fn run(
        mut self,
        channels: Vec<(TcpListener, bool, Option<Arc<ChannelTlsContext>>)>,
        stopping: Arc<AtomicBool>,
        fabric_runtime: tokio::runtime::Handle,
    ) {
        let context = PeerContext {
            inbound: self.inbound_sender.clone(),
            service: self.service.clone(),
            fabric: self.fabric.clone(),
            serve_on: fabric_runtime,
        };
        for (listener, fabric, tls) in channels {
            tokio::spawn(accept(listener, context.clone(), fabric, tls));
        }
        let mut ticker = tokio::time::interval(Duration::from_millis(TICK_MS));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last_keepalive = Instant::now();
        let mut last_tick = Instant::now();
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    if stopping.load(Ordering::Relaxed) {
                        return;
                    }
                    let stalls = self.node.stats().stalls;
                    let effects = self.node.tick(self.now());
                    if self.node.stats().stalls > stalls {
                        tracing::warn!(
                            since_last_tick_ms = last_tick.elapsed().as_millis() as u64,
                            "this node stalled (frozen or starved of CPU): it heard no heartbeat meanwhile"
                        );
                    }
                    last_tick = Instant::now();
                    if self.service.dist().take_recluster_request() {
                        // Strong consistency: `recluster:`, `revive:` or a
                        // roster not yet decided with (a principal acts).
                        self.node.request_recluster();
                    }
                    self.perform(effects);
                    let actions = self.agreement.tick(self.now());
                    self.perform_agreement(actions);
                    self.service.cluster_ticked(self.node.stall_bound_ms());
                    self.service.set_cluster_clock_skew(self.node.clock_skew_ms());
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
                self.fabric.learn(&hello);
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
            Inbound::Computed(cluster_key, placements) => {
                let actions = self.agreement.computed(cluster_key, placements);
                self.perform_agreement(actions);
            }
            Inbound::Placement(from, bytes) => match agreement::Frame::decode(&bytes) {
                Ok(frame) => {
                    let actions = self.agreement.on_frame(from, frame, now);
                    self.perform_agreement(actions);
                }
                Err(error) => {
                    tracing::warn!(from = %from, "ignoring a malformed placement frame: {error}");
                }
            },
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
                    // Serving alone from a stale view could acknowledge
                    // writes on copies the cluster has moved past: stop
                    // serving until the next view (alone, if nobody else
                    // is reachable: a network split) is agreed.
                    tracing::warn!("left the cluster view; not serving until a new view is agreed");
                    self.view = None;
                    self.pending = None;
                    self.agreement.orphaned();
                    self.service.set_orphan();
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
                let destination = Destination {
                    address: address.to_owned(),
                    tls: self.heartbeat_tls.clone(),
                };
                tokio::spawn(outbound(
                    destination,
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
        for member in members {
            if *member == self.hello.node_id {
                continue;
            }
            if !self.fabric.send(*member, frame(KIND_KEEPALIVE, &[])) {
                self.dropped_messages += 1;
            }
        }
        // Queues of nodes no longer in the view close with their senders.
        self.fabric.retain(members);
    }

    /// Publishes the pending view once every member's hello is known and
    /// its maps are decided (at once for the paper's map).
    fn try_publish(&mut self) {
        let Some((key, succession)) = &self.view else {
            return;
        };
        let key = *key;
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
                tls: hello.tls.clone(),
            });
        }
        if self
            .published
            .as_ref()
            .is_some_and(|(published_key, published_members)| {
                *published_key == key && *published_members == members
            })
        {
            return;
        }
        let entries: Vec<NodeEntry> = members
            .iter()
            .map(|member| NodeEntry {
                id: member.node_id,
                rack_id: member.rack_id,
            })
            .collect();
        self.pending = Some((key, members));
        let actions = self.agreement.view_ready(key, &entries, self.now());
        self.perform_agreement(actions);
    }

    /// Performs what the placement agreement asks.
    fn perform_agreement(&mut self, actions: Vec<agreement::Action>) {
        for action in actions {
            match action {
                agreement::Action::Send { to, frame: bytes } => {
                    let bytes = frame(KIND_PLACEMENT, &bytes);
                    for node in to {
                        if !self.fabric.send(node, bytes.clone()) {
                            self.dropped_messages += 1;
                        }
                    }
                }
                agreement::Action::Install { cluster_key, maps } => self.publish(cluster_key, maps),
                agreement::Action::Compute { cluster_key, jobs } => self.compute(cluster_key, jobs),
                agreement::Action::Stalled { source, waited_ms } => {
                    tracing::warn!(
                        principal = %source,
                        waited_ms,
                        "prefer-minimal-migration: the view's principal has not answered this node's offer \
                         (a Citrine without the option does not); not serving until it answers or the view \
                         changes: upgrade the principal, or set prefer-minimal-migration false on this node"
                    );
                    self.service.set_orphan();
                }
            }
        }
    }

    /// Computes placements on a thread of their own (a small cluster's
    /// rebalance takes tens of milliseconds, seconds in a debug build:
    /// too long for the heartbeat thread) and hands them back.
    fn compute(&mut self, cluster_key: u64, jobs: Vec<agreement::Job>) {
        let sender = self.inbound_sender.clone();
        let spawned = std::thread::Builder::new()
            .name("citrine-placement".into())
            .spawn(move || {
                let placements = jobs.iter().map(agreement::Job::run).collect();
                let _ = sender.blocking_send(Inbound::Computed(cluster_key, placements));
            });
        if let Err(error) = spawned {
            tracing::error!("cannot start the placement thread: {error}");
        }
    }

    /// Publishes view `key` (if it is the pending one) with `maps` for the
    /// namespaces the agreement decided and the paper's map for the others.
    fn publish(&mut self, key: u64, maps: Vec<(String, PartitionMap)>) {
        let Some((pending_key, members)) = self.pending.take() else {
            return;
        };
        if pending_key != key {
            self.pending = Some((pending_key, members));
            return;
        }
        let peers_changed = self.published.as_ref().is_none_or(|(_, old)| {
            old.iter()
                .map(|member| (member.node_id, &member.service_address, &member.tls))
                .ne(members
                    .iter()
                    .map(|member| (member.node_id, &member.service_address, &member.tls)))
        });
        self.partition_generation += 1;
        if peers_changed {
            self.peers_generation += 1;
        }
        let namespaces = Service::namespace_factors(&self.service.config);
        let stable: Vec<String> = maps.iter().map(|(name, _)| name.clone()).collect();
        let state = ClusterState::with_maps(
            self.hello.node_id,
            key,
            members.clone(),
            &namespaces,
            maps,
            (self.partition_generation, self.peers_generation),
        );
        tracing::info!(
            cluster_key = format!("{key:X}"),
            size = members.len(),
            partition_generation = self.partition_generation,
            stable_placement = ?stable,
            "published partition map"
        );
        self.service.publish_cluster(state);
        self.published = Some((key, members));
    }
}

/// What a peer connection's reader needs.
#[derive(Clone)]
struct PeerContext {
    inbound: mpsc::Sender<Inbound>,
    service: Arc<Service>,
    fabric: Arc<FabricHub>,
    /// Where fabric requests are served (the `citrine-fabric` thread).
    serve_on: tokio::runtime::Handle,
}

/// Unix time in milliseconds (at least 1).
fn boot_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |since| since.as_millis() as u64)
        .max(1)
}

/// Accepts peer connections on one channel and reads their frames (after
/// the TLS handshake on a TLS channel).
async fn accept(
    listener: TcpListener,
    context: PeerContext,
    fabric: bool,
    tls: Option<Arc<ChannelTlsContext>>,
) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let context = context.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let stream = match tls {
                        None => PeerStream::plain(stream),
                        Some(tls) => match tls.accept(stream).await {
                            Ok(stream) => PeerStream::Tls(Box::new(stream)),
                            Err(error) => {
                                log_handshake_failure(
                                    &tls.accept_failures,
                                    tls.channel,
                                    &peer.ip().to_string(),
                                    "from",
                                    &error,
                                );
                                return;
                            }
                        },
                    };
                    read_peer(stream, peer, context, fabric).await;
                });
            }
            Err(error) => {
                tracing::warn!("cluster accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Logs a fabric call whose serving panicked (the caller's call times
/// out; the node keeps serving) and reports any partition a change it cut
/// short has stopped (see `citrine_data::namespace::Namespace::serving`).
fn watch_fabric_call(context: &PeerContext, served: tokio::task::JoinHandle<()>) {
    let service = context.service.clone();
    context.serve_on.spawn(async move {
        if let Err(error) = served.await {
            if error.is_panic() {
                tracing::error!("serving a fabric call panicked; the node keeps serving");
                service.report_failed_partitions();
            }
        }
    });
}

/// Reads frames from one inbound peer connection until it closes or sends
/// something malformed.
async fn read_peer(
    mut stream: PeerStream,
    peer: std::net::SocketAddr,
    context: PeerContext,
    fabric: bool,
) {
    let inbound = &context.inbound;
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
        let frame = PeerFrame {
            kind,
            bytes: &buffer[1..],
            fabric,
        };
        let message = match frame.take(&context, &mut sender) {
            Taken::Forward(message) => message,
            Taken::Done => continue,
            Taken::Close(why) => {
                tracing::warn!(%peer, kind, fabric, "{why}");
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

/// One frame read from a peer connection.
struct PeerFrame<'a> {
    kind: u8,
    bytes: &'a [u8],
    /// Read on the fabric channel (else the heartbeat channel).
    fabric: bool,
}

/// What became of a peer's frame.
enum Taken {
    /// A message for the driver.
    Forward(Inbound),
    /// Handled here (a fabric request or response).
    Done,
    /// Malformed or out of place: the connection closes (the log line).
    Close(String),
}

impl PeerFrame<'_> {
    /// Decodes the frame and does what it asks: a hello names the
    /// connection's `sender`; a fabric request is served on the fabric
    /// thread, a response completes its call. Nothing a peer sends panics
    /// the node: a malformed frame closes the connection.
    fn take(&self, context: &PeerContext, sender: &mut Option<NodeId>) -> Taken {
        match self.kind {
            KIND_HELLO => match Hello::decode(self.bytes) {
                Some(hello) if !same_cluster(&hello, &context.service.config.cluster_name) => {
                    Taken::Close(format!(
                        "ignoring message from {:X} with different cluster name '{}'",
                        hello.node_id.0,
                        hello.cluster_name.unwrap_or_default()
                    ))
                }
                Some(hello) => {
                    *sender = Some(hello.node_id);
                    Taken::Forward(Inbound::Hello(hello))
                }
                None => Taken::Close("closing cluster connection: malformed hello".to_owned()),
            },
            KIND_CLUSTER if !self.fabric => match Envelope::decode(self.bytes) {
                Ok(envelope) => Taken::Forward(Inbound::Cluster(envelope)),
                Err(error) => Taken::Close(format!(
                    "closing cluster connection: malformed message: {error}"
                )),
            },
            KIND_REQUEST if self.fabric => {
                let (Some(from), Some((id, call_kind, payload))) =
                    (*sender, decode_request(self.bytes))
                else {
                    return Taken::Close("closing fabric connection: malformed request".to_owned());
                };
                let payload = payload.to_vec();
                let service = context.service.clone();
                let hub = context.fabric.clone();
                let served = context.serve_on.spawn(async move {
                    let answer = service.serve_fabric(call_kind, &payload).await;
                    hub.send(from, response_frame(id, &answer));
                });
                watch_fabric_call(context, served);
                Taken::Done
            }
            KIND_RESPONSE if self.fabric => {
                let Some((id, answer)) = decode_response(self.bytes) else {
                    return Taken::Close(
                        "closing fabric connection: malformed response".to_owned(),
                    );
                };
                context.fabric.answer(id, answer.to_vec());
                Taken::Done
            }
            KIND_PLACEMENT => match *sender {
                Some(node) => Taken::Forward(Inbound::Placement(node, self.bytes.to_vec())),
                None => {
                    Taken::Close("closing cluster connection: placement before hello".to_owned())
                }
            },
            KIND_KEEPALIVE if self.fabric => match *sender {
                Some(node) => Taken::Forward(Inbound::Fabric(node)),
                None => {
                    Taken::Close("closing fabric connection: keepalive before hello".to_owned())
                }
            },
            _ => Taken::Close("closing cluster connection: unexpected frame kind".to_owned()),
        }
    }
}

/// Logs a failed TLS handshake with a peer (at most once per window for
/// the same failure): the reason a node is kept out of the cluster.
fn log_handshake_failure(
    limit: &RepeatLimit,
    channel: &str,
    peer: &str,
    direction: &str,
    error: &str,
) {
    if let Some(suppressed) = limit.admit(&format!("{peer} {error}")) {
        let earlier = if suppressed > 0 {
            format!(" ({suppressed} earlier failures not logged)")
        } else {
            String::new()
        };
        tracing::warn!("{channel} TLS handshake {direction} {peer} failed: {error}; the peer cannot take part in the cluster{earlier}");
    }
}

/// Where an outbound connection goes, and over what.
struct Destination {
    address: String,
    /// The channel's TLS, when the connection is TLS.
    tls: Option<Arc<ChannelTlsContext>>,
}

impl Destination {
    /// Connects (and shakes hands) within the timeouts.
    async fn connect(&self, failures: &RepeatLimit) -> Option<PeerStream> {
        let address = &self.address;
        let stream = match tokio::time::timeout(
            Duration::from_millis(CONNECT_TIMEOUT_MS),
            TcpStream::connect(address),
        )
        .await
        {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                tracing::trace!(%address, "cannot connect to peer: {error}");
                return None;
            }
            Err(_) => {
                tracing::trace!(%address, "connecting to peer timed out");
                return None;
            }
        };
        let _ = stream.set_nodelay(true);
        let Some(tls) = &self.tls else {
            return Some(PeerStream::plain(stream));
        };
        match tls.connect(stream).await {
            Ok(stream) => Some(PeerStream::Tls(Box::new(stream))),
            Err(error) => {
                log_handshake_failure(failures, tls.channel, address, "with", &error);
                None
            }
        }
    }
}

/// How many queued bytes one socket write may carry: frames queued while
/// the previous write ran go out together, up to this much.
const COALESCE_BYTES: usize = 256 * 1024;

/// Drains one destination's queue into a connection, reconnecting as needed.
/// Messages queued while the peer is unreachable are dropped. Frames queued
/// behind the first are written with it in one write (in queue order).
async fn outbound(destination: Destination, mut queue: mpsc::Receiver<Vec<u8>>, hello: Vec<u8>) {
    let mut connection: Option<PeerStream> = None;
    let mut retry_at = Instant::now();
    let failures = RepeatLimit::default();
    let mut batch = Vec::new();
    while let Some(first) = queue.recv().await {
        if connection.is_none() {
            if Instant::now() < retry_at {
                continue;
            }
            connection = open_outbound(&destination, &failures, &hello).await;
            if connection.is_none() {
                retry_at = Instant::now() + Duration::from_millis(100);
                continue;
            }
        }
        let bytes = coalesce(first, &mut queue, &mut batch);
        if let Some(stream) = connection.as_mut() {
            if stream.write_all(bytes).await.is_err() {
                connection = None;
                retry_at = Instant::now() + Duration::from_millis(100);
            }
        }
    }
}

/// Connects to `destination` and sends the hello.
async fn open_outbound(
    destination: &Destination,
    failures: &RepeatLimit,
    hello: &[u8],
) -> Option<PeerStream> {
    let mut stream = destination.connect(failures).await?;
    stream.write_all(hello).await.ok()?;
    Some(stream)
}

/// `first` and the frames already queued behind it, up to
/// [`COALESCE_BYTES`], as one run of bytes (`first` alone when nothing is
/// queued: no copy).
fn coalesce<'a>(
    first: Vec<u8>,
    queue: &mut mpsc::Receiver<Vec<u8>>,
    batch: &'a mut Vec<u8>,
) -> &'a [u8] {
    batch.clear();
    let mut first = Some(first);
    while batch.len() + first.as_ref().map_or(0, Vec::len) < COALESCE_BYTES {
        match queue.try_recv() {
            Ok(next) => {
                if let Some(first) = first.take() {
                    *batch = first;
                }
                batch.extend_from_slice(&next);
            }
            Err(_) => break,
        }
    }
    if let Some(first) = first {
        *batch = first;
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_frames_go_out_together_in_order_up_to_the_bound() {
        let (sender, mut queue) = mpsc::channel(16);
        let mut batch = Vec::new();
        // Nothing queued: the first frame alone.
        assert_eq!(coalesce(vec![1, 2], &mut queue, &mut batch), &[1, 2]);
        for frame in [vec![3], vec![4, 5], vec![6]] {
            sender.try_send(frame).expect("test step");
        }
        assert_eq!(coalesce(vec![2], &mut queue, &mut batch), &[2, 3, 4, 5, 6]);
        // A run stops once it reaches the bound; the rest waits in order.
        let big = vec![7u8; COALESCE_BYTES - 1];
        sender.try_send(vec![8]).expect("test step");
        sender.try_send(vec![9]).expect("test step");
        let run = coalesce(big, &mut queue, &mut batch).to_vec();
        assert_eq!(run.len(), COALESCE_BYTES);
        assert_eq!(run[COALESCE_BYTES - 1], 8);
        assert_eq!(coalesce(vec![0], &mut queue, &mut batch), &[0, 9]);
    }

    #[tokio::test]
    async fn frames_read_back_through_the_buffered_plain_stream() {
        use crate::cluster_tls::PLAIN_READ_BUFFER;
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("io");
        let address = listener.local_addr().expect("test step");
        let writer = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("io");
            let mut bytes = Vec::new();
            for index in 0..1000u32 {
                bytes.extend(frame((index % 200) as u8, &index.to_be_bytes()));
            }
            bytes.extend(frame(9, &vec![0xAB; 3 * PLAIN_READ_BUFFER]));
            socket.write_all(&bytes).await.expect("io");
        });
        let mut stream = PeerStream::plain(TcpStream::connect(address).await.expect("io"));
        let mut buffer = Vec::new();
        for index in 0..1000u32 {
            let kind = read_frame(&mut stream, &mut buffer).await.expect("io");
            assert_eq!(kind, Some((index % 200) as u8));
            assert_eq!(buffer[1..], index.to_be_bytes());
        }
        assert_eq!(
            read_frame(&mut stream, &mut buffer).await.expect("io"),
            Some(9)
        );
        assert_eq!(buffer[1..], vec![0xAB; 3 * PLAIN_READ_BUFFER]);
        assert_eq!(
            read_frame(&mut stream, &mut buffer).await.expect("io"),
            None
        );
        writer.await.expect("io");
    }

    #[test]
    fn hello_round_trip_and_garbage() {
        let hello = Hello {
            node_id: NodeId(0xBB9),
            rack_id: 2,
            service_address: "127.0.0.1:3000".into(),
            fabric_address: "127.0.0.1:3001".into(),
            tls: None,
            fabric_tls_address: None,
            cluster_name: None,
        };
        // With a TLS port the hello carries two more texts; without one it
        // is what nodes before TLS sent.
        let with_tls = Hello {
            tls: Some(TlsEndpoint {
                address: "127.0.0.1:4333".into(),
                name: "localhost".into(),
            }),
            ..hello.clone()
        };
        let tls_bytes = with_tls.encode();
        assert_eq!(Hello::decode(&tls_bytes), Some(with_tls.clone()));
        assert_eq!(&tls_bytes[..hello.encode().len()], &hello.encode()[..]);
        assert_eq!(Hello::decode(&tls_bytes[..tls_bytes.len() - 10]), None);
        let bytes = hello.encode();
        assert_eq!(Hello::decode(&bytes), Some(hello.clone()));
        for cut in 0..bytes.len() {
            assert_eq!(Hello::decode(&bytes[..cut]), None);
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Hello::decode(&longer), None);
        // Fabric TLS adds a fifth text, with or without a TLS service port.
        for service_tls in [None, with_tls.tls.clone()] {
            let fabric_tls = Hello {
                fabric_address: String::new(),
                tls: service_tls,
                fabric_tls_address: Some("127.0.0.1:3011".into()),
                ..hello.clone()
            };
            let bytes = fabric_tls.encode();
            assert_eq!(Hello::decode(&bytes), Some(fabric_tls));
            assert_eq!(Hello::decode(&bytes[..bytes.len() - 5]), None);
        }
    }

    #[test]
    fn the_cluster_name_rides_in_the_tls_name_text_of_a_node_without_tls() {
        let named = Hello {
            node_id: NodeId(0xBB9),
            rack_id: 0,
            service_address: "127.0.0.1:3000".into(),
            fabric_address: "127.0.0.1:3001".into(),
            tls: None,
            fabric_tls_address: None,
            cluster_name: Some("prod".into()),
        };
        let bytes = named.encode();
        // Four texts, the TLS address empty: what a node with fabric TLS
        // and no TLS service port sent before, which builds before this
        // one read as "no TLS port", ignoring the name.
        let old_form = Hello {
            cluster_name: None,
            fabric_tls_address: Some("x".into()),
            ..named.clone()
        }
        .encode();
        assert_eq!(bytes[..bytes.len() - 5], old_form[..old_form.len() - 3]);
        assert_eq!(&bytes[bytes.len() - 5..], b"\x04prod");
        assert_eq!(Hello::decode(&bytes), Some(named.clone()));
        // With fabric TLS: a fifth text after the name.
        let with_fabric_tls = Hello {
            fabric_tls_address: Some("127.0.0.1:3011".into()),
            ..named.clone()
        };
        let bytes = with_fabric_tls.encode();
        assert_eq!(Hello::decode(&bytes), Some(with_fabric_tls));
        // A TLS service port takes the text: no name said.
        let with_tls = Hello {
            tls: Some(TlsEndpoint {
                address: "127.0.0.1:4333".into(),
                name: "localhost".into(),
            }),
            ..named.clone()
        };
        let decoded = Hello::decode(&with_tls.encode()).expect("decodes");
        assert_eq!(decoded.cluster_name, None);
        assert_eq!(decoded.tls, with_tls.tls);
        // Another name is refused; the same one, or none, is not.
        assert!(same_cluster(&named, "prod"));
        assert!(!same_cluster(&named, "citrine"));
        assert!(same_cluster(&decoded, "citrine"));
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

    #[test]
    #[allow(clippy::unwrap_used)]
    fn fabric_request_and_response_frames() {
        let bytes = request_frame(0x0102_0304_0506_0708, 2, b"payload");
        assert_eq!(
            u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize,
            bytes.len() - 4
        );
        assert_eq!(bytes[4], KIND_REQUEST);
        assert_eq!(
            decode_request(&bytes[5..]),
            Some((0x0102_0304_0506_0708, 2, &b"payload"[..]))
        );
        let bytes = response_frame(42, b"\x00");
        assert_eq!(bytes[4], KIND_RESPONSE);
        assert_eq!(
            u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize,
            bytes.len() - 4
        );
        assert_eq!(decode_response(&bytes[5..]), Some((42, &[0u8][..])));
        for cut in 0..8 {
            assert_eq!(decode_request(&[0; 9][..cut]), None);
            assert_eq!(decode_response(&[0; 8][..cut]), None);
        }
        assert_eq!(decode_request(&[0; 8]), None);
    }
}
