//! Secondary indexes over a real three-node cluster: an index created
//! through one node exists on every node (and one deleted through another
//! is gone from every node), a query sent to every node returns each
//! matching record exactly once (each node its master partitions), a
//! background query sent to every node writes each matching record once
//! (replicas included), and a node that was down when an index was
//! created gets it when it rejoins. UDF modules, the other shared metadata,
//! take the same way: registered through one node, listed by all; a node
//! that was down gets the module registered meanwhile, and not the one
//! removed meanwhile.

#![allow(clippy::unwrap_used)]

mod common;

use common::cluster::{get_bin, put, start_cluster, wait_for_cluster, wait_for_stable, Node};
use common::stream::read_stream;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Waits until every node of `group` answers `command` with a value
/// `accept` takes.
fn wait_all(group: &[&Node], command: &str, accept: impl Fn(&str) -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answers: Vec<Option<String>> =
            group.iter().map(|node| node.info_value(command)).collect();
        if answers
            .iter()
            .all(|answer| answer.as_deref().is_some_and(&accept))
        {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {answers:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts that every node of `group` answers `command` with `expected`
/// now: a shared-metadata command answers only once every member holds
/// its change, so no waiting is needed after it.
fn assert_all(group: &[&Node], command: &str, accept: impl Fn(&str) -> bool, what: &str) {
    let answers: Vec<Option<String>> = group.iter().map(|node| node.info_value(command)).collect();
    assert!(
        answers
            .iter()
            .all(|answer| answer.as_deref().is_some_and(&accept)),
        "{what}: {answers:?}"
    );
}

/// The digests one node returns for `v == value` (its master partitions;
/// the others it reports unavailable).
fn query_node(node: &Node, value: &str) -> Vec<[u8; 20]> {
    use citrine_wire::msg::{field_type, info1, info3, MessageWriter, MsgHeader};
    let header = MsgHeader {
        info1: info1::READ,
        info3: info3::PARTITION_DONE,
        transaction_ttl: 5000,
        ..MsgHeader::default()
    };
    let mut range = vec![1u8, 1, b'v', 3];
    for _ in 0..2 {
        range.extend_from_slice(&(value.len() as u32).to_be_bytes());
        range.extend_from_slice(value.as_bytes());
    }
    let mut frame = Vec::new();
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::TASK_ID, &11u64.to_be_bytes())
        .field(field_type::INDEX_RANGE, &range);
    writer.finish();
    let mut stream = node.connect();
    std::io::Write::write_all(&mut stream, &frame).unwrap();
    let (messages, _) = read_stream(&mut stream);
    let (last, rest) = messages.split_last().unwrap();
    assert_eq!(
        last.header.result_code, 0,
        "query refused by node {}",
        node.id
    );
    rest.iter()
        .filter(|message| message.header.info3 & info3::PARTITION_DONE == 0)
        .map(|message| {
            message
                .field(field_type::DIGEST)
                .unwrap()
                .try_into()
                .unwrap()
        })
        .collect()
}

/// Sends a background query writing bin "hit" = 1 to every record whose
/// `v` is "three"; answers the acceptance's result code.
fn background_hit(node: &Node, trid: u64) -> u8 {
    use citrine_wire::msg::{field_type, info2, op_type, MessageWriter, MsgHeader};
    let header = MsgHeader {
        info2: info2::WRITE,
        transaction_ttl: 5000,
        ..MsgHeader::default()
    };
    let mut range = vec![1u8, 1, b'v', 3];
    for _ in 0..2 {
        range.extend_from_slice(&5u32.to_be_bytes());
        range.extend_from_slice(b"three");
    }
    let mut frame = Vec::new();
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::TASK_ID, &trid.to_be_bytes())
        .field(field_type::INDEX_RANGE, &range);
    writer.op(op_type::WRITE, 1, b"hit", &1i64.to_be_bytes());
    writer.finish();
    let mut stream = node.connect();
    std::io::Write::write_all(&mut stream, &frame).unwrap();
    let (messages, _) = read_stream(&mut stream);
    assert_eq!(messages.len(), 1);
    messages[0].header.result_code
}

/// Bin "hit" of record `key`, read through `node`.
fn hit(node: &Node, key: &str) -> Option<i64> {
    let (code, value) = get_bin(&mut node.connect(), key, "hit");
    assert_eq!(code, 0, "{key}");
    value.map(|value| i64::from_be_bytes(value.try_into().unwrap()))
}

#[test]
fn index_definitions_reach_every_node_and_queries_cover_the_cluster_once() {
    let mut nodes = start_cluster(90);
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_stable(&group, Duration::from_secs(60));
    let mut stream = nodes[0].connect();
    for index in 0..300 {
        let value = if index % 3 == 0 { "three" } else { "other" };
        assert_eq!(put(&mut stream, &format!("k{index}"), value), 0);
    }
    let create = "sindex-create:namespace=test;indexname=by_v;bin=v;type=STRING";
    assert_eq!(nodes[1].info_value(create).as_deref(), Some("ok"));
    let exists = "sindex-exists:namespace=test;indexname=by_v";
    assert_all(
        &group,
        exists,
        |answer| answer == "true",
        "answered before every node had the index",
    );
    wait_all(
        &group,
        "sindex/test/by_v",
        |answer| answer.contains("load_pct=100;"),
        "the index is not built on every node",
    );
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for node in &nodes {
        let digests = query_node(node, "three");
        total += digests.len();
        seen.extend(digests);
    }
    assert_eq!(
        (total, seen.len()),
        (100, 100),
        "each record once, from its master"
    );

    // A background query sent to every node (as clients send it): each
    // node writes the records it masters, replicas included.
    for node in &nodes {
        assert_eq!(background_hit(node, 99), 0);
    }
    wait_all(
        &group,
        "query-show:trid=99",
        |answer| answer.contains("status=done(ok)"),
        "the background query did not finish on every node",
    );
    let succeeded: u64 = nodes
        .iter()
        .map(|node| {
            let answer = node.info_value("query-show:trid=99").unwrap();
            answer
                .split(':')
                .find_map(|pair| pair.strip_prefix("recs-succeeded="))
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(succeeded, 100);
    for index in 0..300 {
        let expected = (index % 3 == 0).then_some(1);
        for node in &nodes {
            assert_eq!(
                hit(node, &format!("k{index}")),
                expected,
                "k{index} via {}",
                node.id
            );
        }
    }

    // Deleted through another node: gone everywhere.
    let delete = "sindex-delete:namespace=test;indexname=by_v";
    assert_eq!(nodes[2].info_value(delete).as_deref(), Some("ok"));
    assert_all(
        &group,
        exists,
        |answer| answer == "false",
        "answered before every node lost the index",
    );
    // At once another definition under the name, through a third node
    // (as the official clients' suites do between test files): it sees
    // the delete, so this is a new index, not "another one has the name".
    let other = "sindex-create:namespace=test;indexname=by_v;bin=w;type=NUMERIC";
    assert_eq!(nodes[0].info_value(other).as_deref(), Some("ok"));
    assert_all(
        &group,
        "sindex-list:namespace=test",
        |answer| answer.starts_with("ns=test:indexname=by_v:set=null:bin=w:type=numeric:"),
        "the new definition is not on every node",
    );
    assert_eq!(nodes[1].info_value(delete).as_deref(), Some("ok"));
    assert_all(
        &group,
        exists,
        |answer| answer == "false",
        "the second index is not gone",
    );

    // UDF modules: registered through one node, listed by every node.
    let module_f =
        "udf-put:filename=f.lua;content=ZnVuY3Rpb24gZihyZWMpIHJldHVybiAxIGVuZA==;udf-type=LUA;";
    assert_eq!(nodes[1].info_value(module_f).as_deref(), Some("ok"));
    assert_all(
        &group,
        "udf-list",
        |answer| answer == "filename=f.lua,hash=124814078c4397c597cd9f704c94a39a46a0db33,type=LUA;",
        "the module is not on every node",
    );

    // A node down when an index is created gets it when it comes back.
    nodes[2].kill();
    wait_for_cluster(
        &nodes[..2].iter().collect::<Vec<_>>(),
        2,
        Duration::from_secs(30),
    );
    assert_eq!(nodes[0].info_value(create).as_deref(), Some("ok"));
    // Meanwhile f.lua goes and g.lua comes.
    assert_eq!(
        nodes[0].info_value("udf-remove:filename=f.lua").as_deref(),
        Some("ok")
    );
    let module_g =
        "udf-put:filename=g.lua;content=ZnVuY3Rpb24gZyhyZWMpIHJldHVybiAyIGVuZA==;udf-type=LUA;";
    assert_eq!(nodes[1].info_value(module_g).as_deref(), Some("ok"));
    let seed = nodes[0].heartbeat_address();
    nodes[2].start(&seed);
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&group, 3, Duration::from_secs(30));
    wait_all(
        &group,
        "sindex/test/by_v",
        |answer| answer.contains("load_pct=100;"),
        "the restarted node did not get the index",
    );
    wait_all(
        &group,
        "udf-list",
        |answer| answer == "filename=g.lua,hash=f7eb310df5e5f2fd7a5092b92d0fc6a092151965,type=LUA;",
        "the rejoined node did not settle on the modules",
    );
    // And the delete before it did not come back anywhere.
    wait_all(
        &group,
        "sindex",
        |answer| answer.matches("indexname=by_v:").count() == 1,
        "one index by that name",
    );
}
