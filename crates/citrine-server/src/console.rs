//! The web console on the `[http]` port: `GET /console` answers one static
//! page (`console.html`, compiled into the binary: no framework, no CDN,
//! it works offline) whose script polls `GET /console/state.json`, the
//! whole cluster as JSON built from the same info commands an operator
//! runs: `statistics`, `namespace/NS`, `replicas`, `latencies:`,
//! `roster:namespace=NS`, `get-config:context=xdr` and
//! `get-stats:context=xdr;dc=DC`.
//!
//! Design: the node serving the page gathers every member's answers over
//! the members' client ports (its own in-process), in parallel, each
//! bounded by [`PEER_TIMEOUT`]. The page therefore talks to one origin (no
//! cross-origin requests, no other node needs an HTTP port), and a node
//! that stops answering is still listed — as `unreachable` while it is in
//! the view, `gone` once the view dropped it — because the console
//! remembers every node it has seen ([`Console::seen`]). The page computes
//! throughput from the deltas of the cumulative counters between polls.
//!
//! Invariants: a peer's answer is read with a bounded size
//! ([`ANSWER_MAX`]) and time; nothing here runs on the service threads or
//! takes a lock they take (it reads the published cluster state and
//! statistics); a state built less than [`REUSE`] ago is served again, so
//! many open pages cost the cluster one gathering per [`REUSE`].

use crate::console_auth::{self, AskError, Login};
use citrine_service::Service;
use citrine_wire::info::{parse_response, request_frame};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The page, compiled into the binary.
pub const PAGE: &str = include_str!("console.html");

/// How long a peer may take to connect and answer.
pub const PEER_TIMEOUT: Duration = Duration::from_millis(1500);
/// The largest info answer read from a peer.
pub const ANSWER_MAX: u64 = 8 * 1024 * 1024;
/// A state younger than this is served again.
pub const REUSE: Duration = Duration::from_millis(500);
/// Nodes remembered at most (the oldest sightings are forgotten first).
const SEEN_MAX: usize = 256;
/// A node out of the view this long is forgotten.
const FORGET: Duration = Duration::from_secs(3600);

/// What the console remembers between polls (owned by the HTTP thread).
pub struct Console {
    service: Arc<Service>,
    /// Every node seen in a view: id → (service address, last seen).
    seen: BTreeMap<String, (String, Instant)>,
    /// The last state served, when it was built, and for whom (security
    /// on: the login it was gathered as).
    last: Option<(Instant, Option<Login>, String)>,
}

/// One node's info answers (or why there are none).
struct Answers {
    id: String,
    address: String,
    member: bool,
    result: Result<BTreeMap<String, String>, AskError>,
}

impl Console {
    pub fn new(service: Arc<Service>) -> Console {
        Console {
            service,
            seen: BTreeMap::new(),
            last: None,
        }
    }

    /// The JSON of `/console/state.json`, gathered as `login` (security
    /// on; `None`: off): this node's refusal of the login when it refuses
    /// it ([`console_auth`]).
    pub fn state_json(&mut self, login: Option<&Login>) -> Result<String, AskError> {
        if let Some((built, by, json)) = &self.last {
            if built.elapsed() < REUSE && by.as_ref() == login {
                return Ok(json.clone());
            }
        }
        let json = self.build(login)?.to_string();
        self.last = Some((Instant::now(), login.cloned(), json.clone()));
        Ok(json)
    }

    /// Whether this node accepts `login` (a login on its client port).
    pub fn verify(&self, login: &Login) -> Result<(), AskError> {
        let cluster = self.service.layers().cluster();
        let address = cluster
            .members
            .iter()
            .find(|member| member.node_id == cluster.self_id)
            .map(|member| member.service_address.clone())
            .ok_or_else(|| AskError::Failed("this node's address is not known yet".into()))?;
        let mut stream = connect(&address)?;
        console_auth::log_in(&mut stream, login)
    }

