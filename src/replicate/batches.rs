//! A fetched partition's records, cut into whole batches and sorted into
//! what is copied and what is passed: control batches (brokers refuse them
//! from clients) and, read_committed, the batches of aborted transactions,
//! found the way Kafka's consumer finds them (`wire::aborted`). Pure.
//!
//! A batch is copied byte for byte but for its baseOffset, zeroed because
//! Kafka 4 brokers refuse a client append with any other (`INVALID_RECORD`,
//! `UnifiedLog.analyzeAndValidateRecords`); it lies outside the CRC and the
//! broker assigns it anyway.

use bytes::{Bytes, BytesMut};
use thiserror::Error;

use super::partitions::{Batch, Item};
use crate::wire::aborted::{AbortedError, AbortedFilter, AbortedTransaction, Decision};
use crate::wire::batch::{BatchError, BatchHeader, BATCH_LENGTH_OFFSET, HEADER_LEN, LOG_OVERHEAD};

/// Fetched records that cannot be copied.
#[derive(Debug, Error)]
pub enum SplitError {
    #[error("malformed record batch at byte {at}: batchLength {length}")]
    Length { at: usize, length: i32 },
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error(transparent)]
    Aborted(#[from] AbortedError),
}

/// What one partition's records hold.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Split {
    pub items: Vec<Item>,
    /// Size of a trailing batch the fetch cut short (fetched again from
    /// its own offset), when its length field was whole.
    pub partial_needed: Option<usize>,
}

/// Cuts `records` into batches, each header checked, and sorts them.
/// `aborted` is the Fetch's aborted-transaction list (empty when read
/// uncommitted: then every data batch is copied).
pub(crate) fn split(
    records: &Bytes,
    aborted: Vec<AbortedTransaction>,
) -> Result<Split, SplitError> {
    let mut filter = AbortedFilter::new(aborted);
    let mut out = Split::default();
    let mut pos = 0usize;
    while pos < records.len() {
        let rest = &records[pos..];
        let Some(length) = rest.get(BATCH_LENGTH_OFFSET..LOG_OVERHEAD) else {
            break;
        };
        let length = i32::from_be_bytes([length[0], length[1], length[2], length[3]]);
        let total = match usize::try_from(length) {
            Ok(n) if n >= HEADER_LEN - LOG_OVERHEAD => LOG_OVERHEAD + n,
            _ => return Err(SplitError::Length { at: pos, length }),
        };
        if rest.len() < total {
            out.partial_needed = Some(total);
            break;
        }
        let bytes = records.slice(pos..pos + total);
        let h = BatchHeader::parse(&bytes)?;
        let last_offset = h.base_offset() + i64::from(h.last_offset_delta());
        let item = match filter.decide(&bytes)? {
            Decision::Control(_) => Item::Skip {
                last_offset,
                aborted: false,
            },
            Decision::Aborted => Item::Skip {
                last_offset,
                aborted: true,
            },
            Decision::Keep => Item::Data(Batch {
                base_offset: h.base_offset(),
                last_offset,
                records: u32::try_from(h.record_count()).unwrap_or(0),
                transactional: h.is_transactional(),
                producer_id: h.producer_id(),
                bytes: zero_base_offset(bytes),
            }),
        };
        out.items.push(item);
        pos += total;
    }
    Ok(out)
}

fn zero_base_offset(batch: Bytes) -> Bytes {
    if batch.len() < 8 || batch[..8] == [0; 8] {
        return batch;
    }
    let mut b = BytesMut::from(&batch[..]);
    b[..8].fill(0);
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    const TRANSACTIONAL: i16 = 0x10;
    const CONTROL: i16 = 0x20;

    /// A batch header with the fields read here, then `payload`.
    fn batch(base: i64, last_delta: i32, attributes: i16, pid: i64, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.put_i64(base);
        b.put_i32((HEADER_LEN - LOG_OVERHEAD + payload.len()) as i32);
        b.put_i32(0); // partitionLeaderEpoch
        b.put_i8(2); // magic
        b.put_u32(0); // crc (not checked here)
        b.put_i16(attributes);
        b.put_i32(last_delta);
        b.put_i64(0);
        b.put_i64(0);
        b.put_i64(pid);
        b.put_i16(0);
        b.put_i32(0);
        b.put_i32(last_delta + 1);
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn whole_batches_are_kept_with_their_base_offset_zeroed() {
        let first = batch(10, 2, 0, 7, b"abc");
        let mut data = first.clone();
        data.extend(batch(13, 0, CONTROL, 7, b"x"));
        let third = batch(14, 4, 0, 7, b"hello");
        data.extend_from_slice(&third[..20]);
        let out = split(&Bytes::from(data), Vec::new()).expect("valid");
        assert_eq!(out.items.len(), 2);
        let Item::Data(b) = &out.items[0] else {
            panic!("data first: {:?}", out.items[0]);
        };
        assert_eq!((b.base_offset, b.last_offset, b.records), (10, 12, 3));
        assert_eq!(&b.bytes[..8], &[0u8; 8]);
        assert_eq!(&b.bytes[8..], &first[8..]);
        assert_eq!(
            out.items[1],
            Item::Skip {
                last_offset: 13,
                aborted: false
            }
        );
        assert_eq!(out.partial_needed, Some(third.len()));
    }

    #[test]
    fn batches_of_aborted_transactions_are_passed() {
        let mut data = batch(0, 1, TRANSACTIONAL, 9, b"aa");
        data.extend(batch(2, 0, TRANSACTIONAL, 8, b"bb"));
        let aborted = vec![AbortedTransaction {
            producer_id: 9,
            first_offset: 0,
        }];
        let out = split(&Bytes::from(data), aborted).expect("valid");
        assert_eq!(
            out.items[0],
            Item::Skip {
                last_offset: 1,
                aborted: true
            }
        );
        assert!(matches!(&out.items[1], Item::Data(b) if b.producer_id == 8 && b.transactional));
    }

    #[test]
    fn a_bad_length_or_magic_is_refused() {
        let mut b = batch(0, 0, 0, 1, b"");
        b[8..12].copy_from_slice(&10i32.to_be_bytes());
        assert!(split(&Bytes::from(b), Vec::new()).is_err());
        let mut b = batch(0, 0, 0, 1, b"");
        b[16] = 1;
        assert!(split(&Bytes::from(b), Vec::new()).is_err());
    }
}
