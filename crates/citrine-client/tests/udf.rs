//! Lua UDFs through the client, against a real `citrined` process: module
//! registration, listing, fetching and removal; record UDFs on one record
//! and on a batch; background UDF jobs; raw aggregation output.

mod common;

use citrine_client::msgpack::{self, Element};
use citrine_client::{
    udf_hash, BackgroundTask, BatchPolicy, Bin, Bins, Client, ClientConfig, Error, IndexFilter,
    IndexType, Key, ReadPolicy, ResultCode, ScanPolicy, Statement, Value, WritePolicy,
};
use common::Server;
use std::time::Duration;

const MODULE: &str = r#"
function bump(rec, bin, by)
  local old = rec[bin]
  if old == nil then old = 0 end
  rec[bin] = old + by
  aerospike:update(rec)
  local result = map()
  result['old'] = old
  result['new'] = rec[bin]
  return result
end

function echo(rec, value) return value end

function nothing(rec) end

function fail(rec, text) error(text) end

function double_unless(rec, bad)
  local n = rec['n']
  if n == bad then error('refusing record ' .. tostring(n)) end
  rec['doubled'] = n * 2
  aerospike:update(rec)
  return n * 2
end

function tag(rec, value)
  rec['tag'] = value
  aerospike:update(rec)
end

local function add(a, b) return a + b end

function count(stream)
  return stream : map(function(rec) return 1 end) : reduce(add)
end

function values_at_least(stream, low)
  return stream : filter(function(rec) return rec['n'] >= low end)
                : map(function(rec) return rec['n'] end)
end
"#;

async fn connect(server: &Server) -> Client {
    Client::connect(ClientConfig::new([server.seed()]))
        .await
        .expect("client connects")
}

/// A map element's value under a string key.
fn entry<'e>(element: &'e Element, name: &str) -> Option<&'e Element> {
    match element {
        Element::Map(entries) => entries
            .iter()
            .find(|(key, _)| matches!(key, Element::String(text) if text == name))
            .map(|(_, value)| value),
        _ => None,
    }
}

async fn int_bin(client: &Client, key: &Key, bin: &str) -> Option<i64> {
    let record = client
        .get(&ReadPolicy::default(), key, Bins::All)
        .await
        .expect("get")?;
    match record.bin(bin) {
        Some(Value::Int(value)) => Some(*value),
        _ => None,
    }
}

