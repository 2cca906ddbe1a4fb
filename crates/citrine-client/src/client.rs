//! The public [`Client`]: connect, single-record commands, info, stats.
//!
//! Owns the command execution loop: pick the node for the key's partition
//! from the current snapshot (one hop: master for writes, per [`Replica`]
//! for reads), run one attempt on a pooled connection under the socket
//! deadline, and on a retryable failure back off and try again until
//! `max_retries` or the total deadline. Node health is updated on every
//! attempt (success resets the node's failure count, a network failure or
//! timeout increments it).
//!
//! Invariant: a command's request frame is encoded once and resent
//! unchanged; an answer is returned to the caller only if it came from an
//! attempt whose connection is then put back in the pool in a clean state.

use crate::cluster::{Cluster, ClusterState};
use crate::command::{
    encode_request, operate_flags, parse_answer, respond_all_ops, Answer, Bins, Key, Operation,
    Record, Request, RequestOps, WRITE_DELETE,
};
use crate::error::{is_retryable_code, Error, Result};
use crate::node::Node;
use crate::policy::{Policy, ReadPolicy, Replica, WritePolicy};
use crate::value::Bin;
use crate::ClientConfig;
use citrine_types::{NodeId, ResultCode};
use citrine_wire::frame::MessageType;
use citrine_wire::msg::{info1, op_type, MsgHeader};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// A connected smart client. Cheap to clone; all clones share one cluster
/// view, one set of pools and one tend task (stopped when the last clone is
/// dropped or [`Client::close`] is called).
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) cluster: Arc<Cluster>,
    tender: Arc<TendTask>,
    sequence: Arc<AtomicU64>,
}

#[derive(Debug)]
struct TendTask(tokio::task::JoinHandle<()>);

impl Drop for TendTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A node as listed by [`Client::nodes`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSummary {
    pub id: NodeId,
    pub address: SocketAddr,
    pub build: String,
    pub failures: u32,
    pub reachable: bool,
}

/// Snapshot of the client's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub commands: u64,
    pub retries: u64,
    pub command_failures: u64,
    pub tends: u64,
    pub tend_failures: u64,
    pub nodes_added: u64,
    pub nodes_removed: u64,
    pub partition_refreshes: u64,
    pub peers_refreshes: u64,
    pub nodes: usize,
}

