//! `citrine scan`, `citrine query` and `citrine index`: many records at
//! once, through the smart client's partition-tracked scans and queries,
//! and the secondary indexes queries use.
//!
//! Owns the command-line forms of a query condition (`--equal BIN=VALUE`,
//! `--range BIN=LOW..HIGH`, `--on list|mapkeys|mapvalues`) and the output:
//! one line per record for people, or one JSON object per line
//! (`--output-json`) for scripts; the record count goes to stderr so it
//! never mixes with the records.

use crate::record::{connect, parse_value, show_value, value_to_json};
use crate::{CliResult, HostArgs};
use citrine_client::{
    Bins, Client, IndexCollection, IndexFilter, IndexType, KeyRecord, PartitionFilter, ScanPolicy,
    Statement, UserKey, Value,
};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collection {
    /// The bin's value itself.
    Default,
    /// Each element of a list bin.
    List,
    /// Each key of a map bin.
    Mapkeys,
    /// Each value of a map bin.
    Mapvalues,
}

impl From<Collection> for IndexCollection {
    fn from(collection: Collection) -> IndexCollection {
        match collection {
            Collection::Default => IndexCollection::Default,
            Collection::List => IndexCollection::List,
            Collection::Mapkeys => IndexCollection::MapKeys,
            Collection::Mapvalues => IndexCollection::MapValues,
        }
    }
}

/// What `scan` and `query` share.
#[derive(clap::Args, Debug)]
pub struct ReadManyArgs {
    #[command(flatten)]
    pub host: HostArgs,
    /// Namespace.
    #[arg(short = 'n', long = "namespace", default_value = "test")]
    pub namespace: String,
    /// Set (empty = the whole namespace).
    #[arg(short = 's', long = "set", default_value = "")]
    pub set: String,
    /// Bins to print (default all).
    #[arg(value_name = "BIN")]
    pub bins: Vec<String>,
    /// Print keys and metadata only.
    #[arg(long = "no-bins")]
    pub no_bins: bool,
    /// Stop after this many records.
    #[arg(long = "max-records", default_value_t = 0, value_name = "N")]
    pub max_records: u64,
    /// Records a second each node sends (0 = as fast as it can).
    #[arg(long = "rps", default_value_t = 0, value_name = "N")]
    pub records_per_second: u32,
    /// Only partitions BEGIN..BEGIN+COUNT, as BEGIN:COUNT (ids 0..4096).
    #[arg(long = "partitions", value_name = "BEGIN:COUNT")]
    pub partitions: Option<String>,
    /// Print each record as a JSON object on its own line.
    #[arg(long = "output-json")]
    pub output_json: bool,
}

#[derive(clap::Args, Debug)]
#[command(
    disable_help_flag = true,
    after_help = "Prints one line per record and the count on stderr.\n\
                  Examples:\n  citrine scan -n test -s demo\n  citrine scan -n test -s demo a b --max-records 10\n  \
                  citrine scan -n test --no-bins --output-json | wc -l"
)]
pub struct ScanArgs {
    #[command(flatten)]
    pub common: ReadManyArgs,
}

#[derive(clap::Args, Debug)]
#[command(
    disable_help_flag = true,
    after_help = "The bin needs a secondary index of the value's type (see `citrine index create`).\n\
                  Examples:\n  citrine query -n test -s demo --range age=30..39\n  \
                  citrine query -n test -s demo --equal name=alice\n  \
                  citrine query -n test --range tags=5..5 --on list\n  \
                  citrine query -n test -s places --geo 'loc={\"type\":\"AeroCircle\",\"coordinates\":[[-122,37.5],5000]}'"
)]
pub struct QueryArgs {
    #[command(flatten)]
    pub common: ReadManyArgs,
    /// Records whose BIN equals VALUE (an integer or a string).
    #[arg(long = "equal", value_name = "BIN=VALUE", conflicts_with_all = ["range", "geo"])]
    pub equal: Option<String>,
    /// Records of a geo2dsphere index on BIN whose point lies in a GeoJSON
    /// region (Polygon, AeroCircle), or whose region holds a GeoJSON Point.
    #[arg(long = "geo", value_name = "BIN=GEOJSON", conflicts_with = "range")]
    pub geo: Option<String>,
    /// Records whose integer BIN is within LOW..HIGH (both included).
    #[arg(long = "range", value_name = "BIN=LOW..HIGH")]
    pub range: Option<String>,
    /// What of the bin the index holds.
    #[arg(long = "on", value_enum, default_value_t = Collection::Default)]
    pub on: Collection,
    /// Use this index (by name) instead of finding one by bin and type.
    #[arg(long = "index", value_name = "NAME")]
    pub index: Option<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Numeric,
    String,
    Blob,
    /// GeoJSON points and regions.
    Geo2dsphere,
}

