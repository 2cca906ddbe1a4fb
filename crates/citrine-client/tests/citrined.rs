//! Integration tests of the client against a real `citrined` process:
//! discovery, every single-record command and policy, info, typed errors,
//! and a server restart in the middle of a workload.

mod common;

use citrine_client::{
    Bin, Bins, Client, ClientConfig, Error, Expiration, GenerationPolicy, Key, Operation,
    ReadPolicy, RecordExistsAction, ResultCode, Value, WritePolicy,
};
use common::Server;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

async fn connect(server: &Server) -> Client {
    Client::connect(ClientConfig::new([server.seed()]))
        .await
        .expect("client connects")
}

#[tokio::test]
async fn discovers_the_node_and_its_partitions() {
    let server = Server::start();
    let client = connect(&server).await;
    let nodes = client.nodes();
    assert_eq!(nodes.len(), 1);
    assert!(nodes[0].build.starts_with("8."), "build {}", nodes[0].build);
    let key = Key::new("test", "demo", "key1");
    assert_eq!(
        client.master_of(&key),
        Some(nodes[0].id),
        "all partitions of `test` are mastered by the node"
    );
    let stats = client.stats();
    assert!(
        stats.partition_refreshes >= 1 && stats.peers_refreshes >= 1,
        "{stats:?}"
    );
    client.close();
}

#[tokio::test]
async fn single_record_commands() {
    let server = Server::start();
    let client = connect(&server).await;
    let read = ReadPolicy::default();
    let write = WritePolicy::default();
    let key = Key::new("test", "demo", "crud");

    assert_eq!(
        client
            .get(&read, &key, Bins::All)
            .await
            .expect("get missing"),
        None
    );
    assert!(!client.exists(&read, &key).await.expect("exists missing"));
    client
        .put(
            &write,
            &key,
            &[
                Bin::new("a", 1i64),
                Bin::new("s", "hello"),
                Bin::new("f", 2.5),
            ],
        )
        .await
        .expect("put");
    assert!(client.exists(&read, &key).await.expect("exists"));

    let record = client
        .get(&read, &key, Bins::All)
        .await
        .expect("get")
        .expect("found");
    assert_eq!(record.generation, 1);
    assert_eq!(record.bin("a"), Some(&Value::Int(1)));
    assert_eq!(record.bin("s"), Some(&Value::String("hello".into())));
    assert_eq!(record.bin("f"), Some(&Value::Float(2.5)));

    let named = client
        .get(&read, &key, Bins::Names(vec!["s".into()]))
        .await
        .expect("get named")
        .expect("found");
    assert_eq!(named.bins.len(), 1);
    assert_eq!(named.bin("s"), Some(&Value::String("hello".into())));

    let header = client
        .get(&read, &key, Bins::Header)
        .await
        .expect("header")
        .expect("found");
    assert!(header.bins.is_empty());
    assert_eq!(header.generation, 1);

    client.touch(&write, &key).await.expect("touch");
    let after_touch = client
        .get(&read, &key, Bins::Header)
        .await
        .expect("header")
        .expect("found");
    assert_eq!(after_touch.generation, 2);

    client
        .add(&write, &key, &[Bin::new("a", 41i64)])
        .await
        .expect("add");
    client
        .append(&write, &key, &[Bin::new("s", " world")])
        .await
        .expect("append");
    client
        .prepend(&write, &key, &[Bin::new("s", ">")])
        .await
        .expect("prepend");
    let record = client
        .get(&read, &key, Bins::All)
        .await
        .expect("get")
        .expect("found");
    assert_eq!(record.bin("a"), Some(&Value::Int(42)));
    assert_eq!(record.bin("s"), Some(&Value::String(">hello world".into())));

    assert!(client.delete(&write, &key).await.expect("delete"));
    assert!(!client.delete(&write, &key).await.expect("delete again"));
    assert_eq!(
        client
            .get(&read, &key, Bins::All)
            .await
            .expect("get deleted"),
        None
    );
    client.close();
}

