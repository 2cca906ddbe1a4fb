//! Latency histograms (`latencies:`) and the Prometheus endpoint
//! (`[http] port`, `GET /metrics`) of real `citrined` processes.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_wire::msg::op_type;
use common::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Starts citrined with `[service] ticker-interval = 1`, these extra
/// config lines after it (a section of their own), and namespace `test`.
fn start_configured(extra: &str) -> Server {
    let directory = std::env::temp_dir().join(format!(
        "citrine-metrics-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&directory).unwrap();
    let config = directory.join("citrine.toml");
    std::fs::write(
        &config,
        format!("[service]\nticker-interval = 1\n\n{extra}\n\n[[namespace]]\nname = \"test\"\n"),
    )
    .unwrap();
    let server = start(&["--config", config.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&directory);
    server
}

/// `count` writes and reads of distinct keys of set "demo".
fn traffic(port: u16, count: usize) {
    let mut stream = connect(port);
    for index in 0..count {
        let key = format!("k{index}");
        let value = (index as i64).to_be_bytes().to_vec();
        let put = write_request("test", &key, &[(op_type::WRITE, 1, "n", value)]);
        let (_, body) = round_trip(&mut stream, &put).unwrap();
        assert_eq!(decode_reply(&body).0.result_code, 0);
        let (_, body) = round_trip(&mut stream, &get_all_request("test", &key)).unwrap();
        assert_eq!(decode_reply(&body).0.result_code, 0);
    }
}

/// The value of one info command.
fn info_value(port: u16, command: &str) -> String {
    let mut stream = connect(port);
    info(&mut stream, &[command]).remove(0).1
}

/// Checks one `NAME:UNIT,OPS,PCT×17` entry of `latencies:`; returns its
/// operations per second.
fn check_entry(entry: &str, name: &str) -> f64 {
    let value = entry
        .strip_prefix(name)
        .and_then(|rest| rest.strip_prefix(':'))
        .unwrap_or_else(|| panic!("{entry:?} is not {name}'s"));
    let columns: Vec<&str> = value.split(',').collect();
    assert_eq!(columns.len(), 19, "{entry}");
    assert_eq!(columns[0], "msec", "{entry}");
    let decimals = |text: &str, places: usize| {
        text.split_once('.')
            .is_some_and(|(_, fraction)| fraction.len() == places)
    };
    assert!(decimals(columns[1], 1), "ops/sec with one decimal: {entry}");
    let shares: Vec<f64> = columns[2..]
        .iter()
        .map(|share| {
            assert!(decimals(share, 2), "shares with two decimals: {entry}");
            share.parse().unwrap()
        })
        .collect();
    assert!(
        shares.windows(2).all(|pair| pair[0] >= pair[1]) && shares[0] <= 100.0,
        "shares above rising thresholds never grow: {entry}"
    );
    columns[1].parse().unwrap()
}

#[test]
fn latencies_answer_read_and_write_histograms_after_traffic() {
    let server = start_configured("");
    let before = info_value(server.port, "latencies:hist={test}-read");
    assert_eq!(
        before, "{test}-read:",
        "no operation yet: an empty histogram"
    );
    assert_eq!(
        info_value(server.port, "latencies:hist={nope}-read"),
        "ERROR:4:bad hist name"
    );

    traffic(server.port, 300);
    let (mut read_rate, mut write_rate) = (0.0f64, 0.0f64);
    let deadline = Instant::now() + Duration::from_secs(10);
    while read_rate == 0.0 || write_rate == 0.0 {
        assert!(
            Instant::now() < deadline,
            "no interval reported the traffic"
        );
        std::thread::sleep(Duration::from_millis(100));
        let all = info_value(server.port, "latencies:");
        let entries: Vec<&str> = all.split(';').collect();
        let names: Vec<&str> = entries
            .iter()
            .map(|entry| entry.split(':').next().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "batch-index",
                "{test}-read",
                "{test}-write",
                "{test}-udf",
                "{test}-batch-sub-read",
                "{test}-batch-sub-write",
                "{test}-batch-sub-udf",
                "{test}-pi-query",
                "{test}-si-query"
            ]
        );
        if entries[1] == "{test}-read:" || entries[2] == "{test}-write:" {
            continue;
        }
        read_rate = read_rate.max(check_entry(entries[1], "{test}-read"));
        write_rate = write_rate.max(check_entry(entries[2], "{test}-write"));
        assert_eq!(entries[3], "{test}-udf:", "no UDF ran");
    }
    let one = info_value(server.port, "latencies:hist={test}-write");
    check_entry(&one, "{test}-write");
}

/// An HTTP exchange: `request` sent as is; the status and the whole
/// answer (head and body).
fn http(port: u16, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer:?}"));
    (status, answer)
}

/// Parses an exposition: every sample `name{labels} value` under its
/// family's `# HELP` and `# TYPE`; returns sample → value.
fn parse_exposition(text: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    let mut typed: HashMap<String, String> = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(
                typed.insert(name.to_owned(), kind.to_owned()).is_none(),
                "{name} typed twice"
            );
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("value of {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{name}"
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|f| typed.get(*f).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(name);
        assert!(typed.contains_key(family), "{name} has no # TYPE before it");
        if let Some(labels) = series.strip_prefix(name) {
            assert!(
                labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                "{series}"
            );
        }
        assert!(
            samples.insert(series.to_owned(), value).is_none(),
            "{series} twice"
        );
    }
    samples
}

#[test]
fn the_prometheus_endpoint_serves_every_statistic_and_survives_bad_requests() {
    let http_port = free_port();
    let server = start_configured(&format!(
        "[http]\naddress = \"127.0.0.1\"\nport = {http_port}"
    ));
    traffic(server.port, 50);
    let create = "sindex-create:namespace=test;set=demo;indexname=by_n;bin=n;type=NUMERIC";
    assert_eq!(info_value(server.port, create), "ok");

    let (status, answer) = http(http_port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 200, "{answer}");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    let samples = parse_exposition(body);
    let node = format!(
        "cluster_name=\"citrine\",service=\"127.0.0.1:{}\"",
        server.port
    );
    let get = |series: &str| {
        *samples
            .get(series)
            .unwrap_or_else(|| panic!("no {series} in\n{body}"))
    };
    assert!(body.contains("aerospike_node_up{build=\"8.1.2.0\",cluster_name=\"citrine\",node_id="));
    assert!(
        get(&format!(
            "aerospike_node_stats_client_connections{{{node}}}"
        )) >= 0.0
    );
    let namespace =
        format!("{node},storage_engine=\"memory\"").replace("service=", "ns=\"test\",service=");
    assert_eq!(
        get(&format!("aerospike_namespace_objects{{{namespace}}}")),
        50.0
    );
    assert_eq!(
        get(&format!(
            "aerospike_namespace_client_write_success{{{namespace}}}"
        )),
        50.0
    );
    let set = format!("{node},set=\"demo\"").replace("service=", "ns=\"test\",service=");
    assert_eq!(get(&format!("aerospike_sets_objects{{{set}}}")), 50.0);
    assert!(
        samples
            .keys()
            .any(|series| series.starts_with("aerospike_sindex_")
                && series.contains("sindex=\"by_n\"")),
        "no per-sindex statistic in\n{body}"
    );
    assert!(body.contains("# TYPE aerospike_latencies_write_ms histogram\n"));
    // Cumulative buckets, +Inf equal to the count: every write counted.
    let port = server.port;
    let bucket = |le: &str| {
        get(&format!(
            "aerospike_latencies_write_ms_bucket{{cluster_name=\"citrine\",le=\"{le}\",ns=\"test\",service=\"127.0.0.1:{port}\"}}"
        ))
    };
    let mut previous = 0.0;
    for threshold in 0..17 {
        let cumulative = bucket(&(1u64 << threshold).to_string());
        assert!(cumulative >= previous, "buckets are cumulative");
        previous = cumulative;
    }
    let histogram = format!("cluster_name=\"citrine\",ns=\"test\",service=\"127.0.0.1:{port}\"");
    let count = get(&format!(
        "aerospike_latencies_write_ms_count{{{histogram}}}"
    ));
    assert_eq!(count, 50.0);
    assert_eq!(bucket("+Inf"), count);
    assert!(get(&format!("aerospike_latencies_write_ms_sum{{{histogram}}}")) > 0.0);
    assert!(get(&format!("aerospike_latencies_read_ms_count{{{histogram}}}")) >= 50.0);

    // The dashboard in the repository reads only metrics the node serves.
    let dashboard =
        std::fs::read_to_string(workspace_root().join("docs/grafana/citrine-dashboard.json"))
            .unwrap();
    let served: std::collections::HashSet<&str> = samples
        .keys()
        .map(|series| series.split('{').next().unwrap())
        .collect();
    let mut referenced = 0;
    for (at, _) in dashboard.match_indices("aerospike_") {
        let name: String = dashboard[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(
            served.contains(name.as_str()),
            "the dashboard reads {name}, not served"
        );
        referenced += 1;
    }
    assert!(referenced >= 10, "the dashboard names {referenced} metrics");

    for (request, expected) in [
        (&b"GET /nothing HTTP/1.1\r\n\r\n"[..], 404),
        (b"POST /metrics HTTP/1.1\r\n\r\n", 405),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /metrics HTTP/9\r\n\r\n", 400),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),
    ] {
        assert_eq!(http(http_port, request).0, expected, "{request:?}");
    }
    let endless = vec![b'A'; 64 * 1024];
    let mut stream = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
    let _ = stream.write_all(&endless);
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer:?}");
    // A client that connects and says nothing, and one that leaves
    // half-way: the endpoint goes on.
    drop(TcpStream::connect(("127.0.0.1", http_port)).unwrap());
    let mut half = TcpStream::connect(("127.0.0.1", http_port)).unwrap();
    half.write_all(b"GET /met").unwrap();
    drop(half);
    let (status, _) = http(http_port, b"HEAD /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(status, 200);
    assert_eq!(http(http_port, b"GET /metrics HTTP/1.1\r\n\r\n").0, 200);
    assert_eq!(info_value(server.port, "namespaces"), "test");
}
