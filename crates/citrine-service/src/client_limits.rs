//! The limits the service port puts on client connections, shared between
//! the server's connection loops (which enforce them) and the info
//! commands (`get-config` reports them, `set-config` changes
//! `proto-fd-idle-ms` at run time). The server stores the configured
//! values before it accepts a connection.
//!
//! Invariant: a value read here is one a configuration or a `set-config`
//! gave; the loops read it with relaxed loads, so a change applies from
//! their next accept (or idle sweep) on.

use std::sync::atomic::AtomicU32;

/// `proto-fd-max` when the configuration names none (the reference's).
pub const PROTO_FD_MAX_DEFAULT: u32 = 15_000;
/// `proto-fd-idle-ms` when the configuration names none: 0, never close a
/// connection idle between requests, as the reference (8.1) does. The
/// Aerospike clients' pools assume it (`maxSocketIdle` 0 keeps idle
/// sockets; a socket the server reaped under them fails a write). The
/// server closes a connection stalled inside a frame regardless (after a
/// minute at most, see the server's service threads).
pub const PROTO_FD_IDLE_MS_DEFAULT: u32 = 0;

/// `proto-fd-max` and `proto-fd-idle-ms`.
#[derive(Debug)]
pub struct ClientLimits {
    /// Most open client connections; one more is closed at accept.
    pub proto_fd_max: AtomicU32,
    /// A client connection on which nothing moved (no byte received, none
    /// of a reply sent) for this many milliseconds is closed, whether it
    /// sits between requests or inside a frame; 0: never between requests.
    pub proto_fd_idle_ms: AtomicU32,
}

impl Default for ClientLimits {
    fn default() -> ClientLimits {
        ClientLimits {
            proto_fd_max: AtomicU32::new(PROTO_FD_MAX_DEFAULT),
            proto_fd_idle_ms: AtomicU32::new(PROTO_FD_IDLE_MS_DEFAULT),
        }
    }
}
