//! The asbackup text backup format, "Version 3.1" (protocol 08 §4): what
//! `citrine backup` writes and `citrine restore` reads, and what
//! Aerospike's own asbackup and asrestore write and read.
//!
//! A file is a header line (`Version 3.1`), meta lines (`# namespace NS`,
//! `# first-file`), global lines (`* i ...` a secondary-index definition,
//! `* u L NAME LEN <bytes>` a UDF module) and records: `+` header lines
//! (`k` user key, optional; `n` namespace; `d` digest; `s` set, optional;
//! `g` generation; `t` expiry; `b` bin count) followed by one `-` line per
//! bin. Tokens are separated by exactly one space, lines by one LF; inside
//! names a space, LF or backslash is escaped with a backslash; values
//! carry their length, so strings and raw bytes are never escaped.
//!
//! Owns [`write`] (records, index lines and UDF modules to bytes) and
//! [`read`] (a streaming parser over any `BufRead` whose every error names
//! the line). Bin values are held in their wire form — particle type and
//! bytes ([`Bin`]) — so what a scan returned is written, and what a
//! restore sends, byte for byte. Invariant: `read` gives back what `write`
//! wrote, for every particle type the format names. Pure: no I/O but the
//! reader's input.

pub mod read;
pub mod write;

pub use citrine_types::Digest;
pub use citrine_wire::digest::UserKey;
pub use read::{ParseError, Reader};

/// The first line of every file this crate writes.
pub const HEADER: &str = "Version 3.1";

/// A bin in its wire form: particle type (02 §4.3) and value bytes. A
/// GeoJSON value is `[flags, cell count (u16 BE), cells..., JSON]` as the
/// server sends it; the file keeps only the JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bin {
    pub name: String,
    pub particle: u8,
    pub bytes: Vec<u8>,
}

/// One record of a backup.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// The user key, when the server stored it.
    pub key: Option<UserKey>,
    pub namespace: String,
    pub digest: Digest,
    /// Empty: no set.
    pub set: String,
    pub generation: u16,
    /// Seconds since 2010-01-01 UTC when the record expires; 0 = never.
    pub expiry: u32,
    pub bins: Vec<Bin>,
}

/// A secondary-index definition (`* i` line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexDef {
    pub namespace: String,
    /// Empty: every set.
    pub set: String,
    pub name: String,
    /// What is indexed in the bin: `N` the value, `L` list elements, `K`
    /// map keys, `V` map values.
    pub collection: u8,
    pub bin: String,
    /// `N` numeric, `S` string, `B` blob, `G` geo2dsphere.
    pub key_type: u8,
    /// The CDT context, base64 of its msgpack (asbackup 3.12 and later).
    pub context: Option<String>,
}

/// A UDF module (`* u` line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdfFile {
    pub name: String,
    pub content: Vec<u8>,
}

/// One entry of a file after its header.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Index(IndexDef),
    Udf(UdfFile),
    Record(Record),
}

/// The one-letter label of a bytes-like particle type, and back.
const BYTES_LABELS: [(u8, u8); 10] = [
    (b'B', 4),
    (b'J', 7),
    (b'C', 8),
    (b'P', 9),
    (b'R', 10),
    (b'H', 11),
    (b'E', 12),
    (b'Y', 18),
    (b'M', 19),
    (b'L', 20),
];

/// Particle types the format names.
pub mod particle {
    pub const NIL: u8 = 0;
    pub const INTEGER: u8 = 1;
    pub const FLOAT: u8 = 2;
    pub const STRING: u8 = 3;
    pub const BLOB: u8 = 4;
    pub const BOOL: u8 = 17;
    pub const GEOJSON: u8 = 23;
}

fn bytes_label(particle: u8) -> Option<u8> {
    BYTES_LABELS
        .iter()
        .find(|(_, p)| *p == particle)
        .map(|(label, _)| *label)
}

fn bytes_particle(label: u8) -> Option<u8> {
    BYTES_LABELS
        .iter()
        .find(|(l, _)| *l == label)
        .map(|(_, particle)| *particle)
}

#[cfg(test)]
mod tests;
