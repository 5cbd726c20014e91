//! Building an uncompressed magic-2 record batch, byte for byte: the records
//! the proxy writes itself (`__mirror_state` entries, the failover barrier's
//! control batch) and the batches tests and benchmarks need.
//!
//! Pure: records in, bytes out. The batch starts at baseOffset 0, which a
//! broker requires of a client batch and then stamps (with
//! partitionLeaderEpoch, both outside the CRC).

use super::{CRC_OFFSET, CRC_START, LOG_OVERHEAD, MAGIC_V2};
use crate::wire::crc32c;
use crate::wire::write::put_varlong;

/// One record. Offsets are consecutive from 0 in the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewRecord<'a> {
    pub key: Option<&'a [u8]>,
    /// `None` is a tombstone.
    pub value: Option<&'a [u8]>,
    pub headers: &'a [(&'a str, Option<&'a [u8]>)],
    /// CreateTime, ms.
    pub timestamp: i64,
}

/// The batch header fields a writer chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewBatch {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub transactional: bool,
    pub control: bool,
}

impl NewBatch {
    /// No producer: PID, epoch and sequence -1 (no idempotence).
    pub const NO_PRODUCER: NewBatch = NewBatch {
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
        transactional: false,
        control: false,
    };
}

/// Why a batch could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error("a record batch needs at least one record")]
    Empty,
    #[error("record batch would exceed 2 GiB")]
    TooLarge,
}

