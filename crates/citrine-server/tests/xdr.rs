//! XDR between two single-node clusters A and B on loopback (issue 42's
//! check): A ships namespace `test` to DC `dcb` (B), configured at run
//! time with the reference's three `set-config:context=xdr` commands.
//! 1 000 records written to A are readable on B within 10 s; then B is
//! paused (SIGSTOP) for 10 s while 500 more records are written to A and
//! 100 of the first updated: within 15 s of B's resumption B has all of
//! them with A's values (the LUT scan recovered what the outage left).
//! `get-stats:context=xdr;dc=dcb;namespace=test` answers `success` (every
//! shipment counted) and `lag`. A keeps its last-ship times in its work
//! directory.
//!
//! A new master of a source cluster resumes from the last-ship times of
//! the old one (they travel between the members): nothing the old master
//! left unshipped is lost, and little it shipped is shipped again. A
//! filter expression set through one member is every member's, and kept
//! across a restart (`xdr-get-filter`).

mod common;

use citrine_wire::digest::{of_key, UserKey};
use common::cluster::*;
use common::xdr::{link, stat, wait_for_values, write_all, xdr_stats};
use std::time::{Duration, Instant};

/// What is missing on B and A's shipping statistics, for a failure's
/// message.
fn missing(a: &Node, b: &Node, expected: &[(String, String)]) -> String {
    let absent = common::xdr::missing(b, expected);
    let stats = xdr_stats(a, "dcb");
    format!(
        "{} missing on B: {absent:?}; A's stats: {stats}",
        absent.len()
    )
}

#[test]
fn ships_to_a_dc_and_recovers_after_its_pause() {
    let work = std::env::temp_dir().join(format!("citrine-xdr-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let mut a = Node::new(0);
    a.data_dir = Some(work.clone());
    let mut b = Node::new(1);
    b.start_seeds(&[]);
    a.start_seeds(&[]);
    link(&a, "dcb", &b, &[]);

    let mut records: Vec<(String, String)> = (0..1000)
        .map(|n| (format!("x{n}"), format!("v{n}")))
        .collect();
    let mut writer = a.connect();
    let started = Instant::now();
    write_all(&mut writer, &records);
    let shipped = wait_for_values(&b, &records, Duration::from_secs(10));
    assert!(
        shipped.is_some(),
        "1 000 records on B within 10 s; {}",
        missing(&a, &b, &records)
    );
    eprintln!(
        "1 000 records written and on B {:?} after the first write",
        started.elapsed()
    );

    b.freeze(true);
    let paused = Instant::now();
    let more: Vec<(String, String)> = (1000..1500)
        .map(|n| (format!("x{n}"), format!("v{n}")))
        .collect();
    write_all(&mut writer, &more);
    records.extend(more);
    let updates: Vec<(String, String)> = (0..100)
        .map(|n| (format!("x{n}"), format!("u{n}")))
        .collect();
    write_all(&mut writer, &updates);
    for (index, update) in updates.into_iter().enumerate() {
        records[index] = update;
    }
    let during = xdr_stats(&a, "dcb");
    std::thread::sleep(Duration::from_secs(10).saturating_sub(paused.elapsed()));
    b.freeze(false);
    let recovered = wait_for_values(&b, &records, Duration::from_secs(15));
    assert!(
        recovered.is_some(),
        "all 1 600 writes on B within 15 s of its resumption; {}",
        missing(&a, &b, &records)
    );
    eprintln!("recovered {recovered:?} after B resumed; stats while paused: {during}");

    let stats = xdr_stats(&a, "dcb");
    eprintln!("get-stats: {stats}");
    let success = stat(&stats, "success").expect("success in get-stats");
    assert!(
        success >= 1600,
        "every write shipped at least once: {stats}"
    );
    assert!(stat(&stats, "lag").is_some(), "lag in get-stats: {stats}");
    let failures =
        stat(&stats, "retry_conn_reset").unwrap_or(0) + stat(&stats, "retry_dest").unwrap_or(0);
    assert!(
        failures > 0,
        "ships to the paused B failed and were retried: {stats}"
    );
    assert!(
        stat(&stats, "recoveries").unwrap_or(0) > 0,
        "rescans recovered them: {stats}"
    );
    drop(writer);
    a.kill();
    b.kill();
    let kept = std::fs::read_dir(&work)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|entry| entry.file_name().to_string_lossy().starts_with("xdr-lst-"))
        })
        .unwrap_or(false);
    assert!(kept, "A keeps its last-ship times in its work directory");
    let _ = std::fs::remove_dir_all(&work);
}

