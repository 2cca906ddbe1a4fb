//! JSON ⇄ Aerospike-dialect msgpack (05 §1) for list and map bins typed on
//! the command line and for printing them back, by way of the server's own
//! value model and codec (`citrine_cdt::value`).
//!
//! Invariants: strings are packed with their particle-type prefix (the
//! codec's); decoding refuses malformed input (`None`, never a panic).
//! Display conventions: GeoJSON prints as `"geojson:<text>"`, bytes as
//! `"0x<hex>"`, an ext other than collection flags as `"<ext>"`, a map key
//! that is not a string as its JSON text.

use citrine_cdt::value::{self, List, Map, Value};
use serde_json::Value as Json;

/// Packs a JSON value.
pub fn pack(json: &Json, out: &mut Vec<u8>) {
    value::encode(&from_json(json), out);
}

fn from_json(json: &Json) -> Value {
    match json {
        Json::Null => Value::Nil,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(number) => match (number.as_i64(), number.as_u64()) {
            (Some(int), _) => Value::Int(int),
            (None, Some(unsigned)) => Value::UInt(unsigned),
            (None, None) => Value::Double(number.as_f64().unwrap_or(0.0)),
        },
        Json::String(text) => Value::str(text),
        Json::Array(items) => Value::List(List {
            flags: 0,
            items: items.iter().map(from_json).collect(),
        }),
        Json::Object(entries) => Value::Map(Map {
            flags: 0,
            entries: entries
                .iter()
                .map(|(key, item)| (Value::str(key), from_json(item)))
                .collect(),
        }),
    }
}

/// Decodes a whole buffer (one msgpack item) into JSON, for display.
pub fn unpack(bytes: &[u8]) -> Option<Json> {
    value::decode(bytes).ok().map(|decoded| to_json(&decoded))
}

fn to_json(decoded: &Value) -> Json {
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    match decoded {
        Value::Nil => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Int(int) => Json::from(*int),
        Value::UInt(unsigned) => Json::from(*unsigned),
        Value::Double(double) => {
            serde_json::Number::from_f64(*double).map_or(Json::Null, Json::Number)
        }
        Value::Str(text) => Json::String(String::from_utf8_lossy(text).into_owned()),
        Value::Geo(text) => Json::String(format!("geojson:{}", String::from_utf8_lossy(text))),
        Value::Blob(_, bytes) if bytes.is_empty() => Json::String(String::new()),
        Value::Blob(_, bytes) => Json::String(format!("0x{}", hex(bytes))),
        Value::List(list) => Json::Array(list.items.iter().map(to_json).collect()),
        Value::Map(map) => Json::Object(
            map.entries
                .iter()
                .map(|(key, item)| {
                    let key = match to_json(key) {
                        Json::String(text) => text,
                        other => other.to_string(),
                    };
                    (key, to_json(item))
                })
                .collect(),
        ),
        Value::Ext(..) | Value::Wildcard | Value::Infinity => Json::String("<ext>".into()),
    }
}

/// Decodes a whole buffer to JSON text, or says how many bytes it could not.
pub fn to_json_text(bytes: &[u8]) -> String {
    match unpack(bytes) {
        Some(json) => json.to_string(),
        None => format!("<msgpack {} bytes>", bytes.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_through_msgpack() {
        let json: Json = serde_json::from_str(
            r#"{"a":[1,-1,300,-300,70000,-70000,5000000000,18446744073709551615,1.5,"x",true,null],"b":{"c":"d"}}"#,
        )
        .expect("json");
        let mut packed = Vec::new();
        pack(&json, &mut packed);
        assert_eq!(unpack(&packed), Some(json));
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
        assert_eq!(unpack(&packed), Some(Json::String(long)));
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
        // Bytes and GeoJSON show what they are.
        assert_eq!(
            to_json_text(&[0x92, 0xa3, 4, 0xab, 0xcd, 0xa3, 23, b'{', b'}']),
            r#"["0xabcd","geojson:{}"]"#
        );
    }
}
