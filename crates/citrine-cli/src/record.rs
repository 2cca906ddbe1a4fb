//! `citrine get|put|delete|exists`: one record, addressed by namespace, set
//! and key, through the smart client.
//!
//! Owns the typing of command-line values: `BIN=VALUE` becomes an integer,
//! a float, `true`/`false`, or a string (quote it to force a string:
//! `name='"42"'`); `--json '{"bin":value}'` gives full JSON with lists and
//! maps packed as Aerospike msgpack. Keys are integers when they parse as
//! i64 unless `--key-type string` says otherwise (the digest depends on it).

use crate::{msgpack, CliResult, HostArgs};
use citrine_client::{
    Bin, Bins, Client, ClientConfig, Expiration, GenerationPolicy, Key, ReadPolicy,
    RecordExistsAction, Value, WritePolicy,
};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyType {
    /// Integer if the key parses as a 64-bit integer, else string.
    Auto,
    Int,
    String,
}

#[derive(clap::Args, Debug)]
#[command(
    disable_help_flag = true,
    after_help = "Values: 42 → integer, 1.5 → float, true/false → bool, anything else → string;\n\
                  quote to force a string: n='\"42\"'. Lists and maps: --json '{\"l\":[1,2],\"m\":{\"k\":\"v\"}}'.\n\
                  Examples:\n  citrine put -n test -s demo key1 a=1 b=hello c=2.5\n  \
                  citrine get -n test -s demo key1\n  citrine get -n test -s demo key1 a b\n  \
                  citrine exists -n test key1 && echo present\n  citrine delete -n test -s demo key1"
)]
pub struct RecordArgs {
    #[command(flatten)]
    pub host: HostArgs,
    /// Namespace.
    #[arg(short = 'n', long = "namespace", default_value = "test")]
    pub namespace: String,
    /// Set (empty = no set).
    #[arg(short = 's', long = "set", default_value = "")]
    pub set: String,
    /// How to interpret KEY.
    #[arg(long = "key-type", value_enum, default_value_t = KeyType::Auto)]
    pub key_type: KeyType,
    /// The record's user key.
    pub key: String,
    /// put: BIN=VALUE pairs; get: bin names to read (default all).
    #[arg(value_name = "BIN[=VALUE]")]
    pub bins: Vec<String>,
    /// put: bins as a JSON object.
    #[arg(long = "json", value_name = "OBJECT")]
    pub json: Option<String>,
    /// put: time to live in seconds (-1 never expire, 0 namespace default).
    #[arg(long = "ttl", allow_hyphen_values = true)]
    pub ttl: Option<i64>,
    /// put/delete: apply only if the record's generation equals this.
    #[arg(long = "generation")]
    pub generation: Option<u32>,
    /// put: fail if the record already exists.
    #[arg(long = "create-only")]
    pub create_only: bool,
    /// put: replace all bins instead of merging.
    #[arg(long = "replace")]
    pub replace: bool,
    /// Store the user key with the record.
    #[arg(long = "send-key")]
    pub send_key: bool,
    /// get: print the record as JSON.
    #[arg(long = "output-json")]
    pub output_json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Get,
    Put,
    Delete,
    Exists,
}

/// The error for a whole number an integer bin cannot hold (bins hold
/// signed 64-bit integers; it would otherwise become an inexact float).
fn out_of_range(text: &str) -> String {
    format!(
        "{text} does not fit a 64-bit signed integer ({}..={}); quote it to store it as a string",
        i64::MIN,
        i64::MAX
    )
}

/// Types a command-line value: a quoted string, an integer, `true`/`false`,
/// a float, else a string. A whole number out of the integer range is an
/// error, not a float.
pub fn parse_value(text: &str) -> Result<Value, String> {
    if text.len() >= 2
        && ((text.starts_with('"') && text.ends_with('"'))
            || (text.starts_with('\'') && text.ends_with('\'')))
    {
        return Ok(Value::String(text[1..text.len() - 1].to_owned()));
    }
    if let Ok(int) = text.parse::<i64>() {
        return Ok(Value::Int(int));
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(out_of_range(text));
    }
    match text {
        "true" => return Ok(Value::Bool(true)),
        "false" => return Ok(Value::Bool(false)),
        _ => {}
    }
    if text.chars().any(|c| c.is_ascii_digit()) {
        if let Ok(float) = text.parse::<f64>() {
            if float.is_finite() {
                return Ok(Value::Float(float));
            }
        }
    }
    Ok(Value::String(text.to_owned()))
}

