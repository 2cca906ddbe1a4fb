//! Parsing the text format as a stream: [`Reader::new`] checks the header
//! and meta lines, [`Reader::next_entry`] returns one index, UDF module or
//! record at a time, holding nothing else in memory.
//!
//! Every error is a [`ParseError`] naming the line it was found on (lines
//! counted as an editor counts them, the LFs inside raw values included)
//! and, for an error inside a record, the line that record began on, so
//! an operator can find it. A length is trusted only as far as the bytes
//! are really there: a value is read in pieces, never allocated whole
//! from its announced size, and no value may exceed [`MAX_VALUE`].

use crate::{bytes_particle, particle, Bin, Digest, Entry, IndexDef, Record, UdfFile, UserKey};
use base64::Engine as _;
use std::io::{BufRead, Read};

/// The largest value (string, blob, UDF module) a file may hold: 128 MiB,
/// the largest message a server accepts.
pub const MAX_VALUE: u64 = 128 << 20;
/// The longest name or number token.
const MAX_TOKEN: usize = 64 * 1024;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// What is wrong with a file, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// The line the error was found on (1-based).
    pub line: u64,
    /// The line the record being read began on, if inside one.
    pub record_line: Option<u64>,
    pub message: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.record_line {
            Some(start) if start != self.line => write!(
                f,
                "line {}: {} (in the record that starts on line {start})",
                self.line, self.message
            ),
            _ => write!(f, "line {}: {}", self.line, self.message),
        }
    }
}

impl std::error::Error for ParseError {}

type Parsed<T> = Result<T, ParseError>;

/// A streaming parser of one backup file.
pub struct Reader<R> {
    input: R,
    /// Current line (1-based).
    line: u64,
    /// Bytes consumed so far.
    offset: u64,
    /// `Version 3.0`: names are not escaped.
    legacy: bool,
    namespace: Option<String>,
    first_file: bool,
    /// The line the entry being read began on.
    entry_line: u64,
    in_record: bool,
}

impl<R: BufRead> Reader<R> {
    /// Reads the header line and the meta lines.
    pub fn new(input: R) -> Parsed<Reader<R>> {
        let mut reader = Reader {
            input,
            line: 1,
            offset: 0,
            legacy: false,
            namespace: None,
            first_file: false,
            entry_line: 1,
            in_record: false,
        };
        reader.version()?;
        reader.meta()?;
        Ok(reader)
    }

    /// The namespace the `# namespace` line names.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// Whether the file says it is the first of its backup.
    pub fn first_file(&self) -> bool {
        self.first_file
    }

    /// The line the last entry returned began on.
    pub fn entry_line(&self) -> u64 {
        self.entry_line
    }

    /// Bytes read so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next entry, or `None` at the end of the file.
    pub fn next_entry(&mut self) -> Parsed<Option<Entry>> {
        self.in_record = false;
        self.entry_line = self.line;
        let Some(first) = self.peek()? else {
            return Ok(None);
        };
        self.advance(1);
        match first {
            b'*' if !self.legacy => self.global().map(Some),
            b'+' => {
                self.in_record = true;
                let record = self.record()?;
                self.in_record = false;
                Ok(Some(Entry::Record(record)))
            }
            other => Err(self.error(format!(
                "a line starting with {}: expected `+` (a record) or `*` (an index or UDF module)",
                shown(other)
            ))),
        }
    }

    fn version(&mut self) -> Parsed<()> {
        // At most 40 bytes: a compressed or encrypted file has no line.
        let mut line = Vec::new();
        while line.len() < 40 {
            match self.peek()? {
                None | Some(b'\n') => break,
                Some(byte) => {
                    line.push(byte);
                    self.advance(1);
                }
            }
        }
        if self.peek()? != Some(b'\n') && line.starts_with(b"Version ") {
            return Err(self.error("the file ends inside the header line: truncated".into()));
        }
        if line.starts_with(b"Version ") {
            self.advance(1);
        }
        match &line[..] {
            b"Version 3.1" => Ok(()),
            b"Version 3.0" => {
                self.legacy = true;
                Ok(())
            }
            other if other.starts_with(b"Version ") => Err(ParseError {
                line: 1,
                record_line: None,
                message: format!(
                    "backup format {} is not supported (this reads versions 3.0 and 3.1)",
                    String::from_utf8_lossy(&other[8..])
                ),
            }),
            other => Err(ParseError {
                line: 1,
                record_line: None,
                message: format!(
                    "not an asbackup file: it starts with {:?}, not \"Version 3.1\" \
                     (compressed or encrypted? pass --compress / --encrypt)",
                    String::from_utf8_lossy(other)
                ),
            }),
        }
    }

