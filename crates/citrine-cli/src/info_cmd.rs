//! `citrine info` (asinfo-like) and `citrine cluster` (node table).
//!
//! `info` talks to exactly one host over one connection; `cluster` uses the
//! smart client to discover every node, then asks each for `build`,
//! `replicas`, `statistics` and `cluster-key`. Missing or unparsable stats
//! print as `-`, so the table works against any protocol-speaking server.

use crate::{CliResult, HostArgs};
use citrine_client::partition::parse_replicas;
use citrine_client::{Client, ClientConfig};
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args, Debug)]
#[command(
    disable_help_flag = true,
    after_help = "Examples:\n  citrine info                      summary of 127.0.0.1:3000\n  \
                  citrine info -v build             value only\n  \
                  citrine info -h 10.0.0.1:3100 namespaces statistics\n  \
                  citrine info 'namespace/test'"
)]
pub struct InfoArgs {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub login: crate::acl_cmd::LoginArgs,
    /// Print only the value of this one command (scripts).
    #[arg(short = 'v', long = "value", value_name = "COMMAND")]
    pub value: Option<String>,
    /// Show raw values (no splitting of `k=v;k=v` lists onto lines).
    #[arg(short = 'r', long = "raw")]
    pub raw: bool,
    /// Info commands to run, e.g. `build`, `namespaces`, `namespace/test`.
    #[arg(value_name = "COMMAND")]
    pub commands: Vec<String>,
    #[command(flatten)]
    pub tls: crate::tls_info::TlsArgs,
}

/// Runs info commands on the one host `args` names, over TLS when
/// `--tls-name` is given.
async fn ask(
    args: &InfoArgs,
    commands: &[&str],
    timeout: Duration,
) -> Result<Vec<(String, String)>, String> {
    let credentials = args.login.credentials();
    if args.tls.tls_name.is_some() {
        let credentials = credentials.as_ref();
        return crate::tls_info::info(&args.host.host, commands, timeout, &args.tls, credentials)
            .await;
    }
    citrine_client::info_at_as(&args.host.host, commands, timeout, credentials.as_ref())
        .await
        .map_err(|e| connect_hint(&args.host.host, &e))
}

#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub host: HostArgs,
    /// Count only this namespace's partitions (default: every namespace's,
    /// added up; each namespace has 4096).
    #[arg(short = 'n', long = "namespace", value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

fn connect_hint(host: &str, error: &citrine_client::Error) -> String {
    format!("cannot talk to {host}: {error}\n  hint: is the server running? start it with `citrined --port PORT`, or pass -h HOST:PORT")
}

/// Lays a value out for people: `k=v;k=v` lists one item per line.
pub fn format_value(value: &str, indent: &str) -> String {
    if value.contains(';') {
        value
            .split(';')
            .filter(|item| !item.is_empty())
            .map(|item| format!("{indent}{item}"))
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        format!("{indent}{value}")
    }
}

