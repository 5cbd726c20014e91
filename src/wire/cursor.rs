//! The one reader of Kafka bytes: a position over a borrowed slice, with the
//! fixed-width big-endian integers and the varints of Kafka's `ByteUtils`.
//!
//! Every read checks the bytes that remain first and leaves the position
//! where it was when it fails, so a caller can name the field and offset in
//! its own error. Nothing is copied except the fixed-width values, and no
//! length read from the input sizes anything: [`Cursor::bytes`] returns a
//! sub-slice of the input.
//!
//! Varints follow `ByteUtils.readUnsignedVarint` / `readVarint` (at most 5
//! bytes) and `readUnsignedVarlong` / `readVarlong` (at most 10): a longer
//! encoding is refused as Kafka refuses it. Kafka silently drops the bits of
//! the last byte that do not fit the type; no Kafka writer sets them, and
//! these readers refuse them, so one value has one encoding length at most.

/// Why a read failed. The position is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CursorError {
    /// The read needs `need` bytes from the position; `left` remain.
    #[error("needs {need} bytes, only {left} left")]
    Short { need: usize, left: usize },
    /// A varint longer than its type allows, or carrying bits past it.
    #[error("malformed varint")]
    Varint,
}

/// A read position in a slice. What is left to read is kept as a slice
/// itself, so no read has to check the position against the end again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cursor<'a> {
    /// The bytes not read yet: a tail of the slice.
    rest: &'a [u8],
    /// The length of the whole slice: the position is `end - rest.len()`.
    end: usize,
}

