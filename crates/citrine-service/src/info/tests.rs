//! Info-command tests: the answers' forms as the reference gives them
//! (each checked against Aerospike CE 8.1.2 by hand), through
//! `Service::handle`.

#![allow(clippy::unwrap_used)]

use crate::batch::tests::{put, service, START_MS};
use crate::tests::info;
use crate::{ManualClock, Service};
use std::sync::Arc;

fn ask(service: &Service, command: &str) -> String {
    info(service, &[command]).remove(0).1
}

#[test]
fn sets_reads_its_namespace_and_set_as_the_reference_does() {
    let (service, _) = service();
    put(&service, "foo", "k", &[("a", 1)], false);
    put(&service, "bar", "k", &[("a", 1)], false);
    let all = ask(&service, "sets");
    let entries: Vec<&str> = all.split_terminator(';').collect();
    assert_eq!(entries.len(), 2, "{all}");
    assert!(
        entries[0].starts_with("ns=test:set=foo:objects=1:"),
        "{all}"
    );
    assert!(
        entries[1].starts_with("ns=test:set=bar:objects=1:"),
        "{all}"
    );
    assert!(all.ends_with(';'), "{all}");
    // Nothing after the separator (either one) is every namespace.
    for command in ["sets/", "sets:", "sets/test"] {
        assert_eq!(ask(&service, command), all, "{command}");
    }
    // With a set: its properties alone, ended by ';' as every set's line.
    let foo = ask(&service, "sets/test/foo");
    assert!(foo.starts_with("objects=1:tombstones=0:"), "{foo}");
    assert!(foo.ends_with(":stop-writes-size=0;"), "{foo}");
    assert_eq!(foo.matches(';').count(), 1, "{foo}");
    // The set is the rest of the line; an empty or unknown one is nothing.
    for command in [
        "sets/test/foo/x",
        "sets/test/foo/",
        "sets/test/foo:x",
        "sets/test//foo",
        "sets/test/",
        "sets/test/FOO",
        "sets/test/nope",
    ] {
        assert_eq!(ask(&service, command), "", "{command}");
    }
    // The namespace is everything up to the next '/', parameters included.
    for command in [
        "sets//",
        "sets///",
        "sets/nope",
        "sets/test:x",
        "sets:namespace=test",
        "sets/te",
    ] {
        assert_eq!(ask(&service, command), "ns_type=unknown", "{command}");
    }
}

#[test]
fn truncate_lut_counts_from_the_citrusleaf_epoch() {
    let (service, clock) = service();
    put(&service, "s", "k", &[("a", 1)], false);
    clock.advance_ms(5);
    let cut_ms = START_MS + 2;
    let command = format!("truncate:namespace=test;set=s;lut={}", cut_ms * 1_000_000);
    assert_eq!(ask(&service, &command), "ok");
    let epoch_ms = citrine_types::CITRUSLEAF_EPOCH_UNIX_SECONDS * 1000;
    let expected = format!(":truncate_lut={}:", cut_ms - epoch_ms);
    assert!(ask(&service, "sets/test/s").contains(&expected));
    assert!(ask(&service, "sets").contains(&expected));
    let namespace = ask(&service, "namespace/test");
    assert!(namespace.contains(";truncate_lut=0;"), "{namespace}");
    assert_eq!(
        ask(
            &service,
            &format!(
                "truncate-namespace:namespace=test;lut={}",
                cut_ms * 1_000_000
            )
        ),
        "ok"
    );
    let namespace = ask(&service, "namespace/test");
    assert!(
        namespace.contains(&format!(";truncate_lut={};", cut_ms - epoch_ms)),
        "{namespace}"
    );
}

#[test]
fn udf_remove_refuses_only_a_missing_or_overlong_name() {
    let (service, _) = service();
    for command in [
        "udf-remove",
        "udf-remove:",
        "udf-remove:filename",
        "udf-remove:x=1",
        &format!("udf-remove:filename={}", "a".repeat(128)),
    ] {
        assert_eq!(
            ask(&service, command),
            "error=invalid_filename",
            "{command}"
        );
    }
    for command in [
        "udf-remove:filename=",
        "udf-remove:filename=.x",
        "udf-remove:filename=a/b",
        "udf-remove:filename=nope.lua",
        &format!("udf-remove:filename={}", "a".repeat(127)),
    ] {
        assert_eq!(ask(&service, command), "ok", "{command}");
    }
}

/// Sends one write to a record of `set` that does not exist; its result.
fn write_new(service: &Service, set: &str, info2: u8, ops: &[(u8, u8, &str, &[u8])]) -> u8 {
    let header = citrine_wire::msg::MsgHeader {
        info2: citrine_wire::msg::info2::WRITE | info2,
        generation: 5,
        ..Default::default()
    };
    crate::batch::tests::single(service, header, set, "k", ops)
        .header
        .result_code
}

