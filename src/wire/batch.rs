//! Zero-copy view of Kafka v2 record batch headers, and an in-place rewrite of
//! the producer id that updates the CRC without reading the records; and
//! ([`build`]) a new uncompressed batch for the records the proxy writes.
//!
//! Layout (big-endian, offsets from the batch start):
//! baseOffset i64 @0, batchLength i32 @8 (bytes after this field),
//! partitionLeaderEpoch i32 @12, magic i8 @16, crc u32 @17 (CRC-32C of
//! 21..end), attributes i16 @21, lastOffsetDelta i32 @23, baseTimestamp i64
//! @27, maxTimestamp i64 @35, producerId i64 @43, producerEpoch i16 @51,
//! baseSequence i32 @53, recordCount i32 @57, records @61.

use std::iter::FusedIterator;
use std::ops::Range;

use thiserror::Error;

use crate::wire::crc32c;

mod build;
pub use build::{build, BuildError, NewBatch, NewRecord};

pub(crate) const BASE_OFFSET_OFFSET: usize = 0;
pub(crate) const BATCH_LENGTH_OFFSET: usize = 8;
/// baseOffset + batchLength: bytes not counted by batchLength.
pub(crate) const LOG_OVERHEAD: usize = 12;
#[allow(dead_code)] // named so the layout reads whole
pub(crate) const PARTITION_LEADER_EPOCH_OFFSET: usize = 12;
pub(crate) const MAGIC_OFFSET: usize = 16;
pub(crate) const CRC_OFFSET: usize = 17;
/// First byte covered by the CRC.
pub(crate) const CRC_START: usize = 21;
pub(crate) const ATTRIBUTES_OFFSET: usize = 21;
pub(crate) const LAST_OFFSET_DELTA_OFFSET: usize = 23;
#[allow(dead_code)] // named so the layout reads whole
pub(crate) const BASE_TIMESTAMP_OFFSET: usize = 27;
pub(crate) const MAX_TIMESTAMP_OFFSET: usize = 35;
pub(crate) const PRODUCER_ID_OFFSET: usize = 43;
pub(crate) const PRODUCER_EPOCH_OFFSET: usize = 51;
pub(crate) const BASE_SEQUENCE_OFFSET: usize = 53;
pub(crate) const RECORD_COUNT_OFFSET: usize = 57;
pub(crate) const HEADER_LEN: usize = 61;

pub(crate) const MAGIC_V2: i8 = 2;
const COMPRESSION_MASK: i16 = 0x07;
const TRANSACTIONAL_FLAG: i16 = 0x10;
const CONTROL_FLAG: i16 = 0x20;
/// Smallest valid batchLength: the rest of the header.
const MIN_BATCH_LENGTH: usize = HEADER_LEN - LOG_OVERHEAD;

/// A malformed batch; `offset` is where the batch starts in the slice given.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BatchError {
    #[error("record batch at byte {offset} is truncated: header needs {HEADER_LEN} bytes, {available} left")]
    Truncated { offset: usize, available: usize },
    #[error("record batch at byte {offset} has magic {magic}, only magic {MAGIC_V2} is supported")]
    UnsupportedMagic { offset: usize, magic: i8 },
    #[error(
        "record batch at byte {offset} has batchLength {batch_length}, \
         valid range is {MIN_BATCH_LENGTH}..={max}"
    )]
    BadLength {
        offset: usize,
        batch_length: i32,
        max: usize,
    },
    #[error("record batch is {total} bytes according to batchLength, but the slice holds {len}")]
    LengthMismatch { total: usize, len: usize },
    #[error(
        "batch no longer matches the planned patch: expected producer id {expected_pid} \
         and crc {expected_crc:#010x}, found {found_pid} and {found_crc:#010x}"
    )]
    StalePatch {
        expected_pid: i64,
        expected_crc: u32,
        found_pid: i64,
        found_crc: u32,
    },
}

/// Position of one batch within a records slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchRef {
    pub offset: usize,
    pub len: usize,
}