    fn meta(&mut self) -> Parsed<()> {
        while self.peek()? == Some(b'#') {
            self.advance(1);
            self.expect(b' ', "a space after `#`")?;
            let word = self.token(b" \n", false, "a meta line")?;
            match &word[..] {
                b"namespace" => {
                    self.expect(b' ', "a space before the namespace")?;
                    self.namespace = Some(self.text(b"\n", "the namespace")?);
                }
                b"first-file" => self.first_file = true,
                _ => {
                    // A meta line of a later writer: skipped.
                    self.token(b"\n", false, "a meta line")?;
                }
            }
            self.expect(b'\n', "the end of the meta line")?;
        }
        Ok(())
    }

    fn global(&mut self) -> Parsed<Entry> {
        self.expect(b' ', "a space after `*`")?;
        match self.byte("the global line's kind")? {
            b'i' => self.index().map(Entry::Index),
            b'u' => self.udf().map(Entry::Udf),
            other => Err(self.error(format!(
                "a global line of kind {}: expected `i` (index) or `u` (UDF module)",
                shown(other)
            ))),
        }
    }

    fn index(&mut self) -> Parsed<IndexDef> {
        self.expect(b' ', "a space")?;
        let namespace = self.text(b" ", "the index's namespace")?;
        self.expect(b' ', "a space after the namespace")?;
        let set = self.text(b" ", "the index's set")?;
        self.expect(b' ', "a space after the set")?;
        let name = self.text(b" ", "the index's name")?;
        self.expect(b' ', "a space after the index name")?;
        let collection = self.byte("the index type")?;
        if !matches!(collection, b'N' | b'L' | b'K' | b'V') {
            return Err(self.error(format!(
                "index type {}: expected N, L, K or V",
                shown(collection)
            )));
        }
        self.expect(b' ', "a space after the index type")?;
        let paths = self.number(b" ", "the number of index paths")?;
        if paths != 1 {
            return Err(self.error(format!(
                "an index over {paths} bins: only single-bin indexes exist"
            )));
        }
        self.expect(b' ', "a space before the indexed bin")?;
        let bin = self.text(b" ", "the indexed bin")?;
        self.expect(b' ', "a space after the indexed bin")?;
        let key_type = self.byte("the index's data type")?;
        if !matches!(key_type, b'N' | b'S' | b'B' | b'G') {
            return Err(self.error(format!(
                "index data type {}: expected N, S, B or G",
                shown(key_type)
            )));
        }
        let mut context = None;
        if self.peek()? == Some(b' ') {
            self.advance(1);
            let text = self.text(b"\n", "the index's context")?;
            context = Some(text).filter(|text| !text.is_empty());
        }
        self.expect(b'\n', "the end of the index line")?;
        Ok(IndexDef {
            namespace,
            set,
            name,
            collection,
            bin,
            key_type,
            context,
        })
    }

    fn udf(&mut self) -> Parsed<UdfFile> {
        self.expect(b' ', "a space")?;
        let kind = self.byte("the UDF type")?;
        if kind != b'L' {
            return Err(self.error(format!("UDF type {}: expected L (Lua)", shown(kind))));
        }
        self.expect(b' ', "a space after the UDF type")?;
        let name = self.text(b" ", "the UDF module's name")?;
        self.expect(b' ', "a space after the module name")?;
        let content = self.sized("the UDF module")?;
        self.expect(b'\n', "the end of the UDF module")?;
        Ok(UdfFile { name, content })
    }