#[tokio::test]
async fn modules_register_list_get_and_remove() {
    let server = Server::start();
    let client = connect(&server).await;
    assert!(client
        .list_udfs()
        .await
        .expect("list")
        .iter()
        .all(|module| module.filename != "citrine_m.lua"));

    client
        .register_udf("citrine_m.lua", MODULE.as_bytes())
        .await
        .expect("register");
    let listed = client.list_udfs().await.expect("list");
    let module = listed
        .iter()
        .find(|module| module.filename == "citrine_m.lua")
        .unwrap_or_else(|| panic!("the module is listed: {listed:?}"));
    assert_eq!(module.hash, udf_hash(MODULE.as_bytes()));
    assert_eq!(module.hash.len(), 40);
    assert_eq!(
        client.get_udf("citrine_m.lua").await.expect("get"),
        Some(MODULE.as_bytes().to_vec())
    );

    // Registering new source under the same name replaces it.
    let changed = format!("{MODULE}\nfunction extra(rec) return 7 end\n");
    client
        .register_udf("citrine_m.lua", changed.as_bytes())
        .await
        .expect("replace");
    let listed = client.list_udfs().await.expect("list");
    assert_eq!(
        listed
            .iter()
            .filter(|module| module.filename == "citrine_m.lua")
            .map(|module| module.hash.clone())
            .collect::<Vec<_>>(),
        vec![udf_hash(changed.as_bytes())]
    );
    assert_eq!(
        client
            .execute_udf(
                &WritePolicy::default(),
                &Key::new("test", "udf", "extra"),
                "citrine_m",
                "extra",
                &[],
            )
            .await
            .expect("the new function runs"),
        Value::Int(7)
    );

    client.remove_udf("citrine_m.lua").await.expect("remove");
    assert!(client
        .list_udfs()
        .await
        .expect("list")
        .iter()
        .all(|module| module.filename != "citrine_m.lua"));
    assert_eq!(client.get_udf("citrine_m.lua").await.expect("get"), None);
    client
        .remove_udf("citrine_m.lua")
        .await
        .expect("removing an absent module is fine");

    // A module that does not compile: refused with where and why.
    let error = client
        .register_udf(
            "citrine_bad.lua",
            b"function broken(rec)\n  return (\nend\n",
        )
        .await
        .expect_err("does not compile");
    match &error {
        Error::UdfModule(refusal) => {
            assert_eq!(refusal.filename, "citrine_bad.lua");
            assert_eq!(refusal.reason, "compile_error");
            assert!(refusal.line.is_some_and(|line| line >= 2), "{error}");
            assert!(
                refusal
                    .message
                    .as_deref()
                    .is_some_and(|text| !text.is_empty()),
                "{error}"
            );
        }
        other => panic!("expected a module error, got {other:?}"),
    }
    assert_eq!(client.get_udf("citrine_bad.lua").await.expect("get"), None);
    // A name the server does not accept.
    match client.register_udf("no_extension", b"return 1").await {
        Err(Error::UdfModule(refusal)) => assert_eq!(refusal.reason, "invalid_filename"),
        other => panic!("expected invalid_filename, got {other:?}"),
    }
    // Names that would break the info command never leave the client.
    assert!(matches!(
        client.register_udf("a;b.lua", b"return 1").await,
        Err(Error::InvalidArgument(_))
    ));
    client.close();
}

#[tokio::test]
async fn execute_updates_the_record_and_returns_values() {
    let server = Server::start();
    let client = connect(&server).await;
    client
        .register_udf("citrine_m.lua", MODULE.as_bytes())
        .await
        .expect("register");
    let write = WritePolicy::default();
    let key = Key::new("test", "udf", "counter");
    client
        .put(&write, &key, &[Bin::new("n", 5i64)])
        .await
        .expect("put");

    let result = client
        .execute_udf(
            &write,
            &key,
            "citrine_m",
            "bump",
            &[Value::from("n"), Value::Int(10)],
        )
        .await
        .expect("bump");
    let Value::Map(_) = &result else {
        panic!("a Lua map comes back as a map: {result:?}")
    };
    let element = result.elements().expect("decodes");
    assert_eq!(entry(&element, "old"), Some(&Element::Int(5)));
    assert_eq!(entry(&element, "new"), Some(&Element::Int(15)));
    assert_eq!(int_bin(&client, &key, "n").await, Some(15));

    // A record that does not exist yet is created by the update.
    let fresh = Key::new("test", "udf", "fresh");
    client
        .execute_udf(
            &write,
            &fresh,
            "citrine_m",
            "bump",
            &[Value::from("n"), Value::Int(3)],
        )
        .await
        .expect("bump creates");
    assert_eq!(int_bin(&client, &fresh, "n").await, Some(3));

    // Arguments and return values keep their types.
    let list = msgpack::list(&[Value::Int(1), Value::from("two"), Value::Float(3.5)]);
    for value in [
        Value::Int(-42),
        Value::Float(2.25),
        Value::from("text"),
        list.clone(),
    ] {
        let echoed = client
            .execute_udf(
                &write,
                &key,
                "citrine_m",
                "echo",
                std::slice::from_ref(&value),
            )
            .await
            .expect("echo");
        match (&value, &echoed) {
            (Value::List(_), Value::List(_)) => {
                assert_eq!(echoed.elements(), value.elements())
            }
            _ => assert_eq!(echoed, value),
        }
    }
    assert_eq!(
        client
            .execute_udf(&write, &key, "citrine_m", "nothing", &[])
            .await
            .expect("nothing"),
        Value::Nil
    );

    // The write policy's generation check and record-exists action hold for
    // a UDF as for a put: refused before the function runs.
    let generation = client
        .get(&ReadPolicy::default(), &key, Bins::All)
        .await
        .expect("get")
        .expect("exists")
        .generation;
    let stale = WritePolicy {
        generation: citrine_client::GenerationPolicy::ExpectEqual(generation + 7),
        ..WritePolicy::default()
    };
    let refused = client
        .execute_udf(
            &stale,
            &key,
            "citrine_m",
            "bump",
            &[Value::from("n"), Value::Int(1)],
        )
        .await;
    assert_eq!(
        refused.err().and_then(|e| e.result_code()),
        Some(ResultCode::Generation)
    );
    let current = WritePolicy {
        generation: citrine_client::GenerationPolicy::ExpectEqual(generation),
        ..WritePolicy::default()
    };
    client
        .execute_udf(
            &current,
            &key,
            "citrine_m",
            "bump",
            &[Value::from("n"), Value::Int(1)],
        )
        .await
        .expect("the generation matches");
    let create_only = WritePolicy {
        record_exists: citrine_client::RecordExistsAction::CreateOnly,
        ..WritePolicy::default()
    };
    let refused = client
        .execute_udf(
            &create_only,
            &key,
            "citrine_m",
            "bump",
            &[Value::from("n"), Value::Int(1)],
        )
        .await;
    assert_eq!(
        refused.err().and_then(|e| e.result_code()),
        Some(ResultCode::RecordExists)
    );
    assert_eq!(int_bin(&client, &key, "n").await, Some(16));
    client.close();
}