/// Converts one JSON value to a bin value. A whole number out of the
/// integer range is an error (inside a list or map it is sent as msgpack's
/// unsigned 64-bit integer, which fits up to 2^64 - 1).
pub fn json_to_value(json: &serde_json::Value) -> Result<Value, String> {
    use serde_json::Value as J;
    Ok(match json {
        J::Null => Value::Nil,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => match n.as_i64() {
            Some(int) => Value::Int(int),
            None if n.is_u64() => return Err(out_of_range(&n.to_string())),
            None => Value::Float(n.as_f64().unwrap_or(0.0)),
        },
        J::String(s) => Value::String(s.clone()),
        J::Array(_) => {
            let mut out = Vec::new();
            msgpack::pack(json, &mut out);
            Value::List(out)
        }
        J::Object(_) => {
            let mut out = Vec::new();
            msgpack::pack(json, &mut out);
            Value::Map(out)
        }
    })
}

/// Builds the bins of a put from `BIN=VALUE` pairs and an optional JSON object.
pub fn parse_bins(pairs: &[String], json: Option<&str>) -> Result<Vec<Bin>, String> {
    let mut bins = Vec::new();
    for pair in pairs {
        let (name, value) = pair.split_once('=').ok_or_else(|| {
            format!("`{pair}` is not BIN=VALUE; write e.g. `count=1` or `name=alice`")
        })?;
        if name.is_empty() || name.len() > 15 {
            return Err(format!("bin name `{name}` must be 1 to 15 bytes"));
        }
        let value = parse_value(value).map_err(|why| format!("bin `{name}`: {why}"))?;
        bins.push(Bin::new(name, value));
    }
    if let Some(text) = json {
        let parsed: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            format!("--json is not valid JSON ({e}); example: --json '{{\"a\":1,\"l\":[1,2]}}'")
        })?;
        let object = parsed
            .as_object()
            .ok_or("--json must be a JSON object whose keys are bin names")?;
        for (name, value) in object {
            if name.is_empty() || name.len() > 15 {
                return Err(format!("bin name `{name}` must be 1 to 15 bytes"));
            }
            let value = json_to_value(value).map_err(|why| format!("bin `{name}`: {why}"))?;
            bins.push(Bin::new(name.clone(), value));
        }
    }
    Ok(bins)
}

/// Renders a value for people (lists and maps as JSON).
pub fn show_value(value: &Value) -> String {
    match value {
        Value::List(bytes) | Value::Map(bytes) => msgpack::to_json_text(bytes),
        other => other.to_string(),
    }
}

pub fn value_to_json(value: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        Value::Nil => J::Null,
        Value::Int(i) => J::from(*i),
        Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        Value::String(s) | Value::GeoJson(s) => J::String(s.clone()),
        Value::Bool(b) => J::Bool(*b),
        Value::Blob(b) | Value::Hll(b) => J::String(b.iter().map(|x| format!("{x:02x}")).collect()),
        Value::List(b) | Value::Map(b) => msgpack::unpack(b).unwrap_or(J::Null),
        Value::Raw { .. } => value_to_json(&value.cooked()),
    }
}

fn make_key(args: &RecordArgs) -> Result<Key, String> {
    key_of(&args.namespace, &args.set, &args.key, args.key_type)
}

/// The key of a record named on the command line (`--key-type` rules).
pub fn key_of(namespace: &str, set: &str, key: &str, key_type: KeyType) -> Result<Key, String> {
    let int = key.parse::<i64>();
    Ok(match (key_type, int) {
        (KeyType::Int, Ok(value)) | (KeyType::Auto, Ok(value)) => Key::new(namespace, set, value),
        (KeyType::Int, Err(_)) => {
            return Err(format!("--key-type int but `{key}` is not an integer"))
        }
        _ => Key::new(namespace, set, key),
    })
}

