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

mod common;

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
