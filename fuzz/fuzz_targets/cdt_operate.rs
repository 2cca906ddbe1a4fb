//! CDT ops (`citrine_cdt::operate`) on arbitrary payloads and stored bins.
//!
//! Input: byte 0 picks the op type (bit 0: CDT_MODIFY) and the bin (bit 1:
//! present, bit 2: map rather than list); byte 1 is where the payload ends
//! and the bin's bytes begin. Oracle: no panic, and a bin written back
//! decodes and re-encodes to the same bytes (canonical form).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [mode, split, rest @ ..] = data else {
        return;
    };
    let split = usize::from(*split).min(rest.len());
    let (payload, bin) = rest.split_at(split);
    let particle = if mode & 4 != 0 { 19 } else { 20 };
    let bin = (mode & 2 != 0).then_some((particle, bin));
    if let Ok(outcome) = citrine_cdt::operate(payload, bin, mode & 1 != 0) {
        if let Some((_, bytes)) = outcome.bin {
            let value = citrine_cdt::value::decode_stored(&bytes).expect("a written bin decodes");
            assert_eq!(citrine_cdt::value::to_bytes(&value), bytes, "a written bin is canonical");
        }
    }
});