/// A client connected through `host`, or a message saying what to do.
pub async fn connect(host: &HostArgs) -> Result<Client, String> {
    let mut config = ClientConfig::new([host.host.clone()]);
    config.tend_timeout = Duration::from_millis(host.timeout_ms);
    Client::connect(config).await.map_err(|e| {
        format!(
            "cannot connect to {}: {e}\n  hint: start the server or pass -h HOST:PORT",
            host.host
        )
    })
}

pub async fn run(action: Action, args: RecordArgs) -> CliResult {
    let key = make_key(&args)?;
    // Check the arguments before touching the network.
    let put_bins = if action == Action::Put {
        let bins = parse_bins(&args.bins, args.json.as_deref())?;
        if bins.is_empty() {
            return Err("put needs at least one BIN=VALUE (or --json '{\"bin\":1}')".into());
        }
        bins
    } else {
        Vec::new()
    };
    let client = connect(&args.host).await?;
    let (read, write) = policies(&args)?;
    let code = match action {
        Action::Get => get(&client, &read, &key, &args).await?,
        Action::Put => {
            client.put(&write, &key, &put_bins).await.map_err(hint)?;
            outln!("ok");
            ExitCode::SUCCESS
        }
        Action::Delete => {
            if client.delete(&write, &key).await.map_err(hint)? {
                outln!("deleted");
                ExitCode::SUCCESS
            } else {
                eprintln!("record not found (nothing deleted)");
                ExitCode::from(2)
            }
        }
        Action::Exists => {
            if client.exists(&read, &key).await.map_err(hint)? {
                outln!("true");
                ExitCode::SUCCESS
            } else {
                outln!("false");
                ExitCode::from(2)
            }
        }
    };
    client.close();
    Ok(code)
}

/// The read and write policies the arguments ask for.
fn policies(args: &RecordArgs) -> Result<(ReadPolicy, WritePolicy), String> {
    let timeout = Duration::from_millis(args.host.timeout_ms);
    let mut read = ReadPolicy::default();
    read.base.total_timeout = timeout;
    read.base.send_key = args.send_key;
    let mut write = WritePolicy {
        base: read.base.clone(),
        ..WritePolicy::default()
    };
    if let Some(ttl) = args.ttl {
        write.expiration = expiration(ttl)?;
    }
    if let Some(generation) = args.generation {
        write.generation = GenerationPolicy::ExpectEqual(generation);
    }
    write.record_exists = match (args.create_only, args.replace) {
        (true, true) => return Err("--create-only and --replace cannot be combined".into()),
        (true, false) => RecordExistsAction::CreateOnly,
        (false, true) => RecordExistsAction::Replace,
        (false, false) => RecordExistsAction::Update,
    };
    Ok((read, write))
}

/// `--ttl`: -2 keeps the record's, -1 never expires, 0 is the namespace's
/// default, else seconds.
fn expiration(ttl: i64) -> Result<Expiration, String> {
    Ok(match ttl {
        -1 => Expiration::Never,
        -2 => Expiration::DontUpdate,
        0 => Expiration::NamespaceDefault,
        seconds if seconds > 0 => {
            Expiration::Seconds(u32::try_from(seconds).map_err(|_| "--ttl is too large")?)
        }
        _ => {
            return Err(
                "--ttl must be -2 (keep), -1 (never), 0 (default) or a positive number of seconds"
                    .into(),
            )
        }
    })
}

/// A client error, with a hint for the codes a user can act on.
fn hint(e: citrine_client::Error) -> String {
    let extra = match e.raw_code() {
        Some(20) => {
            "\n  hint: the namespace does not exist; list them with `citrine info namespaces`"
        }
        Some(3) => "\n  hint: the generation did not match; read the record to see its generation",
        Some(5) => "\n  hint: the record exists; drop --create-only to update it",
        Some(21) => "\n  hint: bin names are at most 15 bytes",
        _ => "",
    };
    format!("{e}{extra}")
}

