//! A cheap look at a request's header: API key, version, correlation id and
//! client id, read in place without decoding the body.
//!
//! Every request passes through here, so it allocates nothing. Header v1 and
//! v2 put the client id at the same place; v2 (flexible versions) adds tagged
//! fields after it, which only matter when the body must be found.

use std::ops::Range;

use super::cursor::Cursor;

/// Why a request header could not be read.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum HeaderError {
    #[error("request of {0} bytes is too short for a request header (needs at least 10)")]
    TooShort(usize),
    #[error("client id length {len} at byte 8 overruns the {frame} byte request")]
    ClientIdOverrun { len: i16, frame: usize },
    #[error("client id is not valid UTF-8")]
    ClientIdUtf8,
    #[error("malformed tagged fields in the request header")]
    TaggedFields,
    #[error("malformed {0} in the request body")]
    Body(&'static str),
}

/// The fixed part of a request header plus where the client id is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeaderPeek {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    client_id: Option<Range<usize>>,
    /// Offset of the first byte after the client id.
    after_client_id: usize,
}

impl RequestHeaderPeek {
    /// Read the header of `frame` (a request without its size prefix).
    pub fn parse(frame: &[u8]) -> Result<Self, HeaderError> {
        if frame.len() < 10 {
            return Err(HeaderError::TooShort(frame.len()));
        }
        let api_key = i16::from_be_bytes([frame[0], frame[1]]);
        let api_version = i16::from_be_bytes([frame[2], frame[3]]);
        let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let len = i16::from_be_bytes([frame[8], frame[9]]);
        let (client_id, after_client_id) = if len < 0 {
            (None, 10)
        } else {
            let end = 10 + len as usize;
            if end > frame.len() {
                return Err(HeaderError::ClientIdOverrun {
                    len,
                    frame: frame.len(),
                });
            }
            std::str::from_utf8(&frame[10..end]).map_err(|_| HeaderError::ClientIdUtf8)?;
            (Some(10..end), end)
        };
        Ok(RequestHeaderPeek {
            api_key,
            api_version,
            correlation_id,
            client_id,
            after_client_id,
        })
    }

    /// The client id, if the request carries one.
    pub(crate) fn client_id<'a>(&self, frame: &'a [u8]) -> Option<&'a str> {
        let range = self.client_id.clone()?;
        std::str::from_utf8(frame.get(range)?).ok()
    }

    /// Offset of the request body, given the header version (1 or 2) that the
    /// API key and version imply.
    pub fn body_offset(&self, frame: &[u8], header_version: i16) -> Result<usize, HeaderError> {
        if header_version < 2 {
            return Ok(self.after_client_id);
        }
        skip_tagged_fields(frame, self.after_client_id).ok_or(HeaderError::TaggedFields)
    }
}

/// Offset of a response body, given its header version (0: correlation id
/// only; 1: then tagged fields).
pub fn response_body_offset(frame: &[u8], header_version: i16) -> Option<usize> {
    if frame.len() < 4 {
        return None;
    }
    if header_version < 1 {
        return Some(4);
    }
    skip_tagged_fields(frame, 4)
}

fn skip_tagged_fields(buf: &[u8], pos: usize) -> Option<usize> {
    let mut c = Cursor::at(buf, pos);
    for _ in 0..c.uvarint().ok()? {
        let _tag = c.uvarint().ok()?;
        let size = c.uvarint().ok()?;
        c.skip(size as usize).ok()?;
    }
    Some(c.position())
}

/// The `acks` of a Produce request (v3+), read from the body without
/// decoding it: a fire-and-forget (`acks=0`) request gets no response, so
/// the proxy must not wait for one.
pub(crate) fn produce_acks(
    frame: &[u8],
    body_offset: usize,
    version: i16,
) -> Result<i16, HeaderError> {
    let mut c = after_transactional_id(frame, body_offset, version, "acks")?;
    c.i16().map_err(|_| HeaderError::Body("acks"))
}

/// The `timeout_ms` of a Produce request (after `acks`): how long the
/// broker may wait for the replication `acks` asks for.
pub(crate) fn produce_timeout_ms(
    frame: &[u8],
    body_offset: usize,
    version: i16,
) -> Result<i32, HeaderError> {
    let timeout = |_| HeaderError::Body("timeout_ms");
    let mut c = after_transactional_id(frame, body_offset, version, "timeout_ms")?;
    c.i16().map_err(timeout)?;
    c.i32().map_err(timeout)
}

