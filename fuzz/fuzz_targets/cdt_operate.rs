//! The bin ops (`citrine_cdt::apply`: list and map, bits, HLL) on
//! arbitrary payloads and stored bins.
//!
//! Input: byte 0 picks the op type (bit 0: the modify op type), the bin
//! (bit 1: present; bit 2: a map rather than a list) and the family (bits
//! 3-4: 1 bits on a blob, 2 HLL, else list and map); byte 1 is where the
//! payload ends and the bin's bytes begin. Oracle: no panic; a list or map
//! written back decodes and re-encodes to the same bytes (canonical form);
//! a blob written back is under the 128 MiB bound; an HLL written back has
//! the length its header's bit counts give.
#![no_main]

use citrine_cdt::Family;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [mode, split, rest @ ..] = data else {
        return;
    };
    let split = usize::from(*split).min(rest.len());
    let (payload, bin) = rest.split_at(split);
    let (family, particle) = match (mode >> 3) & 3 {
        1 => (Family::Bits, 4),
        2 => (Family::Hll, 18),
        _ if mode & 4 != 0 => (Family::Cdt, 19),
        _ => (Family::Cdt, 20),
    };
    let bin = (mode & 2 != 0).then_some((particle, bin));
    let Ok(outcome) = citrine_cdt::apply(family, payload, bin, mode & 1 != 0) else {
        return;
    };
    let Some((written, bytes)) = outcome.bin else {
        return;
    };
    match family {
        Family::Cdt => {
            let value = citrine_cdt::value::decode_stored(&bytes).expect("a written bin decodes");
            assert_eq!(
                citrine_cdt::value::to_bytes(&value),
                bytes,
                "a written bin is canonical"
            );
        }
        Family::Bits => {
            assert_eq!(written, 4, "bits write blobs");
            assert!(bytes.len() < 128 << 20, "a blob stays under 128 MiB");
        }
        Family::Hll => {
            assert_eq!(written, 18, "HLL ops write HLLs");
            assert!(bytes.len() >= 11, "an HLL has its header");
            let (p, q) = (bytes[1], bytes[2]);
            let registers = ((6 + usize::from(q)) << p).div_ceil(8);
            assert_eq!(
                bytes.len(),
                11 + registers,
                "an HLL's length matches its header"
            );
        }
    }
});
