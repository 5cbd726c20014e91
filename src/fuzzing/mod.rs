//! The fuzz targets' bodies: one function a target, taking the fuzzer's
//! bytes and asserting the parser's invariants. `fuzz/` calls them, so the
//! parsers they reach stay crate-private; the unit tests below run each one
//! over its committed seeds, so every CI run checks the invariants on real
//! traffic without the nightly toolchain. Not part of the interface.

mod client_responses;
mod frame;
mod produce_plan;
mod record_batches;
mod request_header;
mod responses;
mod schema_walk;
mod state_batches;

pub use client_responses::client_responses;
pub use frame::frame;
pub use produce_plan::produce_plan;
pub use record_batches::record_batches;
pub use request_header::request_header;
pub use responses::responses;
pub use schema_walk::schema_walk;
pub use state_batches::state_batches;

#[cfg(test)]
mod tests {
    use std::path::Path;

    type Target = fn(&[u8]);

    /// Every target, by the name of its folders under `fuzz/seeds` and
    /// `fuzz/seeds-manual`.
    const TARGETS: [(&str, Target); 8] = [
        ("client_responses", super::client_responses),
        ("frame", super::frame),
        ("produce_plan", super::produce_plan),
        ("record_batches", super::record_batches),
        ("request_header", super::request_header),
        ("responses", super::responses),
        ("schema_walk", super::schema_walk),
        ("state_batches", super::state_batches),
    ];

    #[test]
    fn every_committed_seed_holds_its_targets_invariants() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut ran = 0;
        for (name, target) in TARGETS {
            for dir in ["seeds", "seeds-manual"] {
                let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
                    continue;
                };
                for entry in entries {
                    let path = entry.expect("a readable seed folder").path();
                    let input = std::fs::read(&path).expect("a readable seed");
                    target(&input);
                    ran += 1;
                }
            }
        }
        // The seeds are committed (232 today): none read means the
        // folders moved, not that every invariant held.
        assert!(ran >= 200, "only {ran} seeds ran");
    }

    #[test]
    fn short_and_empty_inputs_are_refused_without_a_panic() {
        for (_, target) in TARGETS {
            for input in [&b""[..], &[0], &[0, 0], &[0xff; 7], &[0, 0, 0, 8, 0, 0]] {
                target(input);
            }
        }
    }
}