#[tokio::test]
async fn failures_are_typed_udf_errors_with_the_servers_message() {
    let server = Server::start();
    let client = connect(&server).await;
    client
        .register_udf("citrine_m.lua", MODULE.as_bytes())
        .await
        .expect("register");
    let write = WritePolicy::default();
    let key = Key::new("test", "udf", "failing");
    client
        .put(&write, &key, &[Bin::new("n", 1i64)])
        .await
        .expect("put");

    let error = client
        .execute_udf(
            &write,
            &key,
            "citrine_m",
            "fail",
            &[Value::from("the answer is no")],
        )
        .await
        .expect_err("the function raises an error");
    assert_eq!(error.raw_code(), Some(100));
    assert_eq!(error.result_code(), Some(ResultCode::UdfExecution));
    match &error {
        Error::Udf { message, .. } => {
            assert!(message.contains("the answer is no"), "{message}")
        }
        other => panic!("expected Error::Udf, got {other:?}"),
    }
    assert!(error.to_string().contains("the answer is no"));
    let record = client
        .get(&ReadPolicy::default(), &key, Bins::All)
        .await
        .expect("get")
        .expect("still there");
    assert_eq!(record.generation, 1, "a failed call changes nothing");

    let missing = client
        .execute_udf(&write, &key, "citrine_no_such_module", "f", &[])
        .await
        .expect_err("no such module");
    match &missing {
        // The reference's words for a module it cannot load.
        Error::Udf { message, .. } => assert_eq!(message, "UDF: Execution Error 1"),
        other => panic!("expected Error::Udf, got {other:?}"),
    }
    let no_function = client
        .execute_udf(&write, &key, "citrine_m", "no_such_function", &[])
        .await
        .expect_err("no such function");
    assert_eq!(no_function.raw_code(), Some(100), "{no_function}");
    // The reference's exact words, which clients compare against.
    assert!(
        no_function.to_string().contains("function not found"),
        "{no_function}"
    );
    assert!(matches!(
        client.execute_udf(&write, &key, "", "f", &[]).await,
        Err(Error::InvalidArgument(_))
    ));
    client.close();
}

