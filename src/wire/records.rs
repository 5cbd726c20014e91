//! The records inside one uncompressed v2 record batch, read in place the
//! way Kafka's `DefaultRecord.readFrom` reads them: for each, a varint
//! length, then attributes, a varlong timestamp delta, varint offset delta,
//! key, value (a negative length is null) and headers, which must end
//! exactly where the length says.
//!
//! Pure and borrowed: keys, values and headers are slices of the input, and
//! no count or length read from it sizes anything. Reading a batch's header
//! and refusing compressed batches is the caller's (`wire::batch`).

use super::cursor::{Cursor, CursorError};

/// The part of a record that could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed record: {}", self.field())]
pub(crate) enum MalformedRecord {
    /// Its length, or a length past the end of the records: nothing after
    /// it can be found, so the iteration ends here.
    Length,
    Attributes,
    TimestampDelta,
    OffsetDelta,
    Key,
    Value,
    Headers,
    /// Bytes left between the last header and the end the length gives.
    Size,
}

impl MalformedRecord {
    /// The part, as callers name it in their own errors.
    pub(crate) fn field(self) -> &'static str {
        match self {
            MalformedRecord::Length => "record length",
            MalformedRecord::Attributes => "attributes",
            MalformedRecord::TimestampDelta => "timestamp delta",
            MalformedRecord::OffsetDelta => "offset delta",
            MalformedRecord::Key => "key",
            MalformedRecord::Value => "value",
            MalformedRecord::Headers => "headers",
            MalformedRecord::Size => "record size",
        }
    }
}

/// One record, borrowed from the batch. Its attributes byte is read but
/// not kept: Kafka defines no record attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub timestamp_delta: i64,
    pub offset_delta: i32,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Headers<'a>,
}

/// The headers of a [`Record`]: (key, value) pairs, already checked when
/// the record was read, so iterating them cannot fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Headers<'a> {
    cur: Cursor<'a>,
    left: u32,
}

impl<'a> Iterator for Headers<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        self.left = self.left.checked_sub(1)?;
        let key = nullable(&mut self.cur).ok()??;
        let value = nullable(&mut self.cur).ok()?;
        Some((key, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for Headers<'_> {}

/// The records of a batch's records section (the bytes after its 61-byte
/// header), of which the header declares `count`; a negative count reads
/// none. A record whose length is intact but whose fields are not is
/// reported and stepped over; after a bad length nothing more is read.
/// Bytes after the `count`-th record are not looked at.
#[derive(Debug, Clone)]
pub(crate) struct Records<'a> {
    cur: Cursor<'a>,
    left: u32,
}

impl<'a> Records<'a> {
    pub(crate) fn new(section: &'a [u8], count: i32) -> Records<'a> {
        Records {
            cur: Cursor::new(section),
            left: u32::try_from(count).unwrap_or(0),
        }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, MalformedRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        self.left = self.left.checked_sub(1)?;
        let body = self
            .cur
            .varint()
            .ok()
            .and_then(|len| usize::try_from(len).ok())
            .and_then(|len| self.cur.bytes(len).ok());
        let Some(body) = body else {
            self.left = 0;
            return Some(Err(MalformedRecord::Length));
        };
        Some(record(body))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left as usize))
    }
}

impl std::iter::FusedIterator for Records<'_> {}

/// One record's fields from its `body` (the bytes its length covers).
fn record(body: &[u8]) -> Result<Record<'_>, MalformedRecord> {
    use MalformedRecord as M;
    let mut c = Cursor::new(body);
    c.i8().map_err(|_| M::Attributes)?;
    let timestamp_delta = c.varlong().map_err(|_| M::TimestampDelta)?;
    let offset_delta = c.varint().map_err(|_| M::OffsetDelta)?;
    let key = nullable(&mut c).map_err(|_| M::Key)?;
    let value = nullable(&mut c).map_err(|_| M::Value)?;
    let count = c.varint().map_err(|_| M::Headers)?;
    // Each header takes at least two bytes; Kafka bounds the count the same
    // way before reading any.
    let count = u32::try_from(count)
        .ok()
        .filter(|&n| n as usize <= c.remaining())
        .ok_or(M::Headers)?;
    let headers = Headers {
        cur: c,
        left: count,
    };
    for _ in 0..count {
        // A header key is never null.
        nullable(&mut c).ok().flatten().ok_or(M::Headers)?;
        nullable(&mut c).map_err(|_| M::Headers)?;
    }
    if c.remaining() != 0 {
        return Err(M::Size);
    }
    Ok(Record {
        timestamp_delta,
        offset_delta,
        key,
        value,
        headers,
    })
}

