//! The `network` context of `get-config`: what the node's `[service]`,
//! `[heartbeat]` and `[fabric]` sections resolved to, under the
//! reference's names and in its order (`service.*`, `heartbeat.*`,
//! `fabric.*`), handed to the service once at start.
//!
//! Invariants: only settings Citrine has are listed (none of the
//! reference's fabric channel or keepalive tuning); a port a channel does
//! not open is `0` and a TLS name not given is `null`, as the reference
//! prints them; none of these change while the node runs, so the answer
//! made at start stays true.

use crate::config::ServerConfig;

/// The `network` context's pairs for `config`.
pub fn pairs(config: &ServerConfig) -> Vec<(String, String)> {
    let cluster = &config.cluster;
    let port = |port: Option<u16>| port.unwrap_or(0).to_string();
    let name = |name: Option<&str>| name.unwrap_or("null").to_owned();
    let tls = |channel: &Option<crate::tls_config::ChannelTls>| {
        let settings = channel.as_ref().map(|tls| &tls.settings);
        (
            port(settings.map(|s| s.port)),
            name(settings.map(|s| s.name.as_str())),
        )
    };
    let (heartbeat_tls_port, heartbeat_tls_name) = tls(&cluster.heartbeat_tls);
    let (fabric_tls_port, fabric_tls_name) = tls(&cluster.fabric_tls);
    let interval = cluster.heartbeat_interval_ms.max(1);
    let pairs = [
        ("service.port", config.port.to_string()),
        ("service.address", config.address.clone()),
        (
            "service.access-address",
            config.service.access_address.clone(),
        ),
        (
            "service.tls-port",
            port(config.tls.as_ref().map(|t| t.port)),
        ),
        (
            "service.tls-name",
            name(config.tls.as_ref().map(|t| t.name.as_str())),
        ),
        ("heartbeat.mode", "mesh".to_owned()),
        ("heartbeat.address", cluster.heartbeat_address.clone()),
        ("heartbeat.port", port(cluster.heartbeat_port)),
        ("heartbeat.tls-port", heartbeat_tls_port),
        ("heartbeat.tls-name", heartbeat_tls_name),
        ("heartbeat.interval", interval.to_string()),
        (
            "heartbeat.timeout",
            (cluster.heartbeat_timeout_ms / interval).to_string(),
        ),
        ("fabric.address", cluster.fabric_address.clone()),
        ("fabric.tls-port", fabric_tls_port),
        ("fabric.tls-name", fabric_tls_name),
        ("fabric.port", port(cluster.fabric_port)),
    ];
    pairs
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect()
}
