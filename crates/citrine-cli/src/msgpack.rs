//! JSON ⇄ Aerospike-dialect msgpack (05 §1) for list and map bins typed on
//! the command line and for printing them back.
//!
//! Invariants: strings are packed as str-family items whose first payload
//! byte is the particle type 3; the decoder bounds-checks every length and
//! returns `None` on malformed input (never panics).

use serde_json::Value as Json;

/// Packs a JSON value.
pub fn pack(value: &Json, out: &mut Vec<u8>) {
    match value {
        Json::Null => out.push(0xc0),
        Json::Bool(false) => out.push(0xc2),
        Json::Bool(true) => out.push(0xc3),
        Json::Number(number) => {
            if let Some(int) = number.as_i64() {
                pack_int(int, out);
            } else if let Some(unsigned) = number.as_u64() {
                out.push(0xcf);
                out.extend_from_slice(&unsigned.to_be_bytes());
            } else {
                out.push(0xcb);
                out.extend_from_slice(&number.as_f64().unwrap_or(0.0).to_bits().to_be_bytes());
            }
        }
        Json::String(text) => pack_str(text, out),
        Json::Array(items) => {
            pack_header(items.len(), 0x90, 0xdc, 0xdd, out);
            for item in items {
                pack(item, out);
            }
        }
        Json::Object(entries) => {
            pack_header(entries.len(), 0x80, 0xde, 0xdf, out);
            for (key, item) in entries {
                pack_str(key, out);
                pack(item, out);
            }
        }
    }
}

