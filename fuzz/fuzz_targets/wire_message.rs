//! Concatenated bare AS_MSGs walked with `Message::decode_prefix` (see
//! `oracle::check_messages`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = citrine_wire_fuzz::oracle::check_messages(data);
});
