//! Whole frames: 8-byte proto header + body, dispatched on the message type
//! to the AS_MSG, compressed, info and admin decoders (see `oracle::check_frame`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = citrine_wire_fuzz::oracle::check_frame(data);
});
