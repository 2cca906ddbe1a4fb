//! Batch commands, scans, queries, background jobs and index management
//! through the client, against a real `citrined` process.

mod common;

use citrine_client::{
    BatchPolicy, Bin, Bins, Client, ClientConfig, Error, IndexCollection, IndexFilter, IndexType,
    JobStatus, Key, Operation, PartitionFilter, ScanPolicy, Statement, Value, WritePolicy,
};
use common::Server;
use std::collections::BTreeSet;
use std::time::Duration;

async fn connect(server: &Server) -> Client {
    Client::connect(ClientConfig::new([server.seed()]))
        .await
        .expect("client connects")
}

fn key(set: &str, index: i64) -> Key {
    Key::new("test", set, index)
}

/// Writes `count` records of `set`: bin `n` = index, bin `s` = "v{index % 10}",
/// bin `l` = [index, index + 1000]; the user key is stored.
async fn load(client: &Client, set: &str, count: i64) {
    let mut policy = WritePolicy::default();
    policy.base.send_key = true;
    for index in 0..count {
        client
            .put(
                &policy,
                &key(set, index),
                &[
                    Bin::new("n", index),
                    Bin::new("s", format!("v{}", index % 10)),
                    Bin::new("l", Value::List(int_list(&[index, index + 1000]))),
                ],
            )
            .await
            .expect("put");
    }
}

/// A msgpack list of integers (each as a 64-bit msgpack integer).
fn int_list(values: &[i64]) -> Vec<u8> {
    assert!(values.len() < 16);
    let mut out = vec![0x90 | values.len() as u8];
    for value in values {
        out.push(0xd3);
        out.extend_from_slice(&value.to_be_bytes());
    }
    out
}

fn int_bin(record: &citrine_client::Record, name: &str) -> Option<i64> {
    match record.bin(name) {
        Some(Value::Int(value)) => Some(*value),
        _ => None,
    }
}

fn user_keys(records: &[citrine_client::KeyRecord]) -> Vec<i64> {
    let mut keys: Vec<i64> = records
        .iter()
        .map(|record| match &record.key.user_key {
            Some(citrine_client::UserKey::Integer(value)) => *value,
            other => panic!("stored key expected, got {other:?}"),
        })
        .collect();
    keys.sort_unstable();
    keys
}