    fn record(&mut self) -> Parsed<Record> {
        let mut tag = self.record_tag()?;
        let key = if tag == b'k' {
            let key = self.user_key()?;
            tag = self.next_tag()?;
            Some(key)
        } else {
            None
        };
        self.want_tag(tag, b'n', "the record's namespace")?;
        let namespace = self.text(b"\n", "the record's namespace")?;
        self.expect(b'\n', "the end of the namespace line")?;
        let tag = self.next_tag()?;
        self.want_tag(tag, b'd', "the record's digest")?;
        let digest = self.digest()?;
        let mut tag = self.next_tag()?;
        let mut set = String::new();
        if tag == b's' {
            set = self.text(b"\n", "the record's set")?;
            self.expect(b'\n', "the end of the set line")?;
            tag = self.next_tag()?;
        }
        self.want_tag(tag, b'g', "the record's generation")?;
        let generation = self.bounded(u64::from(u16::MAX), "the generation")? as u16;
        let tag = self.next_tag()?;
        self.want_tag(tag, b't', "the record's expiry time")?;
        let expiry = self.bounded(u64::from(u32::MAX), "the expiry time")? as u32;
        let tag = self.next_tag()?;
        self.want_tag(tag, b'b', "the record's bin count")?;
        let count = self.bounded(u64::from(u16::MAX), "the bin count")?;
        let mut bins = Vec::with_capacity(count.min(64) as usize);
        for _ in 0..count {
            bins.push(self.bin()?);
        }
        Ok(Record {
            key,
            namespace,
            digest,
            set,
            generation,
            expiry,
            bins,
        })
    }

    /// ` X ` after a `+`.
    fn record_tag(&mut self) -> Parsed<u8> {
        self.expect(b' ', "a space after `+`")?;
        let tag = self.byte("a record line's kind")?;
        self.expect(b' ', "a space after the record line's kind")?;
        Ok(tag)
    }

    /// The `+` of the record's next header line, and its kind.
    fn next_tag(&mut self) -> Parsed<u8> {
        self.expect(b'+', "the record's next `+` line")?;
        self.record_tag()
    }

    fn want_tag(&self, tag: u8, want: u8, what: &str) -> Parsed<()> {
        if tag == want {
            return Ok(());
        }
        Err(self.error(format!(
            "`+ {}`: expected `+ {}` ({what})",
            shown(tag),
            want as char
        )))
    }

    fn user_key(&mut self) -> Parsed<UserKey> {
        let kind = self.byte("the key's type")?;
        let key = match kind {
            b'I' => {
                self.expect(b' ', "a space before the key")?;
                UserKey::Integer(self.integer("the integer key")?)
            }
            b'D' => {
                self.expect(b' ', "a space before the key")?;
                UserKey::Float(self.float("the float key")?)
            }
            b'S' | b'X' => {
                self.expect(b' ', "a space before the key")?;
                let bytes = if kind == b'S' {
                    self.sized("the string key")?
                } else {
                    self.sized_base64("the string key")?
                };
                let text = String::from_utf8(bytes)
                    .map_err(|_| self.error("a string key that is not UTF-8".into()))?;
                UserKey::String(text)
            }
            b'B' => UserKey::Blob(self.compact_or_base64("the blob key")?),
            other => {
                return Err(self.error(format!("key type {}: expected I, D, S or B", shown(other))))
            }
        };
        self.expect(b'\n', "the end of the key line")?;
        Ok(key)
    }

    fn digest(&mut self) -> Parsed<Digest> {
        let text = self.token(b"\n", false, "the digest")?;
        let bytes = B64
            .decode(&text)
            .map_err(|_| self.error("the digest is not base64".into()))?;
        let bytes: [u8; 20] = bytes.try_into().map_err(|bytes: Vec<u8>| {
            self.error(format!("a digest of {} bytes, not 20", bytes.len()))
        })?;
        self.expect(b'\n', "the end of the digest line")?;
        Ok(Digest(bytes))
    }

    fn bin(&mut self) -> Parsed<Bin> {
        self.expect(b'-', "a bin line (`-`)")?;
        self.expect(b' ', "a space after `-`")?;
        let label = self.byte("the bin's type")?;
        let compact = self.peek()? == Some(b'!');
        if compact {
            self.advance(1);
        }
        self.expect(b' ', "a space after the bin's type")?;
        let name = self.text(b" \n", "the bin name")?;
        if label == b'N' {
            self.expect(b'\n', "the end of the nil bin")?;
            return Ok(Bin {
                name,
                particle: particle::NIL,
                bytes: Vec::new(),
            });
        }
        self.expect(b' ', "a space after the bin name")?;
        let (particle, bytes) = self.bin_value(label, compact, &name)?;
        self.expect(b'\n', "the end of the bin line")?;
        Ok(Bin {
            name,
            particle,
            bytes,
        })
    }

