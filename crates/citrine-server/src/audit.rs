//! The audit trail's writer: a thread of the server that takes the lines
//! the service sends ([`ChannelSink`]) and appends them to the audit log
//! file (or the node's log when no file is set), and to syslog when
//! `[security.syslog]` is given.
//!
//! Invariants:
//! - the request path never waits for the disk: lines cross a bounded
//!   channel ([`QUEUE_LINES`]); when it is full the line is dropped and
//!   counted (statistic `audit_lines_dropped`), never blocked on;
//! - the file is opened for append (created if absent) before the node
//!   serves, so a bad path stops the start; a write error afterwards is
//!   logged once per failure run and the thread keeps going;
//! - the file is flushed whenever the channel is empty, so a line is on
//!   disk soon after its request is answered.

mod syslog;

use crate::config::AuditConfig;
use citrine_service::security::audit::{file_line, AuditSink, Line};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};

/// Lines that may wait for the writer before new ones are dropped.
pub const QUEUE_LINES: usize = 4096;

/// The service's end of the channel.
pub struct ChannelSink {
    sender: SyncSender<Line>,
    dropped: AtomicU64,
}

impl AuditSink for ChannelSink {
    fn send(&self, line: Line) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.sender.try_send(line)
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Opens the audit file and syslog and starts the writer thread; the
/// sink to give the service.
pub fn start(config: &AuditConfig) -> Result<ChannelSink, String> {
    let file = match &config.file {
        Some(path) => Some(open(path)?),
        None => None,
    };
    let syslog = config.syslog_local.map(syslog::Syslog::open);
    let (sender, receiver) = sync_channel(QUEUE_LINES);
    std::thread::Builder::new()
        .name("citrine-audit".to_owned())
        .spawn(move || write_lines(receiver, file, syslog))
        .map_err(|error| format!("cannot start the audit writer: {error}"))?;
    Ok(ChannelSink {
        sender,
        dropped: AtomicU64::new(0),
    })
}

fn open(path: &std::path::Path) -> Result<BufWriter<File>, String> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(BufWriter::new)
        .map_err(|error| format!("cannot open the audit log {}: {error}", path.display()))
}

/// The writer thread: until every sender is gone.
fn write_lines(
    receiver: Receiver<Line>,
    mut file: Option<BufWriter<File>>,
    syslog: Option<syslog::Syslog>,
) {
    let mut failing = false;
    while let Ok(first) = receiver.recv() {
        let mut next = Some(first);
        while let Some(line) = next {
            write_one(&line, file.as_mut(), syslog.as_ref(), &mut failing);
            next = receiver.try_recv().ok();
        }
        if let Some(file) = file.as_mut() {
            note(file.flush(), &mut failing);
        }
    }
}

fn write_one(
    line: &Line,
    file: Option<&mut BufWriter<File>>,
    syslog: Option<&syslog::Syslog>,
    failing: &mut bool,
) {
    if line.to_log {
        match file {
            Some(file) => {
                let text = file_line(line);
                note(writeln!(file, "{text}"), failing);
            }
            None => tracing::info!(target: "audit", "{}", line.text),
        }
    }
    if line.to_syslog {
        if let Some(syslog) = syslog {
            syslog.info(&line.text);
        }
    }
}

/// Logs the first write error of a run of them.
fn note(result: std::io::Result<()>, failing: &mut bool) {
    match result {
        Ok(()) => *failing = false,
        Err(error) if !*failing => {
            *failing = true;
            tracing::error!("cannot write the audit log: {error}");
        }
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> Line {
        Line {
            unix_ms: 0,
            text: text.to_owned(),
            to_log: true,
            to_syslog: false,
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_blocking() {
        let (sender, receiver) = sync_channel(2);
        let sink = ChannelSink {
            sender,
            dropped: AtomicU64::new(0),
        };
        for index in 0..5 {
            sink.send(line(&index.to_string()));
        }
        assert_eq!(sink.dropped(), 3);
        assert_eq!(
            receiver.try_recv().map(|line| line.text),
            Ok("0".to_owned())
        );
        drop(receiver);
        sink.send(line("after"));
        assert_eq!(sink.dropped(), 4);
    }

    #[test]
    fn lines_reach_the_file() {
        let directory = std::env::temp_dir().join(format!("citrine-audit-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("scratch directory");
        let path = directory.join("audit.log");
        let _ = std::fs::remove_file(&path);
        let config = AuditConfig {
            settings: Default::default(),
            file: Some(path.clone()),
            syslog_local: None,
        };
        let sink = start(&config).expect("start");
        sink.send(line("permitted | type: authentication"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut text = String::new();
        while std::time::Instant::now() < deadline && text.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(5));
            text = std::fs::read_to_string(&path).unwrap_or_default();
        }
        assert_eq!(
            text,
            "Jan 01 1970 00:00:00 GMT: INFO (audit): permitted | type: authentication\n"
        );
        let unwritable = AuditConfig {
            file: Some(directory.join("no/such/dir/audit.log")),
            ..config
        };
        assert!(start(&unwritable).is_err());
        let _ = std::fs::remove_dir_all(&directory);
    }
}
