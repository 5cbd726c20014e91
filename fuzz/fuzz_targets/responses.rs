//! The `responses` target: `kafka_mirror_proxy::fuzzing::responses` says what it
//! feeds and what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kafka_mirror_proxy::fuzzing::responses(data));
