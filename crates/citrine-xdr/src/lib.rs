//! XDR (cross-datacenter replication) without I/O: the configuration of
//! destinations ([`config`]), the shipping decisions of one DC and
//! namespace ([`shipper`]: windows of records past each partition's
//! last-ship time, acknowledgements, hot keys, throughput), and the file
//! the last-ship times are kept in ([`lst_file`]) and the message a
//! master sends them to the other members in ([`lst_push`]). The server does the
//! I/O: it scans the index, reads records, sends them with a smart
//! client and feeds back what happened, passing the time it read.

pub mod config;
pub mod lst_file;
pub mod lst_push;
pub mod shipper;

pub use config::{Command, DcConfig, NamespaceSettings, Rewind};
pub use shipper::{Candidate, Counters, Limits, Outcome, Role, Scan, Ship, Shipper};
