//! List and map values in Aerospike's msgpack dialect (protocol 05 §1):
//! building them from [`Value`]s, and reading them back as [`Element`]s.
//!
//! Owns the encoding of scalars inside collections — strings and blobs as
//! msgpack *str* with a leading particle-type byte (3 string, 4 blob, 23
//! GeoJSON), integers in their smallest form, doubles as float64 — and a
//! decoder that skips the ordered-collection ext marker a server puts
//! first in an ordered list or map.
//!
//! Invariant: [`pack`] of a `Value::List` or `Value::Map` embeds its bytes
//! as they are (they already are msgpack), so nesting costs one copy.

use crate::value::Value;

/// A decoded element of a list or map.
#[derive(Clone, Debug, PartialEq)]
pub enum Element {
    Nil,
    Bool(bool),
    Int(i64),
    /// An unsigned integer above `i64::MAX`.
    UInt(u64),
    Float(f64),
    String(String),
    Blob(Vec<u8>),
    GeoJson(String),
    List(Vec<Element>),
    /// Entries in stored order (key order for a key-ordered map).
    Map(Vec<(Element, Element)>),
}

fn pack_str_header(out: &mut Vec<u8>, length: usize) {
    match length {
        0..=31 => out.push(0xa0 | length as u8),
        32..=0xff => out.extend_from_slice(&[0xd9, length as u8]),
        0x100..=0xffff => {
            out.push(0xda);
            out.extend_from_slice(&(length as u16).to_be_bytes());
        }
        _ => {
            out.push(0xdb);
            out.extend_from_slice(&(length as u32).to_be_bytes());
        }
    }
}

fn pack_typed_bytes(out: &mut Vec<u8>, particle_type: u8, bytes: &[u8]) {
    pack_str_header(out, bytes.len() + 1);
    out.push(particle_type);
    out.extend_from_slice(bytes);
}

