//! The values a record contributes to an index ("keys"), and their bval:
//! the signed 64-bit number an index is ordered by and a query resumes at
//! (protocol 04 §3.3, field BVAL 15).
//!
//! An integer's bval is the integer. A string's or blob's is the first
//! eight bytes (little-endian) of its RIPEMD-160 hash, so equal values
//! share a bval and a query verifies the value itself on the record.
//!
//! Invariants: extraction never fails a write — a source the index cannot
//! read (missing bin, wrong type, a context that finds nothing, an
//! expression that fails) contributes no key; the keys of one record are
//! sorted and unique.

use crate::def::{CollectionType, KeyType, SindexDef, Source};
use citrine_cdt::value::{self, Value};
use citrine_exp::{Expression, Record};
use citrine_types::ParticleType;
use ripemd::{Digest as _, Ripemd160};

/// One indexed value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    Int(i64),
    /// A string's or blob's bytes (which one is the index's key type).
    Bytes(Vec<u8>),
}

impl Key {
    /// The value the index orders by.
    pub fn bval(&self) -> i64 {
        match self {
            Key::Int(value) => *value,
            Key::Bytes(bytes) => bytes_bval(bytes),
        }
    }
}

/// The bval of a string or blob.
pub fn bytes_bval(bytes: &[u8]) -> i64 {
    let hash = Ripemd160::digest(bytes);
    let mut word = [0u8; 8];
    word.copy_from_slice(&hash[..8]);
    i64::from_le_bytes(word)
}

/// A key from a bin's particle, when it is of the index's key type.
fn from_particle(key_type: KeyType, particle_type: u8, bytes: &[u8]) -> Option<Key> {
    match (key_type, ParticleType::from_u8(particle_type)?) {
        (KeyType::Numeric, ParticleType::Integer) => {
            Some(Key::Int(i64::from_be_bytes(bytes.try_into().ok()?)))
        }
        (KeyType::String, ParticleType::String) | (KeyType::Blob, ParticleType::Blob) => {
            Some(Key::Bytes(bytes.to_vec()))
        }
        _ => None,
    }
}

/// The keys of an element of a list or map, when it is of the index's key
/// type (a geo element: the cells of its shape).
fn push_from_value(key_type: KeyType, element: &Value, out: &mut Vec<Key>) {
    if key_type == KeyType::Geo {
        if let Value::Geo(text) = element {
            if let Some(shape) = crate::geo::Shape::parse(text) {
                out.extend(crate::geo::index_cells(&shape).into_iter().map(Key::Int));
            }
        }
        return;
    }
    out.extend(from_value(key_type, element));
}

/// A key from an element of a list or map, when it is of the index's key
/// type (not geo).
fn from_value(key_type: KeyType, element: &Value) -> Option<Key> {
    match (key_type, element) {
        (KeyType::Numeric, Value::Int(value)) => Some(Key::Int(*value)),
        (KeyType::String, Value::Str(bytes)) => Some(Key::Bytes(bytes.clone())),
        (KeyType::Blob, Value::Blob(subtype, bytes))
            if *subtype == ParticleType::Blob as u8 || *subtype == 0 =>
        {
            Some(Key::Bytes(bytes.clone()))
        }
        _ => None,
    }
}

