//! Cluster management of Citrine (001 §2.1): mesh heartbeats with surrogate
//! heartbeats, node health score, and the cluster view (cluster key +
//! succession list) agreed by a Paxos-style round at cluster-change quanta.
//!
//! Everything here is a sans-I/O deterministic state machine: callers pass
//! the time as `u64` milliseconds and incoming messages, and perform the
//! returned [`Effect`]s. The crate uses no randomness, clocks, threads or
//! sockets, so a simulator (`citrine-sim`) can drive many nodes on one
//! thread and replay any run exactly.
//!
//! Modules:
//! - [`heartbeat`]: seeds, learned peers, adjacency list, surrogates;
//! - [`health`]: windowed loss average and outlier verdicts;
//! - [`view`]: [`ClusterView`], [`Ballot`], cluster key derivation;
//! - [`message`]: wire messages and their versioned binary format;
//! - [`node`]: [`ClusterNode`], which combines them;
//! - `partition_map`: partition ownership computed from a succession list;
//! - [`exchange`]: partition versions and what the exchange after a view
//!   change decides per partition (migrations, acting master, drops).

mod codec;
pub mod exchange;
pub mod health;
pub mod heartbeat;
pub mod message;
pub mod node;
pub mod view;

pub mod partition_map;

pub use codec::DecodeError;
pub use health::{HealthConfig, HealthTracker};
pub use heartbeat::{HeartbeatConfig, HeartbeatState};
pub use message::{Envelope, Heartbeat, Message, PeerAddr};
pub use node::{ClusterConfig, ClusterNode, ConfigError, Effect, NodeStats};
pub use view::{Ballot, ClusterView};
