//! Skipping the batches of aborted transactions, the way Kafka's consumer
//! does for `isolation.level=read_committed` (`CompletedFetch.nextFetchedBatch`
//! in kafka-clients).
//!
//! A read_committed Fetch answers, per partition, the records up to the last
//! stable offset and the list of aborted transactions that overlap them:
//! (producer id, first offset). Walking the batches in offset order:
//!
//! - before a batch with a producer id (`>= 0`) is looked at, every aborted
//!   transaction whose first offset is at or below the batch's *last* offset
//!   makes its producer id aborted;
//! - a control batch whose marker is ABORT ends its producer's abort;
//! - a transactional data batch of an aborted producer is skipped;
//! - control batches are never data.
//!
//! Pure: batches in, decisions out. The aborted-transaction list is kept
//! sorted in a vector taken from the caller (its size is the size of the
//! decoded response); the set of aborted producers holds at most one entry
//! per listed transaction.

use std::collections::HashSet;

use thiserror::Error;

use super::batch::{BatchError, BatchHeader, HEADER_LEN};
use super::records::Records;

/// One entry of a Fetch response's `aborted_transactions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTransaction {
    pub producer_id: i64,
    pub first_offset: i64,
}

/// The type of a control record (its key: int16 version, int16 type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ControlType {
    Abort,
    Commit,
    /// Any other type (e.g. 7, `MIRROR_PID_RESET`).
    Other(i16),
}