/// A set comes into being with the first write that reaches its ops (a
/// refused one too), as the reference's does; a write refused before that
/// (a touch of a missing record, a generation check) leaves no set. Each
/// answer was taken from the reference.
#[test]
fn a_set_comes_into_being_with_the_first_write_that_reaches_its_ops() {
    use citrine_wire::msg::{info2, op_type};
    let (service, _) = service();
    let exists = |set: &str| !ask(&service, &format!("sets/test/{set}")).is_empty();
    assert_eq!(
        write_new(&service, "touched", 0, &[(op_type::TOUCH, 0, "", b"")]),
        2
    );
    assert!(!exists("touched"));
    let one = 1i64.to_be_bytes();
    let write_one = (op_type::WRITE, 1, "a", one.as_slice());
    assert_eq!(
        write_new(&service, "gen", info2::GENERATION, &[write_one]),
        3
    );
    assert!(!exists("gen"));
    // GeoJSON is parsed as the op applies: 160 after the set exists.
    let point = b"\0\0\0{\"type\": \"Point\"}";
    assert_eq!(
        write_new(&service, "geo", 0, &[(op_type::WRITE, 23, "g", point)]),
        160
    );
    assert!(exists("geo"));
    let text = (op_type::WRITE, 3, "a", b"x".as_slice());
    let incr = (op_type::INCR, 1, "a", one.as_slice());
    assert_eq!(write_new(&service, "incr", 0, &[text, incr]), 12);
    assert!(exists("incr"));
    let stats = ask(&service, "sets/test/incr");
    assert!(stats.starts_with("objects=0:"), "{stats}");
    assert_eq!(ask(&service, "sets/test/never"), "");
}

/// A non-durable delete's tombstone (kept to order this node's copies) is
/// not reported: the reference keeps none, and its `sets`, `namespace`
/// and `statistics` answers show `tombstones=0` after one.
#[test]
fn a_non_durable_deletes_tombstone_is_not_reported() {
    use citrine_wire::msg::info2;
    let (service, _) = service();
    put(&service, "gone", "k", &[("a", 1)], false);
    let header = citrine_wire::msg::MsgHeader {
        info2: info2::WRITE | info2::DELETE,
        ..Default::default()
    };
    let reply = crate::batch::tests::single(&service, header, "gone", "k", &[]);
    assert_eq!(reply.header.result_code, 0);
    let namespace = service.namespace(b"test").unwrap();
    assert_eq!(namespace.index.tombstone_count(), 1);
    let set = ask(&service, "sets/test/gone");
    assert!(set.starts_with("objects=0:tombstones=0:"), "{set}");
    for command in ["namespace/test", "statistics"] {
        let answer = ask(&service, command);
        assert!(answer.contains(";tombstones=0;"), "{command}: {answer}");
        assert!(!answer.contains(";tombstones=1;"), "{command}: {answer}");
    }
}

/// A namespace holds 4095 sets, as the reference's: the write that would
/// create one more is refused with 4 (the reference's answer), and the
/// sets it has still take writes.
#[test]
fn a_namespace_holds_the_references_4095_sets() {
    let (service, _) = service();
    for n in 0..4095 {
        put(&service, &format!("s{n}"), "k", &[("a", 1)], false);
    }
    let one = 1i64.to_be_bytes();
    let write_one = (citrine_wire::msg::op_type::WRITE, 1, "a", one.as_slice());
    assert_eq!(write_new(&service, "s4095", 0, &[write_one]), 4);
    assert_eq!(ask(&service, "sets/test/s4095"), "");
    put(&service, "s4094", "other", &[("a", 1)], false);
    let last = ask(&service, "sets/test/s4094");
    assert!(last.starts_with("objects=2:"), "{last}");
}

/// The TLS endpoints: empty without a TLS port (the peer list naming the
/// default port 3000); with one, `service-tls-std` is its access address
/// and the peer list names its port. No alternate addresses.
#[test]
fn tls_endpoints_are_answered_when_the_node_has_a_tls_port() {
    let (plain, _) = service();
    assert_eq!(ask(&plain, "service-tls-std"), "");
    assert_eq!(ask(&plain, "peers-tls-std"), "1,3000,[]");
    let mut config = plain.config.clone();
    config.tls_access_address = "10.0.0.5:4333".to_owned();
    let clock = Arc::new(ManualClock::new(START_MS));
    let tls = Service::new(config, clock);
    assert_eq!(ask(&tls, "service-tls-std"), "10.0.0.5:4333");
    assert_eq!(ask(&tls, "service-tls-alt"), "");
    assert_eq!(ask(&tls, "service-clear-std"), "127.0.0.1:3000");
    assert_eq!(ask(&tls, "peers-tls-std"), "1,4333,[]");
    assert_eq!(ask(&tls, "peers-tls-alt"), "1,4333,[]");
}