/// The batch holding `records`, with a correct CRC.
pub fn build(batch: &NewBatch, records: &[NewRecord<'_>]) -> Result<Vec<u8>, BuildError> {
    if records.is_empty() {
        return Err(BuildError::Empty);
    }
    let base_timestamp = records.iter().map(|r| r.timestamp).min().unwrap_or(0);
    let max_timestamp = records.iter().map(|r| r.timestamp).max().unwrap_or(0);
    let count = i32::try_from(records.len()).map_err(|_| BuildError::TooLarge)?;
    let mut attributes: i16 = 0; // no compression, CreateTime
    if batch.transactional {
        attributes |= 0x10;
    }
    if batch.control {
        attributes |= 0x20;
    }
    let mut out = Vec::with_capacity(64 + records.len() * 16);
    out.extend_from_slice(&0i64.to_be_bytes()); // baseOffset
    out.extend_from_slice(&0i32.to_be_bytes()); // batchLength, set below
    out.extend_from_slice(&0i32.to_be_bytes()); // partitionLeaderEpoch
    out.push(MAGIC_V2 as u8);
    out.extend_from_slice(&0u32.to_be_bytes()); // crc, set below
    out.extend_from_slice(&attributes.to_be_bytes());
    out.extend_from_slice(&(count - 1).to_be_bytes()); // lastOffsetDelta
    out.extend_from_slice(&base_timestamp.to_be_bytes());
    out.extend_from_slice(&max_timestamp.to_be_bytes());
    out.extend_from_slice(&batch.producer_id.to_be_bytes());
    out.extend_from_slice(&batch.producer_epoch.to_be_bytes());
    out.extend_from_slice(&batch.base_sequence.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    let mut record = Vec::new();
    for (delta, r) in records.iter().enumerate() {
        record.clear();
        record.push(0); // attributes
        put_varlong(&mut record, r.timestamp.wrapping_sub(base_timestamp));
        put_varlong(&mut record, delta as i64);
        push_nullable(&mut record, r.key)?;
        push_nullable(&mut record, r.value)?;
        put_varlong(&mut record, r.headers.len() as i64);
        for (k, v) in r.headers {
            push_nullable(&mut record, Some(k.as_bytes()))?;
            push_nullable(&mut record, *v)?;
        }
        let len = i32::try_from(record.len()).map_err(|_| BuildError::TooLarge)?;
        put_varlong(&mut out, i64::from(len));
        out.extend_from_slice(&record);
    }
    let batch_length = i32::try_from(out.len() - LOG_OVERHEAD).map_err(|_| BuildError::TooLarge)?;
    out[8..12].copy_from_slice(&batch_length.to_be_bytes());
    let crc = crc32c::checksum(&out[CRC_START..]);
    out[CRC_OFFSET..CRC_START].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

fn push_nullable(out: &mut Vec<u8>, bytes: Option<&[u8]>) -> Result<(), BuildError> {
    match bytes {
        None => put_varlong(out, -1),
        Some(b) => {
            let len = i32::try_from(b.len()).map_err(|_| BuildError::TooLarge)?;
            put_varlong(out, i64::from(len));
            out.extend_from_slice(b);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::batch::{crc_is_valid, BatchHeader};
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    /// kafka-protocol's encoder, as the tests used before this builder.
    fn reference(pid: i64, epoch: i16, seq: i32, control: bool, records: &[NewRecord]) -> Vec<u8> {
        let records: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, r)| Record {
                transactional: false,
                control,
                partition_leader_epoch: 0,
                producer_id: pid,
                producer_epoch: epoch,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: if seq < 0 { -1 } else { seq + i as i32 },
                timestamp: r.timestamp,
                key: r.key.map(Bytes::copy_from_slice),
                value: r.value.map(Bytes::copy_from_slice),
                headers: r
                    .headers
                    .iter()
                    .map(|(k, v)| {
                        (
                            kafka_protocol::protocol::StrBytes::from_string(k.to_string()),
                            v.map(Bytes::copy_from_slice),
                        )
                    })
                    .collect(),
                delete_horizon: false,
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .expect("reference encoding");
        buf.to_vec()
    }

    #[test]
    fn equals_kafka_protocols_encoder() {
        let headers = [("h", Some(&b"v"[..])), ("null", None)];
        let records = [
            NewRecord {
                key: Some(b"k0"),
                value: Some(b"first"),
                headers: &[],
                timestamp: 1_700_000_000_000,
            },
            NewRecord {
                key: None,
                value: None,
                headers: &headers,
                timestamp: 1_700_000_000_005,
            },
            NewRecord {
                key: Some(b""),
                value: Some(&[0xAB; 300]), // a two-byte varint length
                headers: &[],
                timestamp: 1_700_000_000_002,
            },
        ];
        let batch = NewBatch {
            producer_id: 5,
            producer_epoch: 3,
            base_sequence: 10,
            ..NewBatch::NO_PRODUCER
        };
        let built = build(&batch, &records).expect("build");
        assert_eq!(built, reference(5, 3, 10, false, &records));
        assert!(crc_is_valid(&built));
        let h = BatchHeader::parse(&built).expect("header");
        assert_eq!(
            (h.record_count(), h.last_offset_delta(), h.producer_id()),
            (3, 2, 5)
        );

        let control = NewBatch {
            control: true,
            ..NewBatch::NO_PRODUCER
        };
        let one = [NewRecord {
            key: Some(&[0, 0, 0, 7]),
            value: Some(b"v"),
            headers: &[],
            timestamp: 1,
        }];
        let built = build(&control, &one).expect("build");
        assert_eq!(built, reference(-1, -1, -1, true, &one));
    }

    #[test]
    fn exact_bytes_of_a_one_record_control_batch() {
        let built = build(
            &NewBatch {
                control: true,
                ..NewBatch::NO_PRODUCER
            },
            &[NewRecord {
                key: Some(&[0, 0, 0, 7]),
                value: None,
                headers: &[],
                timestamp: 0x0102,
            }],
        )
        .expect("build");
        #[rustfmt::skip]
        let expected_without_crc: &[u8] = &[
            0, 0, 0, 0, 0, 0, 0, 0, // baseOffset
            0, 0, 0, 60,            // batchLength: 49 + 11 bytes of record
            0, 0, 0, 0,             // partitionLeaderEpoch
            2,                      // magic
            0, 0, 0, 0,             // crc (checked below)
            0, 0x20,                // attributes: control
            0, 0, 0, 0,             // lastOffsetDelta
            0, 0, 0, 0, 0, 0, 1, 2, // baseTimestamp
            0, 0, 0, 0, 0, 0, 1, 2, // maxTimestamp
            0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, // producerId -1
            0xFF, 0xFF,             // producerEpoch -1
            0xFF, 0xFF, 0xFF, 0xFF, // baseSequence -1
            0, 0, 0, 1,             // one record
            20,                     // record length 10 (zigzag)
            0, 0, 0,                // attributes, timestampDelta 0, offsetDelta 0
            8, 0, 0, 0, 7,          // key: 4 bytes
            1,                      // value: null
            0,                      // no headers
        ];
        let mut masked = built.clone();
        masked[CRC_OFFSET..CRC_START].fill(0);
        assert_eq!(masked, expected_without_crc);
        assert!(crc_is_valid(&built));
    }

    #[test]
    fn an_empty_batch_is_refused() {
        assert_eq!(build(&NewBatch::NO_PRODUCER, &[]), Err(BuildError::Empty));
    }
}
