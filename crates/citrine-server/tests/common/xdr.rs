//! XDR test support: linking single-node clusters with the reference's
//! `set-config:context=xdr` commands, reading `get-stats:context=xdr`
//! counters, and waiting until records read back with given values.

use super::cluster::{get, put, Node};
use citrine_wire::digest::{of_key, UserKey};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Makes `to` DC `dc` of `from` and ships namespace `test` to it, with
/// the settings `(name, value)` applied to the DC's namespace.
pub fn link(from: &Node, dc: &str, to: &Node, settings: &[(&str, &str)]) {
    let mut commands = vec![
        format!("set-config:context=xdr;dc={dc};action=create"),
        format!(
            "set-config:context=xdr;dc={dc};node-address-port=127.0.0.1:{};action=add",
            to.port
        ),
        format!("set-config:context=xdr;dc={dc};namespace=test;action=add"),
    ];
    for (name, value) in settings {
        commands.push(format!(
            "set-config:context=xdr;dc={dc};namespace=test;{name}={value}"
        ));
    }
    for command in commands {
        assert_eq!(
            from.info_value(&command).as_deref(),
            Some("ok"),
            "{command}"
        );
    }
}

/// `node`'s `get-stats:context=xdr;dc=DC;namespace=test` answer.
pub fn xdr_stats(node: &Node, dc: &str) -> String {
    node.info_value(&format!("get-stats:context=xdr;dc={dc};namespace=test"))
        .unwrap_or_default()
}

/// One counter of a `get-stats` answer.
pub fn stat(answer: &str, name: &str) -> Option<u64> {
    answer
        .split(';')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
}

/// Waits until every `(key, value)` reads back from `node` (bin `v`); the
/// time it took, or `None` after `limit`.
pub fn wait_for_values(
    node: &Node,
    expected: &[(String, String)],
    limit: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let mut stream = node.connect();
    let mut from = 0;
    while started.elapsed() < limit {
        while from < expected.len() {
            let (key, value) = &expected[from];
            match get(&mut stream, key) {
                (0, Some(found)) if found == value.as_bytes() => from += 1,
                _ => break,
            }
        }
        if from == expected.len() {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// The keys of `expected` that `node` does not hold with their value
/// (with digest and partition), for a failure's message.
pub fn missing(node: &Node, expected: &[(String, String)]) -> Vec<String> {
    let mut stream = node.connect();
    expected
        .iter()
        .filter(|(key, value)| get(&mut stream, key).1.as_deref() != Some(value.as_bytes()))
        .map(|(key, _)| {
            let digest = of_key("demo", &UserKey::String(key.clone()));
            format!("{key} {} p{}", digest.to_hex(), digest.partition().index())
        })
        .collect()
}

/// Writes every `(key, value)` (bin `v`), each answered 0.
pub fn write_all(stream: &mut TcpStream, records: &[(String, String)]) {
    for (key, value) in records {
        assert_eq!(put(stream, key, value), 0, "write {key}");
    }
}

/// `count` records `PREFIXn` = `vPREFIXn`.
pub fn records(prefix: &str, count: usize) -> Vec<(String, String)> {
    (0..count)
        .map(|n| (format!("{prefix}{n}"), format!("v{prefix}{n}")))
        .collect()
}
