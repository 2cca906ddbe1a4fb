//! `citrine backup` and `citrine restore`: a namespace to a file in
//! asbackup's text format ("Version 3.1") and back, online, against
//! Citrine or any Aerospike-protocol cluster, so files move between these
//! commands and Aerospike's asbackup/asrestore both ways.
//!
//! Owns the command lines and what both directions share: the scope of a
//! backup (partitions, from a partition list or the nodes named), the
//! filter expression a backup sends (sets, modification times, the
//! user's own), time parsing. [`dump`] runs a backup, [`load`] a restore,
//! [`io`] the file's compression and encryption, [`state`] the journal
//! that makes a backup resumable, [`progress`] the status line and
//! summary. The file format itself is the `citrine-backup` crate.

mod dump;
pub mod io;
mod load;
mod progress;
mod state;

use crate::HostArgs;
use base64::Engine as _;
use io::{Compression, Encryption};
use std::path::PathBuf;

pub use dump::run as run_backup;
pub use load::run as run_restore;

/// How the file's bytes are stored: shared by backup and restore.
#[derive(clap::Args, Debug, Clone)]
pub struct FileArgs {
    /// Compress the file (as asbackup -z zstd). Restore recognises a zstd
    /// file by itself.
    #[arg(short = 'z', long = "compress", value_name = "ALGORITHM")]
    pub compress: Option<Compression>,
    /// zstd compression level (1 fast .. 19 small).
    #[arg(long = "compression-level", default_value_t = 3, value_name = "N")]
    pub compression_level: i32,
    /// Encrypt the file with AES (as asbackup -y); needs --encryption-key-file.
    #[arg(short = 'y', long = "encrypt", value_name = "MODE")]
    pub encrypt: Option<Encryption>,
    /// A PEM RSA private key (e.g. from `openssl genrsa`); the AES key is
    /// derived from it exactly as asbackup derives it.
    #[arg(long = "encryption-key-file", value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Seconds between progress lines when stderr is not a terminal.
    #[arg(
        long = "progress-interval",
        default_value_t = 5,
        value_name = "SECONDS"
    )]
    pub progress_interval: u64,
}

impl FileArgs {
    fn transform(&self) -> Result<io::Transform, String> {
        io::Transform::new(
            self.compress,
            self.compression_level,
            self.encrypt,
            self.key_file.as_deref(),
        )
    }
}

#[derive(clap::Args, Debug)]
#[command(
    disable_help_flag = true,
    after_help = "Writes every record of a namespace (or of some sets, bins, partitions or nodes) to one\n\
                  file in asbackup's text format, which asrestore and `citrine restore` read. The\n\
                  secondary-index definitions and UDF modules go first. Each node streams the\n\
                  partitions it masters; --parallel partitions are read at once. An interrupted\n\
                  backup leaves FILE.state: run the same command with --continue to finish it.\n\
                  Examples:\n  citrine backup -n test -o test.asb\n  \
                  citrine backup -h 10.0.0.1:3000 -n test -s users,orders -o part.asb -z zstd\n  \
                  citrine backup -n test -o new.asb --modified-after 2026-01-01_00:00:00\n  \
                  citrine backup -n test -o half.asb --partition-list 0-2048\n  \
                  citrine backup -n test -o test.asb --continue"
)]
pub struct BackupArgs {
    #[command(flatten)]
    pub host: HostArgs,
    /// Namespace to back up.
    #[arg(short = 'n', long = "namespace")]
    pub namespace: String,
    /// The backup file to write.
    #[arg(short = 'o', long = "output-file", value_name = "FILE")]
    pub output: PathBuf,
    /// Only these sets (comma-separated).
    #[arg(
        short = 's',
        long = "set",
        value_name = "SET[,SET...]",
        value_delimiter = ','
    )]
    pub sets: Vec<String>,
    /// Only these bins (comma-separated).
    #[arg(
        short = 'B',
        long = "bin-list",
        value_name = "BIN[,BIN...]",
        value_delimiter = ','
    )]
    pub bins: Vec<String>,
    /// Only records last written at or after this time (UTC,
    /// YYYY-MM-DD_HH:MM:SS, or seconds since 1970).
    #[arg(short = 'a', long = "modified-after", value_name = "TIME")]
    pub modified_after: Option<String>,
    /// Only records last written before this time.
    #[arg(short = 'b', long = "modified-before", value_name = "TIME")]
    pub modified_before: Option<String>,
    /// Only records this filter expression selects (base64 of its msgpack,
    /// as the clients' Exp.build/base64 gives it).
    #[arg(short = 'f', long = "filter-exp", value_name = "BASE64")]
    pub filter_exp: Option<String>,
    /// Only the partitions these nodes master (HOST:PORT, comma-separated).
    #[arg(
        short = 'l',
        long = "node-list",
        value_name = "HOST:PORT[,...]",
        value_delimiter = ','
    )]
    pub node_list: Vec<String>,
    /// Only these partitions: BEGIN-COUNT ranges or single ids (0..4095).
    #[arg(
        short = 'X',
        long = "partition-list",
        value_name = "RANGE[,...]",
        value_delimiter = ','
    )]
    pub partition_list: Vec<String>,
    /// Partitions read at once (spread over the nodes that master them).
    #[arg(long = "parallel", default_value_t = 16, value_name = "N")]
    pub parallel: usize,
    /// Records a second each node sends per partition read (0 = no limit).
    #[arg(
        short = 'L',
        long = "records-per-second",
        default_value_t = 0,
        value_name = "N"
    )]
    pub records_per_second: u32,
    /// Write blobs, lists, maps and HLLs as raw bytes instead of base64.
    #[arg(short = 'C', long = "compact")]
    pub compact: bool,
    /// Leave out the records (indexes and UDF modules only).
    #[arg(short = 'R', long = "no-records")]
    pub no_records: bool,
    /// Leave out the secondary-index definitions.
    #[arg(short = 'I', long = "no-indexes")]
    pub no_indexes: bool,
    /// Leave out the UDF modules.
    #[arg(short = 'u', long = "no-udfs")]
    pub no_udfs: bool,
    /// Continue the interrupted backup to the same file (from FILE.state).
    #[arg(long = "continue")]
    pub resume: bool,
    #[command(flatten)]
    pub file: FileArgs,
}