#[derive(clap::Subcommand, Debug)]
pub enum IndexCommand {
    /// Create a secondary index and wait until every node has built it.
    #[command(disable_help_flag = true)]
    Create {
        #[command(flatten)]
        host: HostArgs,
        /// Namespace.
        #[arg(short = 'n', long = "namespace", default_value = "test")]
        namespace: String,
        /// Only this set's records (empty = the whole namespace).
        #[arg(short = 's', long = "set", default_value = "")]
        set: String,
        /// The index's name.
        name: String,
        /// The bin it indexes.
        bin: String,
        /// The type of the values it holds.
        #[arg(value_enum)]
        kind: KeyKind,
        /// What of the bin it holds.
        #[arg(long = "on", value_enum, default_value_t = Collection::Default)]
        on: Collection,
        /// Return once the server accepted it, without waiting for the build.
        #[arg(long = "no-wait")]
        no_wait: bool,
    },
    /// Drop a secondary index.
    #[command(disable_help_flag = true)]
    Drop {
        #[command(flatten)]
        host: HostArgs,
        /// Namespace.
        #[arg(short = 'n', long = "namespace", default_value = "test")]
        namespace: String,
        /// The index's name.
        name: String,
    },
    /// List the secondary indexes (of one namespace with -n).
    #[command(disable_help_flag = true)]
    List {
        #[command(flatten)]
        host: HostArgs,
        /// Only this namespace's indexes.
        #[arg(short = 'n', long = "namespace")]
        namespace: Option<String>,
    },
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  citrine index create -n test -s demo age_idx age numeric\n  \
                  citrine index create -n test tags_idx tags numeric --on list\n  \
                  citrine index list\n  citrine index drop -n test age_idx"
)]
pub struct IndexArgs {
    #[command(subcommand)]
    pub command: IndexCommand,
}

fn statement(args: &ReadManyArgs) -> Result<Statement, String> {
    let mut statement = Statement::new(args.namespace.clone(), args.set.clone());
    if args.no_bins {
        statement.bins = Bins::Header;
    } else if !args.bins.is_empty() {
        statement.bins = Bins::Names(args.bins.clone());
    }
    if let Some(text) = &args.partitions {
        let (begin, count) = text
            .split_once(':')
            .and_then(|(begin, count)| Some((begin.parse().ok()?, count.parse().ok()?)))
            .ok_or_else(|| format!("--partitions {text}: write BEGIN:COUNT, e.g. 0:1024"))?;
        statement.partitions = PartitionFilter::range(begin, count).map_err(|e| e.to_string())?;
    }
    Ok(statement)
}

