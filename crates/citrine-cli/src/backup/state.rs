//! The state file of a backup: a journal that lets an interrupted backup
//! continue where it stopped (`citrine backup --continue`).
//!
//! Text, one fact a line, appended after the backup file holds what the
//! line claims (so the journal never claims more than the file has):
//!
//! ```text
//! citrine-backup-state 1
//! run <the options that shape the file>
//! h LENGTH                  header, indexes and UDF modules written
//! p PARTITION DIGEST LENGTH partition written up to this record
//! d PARTITION LENGTH        partition written entirely
//! ```
//!
//! LENGTH is the backup file's length after the step. Resuming cuts the
//! file back to the last LENGTH (dropping a block cut short by the
//! interruption), skips the finished partitions, and scans each partial
//! one again after its last digest. The file is removed when the backup
//! completes.

use base64::Engine as _;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

const MAGIC: &str = "citrine-backup-state 1";
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// How far a partition got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Written up to and including this digest.
    After([u8; 20]),
    Done,
}

/// What a state file says.
#[derive(Debug, Default)]
pub struct Saved {
    /// The file's length once the header was written (`None`: not yet).
    pub header_length: Option<u64>,
    /// The file's length after the last step.
    pub length: u64,
    pub partitions: BTreeMap<u16, Progress>,
}

/// The journal being appended to.
pub struct Journal {
    file: File,
    pub path: PathBuf,
}

/// Where the state of a backup to `output` is kept.
pub fn path_for(output: &Path) -> PathBuf {
    let mut name = output.as_os_str().to_owned();
    name.push(".state");
    PathBuf::from(name)
}

impl Journal {
    /// A new journal for a run with these options.
    pub fn create(path: &Path, run: &str) -> Result<Journal, String> {
        let mut file = File::create(path)
            .map_err(|error| format!("cannot create state file {}: {error}", path.display()))?;
        writeln!(file, "{MAGIC}\nrun {run}")
            .map_err(|error| format!("cannot write state file {}: {error}", path.display()))?;
        Ok(Journal {
            file,
            path: path.to_owned(),
        })
    }

    /// An existing journal, read and opened for appending; its run must
    /// be `run`.
    pub fn resume(path: &Path, run: &str) -> Result<(Journal, Saved), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read state file {}: {error}", path.display()))?;
        let saved = parse(&text, run).map_err(|error| format!("{}: {error}", path.display()))?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|error| format!("cannot open state file {}: {error}", path.display()))?;
        Ok((
            Journal {
                file,
                path: path.to_owned(),
            },
            saved,
        ))
    }

    pub fn header(&mut self, length: u64) -> Result<(), String> {
        self.line(format!("h {length}"))
    }

    pub fn partial(&mut self, partition: u16, digest: [u8; 20], length: u64) -> Result<(), String> {
        self.line(format!("p {partition} {} {length}", B64.encode(digest)))
    }

    pub fn done(&mut self, partition: u16, length: u64) -> Result<(), String> {
        self.line(format!("d {partition} {length}"))
    }

    fn line(&mut self, line: String) -> Result<(), String> {
        writeln!(self.file, "{line}")
            .map_err(|error| format!("cannot write state file {}: {error}", self.path.display()))
    }

    /// The backup is complete: the journal is no longer needed.
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn parse(text: &str, run: &str) -> Result<Saved, String> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err("not a citrine backup state file".into());
    }
    match lines.next().and_then(|line| line.strip_prefix("run ")) {
        Some(saved) if saved == run => {}
        Some(saved) => {
            return Err(format!(
                "it was written by a backup with other options ({saved}); run it with the same ones"
            ))
        }
        None => return Err("its `run` line is missing".into()),
    }
    let mut saved = Saved::default();
    for line in lines {
        // A line cut short by the interruption ends the journal.
        let Some(step) = step(line) else {
            break;
        };
        match step {
            Step::Header(length) => saved.header_length = Some(length),
            Step::Partition(partition, progress, _) => {
                saved.partitions.insert(partition, progress);
            }
        }
        saved.length = step.length();
    }
    Ok(saved)
}

enum Step {
    Header(u64),
    Partition(u16, Progress, u64),
}

impl Step {
    fn length(&self) -> u64 {
        match self {
            Step::Header(length) | Step::Partition(_, _, length) => *length,
        }
    }
}

fn step(line: &str) -> Option<Step> {
    let words: Vec<&str> = line.split(' ').collect();
    match words[..] {
        ["h", length] => Some(Step::Header(length.parse().ok()?)),
        ["d", partition, length] => Some(Step::Partition(
            partition.parse().ok().filter(|p| *p < 4096)?,
            Progress::Done,
            length.parse().ok()?,
        )),
        ["p", partition, digest, length] => {
            let digest: [u8; 20] = B64.decode(digest).ok()?.try_into().ok()?;
            Some(Step::Partition(
                partition.parse().ok().filter(|p| *p < 4096)?,
                Progress::After(digest),
                length.parse().ok()?,
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_step_of_each_partition_wins_and_a_torn_line_ends_the_journal() {
        let text = format!(
            "{MAGIC}\nrun ns=test\nh 100\np 7 {} 250\nd 3 400\nd 7 600\np 9 AAAA",
            B64.encode([1u8; 20])
        );
        let saved = parse(&text, "ns=test").expect("parses");
        assert_eq!(saved.header_length, Some(100));
        assert_eq!(saved.length, 600);
        assert_eq!(saved.partitions.get(&7), Some(&Progress::Done));
        assert_eq!(saved.partitions.get(&3), Some(&Progress::Done));
        assert_eq!(saved.partitions.get(&9), None);
        assert!(parse(&text, "ns=bar").is_err());
        assert!(parse("junk", "ns=test").is_err());
    }
}
