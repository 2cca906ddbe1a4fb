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
    let work = tempdir("node");
    let mut child = Command::new(binary)
        .args(["--port", &port.to_string(), "--address", "127.0.0.1"])
        .args(["--fabric-port", &free_port().to_string()])
        .args(["--heartbeat-port", &free_port().to_string()])
        .args(["--data-dir", work.to_str().expect("utf-8 path")])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn citrined");
    wait_until_serving(&mut child, port, Duration::from_secs(15));
    (Process(child), format!("127.0.0.1:{port}"))
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

/// Writes records of every particle type (and a few plain ones), an index
/// and a UDF module.
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
    let policy = ScanPolicy {
        raw_values: true,
        ..ScanPolicy::default()
    };
    let records = client
        .scan(&policy, &Statement::new("test", ""))
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

async fn sindex_list(host: &str) -> String {
    citrine_client::info_at(host, &["sindex-list:ns=test"], Duration::from_secs(2))
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
    assert!(summary.contains("202 records"), "{summary}");
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

    let restore = citrine(&["restore", "-h", &host_b, "-i", file_arg]);
    assert!(restore.status.success(), "{}", text(&restore));
    assert!(
        text(&restore).contains("202 restored"),
        "{}",
        text(&restore)
    );
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
        text(&again).contains("already on the cluster (--unique): 202"),
        "{}",
        text(&again)
    );
    let _ = std::fs::remove_dir_all(dir);
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
    let resumed = citrine(&[
        "backup",
        "-h",
        &host_a,
        "-n",
        "test",
        "-o",
        file_arg,
        "--continue",
    ]);
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert!(!state.exists(), "state removed once complete");
    // Every record once: the digests in the file are exactly the cluster's.
    let content = std::fs::read(&file).expect("file");
    let mut reader = citrine_backup::Reader::new(&content[..]).expect("header");
    let mut digests = Vec::new();
    while let Some(entry) = reader.next_entry().expect("entry") {
        if let citrine_backup::Entry::Record(record) = entry {
            digests.push(record.digest.0);
        }
    }
    let total = digests.len();
    digests.sort_unstable();
    digests.dedup();
    assert_eq!(
        total,
        digests.len(),
        "no record twice ({done_before} partitions done before)"
    );
    assert_eq!(digests, before.keys().copied().collect::<Vec<_>>());
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