#[derive(clap::Args, Debug)]
#[command(
    disable_help_flag = true,
    after_help = "Reads a backup file (from `citrine backup` or asbackup) and writes its UDF modules,\n\
                  secondary indexes and records into the cluster. By default a record is written\n\
                  unless the cluster holds it with the same or a higher generation (as asrestore\n\
                  does); --unique writes only records the cluster lacks, --replace replaces\n\
                  whole records, --no-generation writes regardless of generations. A damaged\n\
                  file stops the restore at the damage, naming the line; what came before stays.\n\
                  Records go in batch write commands of --batch-size records (as asrestore's\n\
                  batch mode), or one by one with --disable-batch-writes.\n\
                  Examples:\n  citrine restore -i test.asb\n  \
                  citrine restore -h 10.0.0.2:3000 -i test.asb --namespace test,copy --unique\n  \
                  citrine restore -i test.asb.zst --tps 5000"
)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub host: HostArgs,
    /// The backup file to read.
    #[arg(short = 'i', long = "input-file", value_name = "FILE")]
    pub input: PathBuf,
    /// Restore namespace SOURCE into TARGET (default: the file's own).
    #[arg(short = 'n', long = "namespace", value_name = "SOURCE[,TARGET]")]
    pub namespace: Option<String>,
    /// Only records of these sets (comma-separated).
    #[arg(
        short = 's',
        long = "set-list",
        value_name = "SET[,SET...]",
        value_delimiter = ','
    )]
    pub sets: Vec<String>,
    /// Only these bins (comma-separated).
    #[arg(
        short = 'B',
        long = "bin-list",
        value_name = "BIN[,BIN...]",
        value_delimiter = ','
    )]
    pub bins: Vec<String>,
    /// Single-record writes in flight at once (with --disable-batch-writes).
    #[arg(long = "parallel", default_value_t = 32, value_name = "N")]
    pub parallel: usize,
    /// Records per batch write command (asrestore's default, 128).
    #[arg(long = "batch-size", default_value_t = 128, value_name = "N")]
    pub batch_size: usize,
    /// Batch write commands in flight at once (asrestore's default, 32).
    #[arg(long = "max-async-batches", default_value_t = 32, value_name = "N")]
    pub max_async_batches: usize,
    /// Write each record on its own instead of in batch write commands.
    #[arg(long = "disable-batch-writes")]
    pub disable_batch_writes: bool,
    /// Write only records the cluster does not hold.
    #[arg(long = "unique", conflicts_with = "replace")]
    pub unique: bool,
    /// Replace whole records (bins the backup lacks are removed).
    #[arg(long = "replace")]
    pub replace: bool,
    /// Write even where the cluster holds the same or a higher generation.
    #[arg(long = "no-generation")]
    pub no_generation: bool,
    /// At most this many records written a second (0 = no limit).
    #[arg(long = "tps", default_value_t = 0, value_name = "N")]
    pub tps: u32,
    /// Leave out the records.
    #[arg(short = 'R', long = "no-records")]
    pub no_records: bool,
    /// Leave out the secondary indexes.
    #[arg(short = 'I', long = "no-indexes")]
    pub no_indexes: bool,
    /// Leave out the UDF modules.
    #[arg(short = 'u', long = "no-udfs")]
    pub no_udfs: bool,
    #[command(flatten)]
    pub file: FileArgs,
}