/// A varint length and that many bytes; a negative length is null.
fn nullable<'a>(c: &mut Cursor<'a>) -> Result<Option<&'a [u8]>, CursorError> {
    match usize::try_from(c.varint()?) {
        Ok(len) => c.bytes(len).map(Some),
        Err(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::batch::{build, NewBatch, NewRecord, HEADER_LEN};

    /// A one-record section as `wire::batch::build` writes a control
    /// record: length 10, attributes, deltas 0, key {0, 7}, null value,
    /// no headers.
    const CONTROL_RECORD: [u8; 11] = [20, 0, 0, 0, 8, 0, 0, 0, 7, 1, 0];

    fn read(section: &[u8], count: i32) -> Vec<Result<Record<'_>, MalformedRecord>> {
        Records::new(section, count).collect()
    }

    #[test]
    fn reads_a_record_from_exact_bytes() {
        let records = read(&CONTROL_RECORD, 1);
        let [Ok(r)] = records.as_slice() else {
            panic!("one record: {records:?}");
        };
        assert_eq!(
            (r.timestamp_delta, r.offset_delta, r.key, r.value),
            (0, 0, Some(&[0u8, 0, 0, 7][..]), None)
        );
        assert_eq!(r.headers.count(), 0);
        // Deltas, an empty key, headers with a null value.
        let section = [
            30, // length 15
            0,  // attributes
            0xAC, 0x02, // timestamp delta 150
            0x03, // offset delta -2
            0,    // key: empty
            2, b'v', // value "v"
            4,    // two headers
            2, b'a', 2, b'1', // "a" = "1"
            2, b'b', 1, // "b" = null
        ];
        assert_eq!(section.len(), 16);
        let records = read(&section, 1);
        let [Ok(r)] = records.as_slice() else {
            panic!("one record: {records:?}");
        };
        assert_eq!(
            (r.timestamp_delta, r.offset_delta, r.key, r.value),
            (150, -2, Some(&[][..]), Some(&b"v"[..]))
        );
        let headers: Vec<_> = r.headers.collect();
        assert_eq!(headers, [(&b"a"[..], Some(&b"1"[..])), (&b"b"[..], None)]);
    }

    #[test]
    fn reads_what_build_writes() {
        let headers = [("h", Some(&b"v"[..])), ("null", None)];
        let written = [
            NewRecord {
                key: Some(b"k0"),
                value: Some(b"first"),
                headers: &[],
                timestamp: 1_000,
            },
            NewRecord {
                key: None,
                value: None,
                headers: &headers,
                timestamp: 1_005,
            },
            NewRecord {
                key: Some(b""),
                value: Some(&[0xAB; 300]),
                headers: &[],
                timestamp: 998,
            },
        ];
        let batch = build(&NewBatch::NO_PRODUCER, &written).expect("build");
        let read: Vec<Record<'_>> = Records::new(&batch[HEADER_LEN..], 3)
            .collect::<Result<_, _>>()
            .expect("records");
        assert_eq!(read.len(), 3);
        for (i, (r, w)) in read.iter().zip(&written).enumerate() {
            assert_eq!(r.offset_delta, i as i32);
            assert_eq!(r.timestamp_delta, w.timestamp - 998);
            assert_eq!((r.key, r.value), (w.key, w.value));
            let h: Vec<_> = r.headers.collect();
            let w: Vec<_> = w.headers.iter().map(|(k, v)| (k.as_bytes(), *v)).collect();
            assert_eq!(h, w);
        }
        // A count past the records ends at the first missing one.
        let more = read_all(&batch[HEADER_LEN..], 5);
        assert_eq!(more, [Ok(()), Ok(()), Ok(()), Err(MalformedRecord::Length)]);
        assert_eq!(read_all(&batch[HEADER_LEN..], 1), [Ok(())]);
        assert_eq!(read_all(&batch[HEADER_LEN..], -1), []);
    }

    fn read_all(section: &[u8], count: i32) -> Vec<Result<(), MalformedRecord>> {
        Records::new(section, count)
            .map(|r| r.map(|_| ()))
            .collect()
    }

    #[test]
    fn truncated_records_are_errors_never_panics() {
        let batch = build(
            &NewBatch::NO_PRODUCER,
            &[
                NewRecord {
                    key: Some(b"k"),
                    value: Some(b"v"),
                    headers: &[("h", Some(b"x"))],
                    timestamp: 0,
                },
                NewRecord {
                    key: Some(b"k"),
                    value: None,
                    headers: &[],
                    timestamp: 0,
                },
            ],
        )
        .expect("build");
        let section = &batch[HEADER_LEN..];
        let first_len = 1 + usize::from(section[0] / 2);
        for n in 0..section.len() {
            let read = read_all(&section[..n], 2);
            let expected = if n < first_len {
                vec![Err(MalformedRecord::Length)]
            } else {
                vec![Ok(()), Err(MalformedRecord::Length)]
            };
            assert_eq!(read, expected, "cut at {n}");
        }
        assert_eq!(read_all(section, 2), [Ok(()), Ok(())]);
    }

    #[test]
    fn a_bad_field_inside_an_intact_length_is_stepped_over() {
        let mut section = Vec::new();
        // Length 3: attributes, timestamp delta 0, then an unterminated
        // offset delta.
        section.extend_from_slice(&[6, 0, 0, 0x80]);
        section.extend_from_slice(&CONTROL_RECORD);
        // Length 11: the control record's body and one byte more.
        section.extend_from_slice(&[22, 0, 0, 0, 8, 0, 0, 0, 7, 1, 0, 0]);
        // Length 6: null key and value, then a header count of -1.
        section.extend_from_slice(&[12, 0, 0, 0, 1, 1, 1]);
        section.extend_from_slice(&CONTROL_RECORD);
        assert_eq!(
            read_all(&section, 5),
            [
                Err(MalformedRecord::OffsetDelta),
                Ok(()),
                Err(MalformedRecord::Size),
                Err(MalformedRecord::Headers),
                Ok(()),
            ]
        );
        // Negative and over-long lengths end the iteration.
        assert_eq!(read_all(&[1, 0], 2), [Err(MalformedRecord::Length)]);
        let over_long = [0x80, 0x80, 0x80, 0x80, 0x80, 0x00];
        assert_eq!(read_all(&over_long, 1), [Err(MalformedRecord::Length)]);
        // A null header key; a header count past the bytes left.
        let null_key = [16, 0, 0, 0, 1, 1, 2, 1, 1];
        assert_eq!(read_all(&null_key, 1), [Err(MalformedRecord::Headers)]);
        let many = [12, 0, 0, 0, 1, 1, 10];
        assert_eq!(read_all(&many, 1), [Err(MalformedRecord::Headers)]);
    }
}