/// One indexed element of a source value: the source particle itself (a
/// default collection without a context), or an element found in it.
pub(crate) enum Element<'a> {
    Particle(u8, &'a [u8]),
    Value(&'a Value),
}

/// Calls `each` with every element of one source value (the bin's or the
/// expression's particle) that `def`'s context and collection type select.
pub(crate) fn visit(
    def: &SindexDef,
    particle_type: u8,
    bytes: &[u8],
    each: &mut dyn FnMut(Element<'_>),
) {
    if def.context.is_none() && def.collection == CollectionType::Default {
        each(Element::Particle(particle_type, bytes));
        return;
    }
    if particle_type != ParticleType::List as u8 && particle_type != ParticleType::Map as u8 {
        return;
    }
    let Ok(mut element) = value::decode_stored(bytes) else {
        return;
    };
    if let Some(context) = &def.context {
        match citrine_cdt::select(element, context) {
            Ok(Some(found)) => element = found,
            _ => return,
        }
    }
    match (def.collection, &element) {
        (CollectionType::Default, element) => each(Element::Value(element)),
        (CollectionType::List, Value::List(list)) => list
            .items
            .iter()
            .for_each(|item| each(Element::Value(item))),
        (CollectionType::MapKeys, Value::Map(map)) => map
            .entries
            .iter()
            .for_each(|(key, _)| each(Element::Value(key))),
        (CollectionType::MapValues, Value::Map(map)) => map
            .entries
            .iter()
            .for_each(|(_, item)| each(Element::Value(item))),
        _ => {}
    }
}

/// Appends the keys of one source value (the bin's or the expression's
/// particle) under `def`'s context and collection type.
pub(crate) fn collect(def: &SindexDef, particle_type: u8, bytes: &[u8], out: &mut Vec<Key>) {
    visit(def, particle_type, bytes, &mut |element| match element {
        Element::Particle(particle_type, bytes) if def.key_type == KeyType::Geo => {
            if particle_type == ParticleType::GeoJson as u8 {
                if let Some(shape) = crate::geo::Shape::from_particle(bytes) {
                    out.extend(crate::geo::index_cells(&shape).into_iter().map(Key::Int));
                }
            }
        }
        Element::Particle(particle_type, bytes) => {
            out.extend(from_particle(def.key_type, particle_type, bytes))
        }
        Element::Value(element) => push_from_value(def.key_type, element, out),
    });
}

/// The GeoJSON shapes of one source value that `def` indexes.
pub(crate) fn shapes(def: &SindexDef, particle_type: u8, bytes: &[u8]) -> Vec<crate::geo::Shape> {
    let mut out = Vec::new();
    visit(def, particle_type, bytes, &mut |element| match element {
        Element::Particle(particle_type, bytes) => {
            if particle_type == ParticleType::GeoJson as u8 {
                out.extend(crate::geo::Shape::from_particle(bytes));
            }
        }
        Element::Value(Value::Geo(text)) => out.extend(crate::geo::Shape::parse(text)),
        Element::Value(_) => {}
    });
    out
}

/// The source value (particle type, bytes) of `record` for an index
/// defined by `def`: its bin, or its expression's value.
pub(crate) fn source_value(
    def: &SindexDef,
    expression: Option<&Expression>,
    record: &dyn Record,
    now_ms: u64,
) -> Option<(u8, Vec<u8>)> {
    match (&def.source, expression) {
        (Source::Bin(bin), _) => record
            .bin(bin.as_bytes())
            .map(|(particle_type, bytes)| (particle_type, bytes.to_vec())),
        (Source::Expression(_), Some(expression)) => expression.value(record, now_ms),
        (Source::Expression(_), None) => None,
        (Source::Set, _) => Some((ParticleType::Integer as u8, 0i64.to_be_bytes().to_vec())),
    }
}

/// Every key `record` contributes to an index defined by `def`
/// (`expression`: `def`'s parsed expression, for an expression index),
/// sorted and unique, into `out` (cleared first).
pub(crate) fn extract(
    def: &SindexDef,
    expression: Option<&Expression>,
    record: &dyn Record,
    now_ms: u64,
    out: &mut Vec<Key>,
) {
    out.clear();
    match (&def.source, expression) {
        (Source::Bin(bin), _) => {
            if let Some((particle_type, bytes)) = record.bin(bin.as_bytes()) {
                collect(def, particle_type, bytes, out);
            }
        }
        (Source::Expression(_), Some(expression)) => {
            if let Some((particle_type, bytes)) = expression.value(record, now_ms) {
                collect(def, particle_type, &bytes, out);
            }
        }
        (Source::Expression(_), None) => {
            debug_assert!(false, "an expression index without its parsed expression");
        }
        // A record of the set (the caller indexes only those): one entry.
        (Source::Set, _) => out.push(Key::Int(0)),
    }
    if out.len() > 1 {
        out.sort_unstable();
        out.dedup();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::def::params;

    fn def(text: &str) -> SindexDef {
        SindexDef::parse(params(text)).expect("definition")
    }

    fn keys(def: &SindexDef, particle_type: u8, bytes: &[u8]) -> Vec<Key> {
        let mut out = Vec::new();
        collect(def, particle_type, bytes, &mut out);
        out.sort();
        out
    }

    fn msgpack(value: &Value) -> Vec<u8> {
        value::to_bytes(value)
    }

    #[test]
    fn a_scalar_bin_gives_a_key_only_of_its_type() {
        let numeric = def("ns=t;indexname=i;bin=b;type=NUMERIC");
        assert_eq!(
            keys(&numeric, 1, &(-5i64).to_be_bytes()),
            vec![Key::Int(-5)]
        );
        assert!(keys(&numeric, 3, b"five").is_empty());
        assert!(keys(&numeric, 2, &1.5f64.to_bits().to_be_bytes()).is_empty());
        let string = def("ns=t;indexname=i;bin=b;type=STRING");
        assert_eq!(
            keys(&string, 3, b"five"),
            vec![Key::Bytes(b"five".to_vec())]
        );
        assert!(keys(&string, 4, b"five").is_empty());
        let blob = def("ns=t;indexname=i;bin=b;type=BLOB");
        assert_eq!(keys(&blob, 4, &[1, 2]), vec![Key::Bytes(vec![1, 2])]);
    }

    #[test]
    fn collections_give_a_key_per_element_of_the_type() {
        let list = Value::List(value::List {
            flags: 0,
            items: vec![
                Value::Int(3),
                Value::str("a"),
                Value::Int(1),
                Value::Blob(4, vec![9]),
            ],
        });
        let bytes = msgpack(&list);
        let numeric = def("ns=t;indexname=i;bin=b;type=NUMERIC;indextype=LIST");
        assert_eq!(keys(&numeric, 20, &bytes), vec![Key::Int(1), Key::Int(3)]);
        let string = def("ns=t;indexname=i;bin=b;type=STRING;indextype=LIST");
        assert_eq!(keys(&string, 20, &bytes), vec![Key::Bytes(b"a".to_vec())]);
        let blob = def("ns=t;indexname=i;bin=b;type=BLOB;indextype=LIST");
        assert_eq!(keys(&blob, 20, &bytes), vec![Key::Bytes(vec![9])]);
        // A list index over a map bin, or a map index over a list: nothing.
        let mapkeys = def("ns=t;indexname=i;bin=b;type=NUMERIC;indextype=MAPKEYS");
        assert!(keys(&mapkeys, 20, &bytes).is_empty());

        let map = Value::Map(value::Map {
            flags: 0,
            entries: vec![
                (Value::str("k"), Value::Int(7)),
                (Value::Int(2), Value::str("v")),
            ],
        });
        let bytes = msgpack(&map);
        assert_eq!(keys(&mapkeys, 19, &bytes), vec![Key::Int(2)]);
        let mapvalues = def("ns=t;indexname=i;bin=b;type=NUMERIC;indextype=MAPVALUES");
        assert_eq!(keys(&mapvalues, 19, &bytes), vec![Key::Int(7)]);
        assert!(keys(&numeric, 19, &bytes).is_empty());
    }

    #[test]
    fn a_context_leads_to_the_indexed_element() {
        use base64::Engine as _;
        // [[1, 2], [30, 40]]; context: list index 1.
        let nested = Value::List(value::List {
            flags: 0,
            items: vec![
                Value::List(value::List {
                    flags: 0,
                    items: vec![Value::Int(1), Value::Int(2)],
                }),
                Value::List(value::List {
                    flags: 0,
                    items: vec![Value::Int(30), Value::Int(40)],
                }),
            ],
        });
        let ctx = base64::engine::general_purpose::STANDARD.encode([0x92, 0x10, 0x01]);
        let list = def(&format!(
            "ns=t;indexname=i;bin=b;type=NUMERIC;indextype=LIST;context={ctx}"
        ));
        assert_eq!(
            keys(&list, 20, &msgpack(&nested)),
            vec![Key::Int(30), Key::Int(40)]
        );
        // Default collection under a context: the element itself.
        let ctx = base64::engine::general_purpose::STANDARD.encode([0x94, 0x10, 0x00, 0x10, 0x01]);
        let element = def(&format!(
            "ns=t;indexname=i;bin=b;type=NUMERIC;context={ctx}"
        ));
        assert_eq!(keys(&element, 20, &msgpack(&nested)), vec![Key::Int(2)]);
        // A context that finds nothing, or a scalar bin: no key.
        let ctx = base64::engine::general_purpose::STANDARD.encode([0x92, 0x10, 0x05]);
        let missing = def(&format!(
            "ns=t;indexname=i;bin=b;type=NUMERIC;context={ctx}"
        ));
        assert!(keys(&missing, 20, &msgpack(&nested)).is_empty());
        assert!(keys(&missing, 1, &5i64.to_be_bytes()).is_empty());
    }

    #[test]
    fn geo_keys_are_the_cells_of_points_and_regions() {
        let point = br#"{"type":"Point","coordinates":[-122,37.5]}"#;
        let mut particle = vec![0, 0, 0];
        particle.extend_from_slice(point);
        let geo = def("ns=t;indexname=i;bin=b;type=GEO2DSPHERE");
        let cells = keys(&geo, 23, &particle);
        assert_eq!(cells.len(), 1);
        assert!(keys(&geo, 3, point).is_empty(), "a string is not GeoJSON");
        // A list of GeoJSON values under a LIST index: every element's cells.
        let list = Value::List(value::List {
            flags: 0,
            items: vec![
                Value::Geo(point.to_vec()),
                Value::Geo(br#"{"type":"Point","coordinates":[151.2,-33.9]}"#.to_vec()),
                Value::Int(4),
            ],
        });
        let in_list = def("ns=t;indexname=i;bin=b;type=GEO2DSPHERE;indextype=LIST");
        let listed = keys(&in_list, 20, &msgpack(&list));
        assert_eq!(listed.len(), 2);
        assert!(listed.contains(&cells[0]));
        assert_eq!(shapes(&in_list, 20, &msgpack(&list)).len(), 2);
    }

    #[test]
    fn string_bvals_are_stable_and_equal_for_equal_values() {
        assert_eq!(bytes_bval(b"abc"), bytes_bval(b"abc"));
        assert_ne!(bytes_bval(b"abc"), bytes_bval(b"abd"));
        assert_eq!(Key::Int(-9).bval(), -9);
    }
}