/// The filter expression of a backup's options (msgpack), if any.
fn backup_filter(args: &BackupArgs) -> Result<Option<Vec<u8>>, String> {
    let mut terms: Vec<Vec<u8>> = Vec::new();
    if args.sets.len() > 1 {
        let mut any = Vec::new();
        array(&mut any, args.sets.len() + 1);
        any.push(17); // OR
        for set in &args.sets {
            any.extend_from_slice(&[0x93, 1, 0x91, 70]); // [EQ, [SET_NAME], ...]
            let mut literal = vec![3]; // a string particle
            literal.extend_from_slice(set.as_bytes());
            string(&mut any, &literal);
        }
        terms.push(any);
    }
    for (option, code, name) in [
        (&args.modified_after, 4u8, "--modified-after"), // GE
        (&args.modified_before, 5u8, "--modified-before"), // LT
    ] {
        if let Some(text) = option {
            let nanos = parse_time(text).map_err(|error| format!("{name}: {error}"))?;
            let mut term = vec![0x93, code, 0x91, 66]; // [op, [LAST_UPDATE], ns]
            term.push(0xd3);
            term.extend_from_slice(&nanos.to_be_bytes());
            terms.push(term);
        }
    }
    if let Some(text) = &args.filter_exp {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| "--filter-exp: not base64".to_string())?;
        terms.push(bytes);
    }
    Ok(match terms.len() {
        0 => None,
        1 => terms.pop(),
        count => {
            let mut all = Vec::new();
            array(&mut all, count + 1);
            all.push(16); // AND
            terms.iter().for_each(|term| all.extend_from_slice(term));
            Some(all)
        }
    })
}

fn array(out: &mut Vec<u8>, count: usize) {
    if count < 16 {
        out.push(0x90 | count as u8);
    } else {
        out.push(0xdc);
        out.extend_from_slice(&(count as u16).to_be_bytes());
    }
}

fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    if bytes.len() < 32 {
        out.push(0xa0 | bytes.len() as u8);
    } else if bytes.len() < 256 {
        out.extend_from_slice(&[0xd9, bytes.len() as u8]);
    } else {
        out.push(0xda);
        out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    }
    out.extend_from_slice(bytes);
}

/// `YYYY-MM-DD_HH:MM:SS` (UTC) or seconds since 1970, as nanoseconds since 1970.
fn parse_time(text: &str) -> Result<i64, String> {
    if let Ok(seconds) = text.parse::<i64>() {
        return Ok(seconds.saturating_mul(1_000_000_000));
    }
    let bad = || format!("{text:?} is not YYYY-MM-DD_HH:MM:SS nor seconds since 1970");
    let (date, time) = text.split_once(['_', 'T', ' ']).ok_or_else(bad)?;
    let numbers = |part: &str, separator: char| -> Option<Vec<i64>> {
        part.split(separator).map(|n| n.parse().ok()).collect()
    };
    let date = numbers(date, '-')
        .filter(|d| d.len() == 3)
        .ok_or_else(bad)?;
    let time = numbers(time, ':')
        .filter(|t| t.len() == 3)
        .ok_or_else(bad)?;
    let (year, month, day) = (date[0], date[1], date[2]);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || time[0] > 23
        || time[1] > 59
        || time[2] > 60
    {
        return Err(bad());
    }
    // Days from 1970-01-01 to the date (proleptic Gregorian).
    let shifted = if month <= 2 { year - 1 } else { year };
    let era = shifted.div_euclid(400);
    let year_of_era = shifted - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = days * 86_400 + time[0] * 3600 + time[1] * 60 + time[2];
    Ok(seconds * 1_000_000_000)
}

/// `BEGIN-COUNT` ranges and single ids.
fn parse_partitions(list: &[String]) -> Result<Vec<u16>, String> {
    let mut out = Vec::new();
    for item in list {
        let bad = || {
            format!("--partition-list {item:?}: expected BEGIN-COUNT or a partition id (0..4095)")
        };
        let (begin, count) = match item.split_once('-') {
            Some((begin, count)) => (begin.trim().parse::<u32>(), count.trim().parse::<u32>()),
            None => (item.trim().parse::<u32>(), Ok(1)),
        };
        let (begin, count) = (begin.map_err(|_| bad())?, count.map_err(|_| bad())?);
        if count == 0 || begin + count > 4096 {
            return Err(bad());
        }
        out.extend((begin..begin + count).map(|p| p as u16));
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_utc() {
        assert_eq!(parse_time("1970-01-01_00:00:00"), Ok(0));
        assert_eq!(
            parse_time("2010-01-01_00:00:00"),
            Ok(1_262_304_000 * 1_000_000_000)
        );
        assert_eq!(
            parse_time("2024-02-29_12:30:15"),
            Ok(1_709_209_815 * 1_000_000_000)
        );
        assert_eq!(parse_time("17"), Ok(17_000_000_000));
        assert!(parse_time("2024-13-01_00:00:00").is_err());
        assert!(parse_time("yesterday").is_err());
    }

    #[test]
    fn partition_lists() {
        let list = ["0-3".to_string(), "2".into(), "4095".into()];
        assert_eq!(parse_partitions(&list), Ok(vec![0, 1, 2, 4095]));
        assert!(parse_partitions(&["4095-2".into()]).is_err());
        assert!(parse_partitions(&["x".into()]).is_err());
    }
}