/// `count` keys `PREFIXn` (value `vPREFIXn`) whose partitions `node`
/// masters.
fn keys_mastered_by(node: &Node, prefix: &str, count: usize) -> Vec<(String, String)> {
    let mastered = mastered_partitions(node);
    (0..)
        .map(|n| (format!("{prefix}{n}"), format!("v{prefix}{n}")))
        .filter(|(key, _)| {
            let digest = of_key("demo", &UserKey::String(key.clone()));
            mastered[digest.partition().index()]
        })
        .take(count)
        .collect()
}

/// A source cluster of two nodes S1 and S2 ships to D. S1 masters the
/// written keys; D dies after the first batch reached it, and a second
/// batch is written (acknowledged: S2 holds the replicas); then S2's lane
/// for D is added — after those writes — and S1 dies with them unshipped.
/// When D is back (empty: an in-memory namespace), S2, now master of
/// everything, must ship the whole second batch: it resumes from the LSTs
/// S1 sent it, not from when its own lane was added (which would miss the
/// batch), and not from before the first batch (which D would hold again:
/// re-shipped).
#[test]
fn a_new_master_resumes_from_the_old_masters_last_ship_times() {
    let started = Instant::now();
    let (mut s1, mut s2, mut d) = (Node::new(10), Node::new(11), Node::new(12));
    let work = std::env::temp_dir().join(format!("citrine-xdr-s2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    s2.data_dir = Some(work.clone());
    d.start_seeds(&[]);
    let seed = s1.heartbeat_address();
    s1.start(&seed);
    s2.start(&s1.heartbeat_address());
    wait_for_cluster(&[&s1, &s2], 2, Duration::from_secs(20));
    wait_for_stable(&[&s1, &s2], Duration::from_secs(20));
    link(&s1, "dcd", &d, &[]);
    eprintln!("cluster formed {:?}", started.elapsed());
    // A filter set through S1 (`true`: every record passes) is the
    // cluster's: S2 answers it at once, before any lane of its own.
    let set = "xdr-set-filter:dc=dcd;namespace=test;exp=ww==";
    assert_eq!(s1.info_value(set).as_deref(), Some("ok"));
    let get = "xdr-get-filter:dc=dcd;namespace=test";
    let filter = Some("namespace=test:exp=ww==");
    assert_eq!(s2.info_value(get).as_deref(), filter, "S2 has S1's filter");

    let first = keys_mastered_by(&s1, "f", 200);
    let second = keys_mastered_by(&s1, "s", 200);
    let mut writer = s1.connect();
    write_all(&mut writer, &first);
    assert!(
        wait_for_values(&d, &first, Duration::from_secs(10)).is_some(),
        "the first batch on D: {}",
        xdr_stats(&s1, "dcd")
    );
    eprintln!("first batch shipped {:?}", started.elapsed());
    d.kill();
    write_all(&mut writer, &second);
    link(&s2, "dcd", &d, &[]);
    // S1's LSTs reach S2 once a second.
    std::thread::sleep(Duration::from_millis(2500));
    let before = xdr_stats(&s1, "dcd");
    s1.kill();
    wait_for_cluster(&[&s2], 1, Duration::from_secs(10));
    eprintln!("S2 alone {:?}", started.elapsed());
    let old_port = d.port;
    d.start_seeds(&[]);
    if d.port != old_port {
        for (address, action) in [(old_port, "remove"), (d.port, "add")] {
            let command = format!(
                "set-config:context=xdr;dc=dcd;node-address-port=127.0.0.1:{address};action={action}"
            );
            assert_eq!(s2.info_value(&command).as_deref(), Some("ok"));
        }
    }
    let shipped = wait_for_values(&d, &second, Duration::from_secs(15));
    let stats = xdr_stats(&s2, "dcd");
    assert!(
        shipped.is_some(),
        "every acknowledged write of the second batch on D: {:?} missing; S1 before its death: {before}; S2: {stats}",
        common::xdr::missing(&d, &second)
    );
    let reshipped = first.len() - common::xdr::missing(&d, &first).len();
    eprintln!("second batch on D {shipped:?} after D's restart; first batch re-shipped: {reshipped}; S2: {stats}");
    assert!(
        reshipped <= first.len() / 20,
        "S2 re-shipped {reshipped} of the first batch S1 had shipped: {stats}"
    );
    d.kill();
    // S2 keeps the filter in its work directory.
    s2.kill();
    s2.start_seeds(&[]);
    assert_eq!(
        s2.info_value(get).as_deref(),
        filter,
        "kept across a restart"
    );
    s2.kill();
    let _ = std::fs::remove_dir_all(&work);
}

/// A source cluster S1 (alone, shipping to D) is joined by S2, which then
/// masters about half the partitions and fills those holding records
/// slowly (S1 sends 20 records a second). Updates written during the fill
/// to every record — half of them in partitions S2 fills — are on D
/// within 3 s, while S2 still fills (before, the filling half waited for
/// the fill's end), and each was shipped once: S1's and S2's successes
/// grow by the updates' count, S2's hot keys kept it from shipping again
/// what it shipped while filling once it was whole.
#[test]
fn writes_during_a_fill_ship_before_it_ends() {
    let started = Instant::now();
    let (mut s1, mut s2, mut d) = (Node::new(13), Node::new(14), Node::new(15));
    d.start_seeds(&[]);
    let seed = s1.heartbeat_address();
    s1.start(&seed);
    link(&s1, "dcd", &d, &[]);
    let first = common::xdr::records("fill", 200);
    write_all(&mut s1.connect(), &first);
    assert!(
        wait_for_values(&d, &first, Duration::from_secs(10)).is_some(),
        "the first records on D: {}",
        xdr_stats(&s1, "dcd")
    );
    let throttle = |per_second: u32| {
        let command =
            format!("set-config:context=service;migrate-max-records-per-sec={per_second}");
        assert_eq!(s1.info_value(&command).as_deref(), Some("ok"));
    };
    eprintln!("first records on D {:?}", started.elapsed());
    throttle(20);
    s2.start(&seed);
    link(&s2, "dcd", &d, &[]);
    wait_for_cluster(&[&s1, &s2], 2, Duration::from_secs(20));
    eprintln!("S1 and S2 a cluster {:?}", started.elapsed());
    let remaining =
        |node: &Node| common::statistic(&mut node.connect(), "migrate_rx_partitions_remaining");
    let deadline = Instant::now() + Duration::from_secs(10);
    while remaining(&s2) == 0 {
        assert!(Instant::now() < deadline, "S2 fills");
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("S2 fills {:?}", started.elapsed());
    let successes = || {
        [&s1, &s2]
            .iter()
            .map(|node| stat(&xdr_stats(node, "dcd"), "success").unwrap_or(0))
            .sum::<u64>()
    };
    let before = successes();
    let updates: Vec<(String, String)> = first
        .iter()
        .map(|(key, _)| (key.clone(), format!("u-{key}")))
        .collect();
    write_all(&mut s1.connect(), &updates);
    let shipped = wait_for_values(&d, &updates, Duration::from_secs(3));
    let still_filling = remaining(&s2);
    assert!(
        shipped.is_some(),
        "the updates on D within 3 s: {:?} missing; S1: {}; S2: {}",
        common::xdr::missing(&d, &updates),
        xdr_stats(&s1, "dcd"),
        xdr_stats(&s2, "dcd")
    );
    assert!(
        still_filling > 0,
        "S2 still filled when they arrived (else the test proves nothing)"
    );
    eprintln!("updates on D {shipped:?} after written, {still_filling} partitions still filling");
    throttle(0);
    wait_for_stable(&[&s1, &s2], Duration::from_secs(30));
    eprintln!("fill over {:?}", started.elapsed());
    // Past a second's role refresh and a rescan from the LST.
    std::thread::sleep(Duration::from_millis(1500));
    let (s1_stats, s2_stats) = (xdr_stats(&s1, "dcd"), xdr_stats(&s2, "dcd"));
    eprintln!("S1: {s1_stats}\nS2: {s2_stats}");
    assert_eq!(
        successes() - before,
        updates.len() as u64,
        "each update shipped once; S1: {s1_stats}; S2: {s2_stats}"
    );
    assert!(
        stat(&s2_stats, "hot_keys").unwrap_or(0) > 0,
        "S2 skipped what it shipped while filling: {s2_stats}"
    );
    assert!(wait_for_values(&d, &updates, Duration::from_secs(1)).is_some());
    for mut node in [s1, s2, d] {
        node.kill();
    }
}