impl BatchRef {
    pub(crate) fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// Walks the batches of a Produce partition's `records` by batchLength.
/// Stops after the first error: past it, the framing cannot be trusted.
#[derive(Debug, Clone)]
pub struct Batches<'a> {
    records: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> Batches<'a> {
    pub fn new(records: &'a [u8]) -> Self {
        Self {
            records,
            pos: 0,
            failed: false,
        }
    }
}

impl Iterator for Batches<'_> {
    type Item = Result<BatchRef, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self
            .records
            .get(self.pos..)
            .filter(|r| !r.is_empty() && !self.failed)?;
        match check(rest, self.pos) {
            Ok(len) => {
                let item = BatchRef {
                    offset: self.pos,
                    len,
                };
                self.pos += len;
                Some(Ok(item))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

impl FusedIterator for Batches<'_> {}

/// Validates the header at the start of `buf` and returns the batch's total
/// length. `offset` only feeds error messages.
fn check(buf: &[u8], offset: usize) -> Result<usize, BatchError> {
    let header: &[u8; HEADER_LEN] = buf.first_chunk().ok_or(BatchError::Truncated {
        offset,
        available: buf.len(),
    })?;
    let magic = header[MAGIC_OFFSET] as i8;
    if magic != MAGIC_V2 {
        return Err(BatchError::UnsupportedMagic { offset, magic });
    }
    let batch_length = i32::from_be_bytes(field(header, BATCH_LENGTH_OFFSET));
    let max = buf.len() - LOG_OVERHEAD;
    match usize::try_from(batch_length) {
        Ok(n) if (MIN_BATCH_LENGTH..=max).contains(&n) => Ok(LOG_OVERHEAD + n),
        _ => Err(BatchError::BadLength {
            offset,
            batch_length,
            max,
        }),
    }
}

fn field<const N: usize>(header: &[u8; HEADER_LEN], at: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&header[at..at + N]);
    out
}

/// Validated header of exactly one batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchHeader<'a> {
    header: &'a [u8; HEADER_LEN],
    len: usize,
}

impl<'a> BatchHeader<'a> {
    /// `batch` must be exactly one batch, e.g. `&records[batch_ref.range()]`.
    pub(crate) fn parse(batch: &'a [u8]) -> Result<Self, BatchError> {
        let total = check(batch, 0)?;
        match batch.first_chunk() {
            Some(header) if total == batch.len() => Ok(Self { header, len: total }),
            _ => Err(BatchError::LengthMismatch {
                total,
                len: batch.len(),
            }),
        }
    }

    /// Total batch length in bytes, including baseOffset and batchLength.
    pub(crate) fn total_len(&self) -> usize {
        self.len
    }

    pub(crate) fn base_offset(&self) -> i64 {
        i64::from_be_bytes(field(self.header, BASE_OFFSET_OFFSET))
    }
    pub(crate) fn crc(&self) -> u32 {
        u32::from_be_bytes(field(self.header, CRC_OFFSET))
    }
    pub(crate) fn attributes(&self) -> i16 {
        i16::from_be_bytes(field(self.header, ATTRIBUTES_OFFSET))
    }
    pub(crate) fn compression(&self) -> u8 {
        (self.attributes() & COMPRESSION_MASK) as u8
    }
    pub(crate) fn is_transactional(&self) -> bool {
        self.attributes() & TRANSACTIONAL_FLAG != 0
    }
    pub(crate) fn is_control(&self) -> bool {
        self.attributes() & CONTROL_FLAG != 0
    }
    pub(crate) fn max_timestamp(&self) -> i64 {
        i64::from_be_bytes(field(self.header, MAX_TIMESTAMP_OFFSET))
    }
    pub(crate) fn last_offset_delta(&self) -> i32 {
        i32::from_be_bytes(field(self.header, LAST_OFFSET_DELTA_OFFSET))
    }
    pub(crate) fn producer_id(&self) -> i64 {
        i64::from_be_bytes(field(self.header, PRODUCER_ID_OFFSET))
    }
    pub(crate) fn producer_epoch(&self) -> i16 {
        i16::from_be_bytes(field(self.header, PRODUCER_EPOCH_OFFSET))
    }
    pub(crate) fn base_sequence(&self) -> i32 {
        i32::from_be_bytes(field(self.header, BASE_SEQUENCE_OFFSET))
    }
    pub(crate) fn record_count(&self) -> i32 {
        i32::from_be_bytes(field(self.header, RECORD_COUNT_OFFSET))
    }
}

