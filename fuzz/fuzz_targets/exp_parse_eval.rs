//! Expressions (`citrine_exp`): parse and evaluate arbitrary bytes as a
//! filter, an `EXP_READ` and an `EXP_MODIFY` against a fixed record with a
//! bin of every type.
//!
//! Input: byte 0 picks the flags of the op forms (low 5 bits); the rest is
//! the expression. Oracle: no panic; a parsed filter evaluates to one of
//! the three truths; results are well-formed particles (integers and floats
//! 8 bytes, lists and maps decoding to the same bytes).
#![no_main]

use citrine_exp::{BinWrite, Expression, Record};
use libfuzzer_sys::fuzz_target;

struct Fixed {
    bins: Vec<(&'static [u8], u8, Vec<u8>)>,
    digest: [u8; 20],
}

impl Record for Fixed {
    fn bin(&self, name: &[u8]) -> Option<(u8, &[u8])> {
        self.bins
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, p, b)| (*p, b.as_slice()))
    }
    fn key(&self) -> Option<(u8, &[u8])> {
        Some((3, b"key"))
    }
    fn digest(&self) -> &[u8; 20] {
        &self.digest
    }
    fn set_name(&self) -> &[u8] {
        b"set"
    }
    fn last_update_ms(&self) -> u64 {
        1_700_000_000_000
    }
    fn void_time_s(&self) -> Option<u64> {
        Some(1_800_000_000)
    }
    fn record_size(&self) -> u64 {
        100
    }
    fn is_tombstone(&self) -> bool {
        false
    }
    fn exists(&self) -> bool {
        true
    }
}

fn record() -> Fixed {
    Fixed {
        bins: vec![
            (b"i", 1, 7i64.to_be_bytes().to_vec()),
            (b"f", 2, 1.5f64.to_bits().to_be_bytes().to_vec()),
            (b"s", 3, b"abc".to_vec()),
            (b"b", 4, vec![1, 2, 3]),
            (b"t", 17, vec![1]),
            (b"h", 18, vec![4, 0, 0, 0]),
            (b"m", 19, vec![0x82, 0xc7, 0x00, 0x01, 0xc0, 0xa2, 0x03, b'k', 0x05]),
            (b"l", 20, vec![0x93, 0x01, 0x02, 0x93, 0x01, 0x02, 0x03]),
            (b"g", 23, b"\0\0\0{\"type\":\"Point\",\"coordinates\":[1,2]}".to_vec()),
        ],
        digest: [7; 20],
    }
}

fn check_particle(particle: u8, bytes: &[u8]) {
    match particle {
        1 | 2 => assert_eq!(bytes.len(), 8, "numbers are 8 bytes"),
        17 => assert_eq!(bytes.len(), 1, "booleans are 1 byte"),
        19 | 20 => {
            let value = citrine_cdt::value::decode_stored(bytes).expect("a collection decodes");
            assert_eq!(citrine_cdt::value::to_bytes(&value), bytes, "canonical");
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let [flags, expression @ ..] = data else {
        return;
    };
    let record = record();
    let now = 1_700_000_100_000;
    if let Ok(parsed) = Expression::parse(expression) {
        let _ = parsed.filter(&record, now);
    }
    // The op forms: [expression, flags].
    let mut payload = vec![0x92];
    payload.extend_from_slice(expression);
    payload.push(flags & 0x1f);
    if let Ok(Some((particle, bytes))) = citrine_exp::read_op(&payload, &record, now) {
        check_particle(particle, &bytes);
    }
    if let Ok(BinWrite::Store(particle, bytes)) =
        citrine_exp::modify_op(&payload, b"i", &record, now)
    {
        check_particle(particle, &bytes);
    }
});
