//! End-to-end tests of the `citrine` binary: the no-op responder it
//! contains, `info`, `cluster`, `bench`, and record commands against a real
//! `citrined` (found like the client's tests: `$CITRINED_BIN`, else the newer
//! of `<workspace>/target/{release,debug}/citrined`; missing = failure).

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const CITRINE: &str = env!("CARGO_BIN_EXE_citrine");

use citrine_testsupport::{free_port, wait_until_serving};

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn noop() -> (Process, u16) {
    let port = free_port();
    let mut child = Command::new(CITRINE)
        .args(["bench", "--noop-server", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn noop");
    wait_until_serving(&mut child, port, Duration::from_secs(15));
    (Process(child), port)
}

fn citrined() -> (Process, u16) {
    citrined_with(&[])
}

/// A fresh citrined on free ports, with `extra` command-line arguments.
fn citrined_with(extra: &[&str]) -> (Process, u16) {
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
            .unwrap_or_else(|| panic!("citrined not found: build it with `cargo build --release -p citrine-server` or set CITRINED_BIN")),
    };
    assert!(binary.is_file(), "{} does not exist", binary.display());
    let port = free_port();
    let mut child = Command::new(binary)
        .args(["--port", &port.to_string(), "--address", "127.0.0.1"])
        .args([
            "--fabric-port",
            &free_port().to_string(),
            "--heartbeat-port",
            &free_port().to_string(),
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn citrined");
    wait_until_serving(&mut child, port, Duration::from_secs(15));
    (Process(child), port)
}

fn citrine(args: &[&str]) -> Output {
    Command::new(CITRINE)
        .args(args)
        .output()
        .expect("run citrine")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn info_against_the_noop_responder() {
    let (_noop, port) = noop();
    let host = format!("127.0.0.1:{port}");
    let value = citrine(&["info", "-h", &host, "-v", "build"]);
    assert!(value.status.success());
    assert_eq!(stdout(&value).trim(), "8.1.2.0");
    let multi = citrine(&["info", "-h", &host, "statistics", "node"]);
    let text = stdout(&multi);
    assert!(text.contains("statistics:\n    cluster_size=1\n"), "{text}");
    assert!(text.contains("node:\n"), "{text}");
    let bad = citrine(&["info", "-h", &host, "-v", "no-such-command"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("check the command name"));
}

#[test]
fn cluster_table_and_bench_against_the_noop_responder() {
    let (_noop, port) = noop();
    let host = format!("127.0.0.1:{port}");
    let table = citrine(&["cluster", "-h", &host]);
    assert!(table.status.success());
    let text = stdout(&table);
    assert!(
        text.contains("Master parts")
            && text.contains("BB9000000000C17")
            && text.contains("1 node(s); partitions of namespaces bar, test added up"),
        "{text}"
    );
    let one = citrine(&["cluster", "-h", &host, "-n", "test"]);
    let text = stdout(&one);
    assert!(
        one.status.success() && text.contains("1 node(s); partitions of namespace test"),
        "{text}"
    );
    let missing = citrine(&["cluster", "-h", &host, "-n", "nosuch"]);
    assert!(!missing.status.success());
    let why = String::from_utf8_lossy(&missing.stderr);
    assert!(
        why.contains("no node has namespace `nosuch` (namespaces: bar, test)"),
        "{why}"
    );

    let json = std::env::temp_dir().join(format!("citrine-bench-{port}.json"));
    let bench = citrine(&[
        "bench",
        "-h",
        &host,
        "-k",
        "1000",
        "-o",
        "2*S:10",
        "-w",
        "ru,80",
        "-c",
        "4",
        "--ops",
        "2000",
        "-q",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]);
    assert!(
        bench.status.success(),
        "{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written"))
            .expect("valid json");
    assert_eq!(summary["total_ops"], 2000);
    assert_eq!(summary["errors"], 0);
    assert!(summary["ops"]["read"]["count"]
        .as_u64()
        .is_some_and(|n| n > 1000));
    let _ = std::fs::remove_file(json);
}

/// `citrine cluster` against a real node: one row with the node's rack (from
/// `rack-ids`), every partition of `test` mastered there, no replicas (one
/// node), no migrations.
#[test]
fn cluster_table_against_citrined() {
    let (_server, port) = citrined_with(&["--rack-id", "7"]);
    let host = format!("127.0.0.1:{port}");
    let table = citrine(&["cluster", "-h", &host, "-n", "test"]);
    let text = stdout(&table);
    assert!(table.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[0]
        .split("  ")
        .filter(|c| !c.is_empty())
        .map(str::trim)
        .collect();
    assert_eq!(
        (header.len(), &header[2..5]),
        (8, &["Build", "Rack", "Master parts"][..]),
        "{text}"
    );
    let row: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(row.len(), 8, "{text}");
    assert_eq!(row[1], host, "{text}");
    assert_eq!(&row[3..7], ["7", "4096", "0", "0"], "{text}");
    assert_eq!(
        lines[3], "1 node(s); partitions of namespace test",
        "{text}"
    );
    // The namespace's configuration names the rack too, as the reference's does.
    let config = citrine(&[
        "info",
        "-h",
        &host,
        "-v",
        "get-config:context=namespace;id=test",
    ]);
    let config = stdout(&config);
    assert!(
        config.split(';').any(|pair| pair == "rack-id=7"),
        "{config}"
    );
}

#[test]
fn records_against_citrined() {
    let (_server, port) = citrined();
    let host = format!("127.0.0.1:{port}");
    let put = citrine(&[
        "put",
        "-h",
        &host,
        "-n",
        "test",
        "-s",
        "cli",
        "k1",
        "a=1",
        "b=hello",
        "c=2.5",
        "--json",
        r#"{"l":[1,2]}"#,
    ]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = citrine(&[
        "get",
        "-h",
        &host,
        "-n",
        "test",
        "-s",
        "cli",
        "k1",
        "--output-json",
    ]);
    assert!(get.status.success());
    let record: serde_json::Value = serde_json::from_str(stdout(&get).trim()).expect("json record");
    assert_eq!(record["bins"]["a"], 1);
    assert_eq!(record["bins"]["b"], "hello");
    assert_eq!(record["bins"]["c"], 2.5);
    assert_eq!(record["bins"]["l"], serde_json::json!([1, 2]));
    assert!(
        citrine(&["exists", "-h", &host, "-n", "test", "-s", "cli", "k1"])
            .status
            .success()
    );
    assert!(
        citrine(&["delete", "-h", &host, "-n", "test", "-s", "cli", "k1"])
            .status
            .success()
    );
    let missing = citrine(&["exists", "-h", &host, "-n", "test", "-s", "cli", "k1"]);
    assert_eq!(missing.status.code(), Some(2));
    let bad_ns = citrine(&["get", "-h", &host, "-n", "nosuchns", "k1"]);
    assert!(!bad_ns.status.success());
    assert!(String::from_utf8_lossy(&bad_ns.stderr).contains("citrine info namespaces"));
}

#[test]
fn scan_query_and_index_against_citrined() {
    let (_server, port) = citrined();
    let host = format!("127.0.0.1:{port}");
    for index in 0..20 {
        let put = citrine(&[
            "put",
            "-h",
            &host,
            "-s",
            "many",
            "--send-key",
            &index.to_string(),
            &format!("n={index}"),
            &format!("s=v{}", index % 4),
        ]);
        assert!(put.status.success());
    }
    let scan = citrine(&["scan", "-h", &host, "-s", "many", "--output-json"]);
    assert!(
        scan.status.success(),
        "{}",
        String::from_utf8_lossy(&scan.stderr)
    );
    let mut keys: Vec<i64> = stdout(&scan)
        .lines()
        .map(|line| {
            let record: serde_json::Value = serde_json::from_str(line).expect("json line");
            assert_eq!(record["bins"]["n"], record["key"]);
            record["key"].as_i64().expect("stored key")
        })
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, (0..20).collect::<Vec<_>>());
    assert!(String::from_utf8_lossy(&scan.stderr).contains("20 records"));
    let limited = citrine(&["scan", "-h", &host, "-s", "many", "--max-records", "5", "n"]);
    assert_eq!(stdout(&limited).lines().count(), 5);
    assert!(stdout(&limited)
        .lines()
        .all(|line| line.contains(" n=") && !line.contains(" s=")));

    let no_index = citrine(&["query", "-h", &host, "-s", "many", "--range", "n=3..7"]);
    assert!(!no_index.status.success());
    assert!(String::from_utf8_lossy(&no_index.stderr).contains("citrine index create"));
    for (name, bin, kind) in [("many_n", "n", "numeric"), ("many_s", "s", "string")] {
        let create = citrine(&[
            "index", "create", "-h", &host, "-s", "many", name, bin, kind,
        ]);
        assert!(
            create.status.success(),
            "{}",
            String::from_utf8_lossy(&create.stderr)
        );
    }
    let list = citrine(&["index", "list", "-h", &host]);
    assert!(
        stdout(&list).contains("indexname=many_n") && stdout(&list).contains("indexname=many_s")
    );
    let range = citrine(&["query", "-h", &host, "-s", "many", "--range", "n=3..7"]);
    assert!(
        range.status.success(),
        "{}",
        String::from_utf8_lossy(&range.stderr)
    );
    assert_eq!(stdout(&range).lines().count(), 5);
    let equal = citrine(&["query", "-h", &host, "-s", "many", "--equal", "s=v1"]);
    let mut found: Vec<String> = stdout(&equal)
        .lines()
        .map(|line| {
            line.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    found.sort();
    assert_eq!(found, ["key=1", "key=13", "key=17", "key=5", "key=9"]);
    let bad = citrine(&["query", "-h", &host, "--range", "n=9..1"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("LOW is above HIGH"));
    assert!(citrine(&["index", "drop", "-h", &host, "many_n"])
        .status
        .success());
    assert!(!stdout(&citrine(&["index", "list", "-h", &host])).contains("many_n"));
}

#[test]
fn udf_modules_and_calls_against_citrined() {
    let (_server, port) = citrined();
    let host = format!("127.0.0.1:{port}");
    let directory = std::env::temp_dir().join(format!("citrine-cli-udf-{port}"));
    std::fs::create_dir_all(&directory).expect("temp dir");
    let source = "function bump(rec, bin, by)\n  local old = rec[bin] or 0\n  rec[bin] = old + by\n  \
                  aerospike:update(rec)\n  local out = map()\n  out['old'] = old\n  out['new'] = rec[bin]\n  \
                  return out\nend\n\nfunction fail(rec, why) error(why) end\n";
    let file = directory.join("cli_counters.lua");
    std::fs::write(&file, source).expect("write module");
    let file = file.to_string_lossy().into_owned();

    let put = citrine(&["udf", "put", "-h", &host, &file]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let hash = citrine_client::udf_hash(source.as_bytes());
    assert_eq!(
        stdout(&put).trim(),
        format!("ok: cli_counters.lua registered (sha1 {hash})")
    );
    let list = citrine(&["udf", "list", "-h", &host]);
    assert!(list.status.success());
    assert!(
        stdout(&list)
            .lines()
            .any(|line| line == format!("cli_counters.lua  {hash}")),
        "{}",
        stdout(&list)
    );
    let get = citrine(&["udf", "get", "-h", &host, "cli_counters"]);
    assert!(get.status.success());
    assert_eq!(get.stdout, source.as_bytes());

    let put_record = citrine(&["put", "-h", &host, "-s", "cliudf", "k1", "hits=4"]);
    assert!(put_record.status.success());
    let execute = citrine(&[
        "udf",
        "execute",
        "-h",
        &host,
        "-n",
        "test",
        "-s",
        "cliudf",
        "k1",
        "cli_counters",
        "bump",
        "hits",
        "3",
    ]);
    assert!(
        execute.status.success(),
        "{}",
        String::from_utf8_lossy(&execute.stderr)
    );
    let result: serde_json::Value =
        serde_json::from_str(stdout(&execute).trim()).expect("JSON result");
    assert_eq!(result, serde_json::json!({"old": 4, "new": 7}));
    let record = citrine(&["get", "-h", &host, "-s", "cliudf", "k1", "--output-json"]);
    let record: serde_json::Value = serde_json::from_str(stdout(&record).trim()).expect("json");
    assert_eq!(record["bins"]["hits"], 7);

    // A function that raises an error: the server's message, status 1.
    let failed = citrine(&[
        "udf",
        "execute",
        "-h",
        &host,
        "-s",
        "cliudf",
        "k1",
        "cli_counters.lua",
        "fail",
        "\"no thanks\"",
    ]);
    assert_eq!(failed.status.code(), Some(1));
    let why = String::from_utf8_lossy(&failed.stderr);
    assert!(
        why.contains("result code 100") && why.contains("no thanks"),
        "{why}"
    );
    let missing = citrine(&["udf", "execute", "-h", &host, "k1", "no_such_mod", "f"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("citrine udf list"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    let bad_arg = citrine(&[
        "udf",
        "execute",
        "-h",
        &host,
        "k1",
        "cli_counters",
        "bump",
        "[1,",
    ]);
    assert_eq!(bad_arg.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad_arg.stderr).contains("not valid JSON"));

    // A module that does not compile is refused with its line.
    let broken = directory.join("cli_broken.lua");
    std::fs::write(&broken, "function f(rec)\n  return (\nend\n").expect("write");
    let refused = citrine(&["udf", "put", "-h", &host, &broken.to_string_lossy()]);
    assert_eq!(refused.status.code(), Some(1));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("compile_error at cli_broken.lua:"), "{why}");

    let remove = citrine(&["udf", "remove", "-h", &host, "cli_counters.lua"]);
    assert!(remove.status.success());
    assert!(!stdout(&citrine(&["udf", "list", "-h", &host])).contains("cli_counters"));
    let gone = citrine(&["udf", "get", "-h", &host, "cli_counters.lua"]);
    assert_eq!(gone.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&directory);
}

#[test]
fn bench_udf_workloads_against_citrined() {
    let (_server, port) = citrined();
    let host = format!("127.0.0.1:{port}");
    let json = std::env::temp_dir().join(format!("citrine-bench-udf-{port}.json"));
    let json_path = json.to_str().expect("utf-8 path");
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "-h", &host, "-s", "benchudf", "-c", "4", "-q"];
        args.extend_from_slice(extra);
        citrine(&args)
    };
    let summary = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written"))
            .expect("valid json")
    };

    // Five keys that do not exist yet: incr creates each and adds 1 per call,
    // so the bins add up to the number of calls.
    let udf = bench(&["-k", "5", "-w", "udf", "--ops", "300", "--json", json_path]);
    assert!(
        udf.status.success(),
        "{}",
        String::from_utf8_lossy(&udf.stderr)
    );
    assert!(
        stdout(&udf).contains("calls citrine_bench.incr(rec, \"b0\")"),
        "{}",
        stdout(&udf)
    );
    let result = summary();
    assert_eq!(result["workload"], "udf");
    assert_eq!(result["udf"], "citrine_bench.incr(b0)");
    assert_eq!(result["errors"], 0);
    assert_eq!(result["ops"]["udf"]["count"], 300);
    let mut total = 0;
    for key in 0..5 {
        let record = citrine(&[
            "get",
            "-h",
            &host,
            "-s",
            "benchudf",
            &key.to_string(),
            "--output-json",
        ]);
        assert!(record.status.success(), "key {key}");
        let record: serde_json::Value = serde_json::from_str(stdout(&record).trim()).expect("json");
        total += record["bins"]["b0"].as_i64().expect("integer bin");
    }
    assert_eq!(total, 300);
    assert!(stdout(&citrine(&["udf", "list", "-h", &host])).contains("citrine_bench.lua"));

    // Read-only calls on ten keys, five of them missing (not found, not errors).
    let read = bench(&[
        "-k", "10", "-w", "udf-read", "--ops", "200", "--json", json_path,
    ]);
    assert!(read.status.success());
    let result = summary();
    assert_eq!(result["workload"], "udf-read");
    assert_eq!(result["errors"], 0);
    assert_eq!(result["ops"]["udf-read"]["count"], 200);
    assert!(result["ops"]["udf-read"]["not_found"]
        .as_u64()
        .is_some_and(|n| n > 0 && n < 200));
    assert!(result["ops"]["udf"].is_null());

    // A bin the function cannot add 1 to: every call is an error.
    assert!(
        citrine(&["put", "-h", &host, "-s", "benchudf", "7", "b0=\"text\""])
            .status
            .success()
    );
    let failing = bench(&[
        "-k",
        "1",
        "--key-start",
        "7",
        "-w",
        "udf",
        "--ops",
        "20",
        "--json",
        json_path,
    ]);
    assert!(!failing.status.success());
    let result = summary();
    assert_eq!(result["errors"], 20);
    assert_eq!(result["ops"]["udf"]["error_kinds"]["code 100 (udf)"], 20);

    // udf needs an integer bin in the object spec.
    let no_int = bench(&["-o", "S:10", "-w", "udf", "--ops", "1"]);
    assert!(!no_int.status.success());
    assert!(String::from_utf8_lossy(&no_int.stderr).contains("give -o an I item"));
    let _ = std::fs::remove_file(json);
}

#[test]
fn verify_reports_progress_and_a_verdict_with_its_exit_code() {
    let (_server, port) = citrined();
    let host = format!("127.0.0.1:{port}");
    let run = citrine(&[
        "verify",
        "-h",
        &host,
        "-n",
        "test",
        "--workload",
        "register",
        "--time",
        "2s",
        "--clients",
        "4",
        "--keys",
        "2",
    ]);
    let text = stdout(&run);
    assert_eq!(run.status.code(), Some(0), "{text}");
    assert!(
        text.contains("ops (") && text.contains(" ok, "),
        "progress lines: {text}"
    );
    assert!(text.contains("verdict: VALID"), "{text}");
    // Nothing listens: the run cannot start, which is exit status 2.
    let nobody = format!("127.0.0.1:{}", free_port());
    let run = citrine(&["verify", "-h", &nobody, "--time", "1s"]);
    let text = stdout(&run);
    assert_eq!(run.status.code(), Some(2), "{text}");
    assert!(text.contains("verdict: COULD NOT RUN"), "{text}");
    let bad = citrine(&["verify", "-h", &host, "--workload", "bank"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("use register, counter or set"));
}

#[test]
fn users_and_roles_against_a_secure_citrined() {
    let directory = std::env::temp_dir().join(format!("citrine-cli-acl-{}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("temp dir");
    let config = directory.join("secure.toml");
    std::fs::write(&config, "[security]\n\n[[namespace]]\nname = \"test\"\n").expect("config");
    let (_server, port) = citrined_with(&["--config", config.to_str().expect("utf8")]);
    let host = format!("127.0.0.1:{port}");
    let as_admin = |args: &[&str]| {
        let mut all = args.to_vec();
        // Each login hashes with bcrypt on both sides: generous timeouts
        // for a loaded 2-core machine.
        all.extend([
            "-h",
            &host,
            "-U",
            "admin",
            "-P",
            "admin",
            "--timeout",
            "20000",
        ]);
        citrine(&all)
    };
    let refused = citrine(&["info", "-h", &host, "-v", "build"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("80"));
    let build = as_admin(&["info", "-v", "build"]);
    assert!(build.status.success(), "{build:?}");
    assert!(
        as_admin(&["role", "create", "demo-rw", "read-write@test.demo"])
            .status
            .success()
    );
    assert!(
        as_admin(&["user", "create", "ann", "pw", "read", "demo-rw"])
            .status
            .success()
    );
    let listed = as_admin(&["user", "list"]);
    let users = stdout(&listed);
    assert!(users.contains("ann\troles=demo-rw,read\n"), "{listed:?}");
    let roles = stdout(&as_admin(&["role", "list", "demo-rw"]));
    assert_eq!(roles, "demo-rw\tprivileges=read-write@test.demo\n");
    let truncate = citrine(&[
        "info",
        "-h",
        &host,
        "-U",
        "ann",
        "-P",
        "pw",
        "truncate:namespace=test",
    ]);
    assert!(!truncate.status.success());
    assert!(
        String::from_utf8_lossy(&truncate.stderr).contains("81"),
        "{truncate:?}"
    );
    assert!(as_admin(&["user", "drop", "ann"]).status.success());
    assert!(!stdout(&as_admin(&["user", "list"])).contains("ann"));
    let _ = std::fs::remove_dir_all(&directory);
}

/// `citrine certs` makes what a node's TLS port needs (examples/secure.toml
/// reads it from `tls/` under the data directory), and `citrine info`
/// talks TLS to it, logged in (the example turns access control on),
/// verifying the certificate for the TLS name against the CA: no login, a
/// wrong name or another CA is refused.
#[test]
fn certs_then_info_over_tls_against_citrined() {
    let data = std::env::temp_dir().join(format!("citrine-cli-tls-{}", free_port()));
    let made = citrine(&["certs", &data.join("tls").display().to_string()]);
    assert!(made.status.success(), "{made:?}");
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let config = workspace.join("examples/secure.toml").display().to_string();
    let tls_port = free_port().to_string();
    let data_text = data.display().to_string();
    let (_node, _) = citrined_with(&[
        "--config",
        &config,
        "--data-dir",
        &data_text,
        "--tls-port",
        &tls_port,
    ]);
    let host = format!("127.0.0.1:{tls_port}");
    let ca = data.join("tls/ca.pem").display().to_string();
    let ask_as = |name: &str, ca: &str, login: &[&str]| {
        let mut args = vec![
            "info",
            "-h",
            &host,
            "--tls-name",
            name,
            "--tls-ca-file",
            ca,
            "--timeout",
            "20000",
            "-v",
            "service-tls-std",
        ];
        args.extend_from_slice(login);
        citrine(&args)
    };
    let ask = |name: &str, ca: &str| ask_as(name, ca, &["-U", "admin", "-P", "admin"]);
    let answer = ask("localhost", &ca);
    assert!(answer.status.success(), "{answer:?}");
    assert_eq!(stdout(&answer).trim(), host);
    let anonymous = ask_as("localhost", &ca, &[]);
    assert!(!anonymous.status.success(), "{anonymous:?}");
    assert!(
        String::from_utf8_lossy(&anonymous.stderr).contains("ERROR:80"),
        "{anonymous:?}"
    );
    let wrong = ask_as("localhost", &ca, &["-U", "admin", "-P", "nope"]);
    assert!(!wrong.status.success(), "{wrong:?}");
    assert!(!ask("elsewhere", &ca).status.success());
    let other = data.join("other");
    assert!(citrine(&["certs", &other.display().to_string()])
        .status
        .success());
    assert!(
        !ask("localhost", &other.join("ca.pem").display().to_string())
            .status
            .success()
    );
    let _ = std::fs::remove_dir_all(&data);
}
