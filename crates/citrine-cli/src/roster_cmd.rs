//! `citrine roster`: the strong-consistency rosters of a node's namespaces
//! — roster, pending roster and observed nodes (`roster:`) — and staging
//! and applying one (`roster-set:`, `recluster:`), as asadm's `manage
//! roster stage observed` and `manage recluster` do, in one command with
//! `stage --observed --apply`.
//!
//! The answers are parsed and the table laid out by pure functions
//! ([`parse_all`], [`table`]), tested without a server.

use crate::{CliResult, HostArgs};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true)]
pub struct RosterArgs {
    #[command(flatten)]
    pub host: HostArgs,
    /// Without one: show every strong-consistency namespace's rosters.
    #[command(subcommand)]
    pub action: Option<RosterAction>,
}

#[derive(clap::Subcommand, Debug)]
pub enum RosterAction {
    /// Stage a namespace's pending roster (roster-set): the observed nodes,
    /// or the nodes given as ID[@RACK],...
    Stage {
        #[arg(short = 'n', long = "namespace")]
        namespace: String,
        /// Stage the nodes the cluster observes now (with their racks).
        #[arg(long, conflicts_with = "nodes")]
        observed: bool,
        /// The nodes, as ID[@RACK],... (the roster answer's format).
        #[arg(required_unless_present = "observed")]
        nodes: Option<String>,
        /// Apply it at once (recluster) after staging.
        #[arg(long)]
        apply: bool,
    },
    /// Apply every pending roster (recluster).
    Apply,
}

/// One namespace's `roster:` fields.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct NamespaceRoster {
    pub namespace: String,
    pub roster: String,
    pub pending: String,
    pub observed: String,
}