#[tokio::test]
async fn batch_reads_writes_and_deletes() {
    let server = Server::start();
    let client = connect(&server).await;
    load(&client, "b", 300).await;
    let policy = BatchPolicy::default();
    // Every third key was never written.
    let keys: Vec<Key> = (0..450).map(|index| key("b", index)).collect();

    let records = client
        .batch_get(&policy, &keys, Bins::All)
        .await
        .expect("batch get");
    assert_eq!(records.len(), 450);
    for (index, record) in records.iter().enumerate() {
        if index < 300 {
            let record = record.as_ref().expect("written record is found");
            assert_eq!(record.bin("n"), Some(&Value::Int(index as i64)));
            assert_eq!(record.generation, 1);
        } else {
            assert!(record.is_none(), "key {index} was never written");
        }
    }
    let named = client
        .batch_get(&policy, &keys[..5], Bins::Names(vec!["s".into()]))
        .await
        .expect("named bins");
    for record in named.iter().flatten() {
        assert_eq!(record.bins.keys().collect::<Vec<_>>(), vec!["s"]);
    }
    let exists = client.batch_exists(&policy, &keys).await.expect("exists");
    assert_eq!(exists.iter().filter(|found| **found).count(), 300);
    assert!(exists[299] && !exists[300]);

    // A key list in another namespace fails per row; here the whole get fails.
    let unknown = [Key::new("nope", "b", 1i64)];
    let error = client
        .batch_get(&policy, &unknown, Bins::All)
        .await
        .expect_err("unknown namespace");
    assert!(error.raw_code().is_some(), "{error}");

    // Operate: add to every record and read the result back.
    let ops = [Operation::incr("n", 10), Operation::Read("n".into())];
    let outcomes = client
        .batch_operate(&policy, &WritePolicy::default(), &keys[295..305], &ops)
        .await
        .expect("batch operate");
    for (offset, outcome) in outcomes.iter().enumerate() {
        let index = 295 + offset as i64;
        let record = outcome.as_ref().expect("incr creates or updates");
        let expected = if index < 300 { index + 10 } else { 10 };
        assert_eq!(record.bin("n"), Some(&Value::Int(expected)), "key {index}");
    }
    // UPDATE_ONLY rows fail with 2 on missing records, row by row.
    let update_only = WritePolicy {
        record_exists: citrine_client::RecordExistsAction::UpdateOnly,
        ..WritePolicy::default()
    };
    let outcomes = client
        .batch_operate(
            &policy,
            &update_only,
            &[key("b", 1), key("b", 9999)],
            &[Operation::Write(Bin::new("t", 1i64))],
        )
        .await
        .expect("batch operate");
    assert!(outcomes[0].is_ok());
    assert_eq!(
        outcomes[1].as_ref().err().and_then(Error::raw_code),
        Some(2)
    );

    let deleted = client
        .batch_delete(&policy, &WritePolicy::default(), &keys[..3])
        .await
        .expect("batch delete");
    assert!(deleted.iter().all(|row| matches!(row, Ok(true))));
    let again = client
        .batch_delete(&policy, &WritePolicy::default(), &keys[..3])
        .await
        .expect("batch delete");
    assert!(again.iter().all(|row| matches!(row, Ok(false))));

    // Many keys: sent in several requests by default.
    let many: Vec<Key> = (0..12_000).map(|index| key("b", index)).collect();
    let found = client.batch_exists(&policy, &many).await.expect("chunked");
    let few = client.batch_exists(&policy, &keys).await.expect("exists");
    assert_eq!(&found[..450], &few[..]);
    assert!(found[450..].iter().all(|found| !found));
    let unchunked = BatchPolicy {
        max_rows_per_request: 0,
        ..BatchPolicy::default()
    };
    // In one request too: the server's `batch-max-requests` is 0 (no
    // limit) by default, as the reference's (its 151 above a set limit is
    // the service's unit test).
    let whole = client
        .batch_exists(&unchunked, &many)
        .await
        .expect("one request of 12 000 rows");
    assert_eq!(whole, found);

    assert!(client
        .batch_get(&policy, &[], Bins::All)
        .await
        .expect("empty")
        .is_empty());
    assert!(matches!(
        client
            .batch_get(&policy, &keys[..1], Bins::Names(vec!["x".repeat(16)]))
            .await,
        Err(Error::InvalidArgument(_))
    ));
    // The connection pool is still clean after all of that.
    assert_eq!(
        client
            .get(&Default::default(), &key("b", 10), Bins::All)
            .await
            .expect("get")
            .and_then(|record| record.bin("n").cloned()),
        Some(Value::Int(10))
    );
    client.close();
}