#[tokio::test]
async fn value_types_round_trip() {
    let server = Server::start();
    let client = connect(&server).await;
    let key = Key::new("test", "types", 7i64);
    // [1, "x"] and {"k": 2} in Aerospike msgpack (strings carry particle type 3).
    let list = vec![0x92, 0x01, 0xa2, 0x03, b'x'];
    let map = vec![0x81, 0xa2, 0x03, b'k', 0x02];
    let bins = vec![
        Bin::new("i", -5i64),
        Bin::new("f", -0.25),
        Bin::new("s", "ünïcode"),
        Bin::new("b", vec![0u8, 1, 2, 255]),
        Bin::new("t", true),
        Bin::new("l", Value::List(list.clone())),
        Bin::new("m", Value::Map(map.clone())),
    ];
    client
        .put(&WritePolicy::default(), &key, &bins)
        .await
        .expect("put");
    let record = client
        .get(&ReadPolicy::default(), &key, Bins::All)
        .await
        .expect("get")
        .expect("found");
    for bin in &bins {
        assert_eq!(record.bin(&bin.name), Some(&bin.value), "bin {}", bin.name);
    }
    client.close();
}

#[tokio::test]
async fn operate_runs_ops_in_order() {
    let server = Server::start();
    let client = connect(&server).await;
    let write = WritePolicy::default();
    let key = Key::new("test", "ops", "counter");
    let record = client
        .operate(
            &write,
            &key,
            &[
                Operation::Write(Bin::new("n", 10i64)),
                Operation::incr("n", 5),
                Operation::Read("n".into()),
            ],
        )
        .await
        .expect("operate");
    assert_eq!(record.bin("n"), Some(&Value::Int(15)));
    let record = client
        .operate(
            &write,
            &key,
            &[
                Operation::Write(Bin::new("s", "b")),
                Operation::Append(Bin::new("s", "c")),
                Operation::Prepend(Bin::new("s", "a")),
                Operation::Read("s".into()),
            ],
        )
        .await
        .expect("operate strings");
    assert_eq!(record.bin("s"), Some(&Value::String("abc".into())));
    let all = client
        .operate(&write, &key, &[Operation::ReadAll])
        .await
        .expect("read all");
    assert_eq!(all.bins.len(), 2);
    let header = client
        .operate(&write, &key, &[Operation::Touch, Operation::ReadHeader])
        .await
        .expect("touch");
    assert!(header.generation >= 3, "generation {}", header.generation);
    client
        .operate(&write, &key, &[Operation::Delete])
        .await
        .expect("delete op");
    assert!(!client
        .exists(&ReadPolicy::default(), &key)
        .await
        .expect("exists"));
    client.close();
}

#[tokio::test]
async fn write_policies_and_typed_errors() {
    let server = Server::start();
    let client = connect(&server).await;
    let key = Key::new("test", "policies", "p");
    let base = WritePolicy::default();

    let update_only = WritePolicy {
        record_exists: RecordExistsAction::UpdateOnly,
        ..base.clone()
    };
    let error = client
        .put(&update_only, &key, &[Bin::new("a", 1i64)])
        .await
        .expect_err("update-only on missing");
    assert_eq!(error.result_code(), Some(ResultCode::NotFound), "{error}");

    let create_only = WritePolicy {
        record_exists: RecordExistsAction::CreateOnly,
        ..base.clone()
    };
    client
        .put(
            &create_only,
            &key,
            &[Bin::new("a", 1i64), Bin::new("b", 2i64)],
        )
        .await
        .expect("create");
    let error = client
        .put(&create_only, &key, &[Bin::new("a", 1i64)])
        .await
        .expect_err("create-only on existing");
    assert_eq!(
        error.result_code(),
        Some(ResultCode::RecordExists),
        "{error}"
    );
    assert!(matches!(error, Error::Server { code: 5, .. }));

    let wrong_generation = WritePolicy {
        generation: GenerationPolicy::ExpectEqual(9),
        ..base.clone()
    };
    let error = client
        .put(&wrong_generation, &key, &[Bin::new("a", 2i64)])
        .await
        .expect_err("generation mismatch");
    assert_eq!(error.result_code(), Some(ResultCode::Generation), "{error}");
    let right_generation = WritePolicy {
        generation: GenerationPolicy::ExpectEqual(1),
        ..base.clone()
    };
    client
        .put(&right_generation, &key, &[Bin::new("a", 2i64)])
        .await
        .expect("generation match");
    let greater = WritePolicy {
        generation: GenerationPolicy::ExpectGreater(2),
        ..base.clone()
    };
    client
        .put(&greater, &key, &[Bin::new("a", 3i64)])
        .await
        .expect_err("gt needs > current");
    let greater = WritePolicy {
        generation: GenerationPolicy::ExpectGreater(5),
        ..base.clone()
    };
    client
        .put(&greater, &key, &[Bin::new("a", 3i64)])
        .await
        .expect("gt");

    let replace = WritePolicy {
        record_exists: RecordExistsAction::Replace,
        ..base.clone()
    };
    client
        .put(&replace, &key, &[Bin::new("c", 3i64)])
        .await
        .expect("replace");
    let record = client
        .get(&ReadPolicy::default(), &key, Bins::All)
        .await
        .expect("get")
        .expect("found");
    assert_eq!(
        record.bins.keys().collect::<Vec<_>>(),
        vec!["c"],
        "replace drops other bins"
    );

    let ttl = WritePolicy {
        expiration: Expiration::Seconds(1000),
        ..base.clone()
    };
    client
        .put(&ttl, &key, &[Bin::new("c", 4i64)])
        .await
        .expect("ttl put");
    let record = client
        .get(&ReadPolicy::default(), &key, Bins::Header)
        .await
        .expect("get")
        .expect("found");
    let left = record.ttl().expect("has a ttl");
    assert!((990..=1000).contains(&left), "ttl {left}");

    let mut send_key = base.clone();
    send_key.base.send_key = true;
    client
        .put(
            &send_key,
            &Key::new("test", "policies", 99i64),
            &[Bin::new("a", 1i64)],
        )
        .await
        .expect("send key");

    let error = client
        .get(
            &ReadPolicy::default(),
            &Key::new("nosuchns", "", 1i64),
            Bins::All,
        )
        .await
        .expect_err("unknown namespace");
    assert_eq!(error.result_code(), Some(ResultCode::Namespace), "{error}");

    let error = client
        .put(&base, &key, &[Bin::new("this_name_is_too_long", 1i64)])
        .await
        .expect_err("bin name");
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
    client.close();
}

