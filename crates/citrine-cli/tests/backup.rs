//! End-to-end tests of `citrine backup` and `citrine restore` against real
//! `citrined` processes (found as in `cli.rs`): records of every particle
//! type, a secondary index and a UDF module backed up from one node and
//! restored into a fresh one; compression and encryption; an interrupted
//! backup continued; damaged files stopping a restore at the damage with
//! what came before kept.

use citrine_client::{
    Bin, Client, ClientConfig, Key, Operation, ScanPolicy, Statement, Value, WritePolicy,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use citrine_backup::UserKey;
use citrine_testsupport::{free_port, wait_until_serving};

const CITRINE: &str = env!("CARGO_BIN_EXE_citrine");

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn citrined() -> (Process, String) {
    let (process, host, _) = citrined_with(&[]);
    (process, host)
}

/// A `citrined` with these extra arguments: its process, service address
/// and heartbeat address (for another node's `--seed`).
fn citrined_with(extra: &[&str]) -> (Process, String, String) {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let binary = match std::env::var("CITRINED_BIN") {
        Ok(path) if PathBuf::from(&path).is_file() => PathBuf::from(path),
        Ok(path) => workspace.join(path),
        Err(_) => ["release", "debug"]
            .iter()
            .map(|profile| workspace.join("target").join(profile).join("citrined"))
            .filter_map(|path| Some((std::fs::metadata(&path).ok()?.modified().ok()?, path)))
            .max_by_key(|(modified, _)| *modified)
            .map(|(_, path)| path)
            .expect("citrined not found: build it with `cargo build -p citrine-server` or set CITRINED_BIN"),
    };
    let port = free_port();
    let heartbeat = free_port();
    let work = tempdir("node");
    let mut child = Command::new(binary)
        .args(extra)
        .args(["--port", &port.to_string(), "--address", "127.0.0.1"])
        .args(["--fabric-port", &free_port().to_string()])
        .args(["--heartbeat-port", &heartbeat.to_string()])
        .args(["--data-dir", work.to_str().expect("utf-8 path")])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn citrined");
    wait_until_serving(&mut child, port, Duration::from_secs(15));
    (
        Process(child),
        format!("127.0.0.1:{port}"),
        format!("127.0.0.1:{heartbeat}"),
    )
}

fn tempdir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "citrine-backup-test-{}-{what}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn citrine(args: &[&str]) -> Output {
    Command::new(CITRINE)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run citrine")
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn connect(host: &str) -> Client {
    Client::connect(ClientConfig::new([host]))
        .await
        .expect("connect")
}

const MODULE: &str = "tally.lua";
const MODULE_SOURCE: &str = "-- counts\nfunction bump(rec, n)\n  rec['n'] = (rec['n'] or 0) + n\n  aerospike:update(rec)\n  return rec['n']\nend\n";

/// Writes records of every particle type, string, integer and blob user
/// keys (and a few plain records), an index and a UDF module.
async fn populate(client: &Client, plain: usize) {
    let send_key = WritePolicy {
        base: citrine_client::Policy {
            send_key: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let geo = r#"{"type":"Point","coordinates":[-122.5,37.7]}"#;
    let bins = vec![
        Bin::new("int", -7i64),
        Bin::new("float", 0.1f64),
        Bin::new("str", "héllo wörld\nline two"),
        Bin::new("blob", vec![0u8, 1, 2, 255, b' ', b'\n']),
        Bin::new("bool", true),
        Bin::new(
            "list",
            citrine_client::msgpack::list(&[Value::Int(1), Value::from("x")]),
        ),
        Bin {
            name: "map".into(),
            value: Value::Map(vec![0x82, 0xa2, 3, b'a', 1, 0xa2, 3, b'b', 0xc3]),
        },
        Bin::new("geo", Value::GeoJson(geo.into())),
        Bin {
            name: "notutf8".into(),
            value: Value::Raw {
                particle: 3,
                bytes: vec![0xff, 0xfe, 0x00, b'x'],
            },
        },
        Bin {
            name: "java".into(),
            value: Value::Raw {
                particle: 7,
                bytes: vec![0xac, 0xed, 0, 5],
            },
        },
    ];
    let key = Key::new("test", "kinds", "every-type");
    client.put(&send_key, &key, &bins).await.expect("put");
    // An HLL bin, made by the server, and a second generation.
    let hll_add = Operation::Raw {
        op_type: 16,
        particle_type: 4,
        bin: "hll".into(),
        value: vec![0x95, 0x01, 0x93, 0x01, 0x02, 0x03, 0x08, 0x00, 0x00],
        write: true,
    };
    client
        .operate(&send_key, &key, &[hll_add])
        .await
        .expect("hll add");
    let int_key = Key::new("test", "kinds", 42i64);
    let with_ttl = WritePolicy {
        expiration: citrine_client::Expiration::Seconds(86_400),
        ..send_key.clone()
    };
    client
        .put(&with_ttl, &int_key, &[Bin::new("int", 42i64)])
        .await
        .expect("put");
    let blob_key = Key::new("test", "blobs", vec![0u8, 0xff, b'\n', b' ']);
    client
        .put(&send_key, &blob_key, &[Bin::new("b", 1i64)])
        .await
        .expect("put");
    for n in 0..plain {
        let key = Key::new("test", "", format!("plain-{n}"));
        client
            .put(
                &WritePolicy::default(),
                &key,
                &[Bin::new("int", n as i64), Bin::new("s", "v")],
            )
            .await
            .expect("put");
    }
    client
        .create_index(
            "test",
            "kinds",
            "by_int",
            "int",
            citrine_client::IndexType::Numeric,
            citrine_client::IndexCollection::Default,
            None,
        )
        .await
        .expect("index");
    client
        .register_udf(MODULE, MODULE_SOURCE.as_bytes())
        .await
        .expect("udf");
}

/// Every record by digest: (user key, void time, bins as raw values).
type Snapshot = BTreeMap<
    [u8; 20],
    (
        Option<citrine_client::UserKey>,
        u32,
        BTreeMap<String, Value>,
    ),
>;

async fn snapshot(client: &Client) -> Snapshot {
    snapshot_of(client, "test").await
}

async fn snapshot_of(client: &Client, namespace: &str) -> Snapshot {
    let policy = ScanPolicy {
        raw_values: true,
        ..ScanPolicy::default()
    };
    let records = client
        .scan(&policy, &Statement::new(namespace, ""))
        .expect("scan")
        .collect()
        .await
        .expect("scan");
    records
        .into_iter()
        .map(|kr| {
            let mut bins = kr.record.bins;
            // GeoJSON: compare the JSON (cells are the server's own).
            if let Some(Value::Raw { bytes, .. }) = bins.get_mut("geo") {
                let cells = usize::from(u16::from_be_bytes([bytes[1], bytes[2]]));
                *bytes = bytes[3 + cells * 8..].to_vec();
            }
            (
                kr.key.digest.0,
                (kr.key.user_key, kr.record.void_time, bins),
            )
        })
        .collect()
}

fn assert_same(before: &Snapshot, after: &Snapshot) {
    assert_eq!(before.len(), after.len(), "record counts");
    for (digest, (key, void_time, bins)) in before {
        let (key2, void_time2, bins2) = after.get(digest).expect("record restored");
        assert_eq!(key, key2, "user key");
        assert_eq!(bins, bins2, "bins of {key:?}");
        assert!(
            void_time.abs_diff(*void_time2) <= 2,
            "expiry {void_time} vs {void_time2}"
        );
    }
}

/// The batch commands `host` has begun (`batch_index_initiate`).
fn batches(rt: &tokio::runtime::Runtime, host: &str) -> u64 {
    let answer = rt.block_on(citrine_client::info_at(
        host,
        &["statistics"],
        Duration::from_secs(2),
    ));
    let statistics = answer.expect("info").remove(0).1;
    statistics
        .split(';')
        .find_map(|pair| pair.strip_prefix("batch_index_initiate="))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no batch_index_initiate in {statistics}"))
}

async fn sindex_list(host: &str) -> String {
    sindex_list_of(host, "test").await
}

async fn sindex_list_of(host: &str, namespace: &str) -> String {
    let command = format!("sindex-list:ns={namespace}");
    citrine_client::info_at(host, &[command.as_str()], Duration::from_secs(2))
        .await
        .expect("info")
        .remove(0)
        .1
}

#[test]
fn a_backup_restored_into_a_fresh_node_reproduces_records_index_and_module() {
    let rt = runtime();
    let (_a, host_a) = citrined();
    let (_b, host_b) = citrined();
    let dir = tempdir("roundtrip");
    let file = dir.join("test.asb");
    let file_arg = file.to_str().expect("utf-8");
    let before = rt.block_on(async {
        let client = connect(&host_a).await;
        populate(&client, 200).await;
        snapshot(&client).await
    });
    let backup = citrine(&["backup", "-h", &host_a, "-n", "test", "-o", file_arg]);
    assert!(backup.status.success(), "{}", text(&backup));
    let summary = text(&backup);
    assert!(summary.contains("203 records"), "{summary}");
    assert!(
        summary.contains("1 secondary indexes, 1 UDF modules"),
        "{summary}"
    );
    let bytes = std::fs::read(&file).expect("backup file");
    assert!(bytes.starts_with(b"Version 3.1\n# namespace test\n# first-file\n"));
    let content = String::from_utf8_lossy(&bytes);
    assert!(
        content.contains("* i test kinds by_int N 1 int N\n"),
        "{content:.400}"
    );
    assert!(content.contains(&format!("* u L {MODULE} {} ", MODULE_SOURCE.len())));
    assert!(
        content.contains("- Y hll ") && content.contains("- J java "),
        "every label"
    );
    assert!(!file.with_extension("asb.state").exists(), "state removed");

    assert_eq!(batches(&rt, &host_b), 0);
    let restore = citrine(&["restore", "-h", &host_b, "-i", file_arg]);
    assert!(restore.status.success(), "{}", text(&restore));
    assert!(
        text(&restore).contains("203 restored"),
        "{}",
        text(&restore)
    );
    // asrestore's batch mode: 203 records in batches of 128.
    assert_eq!(batches(&rt, &host_b), 2);
    rt.block_on(async {
        let client = connect(&host_b).await;
        assert_same(&before, &snapshot(&client).await);
        assert!(sindex_list(&host_b).await.contains("indexname=by_int"));
        let module = client.get_udf(MODULE).await.expect("get udf");
        assert_eq!(module.as_deref(), Some(MODULE_SOURCE.as_bytes()));
    });
    // Again: every record is there with its generation, so nothing is
    // written (the default policy writes only over a lower generation).
    let again = citrine(&["restore", "-h", &host_b, "-i", file_arg, "--unique"]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(text(&again).contains("0 restored"), "{}", text(&again));
    assert!(
        text(&again).contains("already on the cluster (--unique): 203"),
        "{}",
        text(&again)
    );
    generations_decide_what_a_restore_overwrites(&rt, &bytes, &host_b, file_arg);
    let _ = std::fs::remove_dir_all(dir);
}

/// The file keeps each record's generation (the every-type record was
/// written twice); a restore writes a record only over a lower generation
/// unless told `--no-generation`.
fn generations_decide_what_a_restore_overwrites(
    rt: &tokio::runtime::Runtime,
    content: &[u8],
    host: &str,
    file: &str,
) {
    let mut reader = citrine_backup::Reader::new(content).expect("header");
    let mut generation = None;
    while let Some(entry) = reader.next_entry().expect("entry") {
        if let citrine_backup::Entry::Record(record) = entry {
            if record.key == Some(UserKey::String("every-type".into())) {
                generation = Some(record.generation);
            }
        }
    }
    assert_eq!(generation, Some(2), "the every-type record's generation");
    let key = Key::new("test", "kinds", 42i64);
    rt.block_on(async {
        let client = connect(host).await;
        for n in [1i64, 2] {
            let bins = [Bin::new("int", n), Bin::new("extra", "x")];
            client
                .put(&WritePolicy::default(), &key, &bins)
                .await
                .expect("put");
        }
    });
    let bins = || {
        rt.block_on(async {
            let client = connect(host).await;
            let policy = Default::default();
            let record = client.get(&policy, &key, citrine_client::Bins::All);
            record.await.expect("get").expect("found").bins
        })
    };
    let int_bin = || bins()["int"].clone();
    // The backup holds generation 1 of kinds/42, the cluster generation 3:
    // only the every-type record (2 in the file, 1 here) is written.
    let kept = citrine(&["restore", "-h", host, "-i", file]);
    assert!(kept.status.success(), "{}", text(&kept));
    assert!(text(&kept).contains(" 1 restored"), "{}", text(&kept));
    let skipped = "the cluster holds the same or a higher generation: 202";
    assert!(text(&kept).contains(skipped), "{}", text(&kept));
    assert_eq!(int_bin(), Value::Int(2));
    let batched = batches(rt, host);
    let single = ["--no-generation", "--disable-batch-writes"];
    let forced = citrine(&[&["restore", "-h", host, "-i", file][..], &single].concat());
    assert!(forced.status.success(), "{}", text(&forced));
    assert!(text(&forced).contains("203 restored"), "{}", text(&forced));
    assert_eq!(batches(rt, host), batched, "one write a record");
    assert_eq!(int_bin(), Value::Int(42));
    // A restore updates bins; --replace replaces the whole record.
    assert!(bins().contains_key("extra"));
    let replace = ["--replace", "--no-generation"];
    let replaced = citrine(&[&["restore", "-h", host, "-i", file][..], &replace].concat());
    assert!(replaced.status.success(), "{}", text(&replaced));
    assert_eq!(bins().keys().collect::<Vec<_>>(), ["int"]);
}

#[test]
fn compressed_encrypted_and_filtered_backups() {
    let rt = runtime();
    let (_a, host_a) = citrined();
    let (_b, host_b) = citrined();
    let dir = tempdir("transform");
    let key_file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/backup-key.pem");
    let file = dir.join("test.asb.zst.aes");
    let file_arg = file.to_str().expect("utf-8");
    let before = rt.block_on(async {
        let client = connect(&host_a).await;
        populate(&client, 300).await;
        snapshot(&client).await
    });
    let secret = [
        "-z",
        "zstd",
        "-y",
        "aes256",
        "--encryption-key-file",
        key_file.to_str().expect("utf-8"),
    ];
    let mut args = vec![
        "backup",
        "-h",
        &host_a,
        "-n",
        "test",
        "-o",
        file_arg,
        "--parallel",
        "3",
    ];
    args.extend(secret);
    let backup = citrine(&args);
    assert!(backup.status.success(), "{}", text(&backup));
    let bytes = std::fs::read(&file).expect("file");
    assert!(!bytes.windows(7).any(|w| w == b"Version"), "encrypted");
    // Without the key the file is refused, naming what to do.
    let refused = citrine(&["restore", "-h", &host_b, "-i", file_arg]);
    assert!(!refused.status.success());
    assert!(text(&refused).contains("--encrypt"), "{}", text(&refused));
    let mut args = vec!["restore", "-h", &host_b, "-i", file_arg];
    args.extend(secret);
    let restore = citrine(&args);
    assert!(restore.status.success(), "{}", text(&restore));
    rt.block_on(async { assert_same(&before, &snapshot(&connect(&host_b).await).await) });

    // Filters: one set, some bins, modified since the epoch.
    let part = dir.join("kinds.asb");
    let part_arg = part.to_str().expect("utf-8");
    let filtered = citrine(&[
        "backup",
        "-h",
        &host_a,
        "-n",
        "test",
        "-o",
        part_arg,
        "-s",
        "kinds",
        "-B",
        "int,str",
        "--modified-after",
        "2020-01-01_00:00:00",
        "--no-udfs",
    ]);
    assert!(filtered.status.success(), "{}", text(&filtered));
    let content = String::from_utf8_lossy(&std::fs::read(&part).expect("file")).into_owned();
    assert_eq!(content.matches("+ n test\n").count(), 2, "{content}");
    assert!(
        !content.contains("- B blob") && !content.contains("* u "),
        "{content}"
    );
    let future = citrine(&[
        "backup",
        "-h",
        &host_a,
        "-n",
        "test",
        "-o",
        part_arg,
        "--modified-after",
        "2100-01-01_00:00:00",
    ]);
    assert!(future.status.success(), "{}", text(&future));
    assert!(text(&future).contains(" 0 records"), "{}", text(&future));
    // A partition list: exactly the records of those partitions.
    let half = citrine(&[
        "backup",
        "-h",
        &host_a,
        "-n",
        "test",
        "-o",
        part_arg,
        "--partition-list",
        "0-2048",
    ]);
    assert!(half.status.success(), "{}", text(&half));
    let wanted = before
        .keys()
        .filter(|digest| u16::from_le_bytes([digest[0], digest[1]]) & 0xfff < 2048)
        .count();
    assert!(
        text(&half).contains(&format!(" {wanted} records,")),
        "{wanted}: {}",
        text(&half)
    );
    filter_expression_and_modification_times(&rt, &host_a, part_arg);
    let _ = std::fs::remove_dir_all(dir);
}

/// The records of a backup file, by their user keys (as text).
fn user_keys_in(file: &str) -> Vec<String> {
    let content = std::fs::read(file).expect("file");
    let mut reader = citrine_backup::Reader::new(&content[..]).expect("header");
    let mut keys = Vec::new();
    while let Some(entry) = reader.next_entry().expect("entry") {
        if let citrine_backup::Entry::Record(record) = entry {
            keys.push(format!("{:?}", record.key));
        }
    }
    keys.sort();
    keys
}

/// `--filter-exp` (int == 42) and a modification-time split either side
/// of one record written a second after the others.
fn filter_expression_and_modification_times(rt: &tokio::runtime::Runtime, host: &str, file: &str) {
    let backup = |extra: &[&str]| {
        let mut args = vec!["backup", "-h", host, "-n", "test", "-o", file];
        args.extend(extra);
        let output = citrine(&args);
        assert!(output.status.success(), "{}", text(&output));
        user_keys_in(file)
    };
    // [EQ, [BIN, INT, "int"], 42] in msgpack, base64.
    let int_is_42 = "kwGTUQKjaW50Kg==";
    let selected = backup(&["--filter-exp", int_is_42, "-s", "kinds"]);
    assert_eq!(selected, ["Some(Integer(42))"], "{selected:?}");
    let all = backup(&[]).len();
    std::thread::sleep(Duration::from_millis(1100));
    let split = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    std::thread::sleep(Duration::from_millis(1100));
    rt.block_on(async {
        let late = Key::new("test", "late", "late");
        let policy = WritePolicy {
            base: citrine_client::Policy {
                send_key: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let client = connect(host).await;
        client
            .put(&policy, &late, &[Bin::new("int", 1i64)])
            .await
            .expect("put");
    });
    let split = split.to_string();
    let after = backup(&["--modified-after", &split]);
    assert_eq!(after, [r#"Some(String("late"))"#], "{after:?}");
    let before = backup(&["--modified-before", &split]);
    assert_eq!(before.len(), all, "every record but the late one");
    assert!(!before.contains(&after[0]));
}

/// Two `citrined` forming one cluster (replication factor 2): their
/// processes and service addresses, once migrations settled.
fn two_node_cluster() -> (Vec<Process>, Vec<String>) {
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.toml");
    let config = config.to_str().expect("utf-8");
    let (first, host_a, heartbeat) = citrined_with(&["--config", config]);
    let (second, host_b, _) = citrined_with(&["--config", config, "--seed", &heartbeat]);
    let hosts = vec![host_a, host_b];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let rt = runtime();
    loop {
        let keys: Vec<String> = rt.block_on(async {
            let mut keys = Vec::new();
            for host in &hosts {
                let answer = citrine_client::info_at(
                    host,
                    &["cluster-stable:size=2"],
                    Duration::from_secs(2),
                )
                .await;
                keys.push(answer.map(|mut a| a.remove(0).1).unwrap_or_default());
            }
            keys
        });
        let stable = !keys[0].is_empty() && !keys[0].starts_with("ERROR") && keys[0] == keys[1];
        if stable {
            return (vec![first, second], hosts);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no stable cluster: {keys:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The digests of a backup file's records, sorted (duplicates kept).
fn digests_in(file: &str) -> Vec<[u8; 20]> {
    let content = std::fs::read(file).expect("file");
    let mut reader = citrine_backup::Reader::new(&content[..]).expect("header");
    let mut digests = Vec::new();
    while let Some(entry) = reader.next_entry().expect("entry") {
        if let citrine_backup::Entry::Record(record) = entry {
            digests.push(record.digest.0);
        }
    }
    digests.sort_unstable();
    digests
}

#[test]
fn a_node_list_backs_up_the_partitions_those_nodes_master() {
    let rt = runtime();
    let (_nodes, hosts) = two_node_cluster();
    let dir = tempdir("nodes");
    let (all, masters) = rt.block_on(async {
        let client = connect(&hosts[0]).await;
        for _ in 0..100 {
            if client.nodes().len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        populate(&client, 400).await;
        let all: Vec<[u8; 20]> = snapshot(&client).await.into_keys().collect();
        let ids: Vec<_> = hosts
            .iter()
            .map(|host| {
                let node = client
                    .nodes()
                    .into_iter()
                    .find(|n| n.address.to_string() == *host);
                node.expect("both nodes known").id
            })
            .collect();
        let masters: Vec<_> = (0..4096u16)
            .map(|p| client.master_of_partition("test", p))
            .collect();
        (all, (ids, masters))
    });
    let (ids, map) = masters;
    let mut union = Vec::new();
    for (host, id) in hosts.iter().zip(&ids) {
        let file = dir.join("one-node.asb");
        let file = file.to_str().expect("utf-8");
        let backup = citrine(&[
            "backup", "-h", &hosts[0], "-n", "test", "-o", file, "-l", host,
        ]);
        assert!(backup.status.success(), "{}", text(&backup));
        let digests = digests_in(file);
        assert!(
            !digests.is_empty() && digests.len() < all.len(),
            "{host}: {}",
            digests.len()
        );
        for digest in &digests {
            let partition = u16::from_le_bytes([digest[0], digest[1]]) & 0xfff;
            assert_eq!(
                map[usize::from(partition)].as_ref(),
                Some(id),
                "partition {partition}"
            );
        }
        union.extend(digests);
    }
    union.sort_unstable();
    assert_eq!(union, all, "the two nodes' backups hold every record once");
    let nobody = citrine(&[
        "backup",
        "-h",
        &hosts[0],
        "-n",
        "test",
        "-o",
        "x",
        "-l",
        "127.0.0.1:1",
    ]);
    assert!(!nobody.status.success());
    assert!(
        text(&nobody)
            .contains("--node-list 127.0.0.1:1: no node of the cluster is at that address"),
        "{}",
        text(&nobody)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The reference server's `run.sh` (../shared/reference beside the
/// repository or its worktree, or `CITRINE_REFERENCE`), if it is here.
fn reference_run_sh() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("CITRINE_REFERENCE") {
        return Some(PathBuf::from(path));
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    ["..", "../.."]
        .iter()
        .map(|up| {
            workspace
                .join(up)
                .join("shared/reference/aerospike-ce-8.1.2/run.sh")
        })
        .find(|path| path.is_file())
}

/// The reference server (namespaces `test` and `bar`) on three free ports,
/// once both namespaces are balanced: its process and service address.
fn reference(run_sh: &Path) -> (Process, String) {
    let port = loop {
        let port = free_port();
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if port < 65_000 && free(port + 1) && free(port + 2) {
            break port;
        }
    };
    let work = tempdir("reference");
    let child = Command::new("bash")
        .arg(run_sh)
        .arg(port.to_string())
        .arg(&work)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the reference");
    let process = Process(child);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let log = work.join("asd.log");
    while !std::fs::read_to_string(&log).is_ok_and(|text| text.contains("{bar} rebalanced")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the reference did not start: see {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (process, format!("127.0.0.1:{port}"))
}

/// A file's records by digest, bins sorted by name.
fn records_in(file: &str) -> BTreeMap<[u8; 20], citrine_backup::Record> {
    let content = std::fs::read(file).expect("file");
    let mut reader = citrine_backup::Reader::new(&content[..]).expect("header");
    let mut records = BTreeMap::new();
    while let Some(entry) = reader.next_entry().expect("entry") {
        if let citrine_backup::Entry::Record(mut record) = entry {
            record.bins.sort_by(|a, b| a.name.cmp(&b.name));
            records.insert(record.digest.0, record);
        }
    }
    records
}

/// Backed up from the reference server with `citrine backup`, restored into
/// Citrine; backed up from Citrine, restored into the reference (namespace
/// `bar`): every record, the index and the module arrive both ways, and
/// both files hold the same records byte for byte (generations aside: a
/// restored record starts again at 1).
#[test]
fn files_move_between_citrine_and_the_reference_server() {
    let Some(run_sh) = reference_run_sh() else {
        eprintln!(
            "skipped: the reference server is not here (set CITRINE_REFERENCE to its run.sh)"
        );
        return;
    };
    let rt = runtime();
    let (_reference, host_ref) = reference(&run_sh);
    let (_citrine, host_c) = citrined();
    let dir = tempdir("interchange");
    let (from_ref, from_c) = (dir.join("ref.asb"), dir.join("citrine.asb"));
    let (from_ref, from_c) = (
        from_ref.to_str().expect("utf-8"),
        from_c.to_str().expect("utf-8"),
    );
    let before = rt.block_on(async {
        let client = connect(&host_ref).await;
        populate(&client, 100).await;
        snapshot(&client).await
    });
    let backup = citrine(&["backup", "-h", &host_ref, "-n", "test", "-o", from_ref]);
    assert!(backup.status.success(), "{}", text(&backup));
    assert!(text(&backup).contains("103 records"), "{}", text(&backup));
    assert!(
        text(&backup).contains("1 secondary indexes, 1 UDF modules"),
        "{}",
        text(&backup)
    );
    let restore = citrine(&["restore", "-h", &host_c, "-i", from_ref]);
    assert!(restore.status.success(), "{}", text(&restore));
    rt.block_on(async {
        let client = connect(&host_c).await;
        assert_same(&before, &snapshot(&client).await);
        assert!(sindex_list(&host_c).await.contains("indexname=by_int"));
        let module = client.get_udf(MODULE).await.expect("get udf");
        assert_eq!(module.as_deref(), Some(MODULE_SOURCE.as_bytes()));
    });
    let backup = citrine(&["backup", "-h", &host_c, "-n", "test", "-o", from_c]);
    assert!(backup.status.success(), "{}", text(&backup));
    let restore = citrine(&[
        "restore",
        "-h",
        &host_ref,
        "-i",
        from_c,
        "--namespace",
        "test,bar",
    ]);
    assert!(restore.status.success(), "{}", text(&restore));
    rt.block_on(async {
        let client = connect(&host_ref).await;
        assert_same(&before, &snapshot_of(&client, "bar").await);
        let indexes = sindex_list_of(&host_ref, "bar").await;
        assert!(indexes.contains("indexname=by_int"), "{indexes}");
    });
    let (mut ours, theirs) = (records_in(from_c), records_in(from_ref));
    assert_eq!(ours.len(), 103);
    for (digest, record) in &mut ours {
        let theirs = theirs.get(digest).expect("the same records");
        assert!(record.expiry.abs_diff(theirs.expiry) <= 2, "{record:?}");
        record.expiry = theirs.expiry;
        record.generation = theirs.generation;
    }
    assert_eq!(ours, theirs);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_interrupted_backup_continues_without_loss_or_duplicates() {
    let rt = runtime();
    let (_a, host_a) = citrined();
    let dir = tempdir("resume");
    let file = dir.join("test.asb");
    let file_arg = file.to_str().expect("utf-8");
    let before = rt.block_on(async {
        let client = connect(&host_a).await;
        populate(&client, 3000).await;
        snapshot(&client).await
    });
    let state = dir.join("test.asb.state");
    let mut interrupted = false;
    for delay_ms in [300u64, 100, 30] {
        let mut child = Command::new(CITRINE)
            .args([
                "backup",
                "-h",
                &host_a,
                "-n",
                "test",
                "-o",
                file_arg,
                "--parallel",
                "1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn backup");
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
        if state.exists() {
            interrupted = true;
            break;
        }
    }
    assert!(
        interrupted,
        "the backup finished before it could be interrupted"
    );
    let journal = std::fs::read_to_string(&state).expect("state");
    let done_before = journal
        .lines()
        .filter(|line| line.starts_with("d "))
        .count();
    let continue_backup = || {
        let args = ["backup", "-h", &host_a, "-n", "test", "-o", file_arg];
        citrine(&[&args[..], &["--continue"]].concat())
    };
    let resumed = continue_backup();
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert!(!state.exists(), "state removed once complete");
    // Every record once: the digests in the file are exactly the cluster's.
    let mut digests = digests_in(file_arg);
    let total = digests.len();
    digests.dedup();
    assert_eq!(
        total,
        digests.len(),
        "no record twice ({done_before} partitions done before)"
    );
    assert_eq!(digests, before.keys().copied().collect::<Vec<_>>());
    // Interrupted before its header: the state holds only the run's
    // options, and --continue starts afresh (the same file, every record).
    let unstarted: String = journal.lines().take(2).map(|l| format!("{l}\n")).collect();
    std::fs::write(&state, unstarted).expect("state");
    std::fs::write(&file, b"").expect("file");
    let afresh = continue_backup();
    assert!(afresh.status.success(), "{}", text(&afresh));
    assert_eq!(digests_in(file_arg), digests);
    let _ = std::fs::remove_dir_all(dir);
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write");
    path.to_str().expect("utf-8").to_owned()
}

#[test]
fn damaged_files_stop_at_the_damage_and_keep_what_came_before() {
    let rt = runtime();
    let (_a, host_a) = citrined();
    let (_b, host_b) = citrined();
    let dir = tempdir("damage");
    let file = dir.join("test.asb");
    rt.block_on(async { populate(&connect(&host_a).await, 50).await });
    let backup = citrine(&[
        "backup",
        "-h",
        &host_a,
        "-n",
        "test",
        "-o",
        file.to_str().expect("utf-8"),
        "-I",
        "-u",
    ]);
    assert!(backup.status.success(), "{}", text(&backup));
    let whole = std::fs::read(&file).expect("file");
    // Cut the file inside its 21st record.
    let starts: Vec<usize> = whole
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == b"\n+ n")
        .map(|(at, _)| at + 1)
        .collect();
    let cut = starts[20] + 10;
    let truncated = write_file(&dir, "cut.asb", &whole[..cut]);
    let restore = citrine(&["restore", "-h", &host_b, "-i", &truncated]);
    assert!(!restore.status.success());
    let said = text(&restore);
    let line = whole[..cut].iter().filter(|b| **b == b'\n').count() + 1;
    assert!(said.contains(&format!("line {line}:")), "{line}: {said}");
    assert!(said.contains("truncated"), "{said}");
    assert!(
        said.contains("the records before it were written"),
        "{said}"
    );
    // The records wholly before the cut are on the cluster.
    let kept = rt.block_on(async { snapshot(&connect(&host_b).await).await.len() });
    assert_eq!(kept, 20, "the 20 records before the damaged one");

    // A damaged line inside the 31st record: the 30 before it are written
    // (to a fresh namespace, bar), the error names the line and the record.
    let mut corrupt = whole.clone();
    let at = starts[30];
    let generation = at
        + corrupt[at..]
            .windows(4)
            .position(|w| w == b"+ g ")
            .expect("+ g");
    corrupt[generation + 4] = b'x';
    let line = corrupt[..generation]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1;
    let record_line = corrupt[..at].iter().filter(|b| **b == b'\n').count() + 1;
    let corrupt = write_file(&dir, "corrupt.asb", &corrupt);
    let restore = citrine(&["restore", "-h", &host_b, "-i", &corrupt, "-n", "test,bar"]);
    assert!(!restore.status.success());
    let said = text(&restore);
    assert!(
        said.contains(&format!("line {line}: "))
            && said.contains(&format!("starts on line {record_line})")),
        "{line}, {record_line}: {said}"
    );
    let kept = rt.block_on(async { snapshot_of(&connect(&host_b).await, "bar").await.len() });
    assert_eq!(kept, 30, "the 30 records before the damaged one");

    // --tps 50: the 53 records take a second at least.
    let started = std::time::Instant::now();
    let whole_file = file.to_str().expect("utf-8");
    let paced = ["-n", "test,bar", "--no-generation", "--tps", "50"];
    let paced = citrine(&[&["restore", "-h", &host_b, "-i", whole_file][..], &paced].concat());
    assert!(paced.status.success(), "{}", text(&paced));
    assert!(text(&paced).contains("53 restored"), "{}", text(&paced));
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );

    let wrong = write_file(&dir, "v4.asb", b"Version 4.0\n# namespace test\n");
    let said = text(&citrine(&["restore", "-h", &host_b, "-i", &wrong]));
    assert!(
        said.contains("line 1: backup format 4.0 is not supported"),
        "{said}"
    );

    let mut other = whole.clone();
    let from = b"# namespace test\n";
    let at = other
        .windows(from.len())
        .position(|w| w == from)
        .expect("meta");
    other.splice(at..at + from.len(), b"# namespace nosuch\n".iter().copied());
    let nosuch = write_file(&dir, "nosuch.asb", &other);
    let said = text(&citrine(&["restore", "-h", &host_b, "-i", &nosuch]));
    assert!(
        said.contains("namespace nosuch, which the cluster does not have"),
        "{said}"
    );
    assert!(said.contains("--namespace nosuch,OTHER"), "{said}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn help_explains_backup_and_restore() {
    for (command, words) in [
        (
            "backup",
            ["asbackup", "--continue", "--partition-list", "Examples"],
        ),
        (
            "restore",
            ["asbackup", "--unique", "--no-generation", "Examples"],
        ),
    ] {
        let help = citrine(&[command, "--help"]);
        assert!(help.status.success());
        let said = text(&help);
        for word in words {
            assert!(said.contains(word), "{command} --help lacks {word}: {said}");
        }
    }
}