/// The query condition from `--equal` / `--range`.
pub fn parse_filter(
    equal: Option<&str>,
    range: Option<&str>,
    on: Collection,
) -> Result<IndexFilter, String> {
    let filter = match (equal, range) {
        (Some(text), None) => {
            let (bin, value) = text
                .split_once('=')
                .ok_or_else(|| format!("--equal {text}: write BIN=VALUE, e.g. name=alice"))?;
            match parse_value(value).map_err(|why| format!("--equal {text}: {why}"))? {
                Value::Int(value) => IndexFilter::equal(bin, value),
                Value::String(value) => IndexFilter::equal(bin, value),
                other => {
                    return Err(format!(
                        "--equal {text}: {other:?} is neither an integer nor a string"
                    ))
                }
            }
        }
        (None, Some(text)) => {
            let parsed = text.split_once('=').and_then(|(bin, bounds)| {
                let (low, high) = bounds.split_once("..")?;
                Some((bin, low.trim().parse().ok()?, high.trim().parse().ok()?))
            });
            let (bin, low, high): (&str, i64, i64) = parsed.ok_or_else(|| {
                format!("--range {text}: write BIN=LOW..HIGH with integers, e.g. age=30..39")
            })?;
            if low > high {
                return Err(format!("--range {text}: LOW is above HIGH"));
            }
            IndexFilter::range(bin, low, high)
        }
        _ => {
            return Err(
                "a query needs --equal BIN=VALUE, --range BIN=LOW..HIGH or --geo BIN=GEOJSON"
                    .into(),
            )
        }
    };
    Ok(filter.on(on.into()))
}

pub async fn run_scan(args: ScanArgs) -> CliResult {
    let statement = statement(&args.common)?;
    read_many(&args.common, statement).await
}

pub async fn run_query(args: QueryArgs) -> CliResult {
    let mut statement = statement(&args.common)?;
    statement.filter = Some(match &args.geo {
        Some(text) => {
            let (bin, json) = text.split_once('=').ok_or_else(|| {
                format!("--geo {text}: write BIN=GEOJSON, e.g. loc='{{\"type\":\"AeroCircle\",\"coordinates\":[[-122,37.5],5000]}}'")
            })?;
            IndexFilter::geo(bin, json)
        }
        None => parse_filter(args.equal.as_deref(), args.range.as_deref(), args.on)?,
    });
    statement.index_name = args.index.clone();
    read_many(&args.common, statement).await
}

async fn read_many(args: &ReadManyArgs, statement: Statement) -> CliResult {
    let client = connect(&args.host).await?;
    let mut policy = ScanPolicy {
        max_records: args.max_records,
        records_per_second: args.records_per_second,
        include_bin_data: !args.no_bins,
        ..ScanPolicy::default()
    };
    policy.base.socket_timeout = Duration::from_millis(args.host.timeout_ms.max(1000));
    let mut stream = client
        .query(&policy, &statement)
        .map_err(|e| e.to_string())?;
    let mut count = 0u64;
    while let Some(record) = stream.next().await {
        let record = record.map_err(|error| {
            let hint = match error.raw_code() {
                Some(201) => "\n  hint: no index on that bin and type; create one with `citrine index create`",
                Some(203) => "\n  hint: the index is still being built; retry in a moment",
                Some(20) => "\n  hint: the namespace does not exist; list them with `citrine info namespaces`",
                _ => "",
            };
            format!("after {count} records: {error}{hint}")
        })?;
        count += 1;
        print_record(&record, args.output_json);
    }
    eprintln!("{count} records");
    client.close();
    Ok(ExitCode::SUCCESS)
}

fn print_record(record: &KeyRecord, json: bool) {
    let user_key = record.key.user_key.as_ref().map(|key| match key {
        UserKey::Integer(value) => serde_json::json!(value),
        UserKey::Float(value) => serde_json::json!(value),
        UserKey::String(value) => serde_json::json!(value),
        UserKey::Blob(value) => serde_json::json!(value
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect::<String>()),
    });
    if json {
        let bins: serde_json::Map<String, serde_json::Value> = record
            .record
            .bins
            .iter()
            .map(|(name, value)| (name.clone(), value_to_json(value)))
            .collect();
        let out = serde_json::json!({
            "digest": record.key.digest.to_hex(),
            "set": record.key.set,
            "key": user_key,
            "generation": record.record.generation,
            "ttl": record.record.ttl(),
            "bins": bins,
        });
        outln!("{out}");
        return;
    }
    let mut line = match user_key {
        Some(key) => format!("key={key}"),
        None => format!("digest={}", record.key.digest.to_hex()),
    };
    if !record.key.set.is_empty() {
        line.push_str(&format!(" set={}", record.key.set));
    }
    line.push_str(&format!(" gen={}", record.record.generation));
    for (name, value) in &record.record.bins {
        line.push_str(&format!(" {name}={}", show_value(value)));
    }
    outln!("{line}");
}