    /// Gathers every node's answers (as `login`) and shapes them.
    fn build(&mut self, login: Option<&Login>) -> Result<Value, AskError> {
        let service = self.service.clone();
        let layers = service.layers();
        let cluster = layers.cluster();
        let self_id = cluster.self_id.to_string();
        let namespaces: Vec<String> = layers
            .namespaces()
            .map(|namespace| namespace.config.name.clone())
            .collect();
        let now = Instant::now();
        let members: Vec<(String, String)> = cluster
            .members
            .iter()
            .map(|member| (member.node_id.to_string(), member.service_address.clone()))
            .collect();
        for (id, address) in &members {
            self.remember(id.clone(), address, now);
        }
        self.seen
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < FORGET);
        let targets: Vec<(String, String, bool)> = self
            .seen
            .iter()
            .map(|(id, (address, _))| {
                let member = members.iter().any(|(member, _)| member == id);
                (id.clone(), address.clone(), member)
            })
            .collect();
        let answers = gather(&service, (&self_id, login), &targets, &namespaces);
        let own = answers.iter().find(|node| node.id == self_id);
        if let Some(Err(refused @ AskError::Refused(_))) = own.map(|node| &node.result) {
            return Err(refused.clone());
        }
        if login.is_some() && own.is_none() {
            return Err(AskError::Failed("this node is not in its view yet".into()));
        }
        let key = citrine_service::info::cluster_key(&layers);
        Ok(shape(&self_id, &key, cluster.size(), &namespaces, &answers))
    }

    /// Notes a member's sighting (forgetting the oldest beyond
    /// [`SEEN_MAX`]).
    fn remember(&mut self, id: String, address: &str, now: Instant) {
        self.seen.insert(id, (address.to_owned(), now));
        while self.seen.len() > SEEN_MAX {
            let oldest = self
                .seen
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(id) => self.seen.remove(&id),
                None => break,
            };
        }
    }
}

/// The info commands asked of every node.
fn commands(namespaces: &[String]) -> Vec<String> {
    let mut commands: Vec<String> = [
        "node",
        "statistics",
        "replicas",
        "latencies:",
        "get-config:context=xdr",
    ]
    .iter()
    .map(|command| (*command).to_owned())
    .collect();
    for namespace in namespaces {
        commands.push(format!("namespace/{namespace}"));
        commands.push(format!("roster:namespace={namespace}"));
    }
    commands
}

