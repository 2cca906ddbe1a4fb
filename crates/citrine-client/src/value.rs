//! Bin values and their wire encodings (02 §4.3).
//!
//! Owns [`Value`] and [`Bin`]. Invariant: `Value::decode(v.particle_type(),
//! &v.encode())` gives back `v` for every value (GeoJSON cells the server may
//! add are skipped, as every client does). Lists and maps stay raw Aerospike
//! msgpack: the client never re-encodes them.

use citrine_types::ParticleType;

/// A bin value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// No value (writing it deletes the bin).
    Nil,
    Int(i64),
    Float(f64),
    String(String),
    Blob(Vec<u8>),
    Bool(bool),
    /// Raw msgpack of a list (Aerospike dialect, 05 §1).
    List(Vec<u8>),
    /// Raw msgpack of a map (Aerospike dialect, 05 §1).
    Map(Vec<u8>),
    GeoJson(String),
    Hll(Vec<u8>),
    /// A value kept exactly as the server sent it: its particle type and
    /// its wire bytes (a string that is not UTF-8, a language-specific
    /// blob, a GeoJSON value with its cells). What a scan with
    /// [`crate::ScanPolicy::raw_values`] returns; written back unchanged.
    Raw {
        particle: u8,
        bytes: Vec<u8>,
    },
}

impl Value {
    /// Particle type byte sent with this value.
    pub fn particle_type(&self) -> u8 {
        if let Value::Raw { particle, .. } = self {
            return *particle;
        }
        let particle = match self {
            Value::Nil => ParticleType::Null,
            Value::Int(_) => ParticleType::Integer,
            Value::Float(_) => ParticleType::Float,
            Value::String(_) => ParticleType::String,
            Value::Blob(_) => ParticleType::Blob,
            Value::Bool(_) => ParticleType::Bool,
            Value::List(_) => ParticleType::List,
            Value::Map(_) => ParticleType::Map,
            Value::GeoJson(_) => ParticleType::GeoJson,
            Value::Hll(_) => ParticleType::Hll,
            Value::Raw { .. } => ParticleType::Blob,
        };
        particle as u8
    }

    /// Appends the wire encoding of the value to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Value::Nil => {}
            Value::Int(value) => out.extend_from_slice(&value.to_be_bytes()),
            Value::Float(value) => out.extend_from_slice(&value.to_bits().to_be_bytes()),
            Value::String(value) => out.extend_from_slice(value.as_bytes()),
            Value::Blob(bytes)
            | Value::List(bytes)
            | Value::Map(bytes)
            | Value::Hll(bytes)
            | Value::Raw { bytes, .. } => out.extend_from_slice(bytes),
            Value::Bool(value) => out.push(u8::from(*value)),
            Value::GeoJson(text) => {
                out.push(0);
                out.extend_from_slice(&0u16.to_be_bytes());
                out.extend_from_slice(text.as_bytes());
            }
        }
    }

    /// The wire encoding as a new vector.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    /// The value decoded from its particle type and bytes when it is
    /// [`Value::Raw`] (a string that is not UTF-8 decodes lossily), itself
    /// otherwise.
    pub fn cooked(&self) -> Value {
        match self {
            Value::Raw { particle, bytes } => {
                Value::decode(*particle, bytes).unwrap_or_else(|| Value::Blob(bytes.clone()))
            }
            other => other.clone(),
        }
    }

    /// Decodes a value of particle type `particle` from `bytes`. Unknown
    /// particle types and the language-specific blob types come back as
    /// [`Value::Blob`]; malformed numbers give `None`.
    pub fn decode(particle: u8, bytes: &[u8]) -> Option<Value> {
        Some(match ParticleType::from_u8(particle) {
            Some(ParticleType::Null) => Value::Nil,
            Some(ParticleType::Integer) => {
                // The server may send 1, 2, 4 or 8 bytes (zero-extended).
                if bytes.len() > 8 {
                    return None;
                }
                let mut word = [0u8; 8];
                word[8 - bytes.len()..].copy_from_slice(bytes);
                Value::Int(i64::from_be_bytes(word))
            }
            Some(ParticleType::Float) => {
                let word: [u8; 8] = bytes.try_into().ok()?;
                Value::Float(f64::from_bits(u64::from_be_bytes(word)))
            }
            Some(ParticleType::String) => {
                Value::String(String::from_utf8_lossy(bytes).into_owned())
            }
            Some(ParticleType::Bool) => Value::Bool(bytes.first().copied().unwrap_or(0) != 0),
            Some(ParticleType::Hll) => Value::Hll(bytes.to_vec()),
            Some(ParticleType::Map) => Value::Map(bytes.to_vec()),
            Some(ParticleType::List) => Value::List(bytes.to_vec()),
            Some(ParticleType::GeoJson) => {
                let cells = usize::from(u16::from_be_bytes([*bytes.get(1)?, *bytes.get(2)?]));
                let start = 3 + cells * 8;
                Value::GeoJson(String::from_utf8_lossy(bytes.get(start..)?).into_owned())
            }
            _ => Value::Blob(bytes.to_vec()),
        })
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Nil => write!(f, "nil"),
            Value::Int(value) => write!(f, "{value}"),
            Value::Float(value) => write!(f, "{value:?}"),
            Value::String(value) => write!(f, "{value:?}"),
            Value::Bool(value) => write!(f, "{value}"),
            Value::GeoJson(text) => write!(f, "geojson {text}"),
            Value::Blob(bytes) => write!(f, "blob[{}] {}", bytes.len(), hex_prefix(bytes)),
            Value::Hll(bytes) => write!(f, "hll[{}]", bytes.len()),
            Value::Raw { .. } => write!(f, "{}", self.cooked()),
            Value::List(bytes) => write!(
                f,
                "list(msgpack {} bytes) {}",
                bytes.len(),
                hex_prefix(bytes)
            ),
            Value::Map(bytes) => write!(
                f,
                "map(msgpack {} bytes) {}",
                bytes.len(),
                hex_prefix(bytes)
            ),
        }
    }
}