    fn bin_value(&mut self, label: u8, compact: bool, name: &str) -> Parsed<(u8, Vec<u8>)> {
        Ok(match label {
            b'Z' => match self.byte("the boolean")? {
                b'T' => (particle::BOOL, vec![1]),
                b'F' => (particle::BOOL, vec![0]),
                other => {
                    return Err(self.error(format!(
                        "bin {name:?}: boolean {}: expected T or F",
                        shown(other)
                    )))
                }
            },
            b'I' => {
                let value = self.integer("the integer")?;
                (particle::INTEGER, value.to_be_bytes().to_vec())
            }
            b'D' => {
                let value = self.float("the float")?;
                (particle::FLOAT, value.to_bits().to_be_bytes().to_vec())
            }
            b'S' => (particle::STRING, self.sized("the string")?),
            b'X' => (particle::STRING, self.sized_base64("the string")?),
            b'G' => {
                let mut bytes = vec![0, 0, 0];
                bytes.extend_from_slice(&self.sized("the GeoJSON value")?);
                (particle::GEOJSON, bytes)
            }
            other => {
                let particle = bytes_particle(other).ok_or_else(|| {
                    self.error(format!(
                        "bin {name:?}: type {}: expected one of N Z I D S G B J C P R H E Y M L",
                        shown(other)
                    ))
                })?;
                let bytes = if compact {
                    self.sized("the bytes")?
                } else {
                    self.sized_base64("the bytes")?
                };
                (particle, bytes)
            }
        })
    }

    /// After a `B`: `! LEN <raw>` or ` LEN <base64>`.
    fn compact_or_base64(&mut self, what: &str) -> Parsed<Vec<u8>> {
        let compact = self.peek()? == Some(b'!');
        if compact {
            self.advance(1);
        }
        self.expect(b' ', "a space before the length")?;
        if compact {
            self.sized(what)
        } else {
            self.sized_base64(what)
        }
    }

    /// `LEN <LEN raw bytes>`.
    fn sized(&mut self, what: &str) -> Parsed<Vec<u8>> {
        let length = self.number(b" ", what)?;
        self.expect(b' ', "a space after the length")?;
        self.block(length, what)
    }

    /// `LEN <LEN base64 characters>`, decoded.
    fn sized_base64(&mut self, what: &str) -> Parsed<Vec<u8>> {
        let text = self.sized(what)?;
        B64.decode(&text)
            .map_err(|_| self.error(format!("{what} is not valid base64")))
    }

    fn block(&mut self, length: u64, what: &str) -> Parsed<Vec<u8>> {
        if length > MAX_VALUE {
            return Err(self.error(format!(
                "{what} of {length} bytes: larger than the 128 MiB a value may hold"
            )));
        }
        let mut bytes = Vec::with_capacity(length.min(1 << 20) as usize);
        let read = (&mut self.input)
            .take(length)
            .read_to_end(&mut bytes)
            .map_err(|error| self.error(format!("read error: {error}")))?;
        self.offset += read as u64;
        self.line += bytes.iter().filter(|b| **b == b'\n').count() as u64;
        if (read as u64) < length {
            return Err(self.error(format!(
                "the file ends inside {what} ({read} of {length} bytes): truncated"
            )));
        }
        Ok(bytes)
    }

    fn integer(&mut self, what: &str) -> Parsed<i64> {
        let token = self.token(b"\n", false, what)?;
        let text = std::str::from_utf8(&token).ok();
        text.filter(|text| {
            let digits = text.strip_prefix('-').unwrap_or(text);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        })
        .and_then(|text| text.parse::<i64>().ok())
        .ok_or_else(|| {
            self.error(format!(
                "{what}: {:?} is not a 64-bit integer",
                String::from_utf8_lossy(&token)
            ))
        })
    }

    fn float(&mut self, what: &str) -> Parsed<f64> {
        let token = self.token(b"\n", false, what)?;
        std::str::from_utf8(&token)
            .ok()
            .and_then(|text| text.parse::<f64>().ok())
            .ok_or_else(|| {
                self.error(format!(
                    "{what}: {:?} is not a number",
                    String::from_utf8_lossy(&token)
                ))
            })
    }

