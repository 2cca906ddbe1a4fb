//! Storage compression (`citrine_storage::compress`): arbitrary bytes as a
//! stored compressed body (what a device record holds, its checksum aside)
//! never panic the decompressor, which gives exactly the declared length or
//! an error; and arbitrary bodies that compress come back byte for byte.
#![no_main]

use citrine_storage::compress::{compress, decompress, Algorithm, Compression};
use libfuzzer_sys::fuzz_target;

/// The largest body the oracle lets a declared length claim.
const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((selector, rest)) = data.split_first() else {
        return;
    };
    let algorithm = if selector & 1 == 0 {
        Algorithm::Lz4
    } else {
        Algorithm::Zstd
    };
    if let Ok(body) = decompress(algorithm, rest, LIMIT) {
        let declared = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        assert_eq!(body.len(), declared, "decompressed length is the declared one");
    }
    let setting = Compression {
        algorithm,
        level: selector >> 4 & 7,
    };
    if let Some(stored) = compress(setting, rest) {
        assert!(stored.len() < rest.len(), "stored compressed only when smaller");
        let back = decompress(algorithm, &stored, rest.len()).expect("own output decompresses");
        assert_eq!(back, rest, "round trip");
    }
});
