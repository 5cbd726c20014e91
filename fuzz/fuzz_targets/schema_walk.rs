//! The `schema_walk` target: `kafka_mirror_proxy::fuzzing::schema_walk` says what it
//! feeds and what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kafka_mirror_proxy::fuzzing::schema_walk(data));