pub async fn run_index(args: IndexArgs) -> CliResult {
    match args.command {
        IndexCommand::Create {
            host,
            namespace,
            set,
            name,
            bin,
            kind,
            on,
            no_wait,
        } => {
            let client = connect(&host).await?;
            let kind = match kind {
                KeyKind::Numeric => IndexType::Numeric,
                KeyKind::String => IndexType::String,
                KeyKind::Blob => IndexType::Blob,
                KeyKind::Geo2dsphere => IndexType::Geo2DSphere,
            };
            client
                .create_index(&namespace, &set, &name, &bin, kind, on.into(), None)
                .await
                .map_err(|error| {
                    let hint = match error {
                        citrine_client::Error::Info { code: 200, .. } => {
                            "\n  hint: an index of that name (or on that bin and type) exists; see `citrine index list`"
                        }
                        _ => "",
                    };
                    format!("{error}{hint}")
                })?;
            if !no_wait {
                wait_built(&client, &namespace, &name).await?;
            }
            outln!("ok");
            client.close();
            Ok(ExitCode::SUCCESS)
        }
        IndexCommand::Drop {
            host,
            namespace,
            name,
        } => {
            let client = connect(&host).await?;
            client
                .drop_index(&namespace, &name)
                .await
                .map_err(|error| {
                    format!("{error}\n  hint: see `citrine index list` for the names")
                })?;
            outln!("ok");
            client.close();
            Ok(ExitCode::SUCCESS)
        }
        IndexCommand::List { host, namespace } => {
            let client = connect(&host).await?;
            let command = match &namespace {
                Some(namespace) => format!("sindex-list:ns={namespace}"),
                None => "sindex-list".to_owned(),
            };
            let node = client
                .nodes()
                .first()
                .map(|node| node.id)
                .ok_or("the cluster has no node")?;
            let answers = client
                .info(node, &[command.as_str()])
                .await
                .map_err(|e| e.to_string())?;
            let text = answers.get(&command).cloned().unwrap_or_default();
            let mut any = false;
            for entry in text.split(';').filter(|entry| !entry.is_empty()) {
                any = true;
                outln!("{}", entry.replace(':', "  "));
            }
            if !any {
                eprintln!("no secondary indexes");
            }
            client.close();
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn wait_built(client: &Client, namespace: &str, name: &str) -> Result<(), String> {
    client
        .wait_for_index(namespace, name, Duration::from_secs(600))
        .await
        .map_err(|error| format!("the index was created but is not built everywhere: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use citrine_client::FilterValue;

    #[test]
    fn conditions_parse() {
        let equal = parse_filter(Some("name=alice"), None, Collection::Default).expect("equal");
        assert_eq!(equal.begin, FilterValue::String("alice".into()));
        let number = parse_filter(Some("n=42"), None, Collection::List).expect("equal");
        assert_eq!(number.begin, FilterValue::Int(42));
        assert_eq!(number.collection, IndexCollection::List);
        let range = parse_filter(None, Some("age=30..39"), Collection::Default).expect("range");
        assert_eq!(
            (range.begin, range.end),
            (FilterValue::Int(30), FilterValue::Int(39))
        );
        let negative = parse_filter(None, Some("t=-5..-1"), Collection::Default).expect("range");
        assert_eq!(negative.begin, FilterValue::Int(-5));
        for bad in ["age", "age=1", "age=a..b", "age=9..1"] {
            assert!(
                parse_filter(None, Some(bad), Collection::Default).is_err(),
                "{bad}"
            );
        }
        assert!(parse_filter(Some("f=1.5"), None, Collection::Default).is_err());
        assert!(parse_filter(None, None, Collection::Default).is_err());
    }
}