pub async fn run_info(args: InfoArgs) -> CliResult {
    let timeout = Duration::from_millis(args.host.timeout_ms);
    if let Some(command) = &args.value {
        let answer = ask(&args, &[command], timeout).await?;
        let value = answer
            .into_iter()
            .find(|(name, _)| name == command)
            .map(|(_, value)| value)
            .unwrap_or_default();
        outln!("{value}");
        if citrine_client::conn::is_info_error(&value) {
            eprintln!("citrine: the server rejected `{command}`; check the command name (try `citrine info` for the summary)");
            return Ok(ExitCode::FAILURE);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let commands: Vec<&str> = args.commands.iter().map(String::as_str).collect();
    let mut answer = ask(&args, &commands, timeout).await?;
    if commands.is_empty() && answer.is_empty() {
        // The server has no summary answer: ask for the usual identity commands.
        let fallback = [
            "node",
            "build",
            "edition",
            "cluster-name",
            "namespaces",
            "partition-generation",
            "features",
            "service-clear-std",
            "peers-clear-std",
        ];
        answer = ask(&args, &fallback, timeout).await?;
    }
    let mut failed = false;
    if answer.len() == 1 && commands.len() == 1 {
        let value = &answer[0].1;
        failed |= citrine_client::conn::is_info_error(value);
        outln!(
            "{}",
            if args.raw {
                value.clone()
            } else {
                format_value(value, "")
            }
        );
    } else {
        for (name, value) in &answer {
            failed |= citrine_client::conn::is_info_error(value);
            outln!("{name}:");
            outln!(
                "{}",
                if args.raw {
                    format!("    {value}")
                } else {
                    format_value(value, "    ")
                }
            );
        }
    }
    if failed {
        eprintln!(
            "citrine: at least one command answered ERROR; check its spelling and parameters"
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Parses `k=v;k=v` into a map.
pub fn parse_kv(text: &str) -> HashMap<String, String> {
    text.split(';')
        .filter_map(|item| item.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// One row of the cluster table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub node: String,
    pub address: String,
    pub build: String,
    pub rack: String,
    pub masters: String,
    pub replicas: String,
    pub migrations: String,
    pub cluster_key: String,
}

/// Builds a row from a node's info answers (missing values become `-`),
/// counting the partitions of `namespace` only, or of every namespace.
pub fn node_row(
    node: String,
    address: String,
    answer: &HashMap<String, String>,
    namespace: Option<&str>,
) -> NodeRow {
    let good = |name: &str| {
        answer
            .get(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty() && !citrine_client::conn::is_info_error(v))
    };
    let stats = good("statistics")
        .map(|text| parse_kv(&text))
        .unwrap_or_default();
    let (masters, replicas) = match good("replicas").map(|text| parse_replicas(&text)) {
        Some(Ok(mut namespaces)) => {
            namespaces.retain(|ns| namespace.is_none_or(|only| ns.namespace == only));
            let masters: usize = namespaces.iter().map(|ns| ns.count(0)).sum();
            let replicas: usize = namespaces
                .iter()
                .map(|ns| (1..ns.columns.len()).map(|c| ns.count(c)).sum::<usize>())
                .sum();
            (masters.to_string(), replicas.to_string())
        }
        _ => ("-".into(), "-".into()),
    };
    let migrations = if stats.is_empty() {
        "-".to_owned()
    } else {
        stats
            .get("migrate_partitions_remaining")
            .cloned()
            .unwrap_or_else(|| "0".into())
    };
    let cluster_key = good("cluster-key")
        .or_else(|| stats.get("cluster_key").cloned())
        .unwrap_or_else(|| "-".into());
    NodeRow {
        node,
        address,
        build: good("build").unwrap_or_else(|| "-".into()),
        rack: good("rack-ids")
            .map(|text| rack_of(&text, namespace))
            .unwrap_or_else(|| "-".into()),
        masters,
        replicas,
        migrations,
        cluster_key,
    }
}

/// The rack a `rack-ids` answer (`ns:rack;ns:rack`) gives `namespace`, or
/// with no namespace the node's distinct racks joined by `,` (one, when a
/// node is in the same rack for all its namespaces); `-` when it names none.
fn rack_of(rack_ids: &str, namespace: Option<&str>) -> String {
    let mut racks: Vec<&str> = Vec::new();
    for (ns, rack) in rack_ids
        .split(';')
        .filter_map(|item| item.split_once(':'))
        .map(|(ns, rack)| (ns.trim(), rack.trim()))
    {
        if namespace.is_none_or(|only| only == ns) && !racks.contains(&rack) {
            racks.push(rack);
        }
    }
    if racks.is_empty() {
        "-".to_owned()
    } else {
        racks.join(",")
    }
}

/// Renders rows as an aligned text table.
pub fn render_table(rows: &[NodeRow]) -> String {
    let header = [
        "Node",
        "Address",
        "Build",
        "Rack",
        "Master parts",
        "Replica parts",
        "Migrations",
        "Cluster key",
    ];
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|row| {
            [
                row.node.clone(),
                row.address.clone(),
                row.build.clone(),
                row.rack.clone(),
                row.masters.clone(),
                row.replicas.clone(),
                row.migrations.clone(),
                row.cluster_key.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |values: Vec<&str>| {
        values
            .iter()
            .zip(widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = vec![line(header.to_vec())];
    out.push(
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  "),
    );
    for row in &cells {
        out.push(line(row.iter().map(String::as_str).collect()));
    }
    out.join("\n")
}

pub async fn run_cluster(args: ClusterArgs) -> CliResult {
    let mut config = ClientConfig::new([args.host.host.clone()]);
    config.tend_timeout = Duration::from_millis(args.host.timeout_ms);
    let client = Client::connect(config)
        .await
        .map_err(|e| connect_hint(&args.host.host, &e))?;
    let answers = client
        .info_all(&["build", "rack-ids", "replicas", "statistics", "cluster-key"])
        .await;
    let mut rows = Vec::new();
    let mut counted = std::collections::BTreeSet::new();
    for (node, answer) in answers {
        let answer = answer.unwrap_or_default();
        if let Some(Ok(namespaces)) = answer.get("replicas").map(|text| parse_replicas(text)) {
            counted.extend(namespaces.into_iter().map(|ns| ns.namespace));
        }
        rows.push(node_row(
            node.id.to_string(),
            node.address.to_string(),
            &answer,
            args.namespace.as_deref(),
        ));
    }
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    outln!("{}", render_table(&rows));
    let counted: Vec<String> = counted.into_iter().collect();
    match &args.namespace {
        Some(only) if !counted.contains(only) => {
            eprintln!(
                "citrine: no node has namespace `{only}` (namespaces: {}); partition counts are 0",
                counted.join(", ")
            );
            client.close();
            return Ok(ExitCode::FAILURE);
        }
        Some(only) => outln!("{} node(s); partitions of namespace {only}", rows.len()),
        None if counted.len() > 1 => outln!(
            "{} node(s); partitions of namespaces {} added up (-n NAMESPACE for one)",
            rows.len(),
            counted.join(", ")
        ),
        None => outln!("{} node(s)", rows.len()),
    }
    client.close();
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_split_for_people() {
        assert_eq!(format_value("a=1;b=2;", "  "), "  a=1\n  b=2");
        assert_eq!(format_value("8.1.2.0", ""), "8.1.2.0");
    }

    #[test]
    fn rows_fill_missing_with_dashes() {
        let bitmap = citrine_client::partition::encode_bitmap(&[0xFF; 512]);
        let mut answer = HashMap::new();
        answer.insert("build".to_owned(), "8.1.2.0".to_owned());
        answer.insert(
            "replicas".to_owned(),
            format!("test:0,2,{bitmap},{bitmap};bar:0,1,{bitmap}"),
        );
        answer.insert(
            "statistics".to_owned(),
            "cluster_key=ABC;migrate_partitions_remaining=7".to_owned(),
        );
        answer.insert(
            "cluster-key".to_owned(),
            "ERROR:4:unrecognized command".to_owned(),
        );
        answer.insert("rack-ids".to_owned(), "test:2;bar:5".to_owned());
        let only_bar = node_row("A1".into(), "x".into(), &answer, Some("bar"));
        assert_eq!(
            (
                only_bar.masters.as_str(),
                only_bar.replicas.as_str(),
                only_bar.rack.as_str()
            ),
            ("4096", "0", "5")
        );
        let row = node_row("A1".into(), "127.0.0.1:3000".into(), &answer, None);
        assert_eq!(row.masters, "8192");
        assert_eq!(row.replicas, "4096");
        assert_eq!(row.migrations, "7");
        assert_eq!(row.cluster_key, "ABC");
        assert_eq!(row.rack, "2,5");
        let same_rack = HashMap::from([("rack-ids".to_owned(), "test:3;bar:3".to_owned())]);
        assert_eq!(node_row("C".into(), "x".into(), &same_rack, None).rack, "3");
        let community =
            HashMap::from([("rack-ids".to_owned(), "ERROR:25:enterprise only".to_owned())]);
        assert_eq!(node_row("C".into(), "x".into(), &community, None).rack, "-");
        let empty = node_row("B2".into(), "x".into(), &HashMap::new(), None);
        assert_eq!(
            (
                empty.build.as_str(),
                empty.rack.as_str(),
                empty.masters.as_str(),
                empty.migrations.as_str(),
                empty.cluster_key.as_str()
            ),
            ("-", "-", "-", "-", "-")
        );
        let table = render_table(&[row, empty]);
        assert!(
            table.lines().count() == 4 && table.contains("Master parts"),
            "{table}"
        );
    }
}