/// `get`: prints the record (2 when there is none).
async fn get(
    client: &Client,
    read: &ReadPolicy,
    key: &Key,
    args: &RecordArgs,
) -> Result<ExitCode, String> {
    let bins = if args.bins.is_empty() {
        Bins::All
    } else {
        Bins::Names(args.bins.clone())
    };
    let Some(record) = client.get(read, key, bins).await.map_err(hint)? else {
        eprintln!(
            "record not found: {}/{}/{}",
            args.namespace, args.set, args.key
        );
        return Ok(ExitCode::from(2));
    };
    if args.output_json {
        let bins: serde_json::Map<String, serde_json::Value> = record
            .bins
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect();
        let out =
            serde_json::json!({"generation": record.generation, "ttl": record.ttl(), "bins": bins});
        outln!("{out}");
    } else {
        let ttl = record.ttl().map_or("never".to_owned(), |t| format!("{t}s"));
        outln!(
            "generation: {}  ttl: {ttl}  digest: {}",
            record.generation,
            key.digest.to_hex()
        );
        for (name, value) in &record.bins {
            outln!("  {name}: {}", show_value(value));
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_typed() {
        assert_eq!(parse_value("42"), Ok(Value::Int(42)));
        assert_eq!(parse_value("-7"), Ok(Value::Int(-7)));
        assert_eq!(parse_value("2.5"), Ok(Value::Float(2.5)));
        assert_eq!(parse_value("true"), Ok(Value::Bool(true)));
        assert_eq!(parse_value("false"), Ok(Value::Bool(false)));
        assert_eq!(parse_value("hello"), Ok(Value::String("hello".into())));
        assert_eq!(parse_value("\"42\""), Ok(Value::String("42".into())));
        assert_eq!(parse_value("inf"), Ok(Value::String("inf".into())));
        assert_eq!(parse_value("nan"), Ok(Value::String("nan".into())));
        // Whole numbers out of the integer range are refused, not rounded.
        assert_eq!(parse_value("9223372036854775807"), Ok(Value::Int(i64::MAX)));
        for text in [
            "9223372036854775808",
            "-9223372036854775809",
            "+99999999999999999999",
        ] {
            let error = parse_value(text).expect_err(text);
            assert!(error.contains("64-bit signed integer"), "{error}");
        }
        assert_eq!(
            parse_value("'18446744073709551615'"),
            Ok(Value::String("18446744073709551615".into()))
        );
        assert!(json_to_value(&serde_json::json!(18446744073709551615u64)).is_err());
        assert_eq!(json_to_value(&serde_json::json!(-5)), Ok(Value::Int(-5)));
        assert_eq!(
            json_to_value(&serde_json::json!(0.5)),
            Ok(Value::Float(0.5))
        );
    }

    #[test]
    fn bins_from_pairs_and_json() {
        let bins = parse_bins(
            &["a=1".into(), "b=x=y".into()],
            Some(r#"{"l":[1,"s"],"m":{"k":2},"f":1.5,"n":null}"#),
        )
        .expect("bins");
        assert_eq!(bins[0], Bin::new("a", 1i64));
        assert_eq!(bins[1], Bin::new("b", "x=y"));
        assert!(matches!(
            bins.iter().find(|b| b.name == "l").map(|b| &b.value),
            Some(Value::List(_))
        ));
        assert!(matches!(
            bins.iter().find(|b| b.name == "m").map(|b| &b.value),
            Some(Value::Map(_))
        ));
        assert_eq!(
            bins.iter().find(|b| b.name == "f").map(|b| &b.value),
            Some(&Value::Float(1.5))
        );
        assert!(parse_bins(&["noequals".into()], None).is_err());
        assert!(parse_bins(&["waytoolongbinname16=1".into()], None).is_err());
        assert!(parse_bins(&[], Some("[1]")).is_err());
        assert!(parse_bins(&[], Some("{bad")).is_err());
        let list = bins
            .iter()
            .find(|b| b.name == "l")
            .map(|b| show_value(&b.value));
        assert_eq!(list.as_deref(), Some(r#"[1,"s"]"#));
    }
}