#[tokio::test]
async fn batch_udf_answers_every_key_and_reports_the_failing_row() {
    let server = Server::start();
    let client = connect(&server).await;
    client
        .register_udf("citrine_m.lua", MODULE.as_bytes())
        .await
        .expect("register");
    let write = WritePolicy::default();
    let keys: Vec<Key> = (0..20).map(|index| Key::new("test", "bu", index)).collect();
    for (index, key) in keys.iter().enumerate() {
        client
            .put(&write, key, &[Bin::new("n", index as i64)])
            .await
            .expect("put");
    }
    let results = client
        .batch_udf(
            &BatchPolicy::default(),
            &keys,
            "citrine_m",
            "double_unless",
            &[Value::Int(13)],
        )
        .await
        .expect("batch runs");
    assert_eq!(results.len(), 20);
    for (index, result) in results.iter().enumerate() {
        if index == 13 {
            match result {
                Err(Error::Udf { message, .. }) => {
                    assert!(message.contains("refusing record 13"), "{message}")
                }
                other => panic!("row 13: expected Error::Udf, got {other:?}"),
            }
            assert_eq!(result.as_ref().err().and_then(Error::raw_code), Some(100));
        } else {
            assert_eq!(
                result.as_ref().ok(),
                Some(&Value::Int(index as i64 * 2)),
                "row {index}"
            );
        }
    }
    for (index, key) in keys.iter().enumerate() {
        let expected = (index != 13).then_some(index as i64 * 2);
        assert_eq!(
            int_bin(&client, key, "doubled").await,
            expected,
            "key {index}"
        );
    }

    // Keys with their user key sent: rows are not repeated then.
    let policy = BatchPolicy {
        base: citrine_client::Policy {
            send_key: true,
            ..citrine_client::Policy::default()
        },
        ..BatchPolicy::default()
    };
    let results = client
        .batch_udf(
            &policy,
            &keys[..3],
            "citrine_m",
            "echo",
            &[Value::from("x")],
        )
        .await
        .expect("batch runs");
    assert!(
        results
            .iter()
            .all(|result| result.as_ref().ok() == Some(&Value::from("x"))),
        "{results:?}"
    );
    client.close();
}

#[tokio::test]
async fn a_background_udf_job_updates_the_selected_records() {
    let server = Server::start();
    let client = connect(&server).await;
    client
        .register_udf("citrine_m.lua", MODULE.as_bytes())
        .await
        .expect("register");
    let write = WritePolicy::default();
    let keys: Vec<Key> = (0..50).map(|index| Key::new("test", "bg", index)).collect();
    for (index, key) in keys.iter().enumerate() {
        client
            .put(&write, key, &[Bin::new("n", index as i64)])
            .await
            .expect("put");
    }
    // A record of another set, which the job must leave alone.
    let other = Key::new("test", "bg_other", 1i64);
    client
        .put(&write, &other, &[Bin::new("n", 1i64)])
        .await
        .expect("put");

    // Every record of the set.
    let task = client
        .execute_background(
            &write,
            &Statement::new("test", "bg"),
            BackgroundTask::Udf {
                module: "citrine_m",
                function: "tag",
                args: &[Value::from("seen")],
            },
        )
        .await
        .expect("job starts");
    client
        .wait_for_job(task, Duration::from_secs(30))
        .await
        .expect("job finishes");
    let records = client
        .batch_get(&BatchPolicy::default(), &keys, Bins::All)
        .await
        .expect("batch get");
    for (index, record) in records.iter().enumerate() {
        assert_eq!(
            record.as_ref().and_then(|record| record.bin("tag")),
            Some(&Value::from("seen")),
            "key {index}"
        );
    }
    let untouched = client
        .get(&ReadPolicy::default(), &other, Bins::All)
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(untouched.bin("tag"), None);

    // Only the records a secondary-index query selects.
    client
        .create_index(
            "test",
            "bg",
            "bg_n",
            "n",
            IndexType::Numeric,
            Default::default(),
            None,
        )
        .await
        .expect("create index");
    client
        .wait_for_index("test", "bg_n", Duration::from_secs(30))
        .await
        .expect("built");
    let task = client
        .execute_background(
            &write,
            &Statement::new("test", "bg").filter(IndexFilter::range("n", 10, 19)),
            BackgroundTask::Udf {
                module: "citrine_m",
                function: "bump",
                args: &[Value::from("n"), Value::Int(1000)],
            },
        )
        .await
        .expect("job starts");
    client
        .wait_for_job(task, Duration::from_secs(30))
        .await
        .expect("job finishes");
    for (index, key) in keys.iter().enumerate() {
        let expected = index as i64 + if (10..20).contains(&index) { 1000 } else { 0 };
        assert_eq!(
            int_bin(&client, key, "n").await,
            Some(expected),
            "key {index}"
        );
    }
    // The server checks the call before it starts a job.
    let refused = client
        .execute_background(
            &write,
            &Statement::new("test", "bg"),
            BackgroundTask::Udf {
                module: "citrine_m",
                function: "",
                args: &[],
            },
        )
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    // A module this node does not have: the job is accepted (as the
    // reference accepts it) and fails on every record, changing nothing.
    let task = client
        .execute_background(
            &write,
            &Statement::new("test", "bg"),
            BackgroundTask::Udf {
                module: "no_such_module",
                function: "f",
                args: &[],
            },
        )
        .await
        .expect("job starts");
    client
        .wait_for_job(task, Duration::from_secs(30))
        .await
        .expect("job finishes");
    assert_eq!(
        int_bin(&client, &keys[10], "n").await,
        Some(1010),
        "nothing written"
    );
    client.close();
}

