//! The one writer of Kafka's variable-length encodings, the counterpart of
//! [`wire::cursor`](super::cursor): unsigned varints, zigzag varlongs,
//! array counts and strings as Kafka's `ByteUtils` and generated message
//! classes write them. Fixed-width integers are `to_be_bytes` where they
//! are written; everything whose length varies comes from here, so that a
//! reader of the cursor finds the matching writer in one place.
//!
//! Each takes any byte sink (`Vec<u8>`, `BytesMut`); none allocates beyond
//! what it appends.

/// An unsigned varint (`ByteUtils.writeUnsignedVarint`/`Varlong`): 7 bits a
/// byte, least significant first. Read back by [`Cursor::uvarlong`], or by
/// [`Cursor::uvarint`] when it fits 32 bits.
///
/// [`Cursor::uvarint`]: super::cursor::Cursor::uvarint
/// [`Cursor::uvarlong`]: super::cursor::Cursor::uvarlong
pub(crate) fn put_uvarint(out: &mut impl Extend<u8>, mut value: u64) {
    while value >= 0x80 {
        out.extend([(value as u8) | 0x80]);
        value >>= 7;
    }
    out.extend([value as u8]);
}

/// A signed varlong, zigzag-encoded (`ByteUtils.writeVarlong`), as records
/// write every length and delta. Read back by [`Cursor::varlong`] (or
/// [`Cursor::varint`] when it fits 32 bits).
///
/// [`Cursor::varint`]: super::cursor::Cursor::varint
/// [`Cursor::varlong`]: super::cursor::Cursor::varlong
pub(crate) fn put_varlong(out: &mut impl Extend<u8>, value: i64) {
    put_uvarint(out, ((value << 1) ^ (value >> 63)) as u64);
}

/// An array's element count: a compact count (count + 1, unsigned varint)
/// in a flexible version, an int32 before.
pub(crate) fn put_count(out: &mut impl Extend<u8>, count: usize, flexible: bool) {
    match flexible {
        true => put_uvarint(out, (count as u64).saturating_add(1)),
        false => out.extend((count as i32).to_be_bytes()),
    }
}

/// A nullable string: compact (length + 1, 0 for null) in a flexible
/// version, int16 length (-1 for null) before. Callers bound the length
/// far below `i16::MAX`.
pub(crate) fn put_string(out: &mut impl Extend<u8>, s: Option<&str>, flexible: bool) {
    match (s, flexible) {
        (None, true) => out.extend([0]),
        (None, false) => out.extend((-1i16).to_be_bytes()),
        (Some(s), true) => {
            put_count(out, s.len(), true);
            out.extend(s.bytes());
        }
        (Some(s), false) => {
            out.extend((s.len() as i16).to_be_bytes());
            out.extend(s.bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::cursor::Cursor;

    #[test]
    fn unsigned_varints_are_kafkas_bytes_and_read_back() {
        let cases: [(u64, &[u8]); 5] = [
            (0, &[0x00]),
            (127, &[0x7F]),
            (128, &[0x80, 0x01]),
            (300, &[0xAC, 0x02]),
            (u32::MAX as u64, &[0xFF, 0xFF, 0xFF, 0xFF, 0x0F]),
        ];
        for (value, bytes) in cases {
            let mut out = Vec::new();
            put_uvarint(&mut out, value);
            assert_eq!(out, bytes, "{value}");
            assert_eq!(Cursor::new(&out).uvarlong(), Ok(value));
        }
        let mut out = bytes::BytesMut::new();
        put_uvarint(&mut out, u64::MAX);
        assert_eq!(out.len(), 10);
        assert_eq!(Cursor::new(&out).uvarlong(), Ok(u64::MAX));
    }

    #[test]
    fn varlongs_are_zigzag() {
        let cases: [(i64, &[u8]); 5] = [
            (0, &[0x00]),
            (-1, &[0x01]),
            (1, &[0x02]),
            (-2, &[0x03]),
            (150, &[0xAC, 0x02]),
        ];
        for (value, bytes) in cases {
            let mut out = Vec::new();
            put_varlong(&mut out, value);
            assert_eq!(out, bytes, "{value}");
            assert_eq!(Cursor::new(&out).varlong(), Ok(value));
        }
        for value in [i64::MIN, i64::MAX] {
            let mut out = Vec::new();
            put_varlong(&mut out, value);
            assert_eq!(Cursor::new(&out).varlong(), Ok(value));
        }
    }

    #[test]
    fn counts_and_strings_by_version() {
        let mut out = Vec::new();
        put_count(&mut out, 2, true);
        put_count(&mut out, 2, false);
        assert_eq!(out, [3, 0, 0, 0, 2]);
        let mut out = Vec::new();
        put_string(&mut out, Some("ab"), true);
        put_string(&mut out, None, true);
        put_string(&mut out, Some("ab"), false);
        put_string(&mut out, None, false);
        assert_eq!(out, [3, b'a', b'b', 0, 0, 2, b'a', b'b', 0xFF, 0xFF]);
    }
}