pub async fn run(args: RosterArgs) -> CliResult {
    let timeout = Duration::from_millis(args.host.timeout_ms);
    let host = args.host.host.as_str();
    match args.action {
        None => {
            let answer = ask(host, "roster:", timeout).await?;
            outln!("{}", table(&parse_all(&answer)?));
        }
        Some(RosterAction::Apply) => apply(host, timeout).await?,
        Some(RosterAction::Stage {
            namespace,
            observed,
            nodes,
            apply: and_apply,
        }) => {
            let nodes = match (observed, nodes) {
                (true, _) | (false, None) => observed_nodes(host, &namespace, timeout).await?,
                (false, Some(nodes)) => nodes,
            };
            let command = format!("roster-set:namespace={namespace};nodes={nodes}");
            ask(host, &command, timeout).await?;
            outln!("staged the pending roster of {namespace}: {nodes}");
            if and_apply {
                apply(host, timeout).await?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What a node that is not its view's principal answers `recluster:`.
const IGNORED: &str = "ignored-by-non-principal";

/// `recluster:` on the view's principal (its member with the highest node
/// id; any other node answers [`IGNORED`] and changes nothing): asked of
/// `host`, then, when `host` is not the principal, of the highest-id node
/// among the peers `host` lists.
async fn apply(host: &str, timeout: Duration) -> Result<(), String> {
    if ask(host, "recluster:", timeout).await? != IGNORED {
        outln!("applied the pending rosters (recluster)");
        return Ok(());
    }
    let peers = ask(host, "peers-clear-std", timeout).await?;
    let principal = citrine_client::peers::parse_peers(&peers)
        .ok()
        .and_then(|peers| principal_address(&peers))
        .ok_or_else(|| format!("recluster: {host} is not the principal and lists no peer"))?;
    if ask(&principal, "recluster:", timeout).await? == IGNORED {
        return Err(format!(
            "recluster: neither {host} nor {principal} is the principal (the view is changing?): try again"
        ));
    }
    outln!("applied the pending rosters (recluster, on the principal {principal})");
    Ok(())
}

/// The address of the node with the highest id in `peers` — the view's
/// principal when the node that listed them is not.
pub fn principal_address(peers: &citrine_client::peers::Peers) -> Option<String> {
    let peer = peers.peers.iter().max_by_key(|peer| peer.node_id)?;
    let (host, port) = peer.hosts.first()?;
    Some(match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    })
}

/// The observed nodes of `namespace`, refused when there are none.
async fn observed_nodes(host: &str, namespace: &str, timeout: Duration) -> Result<String, String> {
    let answer = ask(host, &format!("roster:namespace={namespace}"), timeout).await?;
    let fields = parse_fields(namespace, &answer)?;
    match fields.observed.as_str() {
        "" | "null" => Err(format!("{namespace}: the cluster observes no node")),
        _ => Ok(fields.observed),
    }
}

/// One info command's answer; an error answer is an error.
async fn ask(host: &str, command: &str, timeout: Duration) -> Result<String, String> {
    let answer = citrine_client::info_at(host, &[command], timeout)
        .await
        .map_err(|error| format!("cannot talk to {host}: {error}"))?
        .into_iter()
        .next()
        .map(|(_, value)| value)
        .unwrap_or_default();
    if citrine_client::conn::is_info_error(&answer) {
        return Err(format!("{command}: {answer}"));
    }
    Ok(answer)
}

/// Parses `roster=…:pending_roster=…:observed_nodes=…` of `namespace`.
pub fn parse_fields(namespace: &str, text: &str) -> Result<NamespaceRoster, String> {
    let field = |name: &str| {
        text.split(':')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_owned)
            .ok_or_else(|| format!("no {name} in the roster answer {text:?}"))
    };
    Ok(NamespaceRoster {
        namespace: namespace.to_owned(),
        roster: field("roster")?,
        pending: field("pending_roster")?,
        observed: field("observed_nodes")?,
    })
}

/// Parses the `roster:` answer of every namespace (`ns=NS:…;ns=…`).
pub fn parse_all(answer: &str) -> Result<Vec<NamespaceRoster>, String> {
    answer
        .split(';')
        .filter(|item| !item.is_empty())
        .map(|item| {
            let (head, rest) = item.split_once(':').unwrap_or((item, ""));
            let namespace = head
                .strip_prefix("ns=")
                .ok_or_else(|| format!("no ns= in the roster answer {item:?}"))?;
            parse_fields(namespace, rest)
        })
        .collect()
}

/// The rosters, one block per namespace, with what to do when the roster
/// is not the observed nodes.
pub fn table(rosters: &[NamespaceRoster]) -> String {
    if rosters.is_empty() {
        return "no strong-consistency namespace".to_owned();
    }
    let mut lines = Vec::new();
    for entry in rosters {
        lines.push(format!("namespace {}", entry.namespace));
        lines.push(format!("  roster          {}", entry.roster));
        lines.push(format!("  pending roster  {}", entry.pending));
        lines.push(format!("  observed nodes  {}", entry.observed));
        if entry.roster != entry.observed {
            lines.push(format!(
                "  the roster is not the observed nodes: `citrine roster stage -n {} --observed --apply` makes it so",
                entry.namespace
            ));
        }
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peer with the highest id is the principal; IPv6 hosts are
    /// bracketed; no peer, no principal.
    #[test]
    fn the_principal_is_the_peer_with_the_highest_id() {
        use citrine_client::peers::parse_peers;
        let peers =
            parse_peers("3,3000,[[A1,,[127.0.0.1:3001]],[B7,,[[::1]:3002]],[B2,,[10.0.0.2]]]")
                .expect("peers");
        assert_eq!(principal_address(&peers).as_deref(), Some("[::1]:3002"));
        let peers = parse_peers("3,3000,[[A1,,[127.0.0.1:3001]],[A3,,[10.0.0.2]]]").expect("peers");
        assert_eq!(principal_address(&peers).as_deref(), Some("10.0.0.2:3000"));
        let none = parse_peers("1,3000,[]").expect("peers");
        assert_eq!(principal_address(&none), None);
    }

    #[test]
    fn every_namespaces_roster_is_parsed_and_shown() {
        let answer = "ns=test:roster=A2@2,A1:pending_roster=A2@2,A1:observed_nodes=A2@2,A1;\
                      ns=sc:roster=null:pending_roster=null:observed_nodes=M1|A2@1";
        let rosters = parse_all(answer).expect("answer");
        assert_eq!(rosters.len(), 2);
        assert_eq!(rosters[1].observed, "M1|A2@1");
        let shown = table(&rosters);
        assert_eq!(
            shown,
            "namespace test\n  roster          A2@2,A1\n  pending roster  A2@2,A1\n  observed nodes  A2@2,A1\n\
             namespace sc\n  roster          null\n  pending roster  null\n  observed nodes  M1|A2@1\n  \
             the roster is not the observed nodes: `citrine roster stage -n sc --observed --apply` makes it so"
        );
        assert_eq!(
            table(&parse_all("").expect("empty")),
            "no strong-consistency namespace"
        );
        assert!(parse_all("roster=null").is_err());
        assert!(parse_fields("x", "roster=null:pending_roster=null").is_err());
    }
}