impl Client {
    /// Connects to the cluster: validates the seeds, discovers the other
    /// nodes through their peers lists, loads the partition map, and starts
    /// the tend loop. Fails when no seed answers as a valid node.
    pub async fn connect(config: ClientConfig) -> Result<Client> {
        if config.seeds.is_empty() {
            return Err(Error::InvalidArgument("no seed host given".into()));
        }
        let interval = config.tend_interval;
        let cluster = Arc::new(Cluster::new(config));
        cluster.tend().await?;
        // A second pass picks up peers' partitions right away in multi-node clusters.
        if cluster.state().nodes.len() > 1 {
            cluster.tend().await?;
        }
        let weak: Weak<Cluster> = Arc::downgrade(&cluster);
        let handle = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let Some(cluster) = weak.upgrade() else { break };
                if cluster.closed.load(Ordering::Relaxed) {
                    break;
                }
                if let Err(error) = cluster.tend().await {
                    tracing::warn!(%error, "tend found no usable node");
                }
            }
        });
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Ok(Client {
            cluster,
            tender: Arc::new(TendTask(handle)),
            sequence: Arc::new(AtomicU64::new(seed | 1)),
        })
    }

    /// The configuration the client was built with.
    pub fn config(&self) -> &ClientConfig {
        &self.cluster.config
    }

    /// Stops the tend loop and closes every pooled connection.
    pub fn close(&self) {
        self.cluster.closed.store(true, Ordering::Relaxed);
        self.tender.0.abort();
        for node in &self.cluster.state().nodes {
            node.pool.close();
        }
    }

    /// Runs one tend pass now (normally done every `tend_interval`).
    pub async fn tend_now(&self) -> Result<()> {
        self.cluster.tend().await
    }

    /// The nodes currently in the cluster view.
    pub fn nodes(&self) -> Vec<NodeSummary> {
        self.cluster
            .state()
            .nodes
            .iter()
            .map(|node| NodeSummary {
                id: node.id,
                address: node.address,
                build: node.build.clone(),
                failures: node.failures(),
                reachable: node.reachable.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Node currently mastering `key`'s partition.
    pub fn master_of(&self, key: &Key) -> Option<NodeId> {
        self.cluster
            .state()
            .map
            .node(&key.namespace, 0, key.partition().index())
    }

    /// Node currently mastering partition `partition` of `namespace`.
    pub fn master_of_partition(&self, namespace: &str, partition: u16) -> Option<NodeId> {
        self.cluster
            .state()
            .map
            .node(namespace, 0, usize::from(partition))
    }

    /// Counters.
    pub fn stats(&self) -> ClientStats {
        let counters = &self.cluster.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ClientStats {
            commands: load(&counters.commands),
            retries: load(&counters.retries),
            command_failures: load(&counters.command_failures),
            tends: load(&counters.tends),
            tend_failures: load(&counters.tend_failures),
            nodes_added: load(&counters.nodes_added),
            nodes_removed: load(&counters.nodes_removed),
            partition_refreshes: load(&counters.partition_refreshes),
            peers_refreshes: load(&counters.peers_refreshes),
            nodes: self.cluster.state().nodes.len(),
        }
    }

    // ----- info -----

    /// Runs info commands on one node.
    pub async fn info(&self, node: NodeId, commands: &[&str]) -> Result<HashMap<String, String>> {
        let state = self.cluster.state();
        let node = state
            .by_id
            .get(&node)
            .ok_or_else(|| Error::InvalidArgument(format!("node {node} is not in the cluster")))?;
        node.info(
            commands,
            Some(Instant::now() + self.cluster.config.tend_timeout),
        )
        .await
    }

    /// Runs info commands on every node, in node order.
    pub async fn info_all(
        &self,
        commands: &[&str],
    ) -> Vec<(NodeSummary, Result<HashMap<String, String>>)> {
        let mut out = Vec::new();
        for summary in self.nodes() {
            let answer = self.info(summary.id, commands).await;
            out.push((summary, answer));
        }
        out
    }

    // ----- single-record commands -----

    /// Reads a record: all bins, named bins, or only its header.
    /// `Ok(None)` when the record does not exist.
    pub async fn get(&self, policy: &ReadPolicy, key: &Key, bins: Bins) -> Result<Option<Record>> {
        let (bits1, ops) = match &bins {
            Bins::All => (info1::READ | info1::GET_ALL, RequestOps::None),
            Bins::Names(names) => (info1::READ, RequestOps::ReadNames(names)),
            Bins::Header => (info1::READ | info1::GET_NO_BINS, RequestOps::None),
        };
        let header = MsgHeader {
            info1: bits1,
            info3: policy.read_mode_sc.info3_bits(),
            transaction_ttl: policy.base.server_timeout_ms(),
            ..MsgHeader::default()
        };
        let answer = self
            .run(&policy.base, key, false, &Request { header, ops })
            .await?;
        match answer.result_code {
            0 => Ok(Some(answer.record)),
            2 => Ok(None),
            code => Err(Error::server(code, answer_node(&answer))),
        }
    }

    /// Writes bins (creating the record per `policy.record_exists`).
    pub async fn put(&self, policy: &WritePolicy, key: &Key, bins: &[Bin]) -> Result<()> {
        self.write_bins(policy, key, op_type::WRITE, bins)
            .await
            .map(|_| ())
    }

    /// Adds integers/floats to bins.
    pub async fn add(&self, policy: &WritePolicy, key: &Key, bins: &[Bin]) -> Result<()> {
        self.write_bins(policy, key, op_type::INCR, bins)
            .await
            .map(|_| ())
    }

    /// Appends to string/blob bins.
    pub async fn append(&self, policy: &WritePolicy, key: &Key, bins: &[Bin]) -> Result<()> {
        self.write_bins(policy, key, op_type::APPEND, bins)
            .await
            .map(|_| ())
    }

    /// Prepends to string/blob bins.
    pub async fn prepend(&self, policy: &WritePolicy, key: &Key, bins: &[Bin]) -> Result<()> {
        self.write_bins(policy, key, op_type::PREPEND, bins)
            .await
            .map(|_| ())
    }

    async fn write_bins(
        &self,
        policy: &WritePolicy,
        key: &Key,
        op: u8,
        bins: &[Bin],
    ) -> Result<Record> {
        if bins.is_empty() {
            return Err(Error::InvalidArgument(
                "a write needs at least one bin".into(),
            ));
        }
        let header = write_header(policy);
        let answer = self
            .run(
                &policy.base,
                key,
                true,
                &Request {
                    header,
                    ops: RequestOps::Bins(op, bins),
                },
            )
            .await?;
        expect_ok(answer)
    }

    /// Deletes a record; returns whether it existed.
    pub async fn delete(&self, policy: &WritePolicy, key: &Key) -> Result<bool> {
        let mut header = write_header(policy);
        header.info2 |= WRITE_DELETE;
        let answer = self
            .run(
                &policy.base,
                key,
                true,
                &Request {
                    header,
                    ops: RequestOps::None,
                },
            )
            .await?;
        match answer.result_code {
            0 => Ok(true),
            2 => Ok(false),
            code => Err(Error::server(code, answer_node(&answer))),
        }
    }

    /// Whether a record exists.
    pub async fn exists(&self, policy: &ReadPolicy, key: &Key) -> Result<bool> {
        Ok(self.get(policy, key, Bins::Header).await?.is_some())
    }

    /// Refreshes a record's TTL (per `policy.expiration`) and bumps its generation.
    pub async fn touch(&self, policy: &WritePolicy, key: &Key) -> Result<()> {
        let header = write_header(policy);
        let ops = [Operation::Touch];
        let answer = self
            .run(
                &policy.base,
                key,
                true,
                &Request {
                    header,
                    ops: RequestOps::Operations(&ops),
                },
            )
            .await?;
        expect_ok(answer).map(|_| ())
    }

    /// Runs several operations atomically on one record and returns the
    /// bins the read operations produced.
    pub async fn operate(
        &self,
        policy: &WritePolicy,
        key: &Key,
        ops: &[Operation],
    ) -> Result<Record> {
        if ops.is_empty() {
            return Err(Error::InvalidArgument(
                "operate needs at least one operation".into(),
            ));
        }
        let (bits1, has_write) = operate_flags(ops);
        let mut header = if has_write {
            let mut header = write_header(policy);
            header.info1 = bits1;
            header
        } else {
            MsgHeader {
                info1: bits1,
                transaction_ttl: policy.base.server_timeout_ms(),
                ..MsgHeader::default()
            }
        };
        if respond_all_ops(ops) {
            header.info2 |= citrine_wire::msg::info2::RESPOND_ALL_OPS;
        }
        let answer = self
            .run(
                &policy.base,
                key,
                has_write,
                &Request {
                    header,
                    ops: RequestOps::Operations(ops),
                },
            )
            .await?;
        expect_ok(answer)
    }

    // ----- execution -----

    pub(crate) async fn run(
        &self,
        policy: &Policy,
        key: &Key,
        is_write: bool,
        request: &Request<'_>,
    ) -> Result<Answer> {
        let mut frame = Vec::with_capacity(128);
        encode_request(
            &mut frame,
            key,
            policy.send_key,
            policy.filter.as_deref(),
            request,
        )?;
        // A UDF need not be idempotent: it is sent again only after a
        // failure that surely did not run it.
        let retries = match request.ops {
            RequestOps::Udf(_) => Retries::NotApplied,
            _ => Retries::Any,
        };
        self.execute(policy, key, is_write, &frame, retries).await
    }

    pub(crate) fn next_random(&self) -> u64 {
        // xorshift64* over a shared counter: only used for jitter and round-robin.
        let mut x = self
            .sequence
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn pick_node(
        &self,
        state: &ClusterState,
        policy: &Policy,
        key: &Key,
        is_write: bool,
        attempt: u32,
        spin: u64,
    ) -> Option<Arc<Node>> {
        let partition = key.partition().index();
        let columns = state.map.replicas(&key.namespace);
        if columns == 0 {
            // No node reports this namespace: let some node answer for it
            // (normally result 20, namespace not found) rather than guess.
            if state.map.namespaces.is_empty() || state.nodes.is_empty() {
                return None;
            }
            return state.nodes.get(spin as usize % state.nodes.len()).cloned();
        }
        let lookup = |column: usize| {
            state
                .map
                .node(&key.namespace, column, partition)
                .and_then(|id| state.by_id.get(&id))
                .cloned()
        };
        if is_write {
            return lookup(0);
        }
        let start = match policy.replica {
            Replica::Master => 0,
            Replica::Sequence => attempt as usize % columns,
            Replica::Any => (spin as usize).wrapping_add(attempt as usize) % columns,
            Replica::PreferRack => {
                if let Some(rack) = self.cluster.config.rack_id {
                    if attempt == 0 {
                        let on_rack = (0..columns)
                            .filter_map(lookup)
                            .find(|node| node.rack(&key.namespace) == Some(rack));
                        if on_rack.is_some() {
                            return on_rack;
                        }
                    }
                }
                attempt as usize % columns
            }
        };
        (0..columns)
            .map(|offset| (start + offset) % columns)
            .find_map(lookup)
    }

    pub(crate) async fn execute(
        &self,
        policy: &Policy,
        key: &Key,
        is_write: bool,
        frame: &[u8],
        retries: Retries,
    ) -> Result<Answer> {
        let counters = &self.cluster.counters;
        counters.commands.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let total_deadline = policy.total_deadline(start);
        let spin = if policy.replica == Replica::Any {
            self.next_random()
        } else {
            0
        };
        let mut attempt: u32 = 0;
        let mut in_doubt = false;
        let last_error = loop {
            let state = self.cluster.state();
            let error = match self.pick_node(&state, policy, key, is_write, attempt, spin) {
                None => Error::NoNode {
                    namespace: key.namespace.clone(),
                    partition: key.partition().get(),
                },
                Some(node) => {
                    drop(state);
                    let socket_deadline = policy.socket_deadline(total_deadline);
                    match attempt_on(&node, frame, socket_deadline).await {
                        Ok(answer) if !is_retryable_code(answer.result_code) => return Ok(answer),
                        Ok(answer) => Error::server(answer.result_code, node.name()),
                        Err(error) => {
                            if error.counts_against_node() {
                                node.record_failure();
                            }
                            if !error.is_retryable() {
                                counters.command_failures.fetch_add(1, Ordering::Relaxed);
                                return Err(error);
                            }
                            error
                        }
                    }
                }
            };
            in_doubt |= error.in_doubt();
            if retries == Retries::NotApplied
                && (error.in_doubt() || error.raw_code() == Some(ResultCode::Timeout.code()))
            {
                // It may have run (a server's 9 can come after the master
                // applied it): not sent again.
                in_doubt = true;
                attempt += 1;
                break error;
            }
            attempt += 1;
            if attempt > policy.max_retries {
                break error;
            }
            let backoff = policy.backoff_for(attempt, self.next_random());
            if let Some(deadline) = total_deadline {
                if Instant::now() + backoff >= deadline {
                    break error;
                }
            }
            counters.retries.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(attempt, %error, "retrying");
            if !backoff.is_zero() {
                tokio::time::sleep(backoff).await;
            }
        };
        counters.command_failures.fetch_add(1, Ordering::Relaxed);
        let mut error = match last_error {
            Error::Timeout { what, in_doubt, .. } => Error::Timeout {
                what,
                iterations: attempt,
                in_doubt,
            },
            other => other,
        };
        error.set_in_doubt(is_write && in_doubt);
        Err(error)
    }
}

/// Which failed attempts of a command may be made again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retries {
    /// Any retryable failure (reads, and writes whose second application
    /// does no harm a policy's retries accept).
    Any,
    /// Only failures after which the server surely did not run the
    /// command: nothing was sent, or the node refused it (11, 14, 18).
    NotApplied,
}

/// One attempt on one node.
async fn attempt_on(node: &Node, frame: &[u8], deadline: Option<Instant>) -> Result<Answer> {
    let mut pooled = node.pool.get(deadline).await?;
    let Some(connection) = pooled.connection() else {
        return Err(Error::Closed);
    };
    let outcome = match connection.exchange(frame, deadline).await {
        Ok((MessageType::Message, body)) => parse_answer(body).map_err(|message| Error::Protocol {
            address: node.address.to_string(),
            message,
        }),
        Ok((other, _)) => Err(Error::Protocol {
            address: node.address.to_string(),
            message: format!("expected an AS_MSG answer, got {other:?}"),
        }),
        Err(error) => Err(error),
    };
    match outcome {
        Ok(mut answer) => {
            pooled.release();
            node.record_success();
            answer.node = Some(node.name());
            Ok(answer)
        }
        Err(error) => {
            pooled.discard();
            if matches!(error, Error::Network { .. }) {
                node.pool.clear_idle();
            }
            Err(error)
        }
    }
}

pub(crate) fn write_header(policy: &WritePolicy) -> MsgHeader {
    let (bits2, bits3, generation) = policy.header_bits();
    MsgHeader {
        info2: bits2,
        info3: bits3,
        generation,
        record_ttl: policy.expiration.wire(),
        transaction_ttl: policy.base.server_timeout_ms(),
        ..MsgHeader::default()
    }
}

pub(crate) fn answer_node(answer: &Answer) -> String {
    answer.node.clone().unwrap_or_default()
}

fn expect_ok(answer: Answer) -> Result<Record> {
    match answer.result_code {
        0 => Ok(answer.record),
        code => Err(Error::server(code, answer_node(&answer))),
    }
}