#[tokio::test]
async fn scans_cover_a_set_once_with_limits_and_partition_filters() {
    let server = Server::start();
    let client = connect(&server).await;
    load(&client, "scan", 600).await;
    load(&client, "other", 50).await;
    let policy = ScanPolicy::default();

    let records = client
        .scan(&policy, &Statement::new("test", "scan"))
        .expect("scan")
        .collect()
        .await
        .expect("scan completes");
    assert_eq!(user_keys(&records), (0..600).collect::<Vec<_>>());
    for record in &records {
        let n = int_bin(&record.record, "n").expect("bin n");
        assert_eq!(record.key.set, "scan");
        assert_eq!(record.key.digest, key("scan", n).digest);
    }

    let whole = client
        .scan(&policy, &Statement::new("test", ""))
        .expect("scan")
        .collect()
        .await
        .expect("namespace scan");
    assert!(whole.len() >= 650, "{} records", whole.len());

    let headers = client
        .scan(&policy, &Statement::new("test", "scan").bins(Bins::Header))
        .expect("scan")
        .collect()
        .await
        .expect("header scan");
    assert_eq!(headers.len(), 600);
    assert!(headers
        .iter()
        .all(|record| record.record.bins.is_empty() && record.record.generation == 1));

    let limited = ScanPolicy {
        max_records: 100,
        ..ScanPolicy::default()
    };
    let some = client
        .scan(&limited, &Statement::new("test", "scan"))
        .expect("scan")
        .collect()
        .await
        .expect("limited scan");
    assert_eq!(some.len(), 100);

    // A quarter of the partitions: exactly the records that live there.
    let quarter = PartitionFilter::range(1024, 1024).expect("range");
    let part = client
        .scan(&policy, &Statement::new("test", "scan").partitions(quarter))
        .expect("scan")
        .collect()
        .await
        .expect("partition scan");
    let expected: Vec<i64> = (0..600)
        .filter(|index| (1024..2048).contains(&key("scan", *index).partition().get()))
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(user_keys(&part), expected);

    // Dropping a stream part-way stops it and leaves the client usable.
    let mut stream = client
        .scan(
            &ScanPolicy {
                queue_size: 1,
                ..ScanPolicy::default()
            },
            &Statement::new("test", "scan"),
        )
        .expect("scan");
    assert!(stream.next().await.expect("a record").is_ok());
    drop(stream);
    assert_eq!(
        client
            .scan(&policy, &Statement::new("test", "scan"))
            .expect("scan")
            .collect()
            .await
            .expect("scan again")
            .len(),
        600
    );

    assert!(matches!(
        client.scan(
            &policy,
            &Statement::new("test", "scan").filter(IndexFilter::range("n", 0, 1))
        ),
        Err(Error::InvalidArgument(_))
    ));
    let unknown = client
        .scan(&policy, &Statement::new("nope", ""))
        .expect("scan")
        .collect()
        .await;
    assert!(unknown.is_err(), "an unknown namespace is an error");
    client.close();
}