#[tokio::test]
async fn aggregation_returns_each_nodes_raw_values() {
    let server = Server::start();
    let client = connect(&server).await;
    client
        .register_udf("citrine_m.lua", MODULE.as_bytes())
        .await
        .expect("register");
    let write = WritePolicy::default();
    for index in 0..30i64 {
        client
            .put(
                &write,
                &Key::new("test", "agg", index),
                &[Bin::new("n", index)],
            )
            .await
            .expect("put");
    }
    let statement = Statement::new("test", "agg");
    let policy = ScanPolicy::default();
    let counts = client
        .query_aggregate_raw(&policy, &statement, "citrine_m", "count", &[])
        .await
        .expect("aggregation");
    assert_eq!(counts.len(), 1, "one node: {counts:?}");
    assert_eq!(counts[0].node, client.nodes()[0].id);
    // A count per partition holding records of the set (30 keys: most in
    // partitions of their own), adding up to 30.
    let partitions: std::collections::BTreeSet<u16> = (0..30)
        .map(|index| Key::new("test", "agg", index).partition().get())
        .collect();
    assert_eq!(counts[0].values.len(), partitions.len(), "{counts:?}");
    let total: i64 = counts[0]
        .values
        .iter()
        .map(|value| match value {
            Value::Int(count) => *count,
            other => panic!("{other:?}"),
        })
        .sum();
    assert_eq!(total, 30);

    let values = client
        .query_aggregate_raw(
            &policy,
            &statement,
            "citrine_m",
            "values_at_least",
            &[Value::Int(25)],
        )
        .await
        .expect("aggregation");
    let mut found: Vec<Value> = values
        .into_iter()
        .flat_map(|output| output.values)
        .collect();
    found.sort_by_key(|value| match value {
        Value::Int(n) => *n,
        _ => i64::MIN,
    });
    assert_eq!(found, (25..30).map(Value::Int).collect::<Vec<_>>());

    let failed = client
        .query_aggregate_raw(&policy, &statement, "citrine_m", "no_such_stream", &[])
        .await
        .expect_err("no such function");
    assert_eq!(failed.raw_code(), Some(100), "{failed}");
    client.close();
}
