//! Secondary indexes (`citrine_sindex`): the values an index takes from an
//! arbitrary bin under an arbitrary context and collection type, a query's
//! INDEX_RANGE, and `sindex-create` parameter text.
//!
//! Input: byte 0 picks the key type (bits 0-1), the collection type (bits
//! 2-3) and the bin's particle type (bits 4-6: integer, string, blob,
//! list, map, others); byte 1 is the context's length, then the context's
//! bytes (used when they form a valid context), then the bin's bytes. The
//! whole input is also parsed as an INDEX_RANGE and, as text, as
//! `sindex-create` parameters.
//!
//! Oracle: no panic; keys come sorted and unique, each of the index's key
//! type; an integer range has begin ≤ end; a definition that parses prints
//! back to parameters that parse to the same definition.
#![no_main]

use citrine_exp::Record;
use citrine_sindex::def::params;
use citrine_sindex::{CollectionType, Filter, Key, KeyType, Range, Sindex, SindexDef, Source};
use libfuzzer_sys::fuzz_target;

struct OneBin<'a> {
    particle_type: u8,
    bytes: &'a [u8],
}

impl Record for OneBin<'_> {
    fn bin(&self, name: &[u8]) -> Option<(u8, &[u8])> {
        (name == b"b").then_some((self.particle_type, self.bytes))
    }
    fn key(&self) -> Option<(u8, &[u8])> {
        None
    }
    fn digest(&self) -> &[u8; 20] {
        &[7; 20]
    }
    fn set_name(&self) -> &[u8] {
        b""
    }
    fn last_update_ms(&self) -> u64 {
        1_700_000_000_000
    }
    fn void_time_s(&self) -> Option<u64> {
        None
    }
    fn record_size(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn is_tombstone(&self) -> bool {
        false
    }
    fn exists(&self) -> bool {
        true
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(filter) = Filter::parse(data) {
        if let Range::Int { begin, end } = filter.range {
            assert!(begin <= end);
        }
        let ranges = filter.bval_ranges();
        assert!(!ranges.is_empty());
        assert!(ranges.iter().all(|(low, high)| low <= high));
        assert!(ranges.windows(2).all(|pair| pair[0].1 < pair[1].0), "sorted, disjoint");
        assert!(filter.check_cost() >= 1);
    }
    let text = String::from_utf8_lossy(data);
    if let Ok(def) = SindexDef::parse(params(&text)) {
        let again = def.to_command();
        assert_eq!(SindexDef::parse(params(&again)).ok(), Some(def));
    }

    let [config, context_length, rest @ ..] = data else {
        return;
    };
    let key_type = match config & 3 {
        0 => KeyType::Numeric,
        1 => KeyType::String,
        2 => KeyType::Blob,
        _ => KeyType::Geo,
    };
    let collection = match (config >> 2) & 3 {
        0 => CollectionType::Default,
        1 => CollectionType::List,
        2 => CollectionType::MapKeys,
        _ => CollectionType::MapValues,
    };
    let particle_type = match (config >> 4) & 7 {
        0 => 1,
        1 => 3,
        2 => 4,
        3 | 4 => 20,
        5 => 19,
        6 => 23,
        _ => 2,
    };
    let context_length = usize::from(*context_length).min(rest.len());
    let (context, bytes) = rest.split_at(context_length);
    let context = (!context.is_empty() && citrine_cdt::check_context(context).is_ok())
        .then(|| context.to_vec());
    let def = SindexDef {
        namespace: "test".into(),
        name: "fuzz".into(),
        set: None,
        source: Source::Bin("b".into()),
        key_type,
        collection,
        context,
    };
    let Ok(index) = Sindex::new(def) else {
        return;
    };
    let mut keys = Vec::new();
    index.keys(&OneBin { particle_type, bytes }, 1_700_000_000_000, &mut keys);
    assert!(keys.windows(2).all(|pair| pair[0] < pair[1]), "sorted, unique");
    for key in &keys {
        match (key_type, key) {
            (KeyType::Numeric | KeyType::Geo, Key::Int(_))
            | (KeyType::String | KeyType::Blob, Key::Bytes(_)) => {}
            _ => panic!("a key of another type than the index's: {key:?}"),
        }
    }
});