/// Full CRC recompute over 21..end. O(batch size): for tests and
/// verification, not for the forwarding path.
pub(crate) fn crc_is_valid(batch: &[u8]) -> bool {
    BatchHeader::parse(batch).is_ok_and(|h| {
        batch
            .get(CRC_START..)
            .is_some_and(|body| crc32c::checksum(body) == h.crc())
    })
}

/// A producer id rewrite of one batch, computed from the header alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PidPatch {
    pub old_pid: i64,
    pub new_pid: i64,
    pub old_crc: u32,
    pub new_crc: u32,
}

impl PidPatch {
    #[cfg(test)]
    pub(crate) fn is_noop(&self) -> bool {
        self.old_pid == self.new_pid
    }

    /// Writes the new pid and crc. The batch must still carry the planned
    /// old pid and crc (or already the new ones: applying twice is harmless),
    /// so a patch cannot land on the wrong batch.
    pub(crate) fn apply(&self, batch: &mut [u8]) -> Result<(), BatchError> {
        let h = BatchHeader::parse(batch)?;
        let found = (h.producer_id(), h.crc());
        if found == (self.new_pid, self.new_crc) {
            return Ok(());
        }
        if found != (self.old_pid, self.old_crc) {
            return Err(BatchError::StalePatch {
                expected_pid: self.old_pid,
                expected_crc: self.old_crc,
                found_pid: found.0,
                found_crc: found.1,
            });
        }
        batch[PRODUCER_ID_OFFSET..PRODUCER_ID_OFFSET + 8]
            .copy_from_slice(&self.new_pid.to_be_bytes());
        batch[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&self.new_crc.to_be_bytes());
        Ok(())
    }
}

/// Computes the producer id rewrite without touching `batch`. The CRC is
/// updated by delta, so a batch with a bad CRC keeps a bad CRC.
pub(crate) fn plan_producer_id_patch(batch: &[u8], new_pid: i64) -> Result<PidPatch, BatchError> {
    let h = BatchHeader::parse(batch)?;
    let (old_pid, old_crc) = (h.producer_id(), h.crc());
    let after = (h.total_len() - PRODUCER_ID_OFFSET - 8) as u64;
    let new_crc = crc32c::patch(old_crc, old_pid.to_be_bytes(), new_pid.to_be_bytes(), after);
    Ok(PidPatch {
        old_pid,
        new_pid,
        old_crc,
        new_crc,
    })
}