fn pack_header(len: usize, fix: u8, sixteen: u8, thirty_two: u8, out: &mut Vec<u8>) {
    if len < 16 {
        out.push(fix | len as u8);
    } else if len <= usize::from(u16::MAX) {
        out.push(sixteen);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(thirty_two);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

fn pack_int(value: i64, out: &mut Vec<u8>) {
    match value {
        0..=127 => out.push(value as u8),
        -32..=-1 => out.push(value as i8 as u8),
        128..=255 => out.extend_from_slice(&[0xcc, value as u8]),
        256..=65535 => {
            out.push(0xcd);
            out.extend_from_slice(&(value as u16).to_be_bytes());
        }
        65536..=4_294_967_295 => {
            out.push(0xce);
            out.extend_from_slice(&(value as u32).to_be_bytes());
        }
        -128..=-33 => out.extend_from_slice(&[0xd0, value as i8 as u8]),
        -32768..=-129 => {
            out.push(0xd1);
            out.extend_from_slice(&(value as i16).to_be_bytes());
        }
        -2_147_483_648..=-32769 => {
            out.push(0xd2);
            out.extend_from_slice(&(value as i32).to_be_bytes());
        }
        _ => {
            out.push(if value > 0 { 0xcf } else { 0xd3 });
            out.extend_from_slice(&value.to_be_bytes());
        }
    }
}

fn pack_str(text: &str, out: &mut Vec<u8>) {
    let len = text.len() + 1;
    if len < 32 {
        out.push(0xa0 | len as u8);
    } else if len < 256 {
        out.extend_from_slice(&[0xd9, len as u8]);
    } else if len <= usize::from(u16::MAX) {
        out.push(0xda);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
    out.push(3);
    out.extend_from_slice(text.as_bytes());
}

/// Decodes one msgpack item into JSON (for display). Returns the value and
/// the rest of the input.
pub fn unpack(bytes: &[u8]) -> Option<(Json, &[u8])> {
    let (&tag, rest) = bytes.split_first()?;
    Some(match tag {
        0x00..=0x7f => (Json::from(tag), rest),
        0xe0..=0xff => (Json::from(tag as i8), rest),
        0xc0 => (Json::Null, rest),
        0xc2 => (Json::Bool(false), rest),
        0xc3 => (Json::Bool(true), rest),
        0xcc..=0xcf => {
            let (value, rest) = take(rest, 1 << (tag - 0xcc))?;
            (Json::from(value), rest)
        }
        0xd0..=0xd3 => {
            let width = 1usize << (tag - 0xd0);
            let (raw, rest) = take(rest, width)?;
            let shift = 64 - 8 * width as u32;
            (Json::from(((raw << shift) as i64) >> shift), rest)
        }
        0xca => {
            let (raw, rest) = take(rest, 4)?;
            (Json::from(f64::from(f32::from_bits(raw as u32))), rest)
        }
        0xcb => {
            let (raw, rest) = take(rest, 8)?;
            (
                serde_json::Number::from_f64(f64::from_bits(raw)).map_or(Json::Null, Json::Number),
                rest,
            )
        }
        0xa0..=0xbf | 0xd9..=0xdb | 0xc4..=0xc6 => {
            let (len, rest) = match tag {
                0xa0..=0xbf => (u64::from(tag & 0x1f), rest),
                0xd9 | 0xc4 => take(rest, 1)?,
                0xda | 0xc5 => take(rest, 2)?,
                _ => take(rest, 4)?,
            };
            let len = usize::try_from(len).ok()?;
            let (payload, rest) = (rest.get(..len)?, rest.get(len..)?);
            let text = match payload.split_first() {
                Some((3, text)) => Json::String(String::from_utf8_lossy(text).into_owned()),
                Some((23, text)) => {
                    Json::String(format!("geojson:{}", String::from_utf8_lossy(text)))
                }
                Some((_, data)) => Json::String(format!(
                    "0x{}",
                    data.iter().map(|b| format!("{b:02x}")).collect::<String>()
                )),
                None => Json::String(String::new()),
            };
            (text, rest)
        }
        0x90..=0x9f | 0xdc | 0xdd => {
            let (count, mut rest) = match tag {
                0x90..=0x9f => (u64::from(tag & 0x0f), rest),
                0xdc => take(rest, 2)?,
                _ => take(rest, 4)?,
            };
            let mut items = Vec::new();
            for _ in 0..count {
                let (item, tail) = unpack(rest)?;
                rest = tail;
                if !is_flags_ext(&item) {
                    items.push(item);
                }
            }
            (Json::Array(items), rest)
        }
        0x80..=0x8f | 0xde | 0xdf => {
            let (count, mut rest) = match tag {
                0x80..=0x8f => (u64::from(tag & 0x0f), rest),
                0xde => take(rest, 2)?,
                _ => take(rest, 4)?,
            };
            let mut map = serde_json::Map::new();
            for _ in 0..count {
                let (key, tail) = unpack(rest)?;
                let (value, tail) = unpack(tail)?;
                rest = tail;
                if is_flags_ext(&key) {
                    continue;
                }
                let key = match key {
                    Json::String(text) => text,
                    other => other.to_string(),
                };
                map.insert(key, value);
            }
            (Json::Object(map), rest)
        }
        0xd4..=0xd8 | 0xc7..=0xc9 => {
            // Extensions (ordering flags, wildcard): shown as a marker.
            let (len, rest) = match tag {
                0xd4..=0xd8 => (1u64 << (tag - 0xd4), rest),
                0xc7 => take(rest, 1)?,
                0xc8 => take(rest, 2)?,
                _ => take(rest, 4)?,
            };
            let len = usize::try_from(len).ok()?;
            let rest = rest.get(1 + len..)?;
            (Json::String("\u{0}ext".into()), rest)
        }
        _ => return None,
    })
}

/// Reads an `n`-byte big-endian unsigned number.
fn take(rest: &[u8], n: usize) -> Option<(u64, &[u8])> {
    let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
    Some((
        head.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)),
        tail,
    ))
}

fn is_flags_ext(value: &Json) -> bool {
    matches!(value, Json::String(text) if text == "\u{0}ext")
}

/// Decodes a whole buffer to JSON text, or a hex dump if it is not valid.
pub fn to_json_text(bytes: &[u8]) -> String {
    match unpack(bytes) {
        Some((value, [])) => value.to_string(),
        _ => format!("<msgpack {} bytes>", bytes.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_through_msgpack() {
        let json: Json = serde_json::from_str(
            r#"{"a":[1,-1,300,-300,70000,-70000,5000000000,1.5,"x",true,null],"b":{"c":"d"}}"#,
        )
        .expect("json");
        let mut packed = Vec::new();
        pack(&json, &mut packed);
        let (back, rest) = unpack(&packed).expect("unpacks");
        assert!(rest.is_empty());
        assert_eq!(back, json);
    }

    #[test]
    fn strings_carry_the_particle_prefix() {
        let mut packed = Vec::new();
        pack(&Json::String("ab".into()), &mut packed);
        assert_eq!(packed, vec![0xa3, 3, b'a', b'b']);
        let long = "x".repeat(40);
        packed.clear();
        pack(&Json::String(long.clone()), &mut packed);
        assert_eq!(&packed[..3], &[0xd9, 41, 3]);
        assert_eq!(unpack(&packed).map(|(v, _)| v), Some(Json::String(long)));
    }

    #[test]
    fn malformed_input_is_rejected() {
        assert!(unpack(&[0x92, 1]).is_none());
        assert!(unpack(&[0xd9, 9, 3]).is_none());
        assert!(unpack(&[]).is_none());
        assert_eq!(to_json_text(&[0x91, 0x01, 0x02]), "<msgpack 3 bytes>");
        // Ordered-map flags ext is skipped.
        assert_eq!(
            to_json_text(&[0x82, 0xc7, 0, 1, 0xc0, 0xa2, 3, b'k', 1]),
            r#"{"k":1}"#
        );
    }
}