/// Every target's answers, asked in parallel: this node's in-process, or
/// with security on over its client port too, logged in as `login`.
fn gather(
    service: &Service,
    (self_id, login): (&str, Option<&Login>),
    targets: &[(String, String, bool)],
    namespaces: &[String],
) -> Vec<Answers> {
    let commands = commands(namespaces);
    std::thread::scope(|scope| {
        let handles: Vec<_> = targets
            .iter()
            .map(|(id, address, member)| {
                let commands = &commands;
                let local = id == self_id && login.is_none();
                let handle = scope.spawn(move || match local {
                    true => Ok(ask_self(service, commands)),
                    false => ask_peer(address, commands, login),
                });
                (id, address, *member, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(id, address, member, handle)| Answers {
                id: id.clone(),
                address: address.clone(),
                member,
                result: handle
                    .join()
                    .unwrap_or_else(|_| Err(AskError::Failed("gathering failed".to_owned()))),
            })
            .collect()
    })
}

/// This node's answers, and its XDR DCs' statistics.
fn ask_self(service: &Service, commands: &[String]) -> BTreeMap<String, String> {
    let run = |commands: &[String]| {
        let body: String = commands.iter().map(|c| format!("{c}\n")).collect();
        let mut out = Vec::new();
        citrine_service::info::handle(service, body.as_bytes(), &mut out);
        parse_response(out.get(8..).unwrap_or_default())
    };
    let mut answers: BTreeMap<String, String> = run(commands).into_iter().collect();
    let more = dc_commands(&answers);
    if !more.is_empty() {
        answers.extend(run(&more));
    }
    answers
}

/// A node's answers over its client port (logged in as `login` first,
/// when there is one), and its XDR DCs' statistics.
fn ask_peer(
    address: &str,
    commands: &[String],
    login: Option<&Login>,
) -> Result<BTreeMap<String, String>, AskError> {
    let mut stream = connect(address)?;
    if let Some(login) = login {
        console_auth::log_in(&mut stream, login)?;
    }
    let mut answers: BTreeMap<String, String> = info_round(&mut stream, commands)
        .map_err(AskError::Failed)?
        .into_iter()
        .collect();
    let more = dc_commands(&answers);
    if !more.is_empty() {
        answers.extend(info_round(&mut stream, &more).map_err(AskError::Failed)?);
    }
    Ok(answers)
}

/// A connection to a node's client port, bounded by [`PEER_TIMEOUT`].
fn connect(address: &str) -> Result<TcpStream, AskError> {
    let socket = resolve(address).map_err(AskError::Failed)?;
    let stream = TcpStream::connect_timeout(&socket, PEER_TIMEOUT)
        .map_err(|error| AskError::Failed(format!("cannot connect to {address}: {error}")))?;
    let _ = stream.set_read_timeout(Some(PEER_TIMEOUT));
    let _ = stream.set_write_timeout(Some(PEER_TIMEOUT));
    Ok(stream)
}

/// `get-stats:context=xdr;dc=DC` for every DC `get-config:context=xdr`
/// names.
fn dc_commands(answers: &BTreeMap<String, String>) -> Vec<String> {
    let dcs = answers
        .get("get-config:context=xdr")
        .and_then(|value| value.strip_prefix("dcs="))
        .unwrap_or_default();
    dcs.split(',')
        .filter(|dc| !dc.is_empty())
        .map(|dc| format!("get-stats:context=xdr;dc={dc}"))
        .collect()
}

fn resolve(address: &str) -> Result<SocketAddr, String> {
    address
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
        .ok_or_else(|| format!("no address {address:?}"))
}

/// One info request and its answer, the answer bounded by [`ANSWER_MAX`].
fn info_round(
    stream: &mut TcpStream,
    commands: &[String],
) -> Result<Vec<(String, String)>, String> {
    let names: Vec<&str> = commands.iter().map(String::as_str).collect();
    let failed = |error: std::io::Error| format!("info failed: {error}");
    stream.write_all(&request_frame(&names)).map_err(failed)?;
    let mut header = [0u8; 8];
    stream.read_exact(&mut header).map_err(failed)?;
    let size = u64::from_be_bytes(header) & ((1 << 48) - 1);
    if header[0] != 2 || header[1] != 1 || size > ANSWER_MAX {
        return Err(format!("not an info answer (header {header:02x?})"));
    }
    let mut body = Vec::new();
    stream.take(size).read_to_end(&mut body).map_err(failed)?;
    if body.len() as u64 != size {
        return Err("info answer cut short".to_owned());
    }
    Ok(parse_response(&body))
}

/// The state: the cluster, its nodes, and each namespace's partition map.
fn shape(
    self_id: &str,
    cluster_key: &str,
    cluster_size: usize,
    namespaces: &[String],
    answers: &[Answers],
) -> Value {
    let nodes: Vec<Value> = answers
        .iter()
        .map(|node| node_json(node, cluster_key, namespaces))
        .collect();
    let mut partitions = Map::new();
    for namespace in namespaces {
        partitions.insert(namespace.clone(), partition_map(namespace, answers));
    }
    json!({
        "served_by": self_id,
        "cluster_key": cluster_key,
        "cluster_size": cluster_size,
        "time_ms": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64),
        "namespaces": namespaces,
        "nodes": nodes,
        "partitions": partitions,
    })
}

/// One node: its health and its figures, each info answer's pairs as an
/// object of strings.
fn node_json(node: &Answers, cluster_key: &str, namespaces: &[String]) -> Value {
    let answers = match &node.result {
        Err(error) => return silent(node, &error.to_string()),
        Ok(answers) => answers,
    };
    let get = |command: &str| answers.get(command).map_or("", String::as_str);
    let refusal = get("statistics");
    if refusal.is_empty() || refusal.starts_with("ERROR") {
        // A node with security on refuses a connection that has not
        // logged in: it answers, but no figures.
        return silent(node, &format!("no statistics: {refusal:?}"));
    }
    let statistics = pairs(get("statistics"), ';');
    let same_cluster = statistics.get("cluster_key").and_then(Value::as_str) == Some(cluster_key);
    let health = match (node.member, same_cluster) {
        (true, true) => "up",
        (_, false) => "other-cluster",
        (false, true) => "gone",
    };
    let mut per_namespace = Map::new();
    let mut rosters = Map::new();
    for namespace in namespaces {
        let figures = pairs(get(&format!("namespace/{namespace}")), ';');
        per_namespace.insert(namespace.clone(), Value::Object(figures));
        let roster = get(&format!("roster:namespace={namespace}"));
        if !roster.is_empty() && !roster.starts_with("ERROR") {
            rosters.insert(namespace.clone(), Value::Object(pairs(roster, ':')));
        }
    }
    let mut xdr = Map::new();
    for (command, value) in answers {
        if let Some(dc) = command.strip_prefix("get-stats:context=xdr;dc=") {
            if !value.starts_with("ERROR") {
                xdr.insert(dc.to_owned(), Value::Object(pairs(value, ';')));
            }
        }
    }
    json!({"id": node.id, "address": node.address, "member": node.member, "health": health,
           "statistics": statistics, "namespaces": per_namespace, "roster": rosters,
           "xdr": xdr, "latencies": latencies(get("latencies:"))})
}

/// A node without figures: `unreachable` in the view, `gone` out of it.
fn silent(node: &Answers, error: &str) -> Value {
    let health = if node.member { "unreachable" } else { "gone" };
    json!({"id": node.id, "address": node.address, "member": node.member,
           "health": health, "error": error})
}

/// `a=1;b=2` as an object of strings.
fn pairs(text: &str, separator: char) -> Map<String, Value> {
    text.split(separator)
        .filter_map(|pair| pair.split_once('='))
        .map(|(name, value)| (name.to_owned(), Value::String(value.to_owned())))
        .collect()
}

/// `latencies:` as `{name: [unit, ops/s, share>1, …]}` (histograms that
/// never counted left out).
fn latencies(text: &str) -> Value {
    let histograms: Map<String, Value> = text
        .split(';')
        .filter_map(|entry| entry.split_once(':'))
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| {
            let columns: Vec<Value> = value
                .split(',')
                .map(|column| Value::String(column.to_owned()))
                .collect();
            (name.to_owned(), Value::Array(columns))
        })
        .collect();
    Value::Object(histograms)
}