/// Appends an integer in its smallest msgpack form.
pub fn pack_int(out: &mut Vec<u8>, value: i64) {
    match value {
        0..=127 => out.push(value as u8),
        -32..=-1 => out.push(value as i8 as u8),
        128..=0xff => out.extend_from_slice(&[0xcc, value as u8]),
        0x100..=0xffff => {
            out.push(0xcd);
            out.extend_from_slice(&(value as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
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
            out.push(0xd3);
            out.extend_from_slice(&value.to_be_bytes());
        }
    }
}

/// Appends an array header for `count` elements.
pub fn pack_array_header(out: &mut Vec<u8>, count: usize) {
    match count {
        0..=15 => out.push(0x90 | count as u8),
        16..=0xffff => {
            out.push(0xdc);
            out.extend_from_slice(&(count as u16).to_be_bytes());
        }
        _ => {
            out.push(0xdd);
            out.extend_from_slice(&(count as u32).to_be_bytes());
        }
    }
}

fn pack_map_header(out: &mut Vec<u8>, count: usize) {
    match count {
        0..=15 => out.push(0x80 | count as u8),
        16..=0xffff => {
            out.push(0xde);
            out.extend_from_slice(&(count as u16).to_be_bytes());
        }
        _ => {
            out.push(0xdf);
            out.extend_from_slice(&(count as u32).to_be_bytes());
        }
    }
}

/// Appends a value as an element of a list or map (or an argument of a
/// CDT operation).
pub fn pack(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Nil => out.push(0xc0),
        Value::Bool(flag) => out.push(if *flag { 0xc3 } else { 0xc2 }),
        Value::Int(number) => pack_int(out, *number),
        Value::Float(number) => {
            out.push(0xcb);
            out.extend_from_slice(&number.to_bits().to_be_bytes());
        }
        Value::String(text) => pack_typed_bytes(out, 3, text.as_bytes()),
        Value::Blob(bytes) => pack_typed_bytes(out, 4, bytes),
        Value::GeoJson(text) => pack_typed_bytes(out, 23, text.as_bytes()),
        // HLLs travel as blobs of their own particle type.
        Value::Hll(bytes) => pack_typed_bytes(out, 18, bytes),
        Value::List(bytes) | Value::Map(bytes) => out.extend_from_slice(bytes),
        Value::Raw { .. } => pack(out, &value.cooked()),
    }
}

/// A list bin value of these elements.
pub fn list(items: &[Value]) -> Value {
    let mut out = Vec::new();
    pack_array_header(&mut out, items.len());
    for item in items {
        pack(&mut out, item);
    }
    Value::List(out)
}

/// A map bin value of these entries (unordered, as given).
pub fn map(entries: &[(Value, Value)]) -> Value {
    let mut out = Vec::new();
    pack_map_header(&mut out, entries.len());
    for (key, item) in entries {
        pack(&mut out, key);
        pack(&mut out, item);
    }
    Value::Map(out)
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < count {
            return None;
        }
        let (head, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Some(head)
    }

    fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn uint(&mut self, width: usize) -> Option<u64> {
        Some(
            self.take(width)?
                .iter()
                .fold(0u64, |value, byte| value << 8 | u64::from(*byte)),
        )
    }

    /// One element; `depth` bounds nesting (hostile input cannot recurse
    /// without end).
    fn element(&mut self, depth: u32) -> Option<Element> {
        if depth > 64 {
            return None;
        }
        let marker = self.byte()?;
        Some(match marker {
            0x00..=0x7f => Element::Int(i64::from(marker)),
            0xe0..=0xff => Element::Int(i64::from(marker as i8)),
            0xc0 => Element::Nil,
            0xc2 => Element::Bool(false),
            0xc3 => Element::Bool(true),
            0xcc => Element::Int(self.uint(1)? as i64),
            0xcd => Element::Int(self.uint(2)? as i64),
            0xce => Element::Int(self.uint(4)? as i64),
            0xcf => {
                let value = self.uint(8)?;
                i64::try_from(value).map_or(Element::UInt(value), Element::Int)
            }
            0xd0 => Element::Int(i64::from(self.uint(1)? as u8 as i8)),
            0xd1 => Element::Int(i64::from(self.uint(2)? as u16 as i16)),
            0xd2 => Element::Int(i64::from(self.uint(4)? as u32 as i32)),
            0xd3 => Element::Int(self.uint(8)? as i64),
            0xca => Element::Float(f64::from(f32::from_bits(self.uint(4)? as u32))),
            0xcb => Element::Float(f64::from_bits(self.uint(8)?)),
            0xa0..=0xbf => self.typed((marker & 0x1f) as usize)?,
            0xd9 | 0xc4 => {
                let length = self.uint(1)? as usize;
                self.typed(length)?
            }
            0xda | 0xc5 => {
                let length = self.uint(2)? as usize;
                self.typed(length)?
            }
            0xdb | 0xc6 => {
                let length = self.uint(4)? as usize;
                self.typed(length)?
            }
            0x90..=0x9f => self.list((marker & 0x0f) as usize, depth)?,
            0xdc => {
                let count = self.uint(2)? as usize;
                self.list(count, depth)?
            }
            0xdd => {
                let count = self.uint(4)? as usize;
                self.list(count, depth)?
            }
            0x80..=0x8f => self.map((marker & 0x0f) as usize, depth)?,
            0xde => {
                let count = self.uint(2)? as usize;
                self.map(count, depth)?
            }
            0xdf => {
                let count = self.uint(4)? as usize;
                self.map(count, depth)?
            }
            _ => return None,
        })
    }

    /// A str/bin payload: its first byte is the particle type.
    fn typed(&mut self, length: usize) -> Option<Element> {
        let payload = self.take(length)?;
        let Some((&particle_type, bytes)) = payload.split_first() else {
            return Some(Element::String(String::new()));
        };
        Some(match particle_type {
            3 => Element::String(String::from_utf8_lossy(bytes).into_owned()),
            23 => Element::GeoJson(String::from_utf8_lossy(bytes).into_owned()),
            _ => Element::Blob(bytes.to_vec()),
        })
    }

    /// Whether the next bytes are the ordered-collection marker (ext type 0).
    fn at_order_marker(&self) -> bool {
        self.bytes.len() >= 3 && self.bytes[0] == 0xc7 && self.bytes[1] == 0
    }

    fn list(&mut self, count: usize, depth: u32) -> Option<Element> {
        let mut remaining = count;
        if remaining > 0 && self.at_order_marker() {
            self.take(3)?;
            remaining -= 1;
        }
        // A count is the sender's word: reserve no more than a little.
        let mut items = Vec::with_capacity(remaining.min(64));
        for _ in 0..remaining {
            items.push(self.element(depth + 1)?);
        }
        Some(Element::List(items))
    }

    fn map(&mut self, count: usize, depth: u32) -> Option<Element> {
        let mut remaining = count;
        if remaining > 0 && self.at_order_marker() {
            self.take(3)?;
            self.element(depth + 1)?;
            remaining -= 1;
        }
        let mut entries = Vec::with_capacity(remaining.min(64));
        for _ in 0..remaining {
            let key = self.element(depth + 1)?;
            let item = self.element(depth + 1)?;
            entries.push((key, item));
        }
        Some(Element::Map(entries))
    }
}

/// Decodes a whole msgpack value (a list or map bin's bytes, or one
/// element); `None` when the bytes are not one complete value.
pub fn unpack(bytes: &[u8]) -> Option<Element> {
    let mut reader = Reader { bytes };
    let element = reader.element(0)?;
    reader.bytes.is_empty().then_some(element)
}

impl Value {
    /// A list or map bin's contents as elements (`None` for other values
    /// or bytes that do not decode).
    pub fn elements(&self) -> Option<Element> {
        match self {
            Value::List(bytes) | Value::Map(bytes) => unpack(bytes),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_take_their_smallest_form_and_round_trip() {
        for (value, bytes) in [
            (0i64, vec![0x00]),
            (127, vec![0x7f]),
            (-1, vec![0xff]),
            (-32, vec![0xe0]),
            (-33, vec![0xd0, 0xdf]),
            (200, vec![0xcc, 200]),
            (70_000, vec![0xce, 0, 1, 0x11, 0x70]),
            (
                i64::MIN,
                [vec![0xd3], i64::MIN.to_be_bytes().to_vec()].concat(),
            ),
        ] {
            let mut out = Vec::new();
            pack_int(&mut out, value);
            assert_eq!(out, bytes, "{value}");
            assert_eq!(unpack(&out), Some(Element::Int(value)));
        }
    }

    #[test]
    fn collections_round_trip_with_typed_strings() {
        let inner = list(&[Value::Int(1), Value::String("x".into())]);
        let value = map(&[
            (Value::String("k".into()), inner),
            (Value::Int(-7), Value::Blob(vec![1, 2])),
            (Value::Bool(true), Value::Float(2.5)),
        ]);
        let Value::Map(bytes) = &value else {
            panic!("a map")
        };
        assert_eq!(
            &bytes[..4],
            &[0x83, 0xa2, 3, b'k'],
            "str with particle type 3"
        );
        assert_eq!(
            value.elements(),
            Some(Element::Map(vec![
                (
                    Element::String("k".into()),
                    Element::List(vec![Element::Int(1), Element::String("x".into())])
                ),
                (Element::Int(-7), Element::Blob(vec![1, 2])),
                (Element::Bool(true), Element::Float(2.5)),
            ]))
        );
        // An ordered map as a server stores it: the marker pair is skipped.
        let ordered = [0x82, 0xc7, 0x00, 0x01, 0xc0, 0x01, 0x02];
        assert_eq!(
            unpack(&ordered),
            Some(Element::Map(vec![(Element::Int(1), Element::Int(2))]))
        );
        assert_eq!(unpack(&[0x92, 0x01]), None, "truncated");
        assert_eq!(unpack(&[0x01, 0x02]), None, "trailing bytes");
        let deep = vec![0x91; 100];
        assert_eq!(unpack(&deep), None, "nesting is bounded");
        // A count far beyond the bytes: refused without reserving for it.
        let mut huge = Vec::new();
        for _ in 0..60 {
            huge.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
        }
        assert_eq!(unpack(&huge), None);
    }
}