fn hex_prefix(bytes: &[u8]) -> String {
    let mut text: String = bytes
        .iter()
        .take(32)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    if bytes.len() > 32 {
        text.push('…');
    }
    text
}

impl From<i64> for Value {
    fn from(value: i64) -> Value {
        Value::Int(value)
    }
}
impl From<i32> for Value {
    fn from(value: i32) -> Value {
        Value::Int(i64::from(value))
    }
}
impl From<u32> for Value {
    fn from(value: u32) -> Value {
        Value::Int(i64::from(value))
    }
}
impl From<f64> for Value {
    fn from(value: f64) -> Value {
        Value::Float(value)
    }
}
impl From<bool> for Value {
    fn from(value: bool) -> Value {
        Value::Bool(value)
    }
}
impl From<&str> for Value {
    fn from(value: &str) -> Value {
        Value::String(value.to_owned())
    }
}
impl From<String> for Value {
    fn from(value: String) -> Value {
        Value::String(value)
    }
}
impl From<Vec<u8>> for Value {
    fn from(value: Vec<u8>) -> Value {
        Value::Blob(value)
    }
}
impl From<&[u8]> for Value {
    fn from(value: &[u8]) -> Value {
        Value::Blob(value.to_vec())
    }
}

/// A named bin value, as written by `put`.
#[derive(Clone, Debug, PartialEq)]
pub struct Bin {
    pub name: String,
    pub value: Value,
}

impl Bin {
    pub fn new(name: impl Into<String>, value: impl Into<Value>) -> Bin {
        Bin {
            name: name.into(),
            value: value.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let values = [
            Value::Nil,
            Value::Int(-5),
            Value::Int(i64::MAX),
            Value::Float(1.5),
            Value::String("héllo".into()),
            Value::Blob(vec![0, 1, 255]),
            Value::Bool(true),
            Value::Bool(false),
            Value::List(vec![0x92, 1, 2]),
            Value::Map(vec![0x81, 1, 2]),
            Value::GeoJson("{\"type\":\"Point\",\"coordinates\":[1,2]}".into()),
            Value::Hll(vec![1, 2, 3]),
        ];
        let raw = Value::Raw {
            particle: 7,
            bytes: vec![0xff, 0, 1],
        };
        assert_eq!(raw.particle_type(), 7);
        assert_eq!(raw.encode(), vec![0xff, 0, 1]);
        assert_eq!(raw.cooked(), Value::Blob(vec![0xff, 0, 1]));
        for value in values {
            let bytes = value.encode();
            assert_eq!(
                Value::decode(value.particle_type(), &bytes),
                Some(value.clone()),
                "{value:?}"
            );
        }
    }

    #[test]
    fn decodes_short_integers_and_cells() {
        assert_eq!(Value::decode(1, &[1, 0]), Some(Value::Int(256)));
        assert_eq!(Value::decode(1, &[0; 9]), None);
        assert_eq!(Value::decode(2, &[0; 4]), None);
        // GeoJSON with one cell id the server added.
        let mut bytes = vec![0, 0, 1];
        bytes.extend_from_slice(&[9; 8]);
        bytes.extend_from_slice(b"{}");
        assert_eq!(Value::decode(23, &bytes), Some(Value::GeoJson("{}".into())));
        assert_eq!(
            Value::decode(7, b"java"),
            Some(Value::Blob(b"java".to_vec()))
        );
        assert_eq!(Value::decode(99, b"x"), Some(Value::Blob(b"x".to_vec())));
    }
}
