//! The web console (`[http] port`, `GET /console` and
//! `GET /console/state.json`) of a real three-node cluster: the JSON shows
//! every node and the whole partition map; the page, loaded in headless
//! Chromium (Debian's `chromium`), shows three nodes and a moving
//! throughput plot, then a killed node gone and migrations run. The
//! browser part runs when `chromium` is installed (scripts/test.sh installs
//! it) and is required when `CITRINE_REQUIRE_CHROMIUM=1`; its screenshots
//! are kept in `target/console-artefacts/`.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_wire::msg::op_type;
use common::cluster::*;
use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One GET on the console's port: (status, body).
fn get(port: u16, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

fn state(port: u16) -> Value {
    let (status, body) = get(port, "/console/state.json");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The nodes' ids with this health.
fn with_health(state: &Value, health: &str) -> Vec<String> {
    state["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|node| node["health"] == health)
        .map(|node| node["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Partitions of `test` whose master is one of the listed nodes.
fn mastered(state: &Value) -> usize {
    let nodes = state["nodes"].as_array().unwrap().len() as i64;
    state["partitions"]["test"]["owners"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|owners| owners[0].as_i64().is_some_and(|m| (0..nodes).contains(&m)))
        .count()
}

/// A cluster of three whose first node serves the console on a port of
/// its own; (nodes, HTTP port).
fn console_cluster() -> (Vec<Node>, u16) {
    let http_port = free_port();
    let directory = std::env::temp_dir().join(format!("citrine-console-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let example = std::fs::read_to_string(workspace_root().join("examples/cluster.toml")).unwrap();
    let config = directory.join("console.toml");
    let with_http = example.replace(
        "[heartbeat]",
        &format!("[http]\nport = {http_port}\n\n[heartbeat]"),
    );
    std::fs::write(
        &config,
        with_http.replace("[service]", "[service]\nticker-interval = 1"),
    )
    .unwrap();
    let mut nodes: Vec<Node> = (0x58..0x5B).map(Node::new).collect();
    nodes[0].config = Some(config);
    let seed = nodes[0].heartbeat_address();
    nodes[0].start(&seed);
    let seed = nodes[0].heartbeat_address();
    for node in nodes.iter_mut().skip(1) {
        node.start(&seed);
    }
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&group, 3, Duration::from_secs(30));
    wait_for_stable(&group, Duration::from_secs(30));
    (nodes, http_port)
}

/// Writes to the cluster through `node` until `stop`; the writes
/// answered 0.
fn load(node: &Node, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let address = node.service_address();
    std::thread::spawn(move || {
        let (mut index, mut written) = (0u64, 0u64);
        while !stop.load(Ordering::Relaxed) {
            let Ok(mut stream) = TcpStream::connect(&address) else {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            while !stop.load(Ordering::Relaxed) {
                let key = format!("k{}", index % 5000);
                let request =
                    write_request("test", &key, &[(op_type::WRITE, 3, "v", b"value".to_vec())]);
                index += 1;
                match round_trip(&mut stream, &request) {
                    Ok((_, body)) if decode_reply(&body).0.result_code == 0 => written += 1,
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
        written
    })
}

#[test]
fn the_console_shows_the_cluster_and_follows_a_node_loss() {
    let (mut nodes, http_port) = console_cluster();
    let (status, page) = get(http_port, "/console");
    assert_eq!(status, 200);
    assert!(
        page.contains("/console/state.json")
            && !page.contains("http://")
            && !page.contains("https://")
    );
    assert_eq!(get(http_port, "/console/nothing").0, 404);

    let before = state(http_port);
    assert_eq!(before["cluster_size"], 3, "{before}");
    assert_eq!(with_health(&before, "up").len(), 3, "{before}");
    assert_eq!(before["partitions"]["test"]["copies"], 2);
    assert_eq!(mastered(&before), 4096, "every partition has a master");
    let key = before["cluster_key"].as_str().unwrap();
    for node in before["nodes"].as_array().unwrap() {
        assert_eq!(node["statistics"]["cluster_key"], key);
        assert!(node["namespaces"]["test"]["data_total_bytes"].is_string());
    }

    let stop = Arc::new(AtomicBool::new(false));
    let writer = load(&nodes[0], stop.clone());
    let browser = Browser::find();
    if let Some(browser) = &browser {
        browser.sees_three_nodes_and_moving_throughput(http_port, &nodes[0].id);
    }

    let lost = nodes[2].id.clone();
    nodes[2].kill();
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let now = state(http_port);
        let sent: u64 = now["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|node| node["statistics"]["migrate_partitions_sent"].as_str())
            .map(|sent| sent.parse::<u64>().unwrap())
            .sum();
        if with_health(&now, "gone") == [lost.clone()] && now["cluster_size"] == 2 && sent > 0 {
            break now;
        }
        assert!(Instant::now() < deadline, "no node loss seen: {now}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(with_health(&after, "up").len(), 2, "{after}");
    if let Some(browser) = &browser {
        browser.sees_the_node_gone(http_port, &lost);
    }
    stop.store(true, Ordering::Relaxed);
    assert!(writer.join().unwrap() > 0, "the load wrote");
    assert_eq!(
        mastered(&state(http_port)),
        4096,
        "the survivors master every partition"
    );
}

/// Headless Chromium, when installed.
struct Browser {
    binary: String,
    artefacts: std::path::PathBuf,
}

impl Browser {
    fn find() -> Option<Browser> {
        let required = std::env::var("CITRINE_REQUIRE_CHROMIUM").is_ok_and(|value| value == "1");
        let found = ["chromium", "chromium-browser"].into_iter().find(|binary| {
            std::process::Command::new(binary)
                .arg("--version")
                .output()
                .is_ok_and(|output| output.status.success())
        });
        match found {
            Some(binary) => {
                let artefacts = workspace_root().join("target/console-artefacts");
                std::fs::create_dir_all(&artefacts).unwrap();
                Some(Browser {
                    binary: binary.to_owned(),
                    artefacts,
                })
            }
            None if required => panic!("chromium is required (CITRINE_REQUIRE_CHROMIUM=1)"),
            None => {
                println!("skipped the browser checks: no chromium (apt-get install -y chromium)");
                None
            }
        }
    }

    /// Loads the page through [`slow_proxy`] for `polls` polls of virtual
    /// time; (the DOM once they ran, and a screenshot saved as `name`).
    fn load(&self, http_port: u16, polls: u32, name: &str) -> String {
        let proxy = slow_proxy(http_port);
        let url = format!("http://127.0.0.1:{proxy}/console");
        // Virtual time runs the page's timers at once; it stands still
        // while a request is open, and the proxy holds each poll open for
        // real time, so rates come from real intervals.
        let budget = format!("--virtual-time-budget={}", polls * 2000 + 500);
        let run = |extra: &[&str]| {
            let output = std::process::Command::new(&self.binary)
                .args([
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--window-size=1400,1900",
                ])
                .arg(&budget)
                .args(extra)
                .arg(&url)
                .output()
                .unwrap();
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        let screenshot = self.artefacts.join(name);
        run(&[&format!("--screenshot={}", screenshot.display())]);
        assert!(
            screenshot.exists(),
            "no screenshot {}",
            screenshot.display()
        );
        run(&["--dump-dom"])
    }

    fn sees_three_nodes_and_moving_throughput(&self, http_port: u16, served_by: &str) {
        let dom = self.load(http_port, 4, "console-three-nodes.png");
        let rows = attribute_texts(&dom, "class=\"node\" data-node=\"");
        assert_eq!(rows.len(), 3, "three node rows in\n{dom}");
        assert_eq!(dom.matches("data-health=\"up\"").count(), 3, "{dom}");
        assert!(dom.contains("data-mastered=\"4096\""), "{dom}");
        // The serving node's line in the per-node throughput plot: the
        // load goes through it.
        let served = format!("data-plot=\"tp-node\" data-series=\"{served_by}\" data-last=\"");
        let moving = attribute_values(&dom, &served);
        assert!(
            moving.iter().any(|last| *last > 0.0),
            "a throughput plot moves:\n{dom}"
        );
    }

    fn sees_the_node_gone(&self, http_port: u16, lost: &str) {
        let dom = self.load(http_port, 2, "console-node-gone.png");
        assert!(
            dom.contains(&format!("data-node=\"{lost}\" data-health=\"gone\"")),
            "{lost} gone in\n{dom}"
        );
        assert_eq!(dom.matches("data-health=\"up\"").count(), 2, "{dom}");
        let sent = attribute_values(&dom, "data-sent=\"");
        assert!(
            sent.iter().any(|sent| *sent > 0.0),
            "migrations ran:\n{dom}"
        );
    }
}

/// The values of an attribute (`prefix` ends with its opening quote) in
/// the rendered elements (not in the script that renders them).
fn attribute_texts<'t>(text: &'t str, prefix: &str) -> Vec<&'t str> {
    text.match_indices(prefix)
        .filter_map(|(at, _)| {
            let rest = &text[at + prefix.len()..];
            Some(&rest[..rest.find('"')?]).filter(|value| !value.starts_with('\''))
        })
        .collect()
}

/// The numeric values of an attribute (see [`attribute_texts`]).
fn attribute_values(text: &str, prefix: &str) -> Vec<f64> {
    attribute_texts(text, prefix)
        .into_iter()
        .filter_map(|value| value.parse().ok())
        .collect()
}

/// A proxy to the console that holds each `state.json` poll 700 ms before
/// passing it on (a slow network, in real time); its port. It serves
/// until the test process ends.
fn slow_proxy(http_port: u16) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            std::thread::spawn(move || relay(client, http_port));
        }
    });
    port
}

fn relay(mut client: TcpStream, http_port: u16) {
    let _ = client.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        match client.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(read) => head.extend_from_slice(&buffer[..read]),
        }
    }
    if String::from_utf8_lossy(&head).contains("state.json") {
        std::thread::sleep(Duration::from_millis(700));
    }
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", http_port)) else {
        return;
    };
    let mut answer = Vec::new();
    if server.write_all(&head).is_ok() && server.read_to_end(&mut answer).is_ok() {
        let _ = client.write_all(&answer);
    }
}
