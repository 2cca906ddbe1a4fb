//! `citrine udf`: Lua modules on the server (`put`, `list`, `get`,
//! `remove`) and calling a module's function on one record (`execute`).
//!
//! Owns the command-line forms of a UDF call — the record's key as
//! `citrine get` takes it, MODULE with or without `.lua`, each ARG as a
//! JSON value (packed as `citrine put --json` packs bin values; a bare word
//! that is not JSON is a string) — and the output: the function's return
//! value as one line of JSON, a module's source byte for byte, one line
//! per listed module. A module the server refuses or a function that
//! fails ends with the server's own message and exit status 1; a module
//! `get` cannot find exits with 2, as `citrine get` does for a record.

use crate::record::{connect, json_to_value, key_of, value_to_json, KeyType};
use crate::{CliResult, HostArgs};
use citrine_client::{udf_hash, Error, Key, Value, WritePolicy};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  citrine udf put ./counters.lua\n  citrine udf list\n  \
                  citrine udf get counters.lua > counters.lua\n  \
                  citrine udf execute -n test -s demo key1 counters bump hits 1\n  \
                  citrine udf remove counters.lua"
)]
pub struct UdfArgs {
    #[command(subcommand)]
    pub command: UdfCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum UdfCommand {
    /// Register a Lua module from FILE (named after the file) and wait until every node has it.
    #[command(disable_help_flag = true)]
    Put {
        #[command(flatten)]
        host: HostArgs,
        /// The Lua source file.
        file: PathBuf,
        /// Register it under this file name instead of FILE's (NAME.lua).
        #[arg(long = "name", value_name = "NAME")]
        name: Option<String>,
    },
    /// List the registered modules and the SHA-1 of each one's source.
    #[command(disable_help_flag = true)]
    List {
        #[command(flatten)]
        host: HostArgs,
    },
    /// Print a registered module's source.
    #[command(disable_help_flag = true)]
    Get {
        #[command(flatten)]
        host: HostArgs,
        /// The module's file name (`.lua` is added when missing).
        name: String,
    },
    /// Remove a module and wait until no node lists it.
    #[command(disable_help_flag = true)]
    Remove {
        #[command(flatten)]
        host: HostArgs,
        /// The module's file name (`.lua` is added when missing).
        name: String,
    },
    /// Call MODULE's FUNCTION on one record and print what it returned as JSON.
    #[command(
        disable_help_flag = true,
        after_help = "Each ARG is a JSON value: 42, 1.5, true, null, \"text\", [1,2], {\"k\":1};\n\
                      a bare word that is not JSON (hello) is the string \"hello\".\n\
                      The function is called as FUNCTION(record, ARG...); a failure prints the server's message.\n\
                      Examples:\n  citrine udf execute -n test -s demo key1 counters bump hits 1\n  \
                      citrine udf execute -n test 42 tools describe '{\"verbose\":true}'"
    )]
    Execute {
        #[command(flatten)]
        host: HostArgs,
        /// Namespace.
        #[arg(short = 'n', long = "namespace", default_value = "test")]
        namespace: String,
        /// Set (empty = no set).
        #[arg(short = 's', long = "set", default_value = "")]
        set: String,
        /// How to interpret KEY.
        #[arg(long = "key-type", value_enum, default_value_t = KeyType::Auto)]
        key_type: KeyType,
        /// Store the user key with the record (when the function writes it).
        #[arg(long = "send-key")]
        send_key: bool,
        /// The record's user key.
        key: String,
        /// The module's name: its file name without `.lua` (a trailing `.lua` is dropped).
        module: String,
        /// The function to call.
        function: String,
        /// The function's arguments after the record, as JSON values.
        #[arg(value_name = "ARG", allow_negative_numbers = true)]
        args: Vec<String>,
    },
}

/// A file name as the server names modules: `.lua` added when missing.
fn module_file_name(name: &str) -> String {
    if name.ends_with(".lua") {
        name.to_owned()
    } else {
        format!("{name}.lua")
    }
}

/// One command-line argument of a call: JSON, or a bare word as a string.
pub fn parse_arg(position: usize, text: &str) -> Result<Value, String> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(json) => json_to_value(&json).map_err(|why| format!("argument {position}: {why}")),
        Err(error) if text.trim_start().starts_with(['[', '{', '"']) => Err(format!(
            "argument {position} `{text}` is not valid JSON ({error}); e.g. [1,2], {{\"k\":1}}, \"text\""
        )),
        Err(_) => Ok(Value::String(text.to_owned())),
    }
}

/// The user-facing text of a client error, with a hint where one helps.
fn explain(error: Error) -> String {
    let hint = match &error {
        Error::Udf { message, .. } if message.contains("function not found") => {
            "\n  hint: `citrine udf get MODULE` shows the module's functions"
        }
        // "UDF: Execution Error 1" is the server's (and the reference's)
        // answer for a module it cannot load.
        Error::Udf { message, .. }
            if message.contains("not found") || message.contains("Execution Error 1") =>
        {
            "\n  hint: see `citrine udf list`; MODULE is the file name without .lua"
        }
        Error::UdfModule(refusal) if refusal.reason == "compile_error" => {
            "\n  hint: fix the Lua source and run `citrine udf put` again"
        }
        Error::UdfModule(refusal) if refusal.reason == "invalid_filename" => {
            "\n  hint: module file names end in .lua and use letters, digits, _ - and ."
        }
        Error::Server { code: 20, .. } => {
            "\n  hint: the namespace does not exist; list them with `citrine info namespaces`"
        }
        _ => "",
    };
    format!("{error}{hint}")
}