#[tokio::test]
async fn queries_through_secondary_indexes_and_background_jobs() {
    let server = Server::start();
    let client = connect(&server).await;
    load(&client, "q", 400).await;
    let wait = Duration::from_secs(20);
    let policy = ScanPolicy::default();

    // No index yet: the server says so (201).
    let missing = client
        .query(
            &policy,
            &Statement::new("test", "q").filter(IndexFilter::range("n", 0, 9)),
        )
        .expect("query")
        .collect()
        .await
        .expect_err("no index");
    assert_eq!(missing.raw_code(), Some(201), "{missing}");

    client
        .create_index(
            "test",
            "q",
            "q_n",
            "n",
            IndexType::Numeric,
            IndexCollection::Default,
            None,
        )
        .await
        .expect("create numeric index");
    client
        .create_index(
            "test",
            "q",
            "q_s",
            "s",
            IndexType::String,
            IndexCollection::Default,
            None,
        )
        .await
        .expect("create string index");
    client
        .create_index(
            "test",
            "q",
            "q_l",
            "l",
            IndexType::Numeric,
            IndexCollection::List,
            None,
        )
        .await
        .expect("create list index");
    for name in ["q_n", "q_s", "q_l"] {
        client
            .wait_for_index("test", name, wait)
            .await
            .expect("index built");
    }

    let range = client
        .query(
            &policy,
            &Statement::new("test", "q").filter(IndexFilter::range("n", 100, 199)),
        )
        .expect("query")
        .collect()
        .await
        .expect("range query");
    assert_eq!(user_keys(&range), (100..200).collect::<Vec<_>>());

    let equal = client
        .query(
            &policy,
            &Statement::new("test", "q").filter(IndexFilter::equal("s", "v7")),
        )
        .expect("query")
        .collect()
        .await
        .expect("string query");
    assert_eq!(
        user_keys(&equal),
        (0..400).filter(|index| index % 10 == 7).collect::<Vec<_>>()
    );

    let listed = client
        .query(
            &policy,
            &Statement::new("test", "q")
                .filter(IndexFilter::range("l", 1390, 1395).on(IndexCollection::List)),
        )
        .expect("query")
        .collect()
        .await
        .expect("list query");
    assert_eq!(user_keys(&listed), (390..396).collect::<Vec<_>>());

    // A limited query resumes across rounds without repeating a record.
    let limited = client
        .query(
            &ScanPolicy {
                max_records: 30,
                ..ScanPolicy::default()
            },
            &Statement::new("test", "q").filter(IndexFilter::range("n", 0, 399)),
        )
        .expect("query")
        .collect()
        .await
        .expect("limited query");
    assert_eq!(limited.len(), 30);
    assert_eq!(
        user_keys(&limited)
            .into_iter()
            .collect::<BTreeSet<_>>()
            .len(),
        30
    );

    // A background job adds 1000 to `n` of the records `s = "v3"` selects.
    let task = client
        .execute_background(
            &WritePolicy::default(),
            &Statement::new("test", "q").filter(IndexFilter::equal("s", "v3")),
            &[Operation::incr("n", 1000)],
        )
        .await
        .expect("background job starts");
    client.wait_for_job(task, wait).await.expect("job finishes");
    assert_eq!(
        client.job_status(task).await.expect("status"),
        JobStatus::Done
    );
    // The same job paced at 20 writes a second: its 40 writes take about
    // two seconds (unpaced, a few milliseconds).
    let mut paced = Statement::new("test", "q").filter(IndexFilter::equal("s", "v3"));
    paced.records_per_second = 20;
    let task = client
        .execute_background(
            &WritePolicy::default(),
            &paced,
            &[Operation::incr("n", 1000)],
        )
        .await
        .expect("paced job starts");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        client.job_status(task).await.expect("status"),
        JobStatus::InProgress,
        "paced"
    );
    client
        .wait_for_job(task, wait)
        .await
        .expect("paced job finishes");
    assert_eq!(
        client.job_status(task ^ 0x5555).await.expect("status"),
        JobStatus::NotFound
    );
    let records = client
        .batch_get(
            &BatchPolicy::default(),
            &(0..400).map(|index| key("q", index)).collect::<Vec<_>>(),
            Bins::Names(vec!["n".into()]),
        )
        .await
        .expect("batch get");
    for (index, record) in records.iter().enumerate() {
        let expected = index as i64 + if index % 10 == 3 { 2000 } else { 0 };
        assert_eq!(
            record.as_ref().and_then(|record| record.bin("n")),
            Some(&Value::Int(expected)),
            "key {index}"
        );
    }
    assert!(matches!(
        client
            .execute_background(
                &WritePolicy::default(),
                &Statement::new("test", "q"),
                &[Operation::Read("n".into())],
            )
            .await,
        Err(Error::InvalidArgument(_))
    ));

    client.drop_index("test", "q_n").await.expect("drop");
    let gone = client
        .query(
            &policy,
            &Statement::new("test", "q").filter(IndexFilter::range("n", 0, 9)),
        )
        .expect("query")
        .collect()
        .await
        .expect_err("dropped index");
    assert_eq!(gone.raw_code(), Some(201));
    let duplicate = client
        .create_index(
            "test",
            "q",
            "q_s",
            "n",
            IndexType::Numeric,
            IndexCollection::Default,
            None,
        )
        .await;
    assert!(duplicate.is_err(), "a taken name is refused: {duplicate:?}");
    client.close();
}

/// A stream dropped while its node is still sending (paced, so the node's
/// task waits in a read) must not leave that connection in the pool: the
/// next command on it would read the rest of the scan as its answer.
#[tokio::test]
async fn a_dropped_stream_leaves_no_half_read_connection_behind() {
    let server = Server::start();
    let mut config = ClientConfig::new([server.seed()]);
    config.max_connections_per_node = 1;
    let client = Client::connect(config).await.expect("client connects");
    load(&client, "drop", 200).await;
    let paced = ScanPolicy {
        records_per_second: 100,
        ..ScanPolicy::default()
    };
    for _ in 0..3 {
        let mut stream = client
            .scan(&paced, &Statement::new("test", "drop"))
            .expect("scan");
        assert!(stream.next().await.expect("a record").is_ok());
        drop(stream);
        // One connection a node: the get takes the scan's, if it was kept.
        for index in [3, 77, 150] {
            let record = client
                .get(&Default::default(), &key("drop", index), Bins::All)
                .await
                .expect("get")
                .expect("found");
            assert_eq!(int_bin(&record, "n"), Some(index), "key {index}");
        }
    }
    client.close();
}