impl<'a> Cursor<'a> {
    /// At the start of `buf`.
    #[inline]
    pub(crate) const fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor {
            rest: buf,
            end: buf.len(),
        }
    }

    /// At `pos` in `buf` (at its end if `pos` is past it). Positions stay
    /// offsets into `buf`, so a caller can read a prefix of its input
    /// (`&input[..end]`) and still report offsets into the whole.
    #[inline]
    pub(crate) fn at(buf: &'a [u8], pos: usize) -> Cursor<'a> {
        Cursor {
            rest: buf.get(pos..).unwrap_or_default(),
            end: buf.len(),
        }
    }

    /// Offset of the next byte to read.
    #[inline]
    pub(crate) fn position(&self) -> usize {
        self.end - self.rest.len()
    }

    /// Bytes left to read.
    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// The bytes left to read, without reading them.
    #[inline]
    #[cfg(test)]
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.rest
    }

    #[cold]
    fn short(&self, need: usize) -> CursorError {
        CursorError::Short {
            need,
            left: self.remaining(),
        }
    }

    /// The next `n` bytes, borrowed from the input.
    #[inline]
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], CursorError> {
        match self.rest.split_at_checked(n) {
            Some((head, tail)) => {
                self.rest = tail;
                Ok(head)
            }
            None => Err(self.short(n)),
        }
    }

    /// Step over the next `n` bytes.
    #[inline]
    pub(crate) fn skip(&mut self, n: usize) -> Result<(), CursorError> {
        self.bytes(n).map(|_| ())
    }

    /// The next `N` bytes, copied.
    #[inline]
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], CursorError> {
        match self.rest.split_first_chunk::<N>() {
            Some((a, tail)) => {
                self.rest = tail;
                Ok(*a)
            }
            None => Err(self.short(N)),
        }
    }

    #[inline]
    pub(crate) fn i8(&mut self) -> Result<i8, CursorError> {
        self.array().map(i8::from_be_bytes)
    }

    #[inline]
    pub(crate) fn i16(&mut self) -> Result<i16, CursorError> {
        self.array().map(i16::from_be_bytes)
    }

    #[inline]
    pub(crate) fn i32(&mut self) -> Result<i32, CursorError> {
        self.array().map(i32::from_be_bytes)
    }

    #[inline]
    #[cfg(test)]
    pub(crate) fn u32(&mut self) -> Result<u32, CursorError> {
        self.array().map(u32::from_be_bytes)
    }

    #[inline]
    #[cfg(test)]
    pub(crate) fn i64(&mut self) -> Result<i64, CursorError> {
        self.array().map(i64::from_be_bytes)
    }

    /// An unsigned varint of at most 5 bytes whose value fits 32 bits
    /// (`ByteUtils.readUnsignedVarint`): the lengths, counts and tags of
    /// flexible message versions.
    #[inline]
    pub(crate) fn uvarint(&mut self) -> Result<u32, CursorError> {
        // The fifth byte may only carry the top four bits, so the value fits.
        self.unsigned::<5, 0x0F>().map(|v| v as u32)
    }

    /// An unsigned varint of at most 10 bytes whose value fits 64 bits
    /// (`ByteUtils.readUnsignedVarlong`).
    #[inline]
    pub(crate) fn uvarlong(&mut self) -> Result<u64, CursorError> {
        // The tenth byte may only carry the top bit.
        self.unsigned::<10, 0x01>()
    }

    /// At most `MAX` bytes of 7 bits each, the last at most `LAST`.
    #[inline(always)]
    fn unsigned<const MAX: usize, const LAST: u8>(&mut self) -> Result<u64, CursorError> {
        let rest = self.rest;
        let mut value = 0u64;
        for i in 0..MAX {
            let Some(&b) = rest.get(i) else {
                return Err(self.short(i + 1));
            };
            value |= u64::from(b & 0x7F) << (7 * i);
            if b & 0x80 == 0 {
                if i == MAX - 1 && b > LAST {
                    break;
                }
                self.rest = rest.get(i + 1..).unwrap_or_default();
                return Ok(value);
            }
        }
        Err(CursorError::Varint)
    }

    /// A zig-zag varint of at most 5 bytes (`ByteUtils.readVarint`): the
    /// lengths and offset deltas inside a record.
    #[inline]
    pub(crate) fn varint(&mut self) -> Result<i32, CursorError> {
        let z = self.uvarint()?;
        Ok((z >> 1) as i32 ^ -((z & 1) as i32))
    }

    /// A zig-zag varint of at most 10 bytes (`ByteUtils.readVarlong`): a
    /// record's timestamp delta.
    #[inline]
    pub(crate) fn varlong(&mut self) -> Result<i64, CursorError> {
        let z = self.uvarlong()?;
        Ok((z >> 1) as i64 ^ -((z & 1) as i64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uvarint(b: &[u8]) -> (Result<u32, CursorError>, usize) {
        let mut c = Cursor::new(b);
        (c.uvarint(), c.position())
    }

    fn varint(b: &[u8]) -> Result<i32, CursorError> {
        Cursor::new(b).varint()
    }

    fn uvarlong(b: &[u8]) -> (Result<u64, CursorError>, usize) {
        let mut c = Cursor::new(b);
        (c.uvarlong(), c.position())
    }

    fn varlong(b: &[u8]) -> Result<i64, CursorError> {
        Cursor::new(b).varlong()
    }

    #[test]
    fn fixed_width_integers_are_big_endian() {
        let b = [
            0xFE, // i8 -2
            0x80, 0x01, // i16 -32767
            0xFF, 0xFF, 0xFF, 0xFE, // i32 -2
            0xFF, 0xFF, 0xFF, 0xFE, // u32 4294967294
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // i64
        ];
        let mut c = Cursor::new(&b);
        assert_eq!(c.i8(), Ok(-2));
        assert_eq!(c.i16(), Ok(-32767));
        assert_eq!(c.i32(), Ok(-2));
        assert_eq!(c.u32(), Ok(0xFFFF_FFFE));
        assert_eq!(c.i64(), Ok(0x0102_0304_0506_0708));
        assert_eq!((c.position(), c.remaining()), (19, 0));
        assert_eq!(c.i8(), Err(CursorError::Short { need: 1, left: 0 }));
    }

    #[test]
    fn a_short_read_says_how_short_and_moves_nothing() {
        let mut c = Cursor::new(&[1, 2, 3]);
        assert_eq!(c.i16(), Ok(0x0102));
        assert_eq!(c.i32(), Err(CursorError::Short { need: 4, left: 1 }));
        assert_eq!(c.bytes(2), Err(CursorError::Short { need: 2, left: 1 }));
        assert_eq!(c.position(), 2);
        assert_eq!(c.rest(), &[3]);
        assert_eq!(
            c.bytes(usize::MAX),
            Err(CursorError::Short {
                need: usize::MAX,
                left: 1
            })
        );
    }

    #[test]
    fn bytes_borrow_the_input() {
        let input = [9u8, 8, 7, 6];
        let mut c = Cursor::new(&input);
        let b = c.bytes(3).expect("3 bytes");
        assert_eq!(b, &[9, 8, 7]);
        assert!(std::ptr::eq(b.as_ptr(), input.as_ptr()));
        assert_eq!(c.bytes(0), Ok(&[][..]));
        c.skip(1).expect("1 byte");
        assert_eq!((c.position(), c.remaining()), (4, 0));
    }

    #[test]
    fn a_cursor_may_start_inside_its_input() {
        let input = [0u8, 0, 0x96, 0x01];
        let mut c = Cursor::at(&input, 2);
        assert_eq!(c.uvarint(), Ok(150));
        assert_eq!(c.position(), 4);
        let c = Cursor::at(&input, 99);
        assert_eq!((c.position(), c.remaining()), (4, 0));
        // A prefix of the input: the reads stop at its end.
        let mut c = Cursor::at(&input[..3], 2);
        assert_eq!(c.uvarint(), Err(CursorError::Short { need: 2, left: 1 }));
    }

    #[test]
    fn unsigned_varints_up_to_five_bytes() {
        assert_eq!(uvarint(&[0x00]), (Ok(0), 1));
        assert_eq!(uvarint(&[0x7F]), (Ok(127), 1));
        assert_eq!(uvarint(&[0x96, 0x01]), (Ok(150), 2));
        // The largest: u32::MAX in 5 bytes, the fifth holding four bits.
        assert_eq!(uvarint(&[0xFF, 0xFF, 0xFF, 0xFF, 0x0F]), (Ok(u32::MAX), 5));
        // Over-long: a sixth byte, as Kafka refuses it.
        assert_eq!(
            uvarint(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x01]),
            (Err(CursorError::Varint), 0)
        );
        // Over 32 bits in the fifth byte.
        assert_eq!(
            uvarint(&[0xFF, 0xFF, 0xFF, 0xFF, 0x1F]),
            (Err(CursorError::Varint), 0)
        );
        // Truncated: the bytes read so far and the one missing.
        assert_eq!(
            uvarint(&[0x80, 0x80]),
            (Err(CursorError::Short { need: 3, left: 2 }), 0)
        );
        assert_eq!(
            uvarint(&[]),
            (Err(CursorError::Short { need: 1, left: 0 }), 0)
        );
    }

    #[test]
    fn signed_varints_are_zigzag() {
        assert_eq!(varint(&[0x00]), Ok(0));
        assert_eq!(varint(&[0x01]), Ok(-1));
        assert_eq!(varint(&[0x02]), Ok(1));
        assert_eq!(varint(&[0x03]), Ok(-2));
        assert_eq!(varint(&[0xAC, 0x02]), Ok(150));
        assert_eq!(varint(&[0xFE, 0xFF, 0xFF, 0xFF, 0x0F]), Ok(i32::MAX));
        assert_eq!(varint(&[0xFF, 0xFF, 0xFF, 0xFF, 0x0F]), Ok(i32::MIN));
        assert_eq!(
            varint(&[0x81, 0x80, 0x80, 0x80, 0x80, 0x00]),
            Err(CursorError::Varint)
        );
        assert_eq!(
            varint(&[0xFF]),
            Err(CursorError::Short { need: 2, left: 1 })
        );
    }

    #[test]
    fn varlongs_up_to_ten_bytes() {
        let max = [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01];
        assert_eq!(uvarlong(&max), (Ok(u64::MAX), 10));
        assert_eq!(varlong(&max), Ok(i64::MIN));
        let mut max_positive = max;
        max_positive[0] = 0xFE;
        assert_eq!(varlong(&max_positive), Ok(i64::MAX));
        assert_eq!(varlong(&[0x03]), Ok(-2));
        assert_eq!(varlong(&[0xAC, 0x02]), Ok(150));
        // 2^35 does not fit a varint but does a varlong.
        let big = [0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
        assert_eq!(uvarlong(&big), (Ok(1 << 35), 6));
        assert_eq!(uvarint(&big).0, Err(CursorError::Varint));
        // Over-long: an eleventh byte; over 64 bits in the tenth.
        assert_eq!(uvarlong(&[0x80; 11]), (Err(CursorError::Varint), 0));
        let mut over = max;
        over[9] = 0x02;
        assert_eq!(uvarlong(&over), (Err(CursorError::Varint), 0));
        assert_eq!(
            uvarlong(&max[..9]),
            (Err(CursorError::Short { need: 10, left: 9 }), 0)
        );
    }
}