pub async fn run(args: UdfArgs) -> CliResult {
    match args.command {
        UdfCommand::Put { host, file, name } => put(&host, &file, name).await,
        UdfCommand::List { host } => {
            let client = connect(&host).await?;
            let modules = client.list_udfs().await.map_err(explain)?;
            if modules.is_empty() {
                eprintln!("no UDF modules");
            }
            for module in modules {
                outln!("{}  {}", module.filename, module.hash);
            }
            client.close();
            Ok(ExitCode::SUCCESS)
        }
        UdfCommand::Get { host, name } => get(&host, &name).await,
        UdfCommand::Remove { host, name } => {
            let name = module_file_name(&name);
            let client = connect(&host).await?;
            client.remove_udf(&name).await.map_err(explain)?;
            outln!("ok");
            client.close();
            Ok(ExitCode::SUCCESS)
        }
        UdfCommand::Execute {
            host,
            namespace,
            set,
            key_type,
            send_key,
            key,
            module,
            function,
            args,
        } => {
            let key = key_of(&namespace, &set, &key, key_type)?;
            execute(&host, send_key, &key, (&module, &function, &args)).await
        }
    }
}

/// `udf put`: registers the module in `file`, named `name` or as the file.
async fn put(host: &HostArgs, file: &Path, name: Option<String>) -> CliResult {
    let source =
        std::fs::read(file).map_err(|error| format!("cannot read {}: {error}", file.display()))?;
    let name = match name {
        Some(name) => module_file_name(&name),
        None => file
            .file_name()
            .and_then(|name| name.to_str())
            .map(str::to_owned)
            .ok_or_else(|| format!("{} has no file name; pass --name", file.display()))?,
    };
    let client = connect(host).await?;
    client.register_udf(&name, &source).await.map_err(explain)?;
    outln!("ok: {name} registered (sha1 {})", udf_hash(&source));
    client.close();
    Ok(ExitCode::SUCCESS)
}

/// `udf get`: writes the module's source to stdout (2 when there is none).
async fn get(host: &HostArgs, name: &str) -> CliResult {
    let name = module_file_name(name);
    let client = connect(host).await?;
    let source = client.get_udf(&name).await.map_err(explain)?;
    client.close();
    match source {
        Some(source) => {
            use std::io::Write as _;
            let mut stdout = std::io::stdout().lock();
            if stdout
                .write_all(&source)
                .and_then(|()| stdout.flush())
                .is_err()
            {
                // Closed stdout (`| head`): nothing more to say.
                return Ok(ExitCode::SUCCESS);
            }
            Ok(ExitCode::SUCCESS)
        }
        None => {
            eprintln!("no module {name} on the server (see `citrine udf list`)");
            Ok(ExitCode::from(2))
        }
    }
}

/// `udf execute`: calls `module.function(record, args...)` on `key` and
/// prints what it returned as JSON.
async fn execute(
    host: &HostArgs,
    send_key: bool,
    key: &Key,
    (module, function, args): (&str, &str, &[String]),
) -> CliResult {
    let module = module.strip_suffix(".lua").unwrap_or(module).to_owned();
    let args = args
        .iter()
        .enumerate()
        .map(|(index, text)| parse_arg(index + 1, text))
        .collect::<Result<Vec<_>, _>>()?;
    let client = connect(host).await?;
    let mut write = WritePolicy::default();
    write.base.total_timeout = Duration::from_millis(host.timeout_ms);
    write.base.send_key = send_key;
    let result = client
        .execute_udf(&write, key, &module, function, &args)
        .await
        .map_err(explain)?;
    outln!("{}", value_to_json(&result));
    client.close();
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_json_or_bare_strings() {
        assert_eq!(parse_arg(1, "42"), Ok(Value::Int(42)));
        assert_eq!(parse_arg(1, "-3"), Ok(Value::Int(-3)));
        assert_eq!(parse_arg(1, "1.5"), Ok(Value::Float(1.5)));
        assert_eq!(parse_arg(1, "true"), Ok(Value::Bool(true)));
        assert_eq!(parse_arg(1, "null"), Ok(Value::Nil));
        assert_eq!(parse_arg(1, "\"42\""), Ok(Value::String("42".into())));
        assert_eq!(parse_arg(1, "hello"), Ok(Value::String("hello".into())));
        assert!(matches!(parse_arg(1, "[1,2]"), Ok(Value::List(_))));
        assert!(matches!(parse_arg(1, r#"{"k":1}"#), Ok(Value::Map(_))));
        let bad = parse_arg(2, "[1,2").expect_err("broken JSON");
        assert!(
            bad.contains("argument 2") && bad.contains("not valid JSON"),
            "{bad}"
        );
        assert!(parse_arg(1, "\"open").is_err());
    }

    #[test]
    fn module_names_get_their_extension() {
        assert_eq!(module_file_name("m"), "m.lua");
        assert_eq!(module_file_name("m.lua"), "m.lua");
    }
}