/// The official Go client's geo specs, through this client: regions
/// holding a point, points inside a polygon, points within a radius.
#[tokio::test]
async fn geo_queries_find_points_in_regions_and_regions_holding_points() {
    let server = Server::start();
    let client = connect(&server).await;
    let mut write = WritePolicy::default();
    write.base.send_key = true;
    client
        .create_index(
            "test",
            "geo",
            "geo_loc",
            "loc",
            IndexType::Geo2DSphere,
            IndexCollection::Default,
            None,
        )
        .await
        .expect("create geo index");
    client
        .wait_for_index("test", "geo_loc", Duration::from_secs(20))
        .await
        .expect("built");
    let bay = r#"{"type":"Polygon","coordinates":[[[-122.5,37.0],[-121.0,37.0],[-121.0,38.08],[-122.5,38.08],[-122.5,37.0]]]}"#;
    // Points 0..20 along a diagonal from (-122, 37.5), 0.1 degree a step;
    // key 100 holds the region itself.
    for index in 0..20i64 {
        let point = format!(
            r#"{{"type":"Point","coordinates":[{:.6},{:.6}]}}"#,
            -122.0 + 0.1 * index as f64,
            37.5 + 0.1 * index as f64
        );
        client
            .put(
                &write,
                &key("geo", index),
                &[Bin::new("loc", Value::GeoJson(point)), Bin::new("n", index)],
            )
            .await
            .expect("put point");
    }
    client
        .put(
            &write,
            &key("geo", 100),
            &[
                Bin::new("loc", Value::GeoJson(bay.into())),
                Bin::new("n", 100i64),
            ],
        )
        .await
        .expect("put region");
    let policy = ScanPolicy::default();
    let run = |filter: IndexFilter| {
        let client = client.clone();
        let policy = policy.clone();
        async move {
            user_keys(
                &client
                    .query(&policy, &Statement::new("test", "geo").filter(filter))
                    .expect("query")
                    .collect()
                    .await
                    .expect("geo query"),
            )
        }
    };
    // Points inside the bay: the first six (the seventh is at 38.1).
    assert_eq!(
        run(IndexFilter::geo("loc", bay)).await,
        (0..6).collect::<Vec<_>>()
    );
    // Within 50 km of the first point: four of them.
    assert_eq!(
        run(IndexFilter::geo_within_radius(
            "loc", -122.0, 37.5, 50_000.0
        ))
        .await,
        vec![0, 1, 2, 3]
    );
    // Regions holding a point: the bay, for points inside it only.
    for (lng, lat, expected) in [(-121.7, 37.8, vec![100]), (-120.0, 37.8, vec![])] {
        let point = format!(r#"{{"type":"Point","coordinates":[{lng},{lat}]}}"#);
        assert_eq!(
            run(IndexFilter::geo("loc", point)).await,
            expected,
            "({lng}, {lat})"
        );
    }
    // The index follows updates and deletes.
    client
        .put(
            &write,
            &key("geo", 0),
            &[Bin::new(
                "loc",
                Value::GeoJson(r#"{"type":"Point","coordinates":[10,10]}"#.into()),
            )],
        )
        .await
        .expect("move point 0");
    client
        .delete(&write, &key("geo", 1))
        .await
        .expect("delete point 1");
    assert_eq!(
        run(IndexFilter::geo("loc", bay)).await,
        (2..6).collect::<Vec<_>>()
    );
    // A query that is not GeoJSON: the server refuses it (4).
    let bad = client
        .query(
            &policy,
            &Statement::new("test", "geo").filter(IndexFilter::geo("loc", "{}")),
        )
        .expect("query")
        .collect()
        .await
        .expect_err("bad geo query");
    assert_eq!(bad.raw_code(), Some(4), "{bad}");
    client.close();
}
