//! Writing the text format: each function appends whole lines to a byte
//! buffer, so a caller can build a block of records and hand it to its
//! file (or compressor) in one piece.
//!
//! Numbers are written so that `read` (and asrestore's `strtod`) get the
//! same value back: integers in decimal, floats in Rust's shortest
//! round-trip form (`1.5`, `1e300`, `NaN`, `inf`, `-inf`).

use crate::{bytes_label, particle, Bin, IndexDef, Record, UdfFile, UserKey, HEADER};
use base64::Engine as _;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// `Version 3.1`, the namespace meta line and, for the first file of a
/// backup, `# first-file`.
pub fn header(out: &mut Vec<u8>, namespace: &str, first_file: bool) {
    out.extend_from_slice(HEADER.as_bytes());
    out.extend_from_slice(b"\n# namespace ");
    escape(out, namespace);
    out.push(b'\n');
    if first_file {
        out.extend_from_slice(b"# first-file\n");
    }
}

/// Appends `text` with every space, LF and backslash escaped by a backslash.
pub fn escape(out: &mut Vec<u8>, text: &str) {
    for &byte in text.as_bytes() {
        if matches!(byte, b' ' | b'\n' | b'\\') {
            out.push(b'\\');
        }
        out.push(byte);
    }
}

/// A secondary-index line: `* i NS SET NAME TYPE 1 BIN KEYTYPE[ CONTEXT]`.
pub fn index(out: &mut Vec<u8>, def: &IndexDef) {
    out.extend_from_slice(b"* i ");
    for token in [&def.namespace, &def.set, &def.name] {
        escape(out, token);
        out.push(b' ');
    }
    out.push(def.collection);
    out.extend_from_slice(b" 1 ");
    escape(out, &def.bin);
    out.push(b' ');
    out.push(def.key_type);
    if let Some(context) = &def.context {
        out.push(b' ');
        escape(out, context);
    }
    out.push(b'\n');
}

/// A UDF module: `* u L NAME LEN <LEN bytes>`.
pub fn udf(out: &mut Vec<u8>, file: &UdfFile) {
    out.extend_from_slice(b"* u L ");
    escape(out, &file.name);
    sized(out, &file.content);
}

/// A record's header lines and bin lines. `compact` writes blobs, lists,
/// maps and HLLs as raw bytes (`B!`) instead of base64. Fails, writing
/// nothing, on a bin the format cannot hold.
pub fn record(out: &mut Vec<u8>, record: &Record, compact: bool) -> Result<(), String> {
    let start = out.len();
    let result = record_lines(out, record, compact);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn record_lines(out: &mut Vec<u8>, record: &Record, compact: bool) -> Result<(), String> {
    if let Some(key) = &record.key {
        user_key(out, key, compact);
    }
    out.extend_from_slice(b"+ n ");
    escape(out, &record.namespace);
    out.extend_from_slice(b"\n+ d ");
    out.extend_from_slice(B64.encode(record.digest.0).as_bytes());
    out.push(b'\n');
    if !record.set.is_empty() {
        out.extend_from_slice(b"+ s ");
        escape(out, &record.set);
        out.push(b'\n');
    }
    let count = u16::try_from(record.bins.len())
        .map_err(|_| format!("{} bins: more than 65535", record.bins.len()))?;
    let meta = format!(
        "+ g {}\n+ t {}\n+ b {count}\n",
        record.generation, record.expiry
    );
    out.extend_from_slice(meta.as_bytes());
    for one in &record.bins {
        bin(out, one, compact).map_err(|error| format!("bin {:?}: {error}", one.name))?;
    }
    Ok(())
}

fn user_key(out: &mut Vec<u8>, key: &UserKey, compact: bool) {
    match key {
        UserKey::Integer(value) => out.extend_from_slice(format!("+ k I {value}\n").as_bytes()),
        UserKey::Float(value) => out.extend_from_slice(format!("+ k D {value:?}\n").as_bytes()),
        UserKey::String(text) => {
            out.extend_from_slice(b"+ k S");
            sized(out, text.as_bytes());
        }
        UserKey::Blob(bytes) if compact => {
            out.extend_from_slice(b"+ k B!");
            sized(out, bytes);
        }
        UserKey::Blob(bytes) => {
            out.extend_from_slice(b"+ k B");
            sized(out, B64.encode(bytes).as_bytes());
        }
    }
}

/// ` LEN <bytes>\n`.
fn sized(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(format!(" {} ", bytes.len()).as_bytes());
    out.extend_from_slice(bytes);
    out.push(b'\n');
}

/// One bin line.
pub fn bin(out: &mut Vec<u8>, bin: &Bin, compact: bool) -> Result<(), String> {
    let value = &bin.bytes[..];
    let label = |out: &mut Vec<u8>, label: &[u8]| {
        out.extend_from_slice(b"- ");
        out.extend_from_slice(label);
        out.push(b' ');
        escape(out, &bin.name);
    };
    match bin.particle {
        particle::NIL => label(out, b"N"),
        particle::BOOL => {
            label(out, b"Z");
            let flag = value.first().ok_or("an empty boolean")?;
            out.extend_from_slice(if *flag != 0 { b" T" } else { b" F" });
        }
        particle::INTEGER => {
            label(out, b"I");
            out.extend_from_slice(format!(" {}", integer(value)?).as_bytes());
        }
        particle::FLOAT => {
            label(out, b"D");
            let word: [u8; 8] = value.try_into().map_err(|_| "a float not 8 bytes long")?;
            let number = f64::from_bits(u64::from_be_bytes(word));
            out.extend_from_slice(format!(" {number:?}").as_bytes());
        }
        particle::STRING => {
            label(out, b"S");
            sized(out, value);
            return Ok(());
        }
        particle::GEOJSON => {
            label(out, b"G");
            sized(out, geojson_text(value)?);
            return Ok(());
        }
        other => {
            let letter = bytes_label(other)
                .ok_or_else(|| format!("particle type {other} has no backup form"))?;
            if compact {
                label(out, &[letter, b'!']);
                sized(out, value);
            } else {
                label(out, &[letter]);
                sized(out, B64.encode(value).as_bytes());
            }
            return Ok(());
        }
    }
    out.push(b'\n');
    Ok(())
}

/// A wire integer: up to 8 bytes, big-endian (servers send 8).
fn integer(bytes: &[u8]) -> Result<i64, String> {
    match bytes.len() {
        8 => {
            let mut word = [0u8; 8];
            word.copy_from_slice(bytes);
            Ok(i64::from_be_bytes(word))
        }
        1..=7 => Ok(bytes.iter().fold(0i64, |acc, b| acc << 8 | i64::from(*b))),
        other => Err(format!("an integer of {other} bytes")),
    }
}

/// The JSON of a wire GeoJSON value (after its flags and cells).
pub fn geojson_text(bytes: &[u8]) -> Result<&[u8], String> {
    let cells = match bytes {
        [_, high, low, ..] => usize::from(u16::from_be_bytes([*high, *low])),
        _ => return Err("a GeoJSON value shorter than its header".into()),
    };
    bytes
        .get(3 + cells * 8..)
        .ok_or_else(|| "a GeoJSON value shorter than its cells".into())
}
