//! XDR topologies between single-node clusters on loopback.
//!
//! - Active-active: A and B each a DC of the other, both written (keys of
//!   their own, keys both write, deletes). After quiescence both hold the
//!   same records, and neither ships back what it received: each site's
//!   `success` stays within the operations made there and stops growing.
//!   B's lane waits `delay-ms` before shipping, so every write of A
//!   reaches B while B's scan is still behind its last-update time: a
//!   site that shipped back what arrived by XDR would ship all of it.
//! - A chain A→B→C: with `forward` off on B's DC C, C gets B's writes and
//!   none of A's; with it on, A's writes go on to C. A's lane waits
//!   `delay-ms`, so A's writes reach B with last-update times B's scan for
//!   C has passed already (B must scan them again).
//! - A filter expression (`xdr-set-filter`) ships only the records it
//!   selects; each record it rejects counts in `filtered_out`.
//! - `enable-compression`: records at or past `compression-threshold`
//!   travel compressed and arrive whole; `uncompressed_pct` and
//!   `compression_ratio` say how many and how much.

mod common;

use base64::Engine as _;
use citrine_wire::msg::op_type::WRITE;
use common::cluster::*;
use common::round_trip;
use common::xdr::{link, missing, records, stat, wait_for_values, write_all, xdr_stats};
use std::time::{Duration, Instant};

