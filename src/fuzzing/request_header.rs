//! Request header peek and the Produce acks peek: bounded reads only.

use crate::wire::header::{produce_acks, RequestHeaderPeek};

/// One input of the `request_header` fuzz target.
pub fn request_header(data: &[u8]) {
    let Ok(h) = RequestHeaderPeek::parse(data) else {
        return;
    };
    if let Some(id) = h.client_id(data) {
        assert!(id.len() <= data.len());
    }
    for header_version in [1, 2] {
        if let Ok(offset) = h.body_offset(data, header_version) {
            assert!(offset <= data.len());
            let _ = produce_acks(data, offset, h.api_version);
        }
    }
}