#[tokio::test]
async fn info_to_one_and_all_nodes() {
    let server = Server::start();
    let client = connect(&server).await;
    let node = client.nodes()[0].id;
    let answer = client
        .info(node, &["node", "namespaces"])
        .await
        .expect("info");
    assert_eq!(
        answer.get("node").map(String::as_str),
        Some(node.to_string().as_str())
    );
    assert!(answer
        .get("namespaces")
        .is_some_and(|ns| ns.split(';').any(|n| n == "test")));
    let all = client.info_all(&["build"]).await;
    assert_eq!(all.len(), 1);
    assert!(all[0].1.as_ref().is_ok_and(|a| a.contains_key("build")));
    let direct = citrine_client::info_at(&server.seed(), &["build"], Duration::from_secs(2))
        .await
        .expect("info_at");
    assert_eq!(direct[0].0, "build");
    client.close();
}

#[tokio::test]
async fn connect_fails_clearly_without_a_server() {
    let port = common::free_port();
    let mut config = ClientConfig::new([format!("127.0.0.1:{port}")]);
    config.tend_timeout = Duration::from_millis(300);
    let error = Client::connect(config).await.expect_err("nothing listens");
    assert!(matches!(error, Error::NoSeed { .. }), "{error}");
    assert!(error.to_string().contains("server is running"), "{error}");
}

/// The server is killed and restarted in the middle of a workload: every
/// operation the application issued still succeeds (after retries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_is_invisible_to_the_application() {
    let mut server = Server::start();
    let mut config = ClientConfig::new([server.seed()]);
    config.tend_interval = Duration::from_millis(200);
    config.tend_timeout = Duration::from_millis(300);
    config.max_node_failures = 3;
    let client = Client::connect(config).await.expect("connect");
    let mut policy = WritePolicy::default();
    policy.base.total_timeout = Duration::from_secs(20);
    policy.base.socket_timeout = Duration::from_millis(500);
    policy.base.max_retries = 10_000;
    policy.base.backoff = Duration::from_millis(10);
    policy.base.max_backoff = Duration::from_millis(100);

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for worker in 0..4i64 {
        let (client, policy, stop, done) =
            (client.clone(), policy.clone(), stop.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let key = Key::new("test", "restart", worker * 1_000_000 + i);
                let ops = [
                    Operation::Write(Bin::new("v", i)),
                    Operation::Read("v".into()),
                ];
                match client.operate(&policy, &key, &ops).await {
                    Ok(record) if record.bin("v") == Some(&Value::Int(i)) => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(record) => failures.push(format!("wrong value {record:?}")),
                    Err(error) => failures.push(error.to_string()),
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            failures
        }));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let before_kill = done.load(Ordering::Relaxed);
    assert!(before_kill > 0, "workload runs before the restart");
    let retries_before = client.stats().retries;
    server.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let during = done.load(Ordering::Relaxed);
    server.restart();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for worker in workers {
        failures.extend(worker.await.expect("worker"));
    }
    let after = done.load(Ordering::Relaxed);
    let stats = client.stats();
    eprintln!("restart test: {before_kill} ops before kill, {during} when restarted, {after} at the end; {stats:?}");
    assert!(
        failures.is_empty(),
        "application saw failures: {:?}",
        &failures[..failures.len().min(5)]
    );
    assert!(
        during - before_kill <= 4,
        "no operation can complete while the server is down ({before_kill} → {during})"
    );
    assert!(
        after > during + 10,
        "workload resumed after the restart ({during} → {after})"
    );
    assert!(
        stats.retries > retries_before,
        "operations were retried: {stats:?}"
    );
    assert_eq!(stats.nodes, 1, "{stats:?}");
    client.close();
}