/// Rewrites the producer id in place; bytes are untouched if it is unchanged.
#[cfg(test)]
pub(crate) fn patch_producer_id(batch: &mut [u8], new_pid: i64) -> Result<PidPatch, BatchError> {
    let patch = plan_producer_id_patch(batch, new_pid)?;
    if !patch.is_noop() {
        patch.apply(batch)?;
    }
    Ok(patch)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid v2 batch with a correct CRC.
    fn build(pid: i64, attributes: i16, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&100i64.to_be_bytes()); // baseOffset
        b.extend_from_slice(&((HEADER_LEN - LOG_OVERHEAD + payload.len()) as i32).to_be_bytes());
        b.extend_from_slice(&7i32.to_be_bytes()); // partitionLeaderEpoch
        b.push(2); // magic
        b.extend_from_slice(&[0; 4]); // crc, filled below
        b.extend_from_slice(&attributes.to_be_bytes());
        b.extend_from_slice(&2i32.to_be_bytes()); // lastOffsetDelta
        b.extend_from_slice(&1_700_000_000_000i64.to_be_bytes()); // baseTimestamp
        b.extend_from_slice(&1_700_000_000_002i64.to_be_bytes()); // maxTimestamp
        b.extend_from_slice(&pid.to_be_bytes());
        b.extend_from_slice(&3i16.to_be_bytes()); // producerEpoch
        b.extend_from_slice(&40i32.to_be_bytes()); // baseSequence
        b.extend_from_slice(&3i32.to_be_bytes()); // recordCount
        b.extend_from_slice(payload);
        let crc = crc32c::checksum(&b[CRC_START..]);
        b[CRC_OFFSET..CRC_START].copy_from_slice(&crc.to_be_bytes());
        b
    }

    #[test]
    fn header_fields() {
        let b = build(0x0102_0304_0506_0708, 0x0032, b"xyz");
        #[rustfmt::skip]
        let expected_prefix: [u8; 21] = [
            0, 0, 0, 0, 0, 0, 0, 100, // baseOffset
            0, 0, 0, 52,              // batchLength = 49 + 3
            0, 0, 0, 7,               // partitionLeaderEpoch
            2,                        // magic
            0x63, 0x1C, 0x43, 0xCF,   // crc
        ];
        assert_eq!(b[..21], expected_prefix);
        assert_eq!(b[43..51], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(b.len(), 64);

        let h = BatchHeader::parse(&b).unwrap();
        assert_eq!(h.total_len(), 64);
        assert_eq!(h.base_offset(), 100);
        assert_eq!(h.crc(), 0x631C_43CF);
        assert_eq!(h.attributes(), 0x0032);
        assert_eq!(h.compression(), 2);
        assert!(h.is_transactional());
        assert!(h.is_control());
        assert_eq!(h.last_offset_delta(), 2);
        assert_eq!(h.producer_id(), 0x0102_0304_0506_0708);
        assert_eq!(h.producer_epoch(), 3);
        assert_eq!(h.base_sequence(), 40);
        assert_eq!(h.record_count(), 3);
        assert!(crc_is_valid(&b));

        let plain = build(1, 0, b"");
        let plain = BatchHeader::parse(&plain).unwrap();
        assert!(!plain.is_transactional() && !plain.is_control());
        assert_eq!(plain.compression(), 0);
    }

    #[test]
    fn patch_rewrites_pid_and_keeps_crc_valid() {
        let mut b = build(5, 0, b"payload bytes that the patch never reads");
        let orig = b.clone();
        let p = patch_producer_id(&mut b, -9_223_371_946_660_462_587).unwrap();
        assert_eq!(
            (p.old_pid, p.new_pid, p.old_crc),
            (
                5,
                -9_223_371_946_660_462_587,
                BatchHeader::parse(&orig).unwrap().crc()
            )
        );
        assert_eq!(b[43..51], [0x80, 0, 0, 0x15, 0, 0, 0, 5]);
        assert_eq!(b[17..21], p.new_crc.to_be_bytes());
        assert!(crc_is_valid(&b));
        // Only the pid and crc bytes changed.
        let diff: Vec<usize> = (0..b.len()).filter(|&i| b[i] != orig[i]).collect();
        assert!(
            diff.iter()
                .all(|&i| (17..21).contains(&i) || (43..51).contains(&i)),
            "{diff:?}"
        );
        // And back again.
        patch_producer_id(&mut b, 5).unwrap();
        assert_eq!(b, orig);
    }

    #[test]
    fn patch_on_corrupt_batch_stays_corrupt() {
        let mut b = build(5, 0, b"abc");
        b[62] ^= 0x01; // flip a payload bit
        let bad_crc = BatchHeader::parse(&b).unwrap().crc();
        let error = bad_crc ^ crc32c::checksum(&b[CRC_START..]);
        assert!(!crc_is_valid(&b));
        patch_producer_id(&mut b, 77).unwrap();
        assert!(!crc_is_valid(&b));
        let h = BatchHeader::parse(&b).unwrap();
        assert_eq!(h.crc() ^ crc32c::checksum(&b[CRC_START..]), error);
    }

    #[test]
    fn same_pid_leaves_bytes_untouched() {
        let mut b = build(5, 0, b"abc");
        b[CRC_OFFSET] ^= 0xFF; // even a bad crc is left alone
        let orig = b.clone();
        let p = patch_producer_id(&mut b, 5).unwrap();
        assert!(p.is_noop());
        assert_eq!(p.old_crc, p.new_crc);
        assert_eq!(b, orig);
    }

    #[test]
    fn plan_then_apply() {
        let frame = build(5, 0, b"abc");
        let p = plan_producer_id_patch(&frame, 9).unwrap();
        let mut copy = frame.clone();
        p.apply(&mut copy).unwrap();
        assert!(crc_is_valid(&copy));
        p.apply(&mut copy).unwrap(); // idempotent
        assert_eq!(BatchHeader::parse(&copy).unwrap().producer_id(), 9);

        let mut other = build(6, 0, b"abc");
        let err = p.apply(&mut other).unwrap_err();
        assert!(
            matches!(
                err,
                BatchError::StalePatch {
                    expected_pid: 5,
                    found_pid: 6,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(other, build(6, 0, b"abc"));
    }

    #[test]
    fn iterates_batches() {
        let (a, b, c) = (build(1, 0, b""), build(2, 0, b"12345"), build(3, 0, b"z"));
        let records = [a.as_slice(), &b, &c].concat();
        let refs: Vec<BatchRef> = Batches::new(&records).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            refs,
            [
                BatchRef { offset: 0, len: 61 },
                BatchRef {
                    offset: 61,
                    len: 66
                },
                BatchRef {
                    offset: 127,
                    len: 62
                }
            ]
        );
        let pids: Vec<i64> = refs
            .iter()
            .map(|r| {
                BatchHeader::parse(&records[r.range()])
                    .unwrap()
                    .producer_id()
            })
            .collect();
        assert_eq!(pids, [1, 2, 3]);
        assert_eq!(Batches::new(&[]).count(), 0);
    }

    #[test]
    fn error_cases() {
        let good = build(1, 0, b"abc");

        // Trailing garbage shorter than a header; iteration stops after the error.
        let mut records = [good.as_slice(), &[0; 11]].concat();
        let mut it = Batches::new(&records);
        assert_eq!(it.next(), Some(Ok(BatchRef { offset: 0, len: 64 })));
        assert_eq!(
            it.next(),
            Some(Err(BatchError::Truncated {
                offset: 64,
                available: 11
            }))
        );
        assert_eq!(it.next(), None);
        records.resize(64 + 60, 0);
        records[64..].copy_from_slice(&good[..60]);
        assert_eq!(
            Batches::new(&records).nth(1),
            Some(Err(BatchError::Truncated {
                offset: 64,
                available: 60
            }))
        );

        let mut bad = good.clone();
        bad[MAGIC_OFFSET] = 1;
        let err = BatchHeader::parse(&bad).unwrap_err();
        assert_eq!(
            err,
            BatchError::UnsupportedMagic {
                offset: 0,
                magic: 1
            }
        );
        assert_eq!(
            err.to_string(),
            "record batch at byte 0 has magic 1, only magic 2 is supported"
        );

        for len in [-1i32, 0, 48, 53, i32::MAX] {
            let mut bad = good.clone();
            bad[8..12].copy_from_slice(&len.to_be_bytes());
            let err = Batches::new(&bad).next().unwrap().unwrap_err();
            assert_eq!(
                err,
                BatchError::BadLength {
                    offset: 0,
                    batch_length: len,
                    max: 52
                }
            );
            assert_eq!(Batches::new(&bad).count(), 1);
        }
        let mut neg = good.clone();
        neg[8..12].copy_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(
            BatchHeader::parse(&neg).unwrap_err().to_string(),
            "record batch at byte 0 has batchLength -1, valid range is 49..=52"
        );

        // Parse wants exactly one batch.
        let two = [good.as_slice(), &good].concat();
        assert_eq!(
            BatchHeader::parse(&two).unwrap_err(),
            BatchError::LengthMismatch {
                total: 64,
                len: 128
            }
        );
        assert!(!crc_is_valid(&two));
        let mut short = good.clone();
        assert!(patch_producer_id(&mut short[..63], 9).is_err());
        assert_eq!(short, good);
    }
}
