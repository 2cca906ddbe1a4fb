//! `citrine`: the command-line tool of Citrine.
//!
//! Owns argument parsing (clap derive) and dispatch to the subcommands:
//! `info` (asinfo-like), `get`/`put`/`delete`/`exists` (single records),
//! `scan`/`query`/`index` (many records, secondary indexes), `udf` (Lua
//! modules and calling them on a record),
//! `cluster` (node table), `bench` (load generator and no-op responder),
//! `verify` (Jepsen-style workloads and checkers against a live cluster),
//! `backup` and `restore` (asbackup-format files), `roster`
//! (strong-consistency rosters), `dev` (a local
//! cluster of `citrined` processes it starts and stops) and `act` (the ACT
//! device test on the device engine's I/O path).
//! Every failure ends with a message saying what to do and exit status 1.
//! Subcommands that take `-h HOST` disable clap's `-h` help short flag;
//! `--help` works everywhere.

/// `println!` that ends the process quietly when stdout is closed (`| head`)
/// instead of panicking on a broken pipe.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout().lock(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}

mod acl_cmd;
mod act;
mod backup;
mod bench;
mod certs;
mod dev;
mod info_cmd;
mod msgpack;
mod multi;
mod noop;
mod record;
mod roster_cmd;
mod tls_info;
mod udf_cmd;
mod verify_cmd;
mod xdr_cmd;

use clap::{ArgAction, Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "citrine",
    version,
    about = "Command-line tool for Citrine and any Aerospike-protocol server",
    long_about = "Command-line tool for Citrine (and any server speaking the Aerospike client protocol).\n\
                  Talks to a server at HOST[:PORT] (default 127.0.0.1:3000).\n\
                  No server yet? `citrine dev` starts a local 3-node cluster (ports 3000, 3100, 3200)\n\
                  and stops it on Ctrl-C.\n\
                  Examples:\n  citrine info -v build\n  citrine put -n test -s demo key1 a=1 b=hello\n  \
                  citrine get -n test -s demo key1\n  citrine scan -n test -s demo\n  \
                  citrine udf put counters.lua\n  citrine cluster\n  citrine bench -k 100000 -w ru,95 -d 10\n  \
                  citrine verify -n test --workload register --time 60s\n  \
                  citrine backup -n test -o test.asb\n  citrine restore -i test.asb\n  \
                  citrine dev --nodes 5 --port 4000\n  \
                  citrine act --device-names /work/act.dat --file-size-mbytes 4096 --test-duration-sec 60"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run info commands on one node (like asinfo).
    Info(info_cmd::InfoArgs),
    /// Read a record and print its bins.
    Get(record::RecordArgs),
    /// Write bins to a record: BIN=VALUE pairs or --json '{"bin":value}'.
    Put(record::RecordArgs),
    /// Delete a record.
    Delete(record::RecordArgs),
    /// Tell whether a record exists (exit status 0 = yes, 2 = no).
    Exists(record::RecordArgs),
    /// Stream every record of a namespace or set.
    Scan(multi::ScanArgs),
    /// Stream the records a secondary index selects (--equal or --range).
    Query(multi::QueryArgs),
    /// Create, drop or list secondary indexes.
    Index(multi::IndexArgs),
    /// Lua UDF modules: put, list, get, remove; execute a function on a record.
    Udf(udf_cmd::UdfArgs),
    /// Print a table of the cluster's nodes.
    Cluster(info_cmd::ClusterArgs),
    /// Benchmark a server (or run the no-op responder with --noop-server).
    Bench(Box<bench::BenchArgs>),
    /// Jepsen-style check of a live cluster: run a workload, check its history.
    Verify(verify_cmd::VerifyArgs),
    /// Back up a namespace to a file in asbackup's format (asrestore reads it).
    Backup(Box<backup::BackupArgs>),
    /// Restore a backup file (from `citrine backup` or asbackup) into a cluster.
    Restore(Box<backup::RestoreArgs>),
    /// Start a local cluster of N citrined nodes in memory; Ctrl-C stops them all.
    Dev(dev::DevArgs),
    /// ACT device test: record reads and large-block writes on a file or raw device.
    #[command(long_about = act::LONG_ABOUT)]
    Act(Box<act::ActArgs>),
    /// Show every XDR destination (DC) of a node: state, lag, queue, counters.
    Xdr(xdr_cmd::XdrArgs),
    /// Strong-consistency rosters: show them, stage one (--observed), apply (recluster).
    Roster(roster_cmd::RosterArgs),
    /// Users of a node with security on: create, drop, password, grant, revoke, list.
    User(acl_cmd::UserArgs),
    /// Roles of a node with security on: create, drop, grant, revoke, list.
    Role(acl_cmd::RoleArgs),
    /// Write a development CA and node/client certificates for TLS into DIR.
    Certs(certs::CertsArgs),
}

/// Shared `-h HOST[:PORT]` option; `--help` stays available as a long flag.
#[derive(clap::Args, Debug, Clone)]
pub struct HostArgs {
    /// Server to talk to, as HOST, HOST:PORT, [IPV6] or [IPV6]:PORT.
    #[arg(
        short = 'h',
        long = "host",
        default_value = "127.0.0.1:3000",
        value_name = "HOST[:PORT]"
    )]
    pub host: String,
    /// Timeout of each request, in milliseconds.
    #[arg(long = "timeout", default_value_t = 2000, value_name = "MS")]
    pub timeout_ms: u64,
    /// Print help.
    #[arg(long = "help", action = ArgAction::Help)]
    pub help: Option<bool>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The no-op responder runs on one thread: cheaper per request than a
    // work-stealing pool, and it leaves the other CPUs to the client.
    let single_thread = matches!(&cli.command, Command::Bench(args) if args.noop_server.is_some());
    let mut builder = if single_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("citrine: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Info(args) => info_cmd::run_info(args).await,
            Command::Get(args) => record::run(record::Action::Get, args).await,
            Command::Put(args) => record::run(record::Action::Put, args).await,
            Command::Delete(args) => record::run(record::Action::Delete, args).await,
            Command::Exists(args) => record::run(record::Action::Exists, args).await,
            Command::Scan(args) => multi::run_scan(args).await,
            Command::Query(args) => multi::run_query(args).await,
            Command::Index(args) => multi::run_index(args).await,
            Command::Udf(args) => udf_cmd::run(args).await,
            Command::Cluster(args) => info_cmd::run_cluster(args).await,
            Command::Bench(args) => bench::run(*args).await,
            Command::Verify(args) => verify_cmd::run(args).await,
            Command::Backup(args) => backup::run_backup(*args).await,
            Command::Restore(args) => backup::run_restore(*args).await,
            Command::Dev(args) => dev::run(args).await,
            Command::Act(args) => act::run(*args),
            Command::Xdr(args) => xdr_cmd::run(args).await,
            Command::Roster(args) => roster_cmd::run(args).await,
            Command::User(args) => acl_cmd::run_user(args).await,
            Command::Role(args) => acl_cmd::run_role(args).await,
            Command::Certs(args) => certs::run(args),
        }
    });
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("citrine: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Result of a subcommand: an exit code, or a message for the user.
pub type CliResult = Result<ExitCode, String>;

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    /// clap checks a command's definition (unique short flags, ...) only
    /// when that subcommand runs; this checks every one of them.
    #[test]
    fn every_subcommand_is_well_formed() {
        Cli::command().debug_assert();
    }
}
