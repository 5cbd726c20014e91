//! The `MIRROR_PID_RESET` barrier (SPEC §7): the control batch a failover
//! writes to every partition of a link's topics, and its recognition when
//! one arrives mirrored from an upstream log.
//!
//! Pure: built exactly as Kafka builds its own control batches (magic 2, no
//! compression, CreateTime, attributes `0x0020`: control, not
//! transactional; producer id, epoch and base sequence -1) holding one
//! record whose key is the control key `{version 0, type 7}` and whose value
//! is `MirrorPidResetRecord` v0 (flexible: int16 version, compact string
//! source cluster id, empty tagged fields; 26 bytes for a 22-character id).

use thiserror::Error;

use crate::mirror::pid::ClusterId;
use crate::wire::batch::{
    build, BatchHeader, Batches, BuildError, NewBatch, NewRecord, HEADER_LEN,
};
use crate::wire::records::Records;

/// Control record type of the barrier (Kafka's own: 0 abort, 1 commit,
/// 2–6 KRaft and leader-change records).
pub(crate) const MIRROR_PID_RESET: i16 = 7;
/// The control key: int16 version 0, int16 type 7.
pub(crate) const CONTROL_KEY: [u8; 4] = [0, 0, 0, MIRROR_PID_RESET as u8];

/// The barrier's control batch header fields.
const BARRIER: NewBatch = NewBatch {
    producer_id: -1,
    producer_epoch: -1,
    base_sequence: -1,
    transactional: false,
    control: true,
};

/// `MirrorPidResetRecord` v0 for `source`.
pub(crate) fn reset_record_value(source: &ClusterId) -> Vec<u8> {
    let id = source.to_string();
    let mut out = Vec::with_capacity(4 + id.len());
    out.extend_from_slice(&0i16.to_be_bytes()); // Version
                                                // Compact string: unsigned varint of length + 1; 23 fits one byte.
    out.push((id.len() + 1) as u8);
    out.extend_from_slice(id.as_bytes());
    out.push(0); // no tagged fields
    out
}

/// The barrier batch for a link whose source cluster is `source`, stamped
/// `timestamp_ms` (CreateTime).
pub fn barrier_batch(source: &ClusterId, timestamp_ms: i64) -> Result<Vec<u8>, BuildError> {
    let value = reset_record_value(source);
    build(
        &BARRIER,
        &[NewRecord {
            key: Some(&CONTROL_KEY),
            value: Some(&value),
            headers: &[],
            timestamp: timestamp_ms,
        }],
    )
}

/// Why a control batch is not a well-formed barrier.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BarrierError {
    #[error("not a MIRROR_PID_RESET control batch")]
    NotABarrier,
    #[error("malformed MIRROR_PID_RESET barrier: {0}")]
    Malformed(&'static str),
}