/// What to do with one fetched batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// A data batch a read_committed consumer would return.
    Keep,
    /// A data batch of an aborted transaction.
    Aborted,
    /// A control batch (never data); its marker type when it could be read.
    Control(Option<ControlType>),
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AbortedError {
    #[error(transparent)]
    Batch(#[from] BatchError),
}

/// The read_committed filter of one partition's fetched batches, fed in
/// offset order. Keep one per partition across Fetch responses only if the
/// aborted lists are merged; normally one per response.
#[derive(Debug, Clone, Default)]
pub(crate) struct AbortedFilter {
    /// Sorted by first offset, descending: the next one is at the end.
    pending: Vec<AbortedTransaction>,
    aborted: HashSet<i64>,
}

impl AbortedFilter {
    /// From a Fetch response's aborted transactions, in any order.
    pub(crate) fn new(mut aborted: Vec<AbortedTransaction>) -> AbortedFilter {
        aborted.sort_by_key(|t| std::cmp::Reverse(t.first_offset));
        AbortedFilter {
            pending: aborted,
            aborted: HashSet::new(),
        }
    }

    /// Decides about `batch` (exactly one whole batch).
    pub(crate) fn decide(&mut self, batch: &[u8]) -> Result<Decision, AbortedError> {
        let h = BatchHeader::parse(batch)?;
        let control = h.is_control().then(|| control_type(batch));
        if h.producer_id() >= 0 {
            let last_offset = h.base_offset() + i64::from(h.last_offset_delta());
            while let Some(t) = self
                .pending
                .last()
                .filter(|t| t.first_offset <= last_offset)
            {
                self.aborted.insert(t.producer_id);
                self.pending.pop();
            }
            if control == Some(Some(ControlType::Abort)) {
                self.aborted.remove(&h.producer_id());
            } else if h.is_transactional()
                && !h.is_control()
                && self.aborted.contains(&h.producer_id())
            {
                return Ok(Decision::Aborted);
            }
        }
        Ok(match control {
            Some(t) => Decision::Control(t),
            None => Decision::Keep,
        })
    }
}

/// The type of the first record of a control batch, if that record can be
/// read and its key holds one (control batches are never compressed).
pub(crate) fn control_type(batch: &[u8]) -> Option<ControlType> {
    let first = Records::new(batch.get(HEADER_LEN..)?, 1).next()?.ok()?;
    // The key: int16 version, int16 type.
    let [_, _, hi, lo, ..] = *first.key? else {
        return None;
    };
    Some(match i16::from_be_bytes([hi, lo]) {
        0 => ControlType::Abort,
        1 => ControlType::Commit,
        t => ControlType::Other(t),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::batch::{build, NewBatch, NewRecord};

    fn batch(base: i64, pid: i64, n: usize, transactional: bool) -> Vec<u8> {
        let records: Vec<NewRecord<'_>> = (0..n)
            .map(|_| NewRecord {
                key: None,
                value: Some(b"v"),
                headers: &[],
                timestamp: 0,
            })
            .collect();
        let mut b = build(
            &NewBatch {
                producer_id: pid,
                producer_epoch: 0,
                base_sequence: if pid < 0 { -1 } else { 0 },
                transactional,
                control: false,
            },
            &records,
        )
        .expect("build");
        b[..8].copy_from_slice(&base.to_be_bytes());
        b
    }

    fn marker(base: i64, pid: i64, kind: i16) -> Vec<u8> {
        let key = [0, 0, 0, kind as u8];
        let value = [0u8, 0, 0, 0, 0, 0];
        let mut b = build(
            &NewBatch {
                producer_id: pid,
                producer_epoch: 0,
                base_sequence: -1,
                transactional: true,
                control: true,
            },
            &[NewRecord {
                key: Some(&key),
                value: Some(&value),
                headers: &[],
                timestamp: 0,
            }],
        )
        .expect("build");
        b[..8].copy_from_slice(&base.to_be_bytes());
        b
    }

    #[test]
    fn control_type_reads_the_first_key_exactly() {
        let m = marker(0, 5, 0);
        // Record: length, attributes 0, timestampDelta 0, offsetDelta 0,
        // keyLength 4 (zig-zag 8), key 00 00 00 00.
        assert_eq!(
            &m[HEADER_LEN + 1..HEADER_LEN + 9],
            &[0, 0, 0, 8, 0, 0, 0, 0]
        );
        assert_eq!(control_type(&m), Some(ControlType::Abort));
        assert_eq!(control_type(&marker(0, 5, 1)), Some(ControlType::Commit));
        assert_eq!(control_type(&marker(0, 5, 7)), Some(ControlType::Other(7)));
        assert_eq!(control_type(&m[..HEADER_LEN + 6]), None, "truncated");
    }

    /// Committed (pid 1), aborted (pid 2), idempotent (pid 3) and plain
    /// (pid -1) batches interleaved, then pid 2 again in a new, committed
    /// transaction.
    #[test]
    fn batches_of_aborted_transactions_are_skipped_like_kafkas_consumer() {
        let log = [
            batch(0, 1, 2, true),  // 0-1 txn of 1, committed
            batch(2, 2, 3, true),  // 2-4 txn of 2, aborted
            batch(5, 3, 1, false), // 5   idempotent
            marker(6, 1, 1),       // 6   COMMIT of 1
            batch(7, 2, 1, true),  // 7   txn of 2, still aborted
            batch(8, -1, 1, false),
            marker(9, 2, 0),        // 9   ABORT of 2
            batch(10, 2, 2, true),  // 10-11 txn of 2, committed
            batch(12, 3, 1, false), // 12
            marker(13, 2, 1),       // 13  COMMIT of 2
        ];
        let mut f = AbortedFilter::new(vec![AbortedTransaction {
            producer_id: 2,
            first_offset: 2,
        }]);
        let decisions: Vec<Decision> = log.iter().map(|b| f.decide(b).expect("decide")).collect();
        use ControlType::*;
        use Decision::*;
        assert_eq!(
            decisions,
            [
                Keep,
                Aborted,
                Keep,
                Control(Some(Commit)),
                Aborted,
                Keep,
                Control(Some(Abort)),
                Keep,
                Keep,
                Control(Some(Commit)),
            ]
        );
    }

    /// The abort starts with the batch whose *last* offset reaches the
    /// transaction's first offset, and the list may come in any order.
    #[test]
    fn aborts_start_at_their_first_offset() {
        let mut f = AbortedFilter::new(vec![
            AbortedTransaction {
                producer_id: 4,
                first_offset: 20,
            },
            AbortedTransaction {
                producer_id: 4,
                first_offset: 3,
            },
        ]);
        // pid 4's committed txn 0-2, then its abort from 3.
        assert_eq!(f.decide(&batch(0, 4, 3, true)), Ok(Decision::Keep));
        assert_eq!(f.decide(&batch(3, 4, 1, true)), Ok(Decision::Aborted));
        assert_eq!(
            f.decide(&marker(4, 4, 0)),
            Ok(Decision::Control(Some(ControlType::Abort)))
        );
        assert_eq!(f.decide(&batch(5, 4, 15, true)), Ok(Decision::Keep));
        // 20 lies inside this batch (18-21): it is aborted.
        assert_eq!(f.decide(&batch(18, 4, 4, true)), Ok(Decision::Aborted));
        // Non-transactional batches of the same pid are never aborted.
        assert_eq!(f.decide(&batch(22, 4, 1, false)), Ok(Decision::Keep));
    }

    #[test]
    fn a_malformed_batch_is_an_error() {
        let mut f = AbortedFilter::default();
        let b = batch(0, 1, 1, true);
        assert!(matches!(
            f.decide(&b[..b.len() - 1]),
            Err(AbortedError::Batch(_))
        ));
    }
}
