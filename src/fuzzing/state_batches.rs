//! The state-topic reader: batches as a fetch returns them, compressed with
//! any codec or not, signed or not. Input: a records slice. Invariants: no
//! panic; the next offset never goes back; every record reported is at or
//! past the offset asked for; memory stays within libFuzzer's RSS limit
//! (a batch decompresses into at most 8 MiB).

use crate::state::mac::StateAuth;
use crate::state::topic::read_batches;

/// One input of the `state_batches` fuzz target.
pub fn state_batches(data: &[u8]) {
    let auth = StateAuth::new(b"0123456789abcdef0123456789abcdef", "__mirror_state", 0);
    for (from, auth) in [(0, None), (3, Some(&auth))] {
        let next = read_batches(data, from, auth, |offset, _| {
            assert!(offset >= from, "record {offset} before {from}");
        });
        assert!(next >= from);
    }
}