/// A cursor on a Produce body past its transactional id; `next` names the
/// field that follows, for the error when the id overruns the frame.
fn after_transactional_id<'f>(
    frame: &'f [u8],
    body_offset: usize,
    version: i16,
    next: &'static str,
) -> Result<Cursor<'f>, HeaderError> {
    let txn_id = |_| HeaderError::Body("transactional_id");
    let mut c = Cursor::at(frame, body_offset);
    let txn_id_len = if version >= 9 {
        // Compact nullable string: length + 1 as an unsigned varint, 0 = null.
        c.uvarint().map_err(txn_id)?.saturating_sub(1) as usize
    } else {
        c.i16().map_err(txn_id)?.max(0) as usize
    };
    // A transactional id that overruns the frame leaves no room for what follows.
    c.skip(txn_id_len).map_err(|_| HeaderError::Body(next))?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Produce v9, correlation 7, client id "ab", one empty tagged-field
    // section, then a body: null transactional id, acks -1.
    const PRODUCE_V9: [u8; 17] = [
        0, 0, 0, 9, 0, 0, 0, 7, 0, 2, b'a', b'b', 0, // header v2
        0, 0xFF, 0xFF, 0, // body: txn id null, acks = -1, (start of timeout)
    ];

    #[test]
    fn peeks_the_fixed_fields_and_client_id() {
        let h = RequestHeaderPeek::parse(&PRODUCE_V9).expect("header");
        assert_eq!((h.api_key, h.api_version, h.correlation_id), (0, 9, 7));
        assert_eq!(h.client_id(&PRODUCE_V9), Some("ab"));
        assert_eq!(h.body_offset(&PRODUCE_V9, 2), Ok(13));
        assert_eq!(h.body_offset(&PRODUCE_V9, 1), Ok(12));
        assert_eq!(produce_acks(&PRODUCE_V9, 13, 9), Ok(-1));
        // Cut inside timeout_ms: an error, not a guess.
        assert_eq!(
            produce_timeout_ms(&PRODUCE_V9, 13, 9),
            Err(HeaderError::Body("timeout_ms"))
        );
        let mut whole = PRODUCE_V9.to_vec();
        whole.extend([0, 0x75, 0x30]); // timeout_ms = 30000
        assert_eq!(produce_timeout_ms(&whole, 13, 9), Ok(30_000));
    }

    #[test]
    fn null_client_id_and_legacy_acks() {
        // Produce v3, null client id, transactional id "t", acks 0.
        let frame = [0, 0, 0, 3, 0, 0, 0, 1, 0xFF, 0xFF, 0, 1, b't', 0, 0];
        let h = RequestHeaderPeek::parse(&frame).expect("header");
        assert_eq!(h.client_id(&frame), None);
        assert_eq!(h.body_offset(&frame, 1), Ok(10));
        assert_eq!(produce_acks(&frame, 10, 3), Ok(0));
    }

    #[test]
    fn malformed_headers_say_why() {
        assert_eq!(
            RequestHeaderPeek::parse(&[0; 5]),
            Err(HeaderError::TooShort(5))
        );
        let overrun = [0, 0, 0, 0, 0, 0, 0, 0, 0, 50, b'x'];
        assert_eq!(
            RequestHeaderPeek::parse(&overrun),
            Err(HeaderError::ClientIdOverrun { len: 50, frame: 11 })
        );
        // One tagged field claiming 9 bytes that are not there.
        let tagged = [0, 0, 0, 9, 0, 0, 0, 7, 0, 0, 1, 0, 9];
        let h = RequestHeaderPeek::parse(&tagged).expect("fixed part");
        assert_eq!(h.body_offset(&tagged, 2), Err(HeaderError::TaggedFields));
        assert_eq!(
            produce_acks(&[0, 0], 1, 3),
            Err(HeaderError::Body("transactional_id"))
        );
        // A transactional id whose compact length is the largest varint:
        // no room for acks, and no arithmetic on the length to overflow.
        let forged = [0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 0xFF, 0xFF];
        assert_eq!(produce_acks(&forged, 0, 9), Err(HeaderError::Body("acks")));
    }
}