/// Waits until `success` at every `(node, dc)` stays the same for
/// `quiet`; the counts, or a panic after `limit`.
fn wait_until_quiet(lanes: &[(&Node, &str)], quiet: Duration, limit: Duration) -> Vec<u64> {
    let started = Instant::now();
    let read = || -> Vec<u64> {
        lanes
            .iter()
            .map(|(node, dc)| stat(&xdr_stats(node, dc), "success").unwrap_or(0))
            .collect()
    };
    let mut last = read();
    let mut since = Instant::now();
    while since.elapsed() < quiet {
        assert!(
            started.elapsed() < limit,
            "shipping never stopped: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
        let now = read();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

#[test]
fn active_active_sites_converge_and_ship_nothing_back() {
    let (mut a, mut b) = (Node::new(0), Node::new(1));
    a.start_seeds(&[]);
    b.start_seeds(&[]);
    link(&a, "dcb", &b, &[]);
    link(&b, "dca", &a, &[("delay-ms", "1500")]);

    let (own_a, own_b, shared) = (records("a", 150), records("b", 150), records("s", 20));
    let (mut at_a, mut at_b) = (a.connect(), b.connect());
    write_all(&mut at_a, &own_a);
    write_all(&mut at_b, &own_b);
    write_all(&mut at_a, &shared);
    // The same keys written at B later: B's values win at both sites.
    let shared_b: Vec<(String, String)> = shared
        .iter()
        .map(|(key, _)| (key.clone(), format!("{key}@b")))
        .collect();
    write_all(&mut at_b, &shared_b);
    let mut expected: Vec<(String, String)> = own_a[10..].to_vec();
    expected.extend(own_b.iter().cloned());
    expected.extend(shared_b.iter().cloned());
    // A's first ten deleted at A once B has them.
    let limit = Duration::from_secs(15);
    assert!(
        wait_for_values(&b, &own_a, limit).is_some(),
        "A's writes on B"
    );
    for (key, _) in &own_a[..10] {
        assert_eq!(delete(&mut at_a, key), 0, "delete {key} at A");
    }
    for node in [&a, &b] {
        let found = wait_for_values(node, &expected, limit);
        assert!(
            found.is_some(),
            "{} lacks {:?}",
            node.id,
            missing(node, &expected)
        );
        let mut stream = node.connect();
        for (key, _) in &own_a[..10] {
            let deadline = Instant::now() + limit;
            while get(&mut stream, key).0 != 2 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            assert_eq!(get(&mut stream, key).0, 2, "{key} deleted at {}", node.id);
        }
    }
    let lanes = [(&a, "dcb"), (&b, "dca")];
    let success = wait_until_quiet(&lanes, Duration::from_millis(2500), limit);
    let (stats_a, stats_b) = (xdr_stats(&a, "dcb"), xdr_stats(&b, "dca"));
    eprintln!("A→B: {stats_a}\nB→A: {stats_b}");
    // Each site shipped its own operations (a write superseded before it
    // shipped ships once) and nothing it received.
    let (ops_a, ops_b) = (own_a.len() + shared.len() + 10, own_b.len() + shared.len());
    assert!(
        (own_a.len() as u64..=ops_a as u64).contains(&success[0]),
        "A shipped its {ops_a} operations only: {stats_a}"
    );
    assert!(
        (own_b.len() as u64..=ops_b as u64).contains(&success[1]),
        "B shipped its {ops_b} operations only, none of A's back: {stats_b}"
    );
    assert_eq!(
        missing(&a, &expected),
        missing(&b, &expected),
        "the same records at both sites"
    );
}

#[test]
fn forward_passes_shipped_writes_down_a_chain() {
    let (mut a, mut b, mut c) = (Node::new(0), Node::new(1), Node::new(2));
    for node in [&mut a, &mut b, &mut c] {
        node.start_seeds(&[]);
    }
    link(&a, "dcb", &b, &[("delay-ms", "500")]);
    link(&b, "dcc", &c, &[]);
    let limit = Duration::from_secs(10);

    let (from_a, from_b) = (records("a", 100), records("b", 50));
    write_all(&mut a.connect(), &from_a);
    write_all(&mut b.connect(), &from_b);
    assert!(
        wait_for_values(&b, &from_a, limit).is_some(),
        "A's writes on B"
    );
    assert!(
        wait_for_values(&c, &from_b, limit).is_some(),
        "B's writes on C"
    );
    wait_until_quiet(&[(&b, "dcc")], Duration::from_millis(1000), limit);
    let shipped = stat(&xdr_stats(&b, "dcc"), "success");
    assert_eq!(shipped, Some(from_b.len() as u64), "B shipped only its own");
    assert_eq!(
        missing(&c, &from_a).len(),
        from_a.len(),
        "forward off: none of A's writes on C"
    );

    let command = "set-config:context=xdr;dc=dcc;namespace=test;forward=true";
    assert_eq!(b.info_value(command).as_deref(), Some("ok"));
    let forwarded = records("f", 100);
    write_all(&mut a.connect(), &forwarded);
    let on_c = wait_for_values(&c, &forwarded, limit);
    assert!(
        on_c.is_some(),
        "forward on: A's writes on C; missing {:?}; B→C: {}",
        missing(&c, &forwarded),
        xdr_stats(&b, "dcc")
    );
}

/// `eq(bin_int("n"), 1)` in the expression wire form, base64.
fn n_is_one() -> String {
    let msgpack = [0x93, 0x01, 0x93, 0x51, 0x02, 0xa1, b'n', 0x01];
    base64::engine::general_purpose::STANDARD.encode(msgpack)
}

#[test]
fn a_filter_expression_ships_only_what_it_selects() {
    let (mut a, mut b) = (Node::new(0), Node::new(1));
    a.start_seeds(&[]);
    b.start_seeds(&[]);
    link(&a, "dcb", &b, &[]);
    let command = format!("xdr-set-filter:dc=dcb;namespace=test;exp={}", n_is_one());
    assert_eq!(a.info_value(&command).as_deref(), Some("ok"));
    let bad = "xdr-set-filter:dc=dcb;namespace=test;exp=!!";
    assert!(a
        .info_value(bad)
        .is_some_and(|answer| answer.starts_with("ERROR")));

    let mut writer = a.connect();
    for n in 0..100i64 {
        let value = (n % 2).to_be_bytes().to_vec();
        let ops = [
            (WRITE, 3, "v", format!("v{n}").into_bytes()),
            (WRITE, 1, "n", value),
        ];
        let request = common::write_request("test", &format!("k{n}"), &ops);
        let (_, body) = round_trip(&mut writer, &request).expect("write to A");
        assert_eq!(common::decode_reply(&body).0.result_code, 0);
    }
    let odd: Vec<(String, String)> = (1..100)
        .step_by(2)
        .map(|n| (format!("k{n}"), format!("v{n}")))
        .collect();
    let even: Vec<(String, String)> = (0..100)
        .step_by(2)
        .map(|n| (format!("k{n}"), format!("v{n}")))
        .collect();
    let limit = Duration::from_secs(10);
    assert!(wait_for_values(&b, &odd, limit).is_some(), "n = 1 shipped");
    wait_until_quiet(&[(&a, "dcb")], Duration::from_millis(1000), limit);
    let stats = xdr_stats(&a, "dcb");
    assert_eq!(missing(&b, &even).len(), even.len(), "n = 0 not shipped");
    assert_eq!(stat(&stats, "filtered_out"), Some(50), "{stats}");
    assert_eq!(stat(&stats, "success"), Some(50), "{stats}");

    let clear = "xdr-set-filter:dc=dcb;namespace=test;exp=null";
    assert_eq!(a.info_value(clear).as_deref(), Some("ok"));
    write_all(&mut writer, &even);
    assert!(
        wait_for_values(&b, &even, limit).is_some(),
        "without the filter every record ships"
    );
}

#[test]
fn compressed_shipping_delivers_records_whole() {
    let (mut a, mut b) = (Node::new(0), Node::new(1));
    a.start_seeds(&[]);
    b.start_seeds(&[]);
    link(&a, "dcb", &b, &[("enable-compression", "true")]);
    let mut expected = records("short", 40);
    let long: Vec<(String, String)> = (0..40)
        .map(|n| (format!("long{n}"), format!("{n:04}").repeat(250)))
        .collect();
    expected.extend(long.iter().cloned());
    write_all(&mut a.connect(), &expected);
    let limit = Duration::from_secs(10);
    let arrived = wait_for_values(&b, &expected, limit);
    assert!(
        arrived.is_some(),
        "missing on B: {:?}",
        missing(&b, &expected)
    );
    wait_until_quiet(&[(&a, "dcb")], Duration::from_millis(1000), limit);
    let stats = xdr_stats(&a, "dcb");
    eprintln!("{stats}");
    let field = |name: &str| -> f64 {
        stats
            .split(';')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {stats}"))
    };
    assert_eq!(
        field("uncompressed_pct"),
        50.0,
        "the short half sent uncompressed"
    );
    let ratio = field("compression_ratio");
    assert!(
        ratio > 0.0 && ratio < 0.2,
        "1 000 repetitive bytes shrink: {stats}"
    );
}