/// The source cluster named by a barrier batch (one whole batch, as
/// [`barrier_batch`] builds it or as a log returns it). A batch that is
/// not a barrier is [`BarrierError::NotABarrier`]; one that claims to be
/// but does not parse is `Malformed`.
pub fn parse_barrier(batch: &[u8]) -> Result<ClusterId, BarrierError> {
    let header = BatchHeader::parse(batch).map_err(|_| BarrierError::NotABarrier)?;
    if !header.is_control() || header.compression() != 0 {
        return Err(BarrierError::NotABarrier);
    }
    let mut batches = Batches::new(batch);
    let Some(Ok(b)) = batches.next() else {
        return Err(BarrierError::NotABarrier);
    };
    let records = batch[b.range()]
        .get(HEADER_LEN..)
        .ok_or(BarrierError::Malformed("header"))?;
    let record = Records::new(records, 1)
        .next()
        .and_then(Result::ok)
        .ok_or(BarrierError::Malformed("record"))?;
    let key = record.key.ok_or(BarrierError::Malformed("record"))?;
    if key != CONTROL_KEY {
        return Err(BarrierError::NotABarrier);
    }
    let value = record.value.ok_or(BarrierError::Malformed("null value"))?;
    let [0, 0, len, rest @ ..] = value else {
        return Err(BarrierError::Malformed("value version"));
    };
    let len = usize::from(*len)
        .checked_sub(1)
        .ok_or(BarrierError::Malformed("null cluster id"))?;
    if rest.len() != len + 1 || rest[len] != 0 {
        return Err(BarrierError::Malformed("value length"));
    }
    let id =
        std::str::from_utf8(&rest[..len]).map_err(|_| BarrierError::Malformed("cluster id"))?;
    ClusterId::parse(id).map_err(|_| BarrierError::Malformed("cluster id"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::batch::crc_is_valid;

    fn cluster() -> ClusterId {
        ClusterId::parse("MkU3OEVBNTcwNTJENDM2Qg").expect("valid id")
    }

    #[test]
    fn reset_record_value_is_26_bytes() {
        let v = reset_record_value(&cluster());
        let mut expected = vec![0x00, 0x00, 23];
        expected.extend_from_slice(b"MkU3OEVBNTcwNTJENDM2Qg");
        expected.push(0x00);
        assert_eq!(v, expected);
        assert_eq!(v.len(), 26);
    }

    #[test]
    fn barrier_batch_exact_bytes() {
        let batch = barrier_batch(&cluster(), 1_700_000_000_000).expect("build");
        let hex: String = batch.iter().map(|b| format!("{b:02x}")).collect();
        // baseOffset 0, batchLength, leader epoch 0, magic 2, CRC,
        // attributes 0x0020, lastOffsetDelta 0, timestamps, PID -1,
        // epoch -1, sequence -1, one record.
        let record = concat!(
            "48", // record length 36 (zig-zag varint)
            "00", // attributes
            "00", // timestamp delta 0
            "00", // offset delta 0
            "08",
            "00000007", // key: 4 bytes {0, 7}
            "34",       // value: 26 bytes
            "000017",   // version 0, compact string length 22 + 1
            "4d6b55334f4556424e5463774e544a454e444d32",
            "5167", // "MkU3OEVBNTcwNTJENDM2Qg"
            "00",   // no tagged fields
            "00",   // no headers
        );
        let expected_tail = format!(
            "0020{}{}{}{}{}{}{}{}",
            "00000000",         // lastOffsetDelta
            "0000018bcfe56800", // base timestamp
            "0000018bcfe56800", // max timestamp
            "ffffffffffffffff", // producer id
            "ffff",             // epoch
            "ffffffff",         // base sequence
            "00000001",         // records
            record
        );
        assert_eq!(&hex[..16], "0000000000000000", "baseOffset");
        assert_eq!(&hex[24..34], "0000000002", "leader epoch and magic");
        assert_eq!(&hex[42..], expected_tail);
        let len = i32::from_be_bytes(batch[8..12].try_into().expect("4 bytes"));
        assert_eq!(len as usize, batch.len() - 12);
        assert!(crc_is_valid(&batch), "CRC");
    }

    #[test]
    fn round_trips_and_rejects_others() {
        let batch = barrier_batch(&cluster(), 42).expect("build");
        assert_eq!(parse_barrier(&batch), Ok(cluster()));

        // A transaction marker (type 0, abort) is a control batch but no barrier.
        let abort = build(
            &NewBatch {
                producer_id: 7,
                producer_epoch: 0,
                base_sequence: -1,
                transactional: true,
                control: true,
            },
            &[NewRecord {
                key: Some(&[0, 0, 0, 0]),
                value: Some(&[0, 0, 0, 0, 0, 0]),
                headers: &[],
                timestamp: 42,
            }],
        )
        .expect("build");
        assert_eq!(parse_barrier(&abort), Err(BarrierError::NotABarrier));

        // A data batch with the same record is not a control batch.
        let value = reset_record_value(&cluster());
        let data = build(
            &NewBatch::NO_PRODUCER,
            &[NewRecord {
                key: Some(&CONTROL_KEY),
                value: Some(&value),
                headers: &[],
                timestamp: 42,
            }],
        )
        .expect("build");
        assert_eq!(parse_barrier(&data), Err(BarrierError::NotABarrier));

        // Truncated value.
        let short = build(
            &BARRIER,
            &[NewRecord {
                key: Some(&CONTROL_KEY),
                value: Some(&value[..20]),
                headers: &[],
                timestamp: 42,
            }],
        )
        .expect("build");
        assert!(matches!(
            parse_barrier(&short),
            Err(BarrierError::Malformed(_))
        ));
        // Any truncation of the batch itself: an error, never a panic.
        for n in 0..batch.len() {
            assert!(parse_barrier(&batch[..n]).is_err());
        }
    }
}