    /// An unsigned decimal ending before one of `delims`.
    fn number(&mut self, delims: &[u8], what: &str) -> Parsed<u64> {
        let token = self.token(delims, false, what)?;
        if token.is_empty() || !token.iter().all(u8::is_ascii_digit) {
            return Err(self.error(format!(
                "{what}: {:?} is not a number",
                String::from_utf8_lossy(&token)
            )));
        }
        std::str::from_utf8(&token)
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
            .ok_or_else(|| self.error(format!("{what}: too large")))
    }

    /// A number on the rest of the line, at most `max`, and the LF.
    fn bounded(&mut self, max: u64, what: &str) -> Parsed<u64> {
        let value = self.number(b"\n", what)?;
        if value > max {
            return Err(self.error(format!("{what} {value} is larger than {max}")));
        }
        self.expect(b'\n', "the end of the line")?;
        Ok(value)
    }

    /// A name token, unescaped, as UTF-8.
    fn text(&mut self, delims: &[u8], what: &str) -> Parsed<String> {
        let token = self.token(delims, !self.legacy, what)?;
        String::from_utf8(token).map_err(|_| self.error(format!("{what} is not UTF-8")))
    }

    /// Bytes up to (not including) the first unescaped byte of `delims`.
    /// Scans the input's buffer a slice at a time.
    fn token(&mut self, delims: &[u8], unescape: bool, what: &str) -> Parsed<Vec<u8>> {
        let mut token = Vec::new();
        let mut escaped = false;
        loop {
            let buffer = match self.input.fill_buf() {
                Ok(buffer) => buffer,
                Err(error) => return Err(self.error(format!("read error: {error}"))),
            };
            if buffer.is_empty() {
                return Err(self.error(format!("the file ends inside {what}: truncated")));
            }
            let mut used = 0;
            let mut found = false;
            for &byte in buffer {
                if !escaped && delims.contains(&byte) {
                    found = true;
                    break;
                }
                used += 1;
                if unescape && !escaped && byte == b'\\' {
                    escaped = true;
                    continue;
                }
                escaped = false;
                token.push(byte);
            }
            let lines = buffer[..used].iter().filter(|b| **b == b'\n').count() as u64;
            self.input.consume(used);
            self.offset += used as u64;
            self.line += lines;
            if token.len() > MAX_TOKEN {
                return Err(self.error(format!("{what} is longer than {MAX_TOKEN} bytes")));
            }
            if found {
                return Ok(token);
            }
        }
    }

    fn expect(&mut self, want: u8, what: &str) -> Parsed<()> {
        match self.peek()? {
            Some(byte) if byte == want => {
                self.advance(1);
                Ok(())
            }
            Some(byte) => Err(self.error(format!("{} where {what} belongs", shown(byte)))),
            None => Err(self.error(format!("the file ends where {what} belongs: truncated"))),
        }
    }

    fn byte(&mut self, what: &str) -> Parsed<u8> {
        match self.peek()? {
            Some(byte) => {
                self.advance(1);
                Ok(byte)
            }
            None => Err(self.error(format!("the file ends where {what} belongs: truncated"))),
        }
    }

    fn peek(&mut self) -> Parsed<Option<u8>> {
        match self.input.fill_buf() {
            Ok(buffer) => Ok(buffer.first().copied()),
            Err(error) => Err(self.error(format!("read error: {error}"))),
        }
    }

    /// Consumes `count` bytes already seen by `peek`.
    fn advance(&mut self, count: usize) {
        if let Ok(buffer) = self.input.fill_buf() {
            self.line += buffer[..count.min(buffer.len())]
                .iter()
                .filter(|b| **b == b'\n')
                .count() as u64;
        }
        self.input.consume(count);
        self.offset += count as u64;
    }

    fn error(&self, message: String) -> ParseError {
        ParseError {
            line: self.line,
            record_line: self.in_record.then_some(self.entry_line),
            message,
        }
    }
}

/// A byte as an operator would want to see it in a message.
fn shown(byte: u8) -> String {
    match byte {
        b'\n' => "a line feed".into(),
        b' ' => "a space".into(),
        0x21..=0x7e => format!("`{}`", byte as char),
        other => format!("byte 0x{other:02x}"),
    }
}