#[tokio::test]
async fn list_and_map_operations_through_operate() {
    use citrine_client::{cdt, msgpack, Element};
    let server = Server::start();
    let client = connect(&server).await;
    let write = WritePolicy::default();
    let key = Key::new("test", "cdt", "profile");
    let s = |text: &str| Value::String(text.into());

    // Lists: append to an absent bin creates it; sizes come back.
    let record = client
        .operate(
            &write,
            &key,
            &[
                cdt::list::append("seg", &Value::Int(10)),
                cdt::list::append_items("seg", &msgpack::list(&[Value::Int(20), s("x")])),
                cdt::list::insert("seg", 0, &Value::Int(5)),
            ],
        )
        .await
        .expect("list writes");
    assert_eq!(
        record.bin("seg"),
        Some(&Value::Int(4)),
        "the last op's size"
    );
    let record = client
        .operate(
            &write,
            &key,
            &[cdt::list::get_range("seg", 1, 2), cdt::list::size("seg")],
        )
        .await
        .expect("list reads");
    // Several ops on one bin: the client keeps the last value per bin.
    assert_eq!(record.bin("seg"), Some(&Value::Int(4)));
    let record = client
        .operate(&write, &key, &[cdt::list::get_range("seg", 1, 2)])
        .await
        .expect("range");
    assert_eq!(
        record.bin("seg").and_then(Value::elements),
        Some(Element::List(vec![Element::Int(10), Element::Int(20)]))
    );
    let record = client
        .operate(
            &write,
            &key,
            &[cdt::list::increment("seg", 0, 2), cdt::list::pop("seg", -1)],
        )
        .await
        .expect("increment, pop");
    assert_eq!(
        record.bin("seg"),
        Some(&Value::String("x".into())),
        "the popped element"
    );

    // Maps: counters and lookups.
    client
        .operate(
            &write,
            &key,
            &[
                cdt::map::put("m", &s("name"), &s("alice")),
                cdt::map::increment("m", &s("visits"), 3),
                cdt::map::increment("m", &s("visits"), 4),
            ],
        )
        .await
        .expect("map writes");
    let record = client
        .operate(&write, &key, &[cdt::map::get_by_key("m", &s("visits"))])
        .await
        .expect("map read");
    assert_eq!(record.bin("m"), Some(&Value::Int(7)));
    let record = client
        .operate(
            &write,
            &key,
            &[
                cdt::map::remove_by_key("m", &s("name")),
                cdt::map::size("m"),
            ],
        )
        .await
        .expect("remove, size");
    assert_eq!(record.bin("m"), Some(&Value::Int(1)));
    let whole = client
        .get(&Default::default(), &key, Bins::All)
        .await
        .expect("get")
        .expect("found");
    assert_eq!(
        whole.bin("seg").and_then(Value::elements),
        Some(Element::List(vec![
            Element::Int(7),
            Element::Int(10),
            Element::Int(20)
        ]))
    );
    assert_eq!(
        whole.bin("m").and_then(Value::elements),
        Some(Element::Map(vec![(
            Element::String("visits".into()),
            Element::Int(7)
        )]))
    );
    // A list op on a map bin: the server's type error comes back typed.
    let error = client
        .operate(&write, &key, &[cdt::list::append("m", &Value::Int(1))])
        .await
        .expect_err("wrong type");
    assert_eq!(error.raw_code(), Some(12), "{error}");
    client.close();
}