/// A namespace's partition map from every node's `replicas` answer: for
/// each of the 4096 partitions, the positions (in the node list) of its
/// master and replicas, `-1` where no node answered for that copy.
fn partition_map(namespace: &str, answers: &[Answers]) -> Value {
    let mut owners: Vec<Vec<i64>> = vec![Vec::new(); citrine_types::PARTITIONS];
    let mut copies = 0;
    for (position, node) in answers.iter().enumerate() {
        let Ok(node_answers) = &node.result else {
            continue;
        };
        let replicas = node_answers.get("replicas").map_or("", String::as_str);
        for (index, bitmap) in replica_bitmaps(replicas, namespace) {
            copies = copies.max(index + 1);
            for (partition, owner) in owners.iter_mut().enumerate() {
                if bit(&bitmap, partition) {
                    if owner.len() <= index {
                        owner.resize(index + 1, -1);
                    }
                    if owner[index] < 0 {
                        owner[index] = position as i64;
                    }
                }
            }
        }
    }
    for owner in &mut owners {
        owner.resize(copies.max(owner.len()), -1);
    }
    json!({"copies": copies, "owners": owners})
}

/// The bitmaps of `namespace` in a `replicas` answer
/// (`ns:regime,count,b64,b64;…`), each with its replica index.
fn replica_bitmaps(replicas: &str, namespace: &str) -> Vec<(usize, Vec<u8>)> {
    use base64::Engine as _;
    let Some(value) = replicas
        .split(';')
        .find_map(|entry| entry.strip_prefix(namespace)?.strip_prefix(':'))
    else {
        return Vec::new();
    };
    value
        .split(',')
        .skip(2)
        .enumerate()
        .filter_map(|(index, text)| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .ok()?;
            (bytes.len() * 8 >= citrine_types::PARTITIONS).then_some((index, bytes))
        })
        .collect()
}

