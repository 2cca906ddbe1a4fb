//! `citrine xdr`: every XDR destination (DC) of one node at a glance —
//! its nodes, and per namespace its state, lag, queue and counters —
//! from `get-config:context=xdr` and `get-stats:context=xdr;dc=…;namespace=…`.
//!
//! The table is built by [`table`] from the answers alone (pure), so its
//! layout is tested without a server.

use crate::{CliResult, HostArgs};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true)]
pub struct XdrArgs {
    #[command(flatten)]
    pub host: HostArgs,
}

/// One DC: its `get-config` answer and, per namespace, its statistics.
pub struct DcAnswers {
    pub name: String,
    pub config: String,
    pub namespaces: Vec<(String, String)>,
}

pub async fn run(args: XdrArgs) -> CliResult {
    let timeout = Duration::from_millis(args.host.timeout_ms);
    let host = &args.host.host;
    let ask = |command: String| async move {
        citrine_client::info_at(host, &[command.as_str()], timeout)
            .await
            .map(|answer| {
                answer
                    .into_iter()
                    .next()
                    .map(|(_, value)| value)
                    .unwrap_or_default()
            })
            .map_err(|error| format!("cannot talk to {host}: {error}"))
    };
    let names = ask("get-config:context=xdr".into()).await?;
    if citrine_client::conn::is_info_error(&names) {
        return Err(format!(
            "the server does not answer XDR's commands: {names}"
        ));
    }
    let mut dcs = Vec::new();
    for name in pair(&names, "dcs")
        .split(',')
        .filter(|name| !name.is_empty())
    {
        let config = ask(format!("get-config:context=xdr;dc={name}")).await?;
        let mut namespaces = Vec::new();
        for namespace in pair(&config, "namespaces")
            .split(',')
            .filter(|n| !n.is_empty())
        {
            let stats = ask(format!(
                "get-stats:context=xdr;dc={name};namespace={namespace}"
            ))
            .await?;
            namespaces.push((namespace.to_owned(), stats));
        }
        dcs.push(DcAnswers {
            name: name.to_owned(),
            config,
            namespaces,
        });
    }
    outln!("{}", table(&dcs));
    Ok(ExitCode::SUCCESS)
}

/// The value of `key` in a `k=v;k=v` answer ("" when absent).
fn pair<'a>(answer: &'a str, key: &str) -> &'a str {
    answer
        .split(';')
        .find_map(|item| item.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or("")
}

/// A namespace's state from its statistics.
fn state(stats: &str) -> &'static str {
    let number = |key| pair(stats, key).parse::<u64>().unwrap_or(0);
    if number("recoveries_pending") > 0 {
        "recovering"
    } else if number("in_queue") + number("in_progress") > 0 {
        "shipping"
    } else {
        "idle"
    }
}

/// The table people read: one line per DC and namespace.
pub fn table(dcs: &[DcAnswers]) -> String {
    if dcs.is_empty() {
        return "no XDR destination (set-config:context=xdr;dc=NAME;action=create)".to_owned();
    }
    let mut out = format!(
        "{:<12} {:<24} {:<12} {:<11} {:>6} {:>9} {:>9} {:>10} {:>8} {:>10}",
        "DC",
        "NODES",
        "NAMESPACE",
        "STATE",
        "LAG_S",
        "IN_QUEUE",
        "IN_FLIGHT",
        "SUCCESS",
        "RETRIES",
        "RECORDS/S"
    );
    for dc in dcs {
        let nodes = match pair(&dc.config, "node-address-ports") {
            "" => "(none)",
            nodes => nodes,
        };
        if dc.namespaces.is_empty() {
            out.push_str(&format!(
                "\n{:<12} {nodes:<24} {:<12} {:<11}",
                dc.name, "(none)", "idle"
            ));
        }
        for (namespace, stats) in &dc.namespaces {
            let retries = pair(stats, "retry_conn_reset").parse::<u64>().unwrap_or(0)
                + pair(stats, "retry_dest").parse::<u64>().unwrap_or(0);
            out.push_str(&format!(
                "\n{:<12} {nodes:<24} {namespace:<12} {:<11} {:>6} {:>9} {:>9} {:>10} {retries:>8} {:>10}",
                dc.name,
                state(stats),
                pair(stats, "lag"),
                pair(stats, "in_queue"),
                pair(stats, "in_progress"),
                pair(stats, "success"),
                pair(stats, "throughput"),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_dc_and_namespace() {
        let dcs = [
            DcAnswers {
                name: "dcb".into(),
                config: "node-address-ports=127.0.0.1:4410;namespaces=test".into(),
                namespaces: vec![(
                    "test".into(),
                    "lag=3;in_queue=5;in_progress=2;success=1600;retry_conn_reset=7;retry_dest=1;recoveries_pending=4;throughput=250".into(),
                )],
            },
            DcAnswers {
                name: "dcc".into(),
                config: "node-address-ports=;namespaces=".into(),
                namespaces: Vec::new(),
            },
        ];
        let text = table(&dcs);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let row: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            row,
            [
                "dcb",
                "127.0.0.1:4410",
                "test",
                "recovering",
                "3",
                "5",
                "2",
                "1600",
                "8",
                "250"
            ]
        );
        assert!(
            lines[2].starts_with("dcc") && lines[2].contains("(none)"),
            "{text}"
        );
        assert!(table(&[]).starts_with("no XDR destination"));
    }
}
