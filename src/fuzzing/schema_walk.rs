//! The schema-driven walk of every compiled-in message at every version.
//! Input: one byte picking the message, one the version, then the body.
//! Invariants: no panic; a body that walks re-emits byte for byte.

use crate::wire::schema;
use crate::wire::walk::{rewrite, validate, Validate};

/// One input of the `schema_walk` fuzz target.
pub fn schema_walk(data: &[u8]) {
    let [pick, version, body @ ..] = data else {
        return;
    };
    let names: Vec<&str> = schema::source_files()
        .map(|(f, _)| f.trim_end_matches(".json"))
        .collect();
    let Ok(m) = schema::message(names[usize::from(*pick) % names.len()]) else {
        return;
    };
    let version = i16::from(*version % 20);
    if validate(m, version, body, 0).is_ok() {
        let out = rewrite(m, version, body, 0, &mut Validate).expect("walks twice");
        assert_eq!(out, body);
    }
}