/// Whether `partition`'s bit is set (most significant bit first).
fn bit(bitmap: &[u8], partition: usize) -> bool {
    bitmap
        .get(partition >> 3)
        .is_some_and(|byte| byte & (0x80 >> (partition & 7)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(id: &str, replicas: &str) -> Answers {
        let mut answers = BTreeMap::new();
        answers.insert("replicas".to_owned(), replicas.to_owned());
        answers.insert("statistics".to_owned(), "cluster_key=K;uptime=3".to_owned());
        Answers {
            id: id.to_owned(),
            address: String::new(),
            member: true,
            result: Ok(answers),
        }
    }

    fn bitmap(partitions: impl Iterator<Item = usize>) -> String {
        use base64::Engine as _;
        let mut bytes = vec![0u8; citrine_types::PARTITIONS / 8];
        for partition in partitions {
            bytes[partition >> 3] |= 0x80 >> (partition & 7);
        }
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn the_partition_map_joins_every_nodes_replicas() {
        let even = bitmap((0..4096).filter(|p| p % 2 == 0));
        let odd = bitmap((0..4096).filter(|p| p % 2 == 1));
        let a = answered("A", &format!("bar:0,1,{odd};test:0,2,{even},{odd}"));
        let b = answered("B", &format!("test:0,2,{odd},{even}"));
        let map = partition_map("test", &[a, b]);
        assert_eq!(map["copies"], 2);
        assert_eq!(map["owners"][0], json!([0, 1]));
        assert_eq!(map["owners"][4095], json!([1, 0]));
        let lonely = partition_map("test", &[answered("C", "test:0,1,garbage")]);
        assert_eq!(lonely["copies"], 0);
    }

    #[test]
    fn a_node_is_up_gone_unreachable_or_in_another_cluster() {
        let up = node_json(&answered("A", ""), "K", &[]);
        assert_eq!(up["health"], "up");
        assert_eq!(up["statistics"]["uptime"], "3");
        let other = node_json(&answered("A", ""), "OTHER", &[]);
        assert_eq!(other["health"], "other-cluster");
        let mut silent = answered("A", "");
        silent.result = Err(AskError::Failed("refused".to_owned()));
        assert_eq!(node_json(&silent, "K", &[])["health"], "unreachable");
        silent.member = false;
        assert_eq!(node_json(&silent, "K", &[])["health"], "gone");
        let mut refusing = answered("A", "");
        if let Ok(answers) = &mut refusing.result {
            answers.insert("statistics".into(), "ERROR:80:not authenticated".into());
        }
        let shown = node_json(&refusing, "K", &[]);
        assert_eq!(shown["health"], "unreachable");
        assert!(shown["error"]
            .as_str()
            .unwrap_or_default()
            .contains("ERROR:80"));
    }

    #[test]
    fn rosters_and_xdr_lag_are_shown_where_they_exist() {
        let mut node = answered("A", "");
        let Ok(answers) = &mut node.result else {
            unreachable!()
        };
        answers.insert("get-config:context=xdr".into(), "dcs=dc1,dc2".into());
        assert_eq!(
            dc_commands(answers),
            [
                "get-stats:context=xdr;dc=dc1",
                "get-stats:context=xdr;dc=dc2"
            ]
        );
        answers.insert(
            "get-stats:context=xdr;dc=dc1".into(),
            "lag=7;in_queue=3".into(),
        );
        answers.insert(
            "get-stats:context=xdr;dc=dc2".into(),
            "ERROR:4:DC dc2 not found".into(),
        );
        let roster = "roster=B@1,A@1:pending_roster=null:observed_nodes=A@1";
        answers.insert("roster:namespace=sc".into(), roster.into());
        answers.insert(
            "roster:namespace=ap".into(),
            "ERROR:4:namespace is not strong-consistency".into(),
        );
        let shown = node_json(&node, "K", &["sc".to_owned(), "ap".to_owned()]);
        assert_eq!(shown["xdr"], json!({"dc1": {"lag": "7", "in_queue": "3"}}));
        assert_eq!(shown["roster"]["sc"]["roster"], "B@1,A@1");
        assert_eq!(shown["roster"]["sc"]["observed_nodes"], "A@1");
        assert!(shown["roster"].get("ap").is_none());
        assert!(dc_commands(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn latencies_keep_the_histograms_that_counted() {
        let value = latencies("batch-index:;{test}-read:msec,1.0,0.00");
        assert_eq!(value, json!({"{test}-read": ["msec", "1.0", "0.00"]}));
    }
}
