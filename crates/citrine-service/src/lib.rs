//! The transaction service: everything a node does with one request.
//!
//! [`Service::handle`] takes one decoded proto frame and writes exactly one
//! reply frame (or asks for the connection to be closed when the frame cannot
//! be trusted). It runs to completion on the calling thread: no queues, no
//! hand-offs, no global lock — the partition lock of the record in question is
//! the only lock a transaction takes.
//!
//! Modules: [`transaction`] (single-record reads, writes, deletes),
//! [`info`] (info commands), [`nsup`] (expiry and eviction passes),
//! [`namespace`] (per-namespace state), [`config`] (validated settings).
//!
//! Architecture invariant: this crate does no network I/O. The server crate
//! owns sockets and threads and calls in here; time comes from a [`Clock`].

#![forbid(unsafe_code)]

pub mod config;
pub mod info;
pub mod namespace;
pub mod nsup;
pub mod transaction;

use citrine_types::{NodeId, ResultCode};
use citrine_wire::frame::{inflate, MessageType, ProtoHeader};
use citrine_wire::msg::Message;
use config::ServiceConfig;
use namespace::Namespace;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use transaction::Now;

/// A source of wall-clock time, injected so tests can move time.
pub trait Clock: Send + Sync + 'static {
    /// Unix time in milliseconds.
    fn now_unix_ms(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock tests set by hand.
#[derive(Debug, Default)]
pub struct ManualClock {
    unix_ms: AtomicU64,
}

impl ManualClock {
    pub fn new(unix_ms: u64) -> ManualClock {
        ManualClock {
            unix_ms: AtomicU64::new(unix_ms),
        }
    }
    pub fn advance_ms(&self, milliseconds: u64) {
        self.unix_ms.fetch_add(milliseconds, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_unix_ms(&self) -> u64 {
        self.unix_ms.load(Ordering::Relaxed)
    }
}

/// The connection must be closed: the frame could not be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseConnection(pub String);

/// Node-wide counters.
#[derive(Debug, Default)]
pub struct NodeStats {
    pub client_connections: AtomicU64,
    pub client_connections_opened: AtomicU64,
    pub client_connections_closed: AtomicU64,
    pub proto_errors: AtomicU64,
    pub info_requests: AtomicU64,
    pub admin_requests: AtomicU64,
    pub transactions: AtomicU64,
    pub compressed_requests: AtomicU64,
}

/// The transaction service of one node.
pub struct Service {
    pub config: ServiceConfig,
    pub node_id: NodeId,
    namespaces: Vec<Arc<Namespace>>,
    clock: Arc<dyn Clock>,
    pub stats: NodeStats,
    started_unix_ms: u64,
}

impl Service {
    pub fn new(config: ServiceConfig, clock: Arc<dyn Clock>) -> Service {
        let namespaces = config
            .namespaces
            .iter()
            .cloned()
            .map(|namespace| Arc::new(Namespace::new(namespace)))
            .collect();
        let started_unix_ms = clock.now_unix_ms();
        Service {
            node_id: NodeId(config.node_id),
            config,
            namespaces,
            clock,
            stats: NodeStats::default(),
            started_unix_ms,
        }
    }

    /// The namespace called `name`.
    #[inline]
    pub fn namespace(&self, name: &[u8]) -> Option<&Namespace> {
        self.namespaces
            .iter()
            .find(|namespace| namespace.config.name.as_bytes() == name)
            .map(Arc::as_ref)
    }

    /// All namespaces, in configuration order.
    pub fn namespaces(&self) -> impl Iterator<Item = &Namespace> {
        self.namespaces.iter().map(Arc::as_ref)
    }

    /// The current time.
    #[inline]
    pub fn now(&self) -> Now {
        Now::from_unix_ms(self.clock.now_unix_ms())
    }

    /// Seconds since the service started.
    pub fn uptime_seconds(&self) -> u64 {
        self.clock
            .now_unix_ms()
            .saturating_sub(self.started_unix_ms)
            / 1000
    }

    /// Handles one request frame and appends the reply frame to `out`.
    ///
    /// Returns `Err` when the connection must be closed (the body of a frame
    /// that cannot be trusted); any request that parses answers with a result
    /// code instead.
    pub fn handle(
        &self,
        header: ProtoHeader,
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CloseConnection> {
        match header.message_type {
            MessageType::Info => {
                self.stats.info_requests.fetch_add(1, Ordering::Relaxed);
                info::handle(self, body, out);
                Ok(())
            }
            MessageType::Admin => {
                self.stats.admin_requests.fetch_add(1, Ordering::Relaxed);
                // No security: every admin request, including login, is answered
                // "security not enabled", which clients take as "no login needed".
                citrine_wire::admin::write_reply(out, ResultCode::SecurityNotEnabled.code());
                Ok(())
            }
            MessageType::Message => self.handle_message(body, out),
            MessageType::Compressed => {
                self.stats
                    .compressed_requests
                    .fetch_add(1, Ordering::Relaxed);
                let (_, inner) =
                    inflate(body).map_err(|error| self.proto_error(error.to_string()))?;
                self.handle_message(&inner, out)
            }
            MessageType::InternalXdr => {
                Err(self.proto_error("XDR messages are not accepted on the service port".into()))
            }
        }
    }

    fn handle_message(&self, body: &[u8], out: &mut Vec<u8>) -> Result<(), CloseConnection> {
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        match Message::decode(body) {
            Ok(message) => {
                transaction::execute(self, &message, out);
                Ok(())
            }
            Err(error) => {
                // The frame boundary is intact, so the stream is still in step:
                // answer with a parameter error and keep serving.
                self.stats.proto_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("malformed AS_MSG: {error}");
                transaction::write_result(out, ResultCode::Parameter);
                Ok(())
            }
        }
    }

    fn proto_error(&self, why: String) -> CloseConnection {
        self.stats.proto_errors.fetch_add(1, Ordering::Relaxed);
        CloseConnection(why)
    }
}

#[cfg(test)]
mod tests;
