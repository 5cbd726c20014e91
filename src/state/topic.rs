//! State records in and out of record batches. Pure: the batch the store
//! produces, and the records of the batches a fetch returned, each with its
//! offset. The proxy writes uncompressed batches, but reads every codec: a
//! broker recompresses them when the topic's or its own `compression.type`
//! says so. What cannot be read is reported and skipped, never guessed at.
//! With the state key, every record written carries its MAC and every
//! record read must verify (`super::mac`).

use std::borrow::Cow;

use super::mac::{MacError, StateAuth, MAC_HEADER};
use crate::mirror::state_records::{RecordError, StateRecord};
use crate::wire::batch::{build, BuildError, NewBatch, NewRecord};
use crate::wire::batch::{BatchHeader, Batches, HEADER_LEN};
use crate::wire::compression::{self, DecompressError};
use crate::wire::records::{Record, Records};

/// The most a state batch's records may decompress to. The proxy writes
/// batches of a few records, which a broker recompresses as they are (log
/// compaction keeps batch boundaries: it never makes a batch larger); this
/// bounds what a batch written around the proxy can cost.
pub(crate) const MAX_DECOMPRESSED: usize = 8 * 1024 * 1024;

/// Why a record (or a whole batch, reported at its base offset) was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkipReason {
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("compressed batch")]
    Compressed(#[from] DecompressError),
    #[error("malformed record: {0}")]
    Malformed(&'static str),
    #[error(transparent)]
    Mac(#[from] MacError),
}

/// A record header as `wire::batch::build` takes it.
type Header<'a> = (&'a str, Option<&'a [u8]>);

/// The batch holding `records` (no producer, CreateTime `now_ms`), each
/// with its MAC in a `kmp-mac` header when `auth` is given.
pub(crate) fn encode_batch(
    records: &[StateRecord],
    now_ms: i64,
    auth: Option<&StateAuth>,
) -> Result<Vec<u8>, BuildError> {
    let encoded: Vec<(Vec<u8>, Option<Vec<u8>>)> = records
        .iter()
        .map(|r| (r.encode_key(), r.encode_value()))
        .collect();
    let macs: Vec<Option<[u8; super::mac::MAC_LEN]>> = encoded
        .iter()
        .map(|(k, v)| auth.map(|a| a.sign(k, v.as_deref())))
        .collect();
    let headers: Vec<Vec<Header<'_>>> = macs
        .iter()
        .map(|m| m.iter().map(|m| (MAC_HEADER, Some(&m[..]))).collect())
        .collect();
    let new: Vec<NewRecord<'_>> = encoded
        .iter()
        .zip(&headers)
        .map(|((k, v), h)| NewRecord {
            key: Some(k),
            value: v.as_deref(),
            headers: h,
            timestamp: now_ms,
        })
        .collect();
    build(&NewBatch::NO_PRODUCER, &new)
}

/// Read the batches of a fetch answer from offset `from` on. `on` gets every
/// record at or past `from` with its offset, decoded or the reason it is
/// skipped. With `auth`, a record whose MAC does not verify is skipped
/// ([`SkipReason::Mac`]) before it is decoded. Returns the offset to fetch
/// next: past the last whole batch (a batch cut short by the fetch size
/// bound is read again next time).
pub fn read_batches(
    records: &[u8],
    from: i64,
    auth: Option<&StateAuth>,
    mut on: impl FnMut(i64, Result<StateRecord, SkipReason>),
) -> i64 {
    for_each_record(records, from, |offset, record| {
        let r = match record {
            Ok(r) => r,
            Err(e) => return on(offset, Err(e)),
        };
        if let Some(auth) = auth {
            let mac = r
                .headers
                .into_iter()
                .find(|(k, _)| *k == MAC_HEADER.as_bytes())
                .map(|(_, v)| v.unwrap_or_default());
            let key = r.key.unwrap_or_default();
            if let Err(e) = auth.verify(offset, key, r.value, mac) {
                return on(offset, Err(e.into()));
            }
        }
        on(
            offset,
            StateRecord::decode(r.key, r.value).map_err(SkipReason::from),
        );
    })
}

/// Every data record of the batches of a fetch answer at or past `from`,
/// decompressed, with its offset (or why it, or its whole batch, is
/// skipped); control batches are passed over. Returns the offset to fetch
/// next, as [`read_batches`] does. The walk under every compacted topic
/// the crate reads (the state topic, the replicator's offsets topic).
pub(crate) fn for_each_record(
    records: &[u8],
    from: i64,
    mut on: impl FnMut(i64, Result<Record<'_>, SkipReason>),
) -> i64 {
    let mut next = from;
    for batch in Batches::new(records) {
        let Ok(batch) = batch else {
            break; // a trailing partial batch
        };
        let bytes = &records[batch.range()];
        let Ok(header) = BatchHeader::parse(bytes) else {
            break;
        };
        let base = header.base_offset();
        let last = base.saturating_add(i64::from(header.last_offset_delta()));
        if last < next {
            continue;
        }
        if header.is_control() {
            next = last + 1;
            continue;
        }
        let section = bytes.get(HEADER_LEN..).unwrap_or_default();
        let section = match header.compression() {
            0 => Cow::Borrowed(section),
            codec => match compression::decompress(codec, section, MAX_DECOMPRESSED) {
                Ok(plain) => Cow::Owned(plain),
                Err(e) => {
                    // Reported where the records asked for start: nothing
                    // before `from` is reported (the fuzz target holds it).
                    on(base.max(next), Err(SkipReason::Compressed(e)));
                    next = last + 1;
                    continue;
                }
            },
        };
        for (i, record) in (0i64..).zip(Records::new(&section, header.record_count())) {
            match record {
                Ok(r) => {
                    let offset = base + i64::from(r.offset_delta);
                    if offset >= next {
                        on(offset, Ok(r));
                    }
                }
                // A malformed record is reported at its place in the batch
                // (`base` + its index, its offset delta being unreadable),
                // or at `next` if that is later.
                Err(e) => on((base + i).max(next), Err(SkipReason::Malformed(e.field()))),
            }
        }
        next = last + 1;
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::pid::ClusterId;
    use crate::mirror::state_records::{OriginKey, OriginValue};
    use uuid::Uuid;

    fn origin(pid: i64, value: bool) -> StateRecord {
        let k = OriginKey {
            topic_id: Uuid::from_u128(1),
            partition: 0,
            source: ClusterId::from_bytes([1; 16]),
            original_pid: pid,
        };
        StateRecord::Origin(
            k,
            value.then_some(OriginValue {
                mapped_pid: -2,
                salt: 0,
                claim_offset: -1,
                last_seen_ms: 3,
            }),
        )
    }

    fn with_base(mut batch: Vec<u8>, base: i64) -> Vec<u8> {
        batch[..8].copy_from_slice(&base.to_be_bytes());
        batch
    }

    #[test]
    fn records_come_back_with_their_offsets() {
        let written = [origin(1, true), origin(2, false), origin(3, true)];
        let mut log = with_base(encode_batch(&written, 5, None).unwrap(), 10);
        log.extend(with_base(encode_batch(&written[..1], 5, None).unwrap(), 13));
        let mut seen = Vec::new();
        let next = read_batches(&log, 0, None, |o, r| seen.push((o, r)));
        assert_eq!(next, 14);
        assert_eq!(
            seen,
            vec![
                (10, Ok(written[0].clone())),
                (11, Ok(written[1].clone())),
                (12, Ok(written[2].clone())),
                (13, Ok(written[0].clone()))
            ]
        );
        // From the middle of a batch; a cut-off trailing batch is left for
        // the next fetch.
        seen.clear();
        let cut = &log[..log.len() - 3];
        assert_eq!(read_batches(cut, 12, None, |o, r| seen.push((o, r))), 13);
        assert_eq!(seen, vec![(12, Ok(written[2].clone()))]);
    }

    /// `batch` as a broker recompressing it with `codec` stores it: the
    /// records section compressed, the codec in the attributes, the length
    /// fixed (the reader does not check CRCs: the broker did).
    fn recompressed(batch: &[u8], codec: u8) -> Vec<u8> {
        use kafka_protocol::compression::{Compressor, Gzip, Lz4, Snappy, Zstd};
        let mut section = bytes::BytesMut::new();
        let put = |b: &mut bytes::BytesMut| {
            b.extend_from_slice(&batch[HEADER_LEN..]);
            Ok(())
        };
        match codec {
            1 => Gzip::compress(&mut section, put),
            2 => Snappy::compress(&mut section, put),
            3 => Lz4::compress(&mut section, put),
            _ => Zstd::compress(&mut section, put),
        }
        .unwrap();
        let mut out = batch[..HEADER_LEN].to_vec();
        out[22] |= codec;
        out.extend_from_slice(&section);
        let len = (out.len() - 12) as i32;
        out[8..12].copy_from_slice(&len.to_be_bytes());
        out
    }

    #[test]
    fn batches_a_broker_recompressed_are_read_with_every_codec() {
        // Signed: the MACs hold over the records, whatever the codec.
        let auth = StateAuth::new(b"0123456789abcdef0123456789abcdef", "__mirror_state", 0);
        let written = [origin(1, true), origin(2, false), origin(3, true)];
        let plain = with_base(encode_batch(&written, 5, Some(&auth)).unwrap(), 10);
        for codec in 1..=4 {
            let mut log = recompressed(&plain, codec);
            log.extend(with_base(
                encode_batch(&written[..1], 5, Some(&auth)).unwrap(),
                13,
            ));
            let mut seen = Vec::new();
            assert_eq!(
                read_batches(&log, 11, Some(&auth), |o, r| seen.push((o, r))),
                14
            );
            assert_eq!(
                seen,
                vec![
                    (11, Ok(written[1].clone())),
                    (12, Ok(written[2].clone())),
                    (13, Ok(written[0].clone()))
                ],
                "codec {codec}"
            );
        }
    }

    #[test]
    fn bad_records_are_skipped_with_their_offset() {
        let batch = build(
            &NewBatch::NO_PRODUCER,
            &[
                NewRecord {
                    key: Some(&[0, 9]),
                    value: None,
                    headers: &[],
                    timestamp: 0,
                },
                NewRecord {
                    key: Some(&origin(1, true).encode_key()),
                    value: origin(1, true).encode_value().as_deref(),
                    headers: &[],
                    timestamp: 0,
                },
            ],
        )
        .unwrap();
        let mut seen = Vec::new();
        assert_eq!(read_batches(&batch, 0, None, |o, r| seen.push((o, r))), 2);
        assert_eq!(
            seen,
            vec![
                (0, Err(SkipReason::Record(RecordError::UnknownType(9)))),
                (1, Ok(origin(1, true)))
            ]
        );
        // Marked compressed but not: skipped whole (the attributes are
        // inside the CRC, but the reader does not check CRCs: the broker
        // did).
        let mut gz = batch.clone();
        gz[22] |= 1;
        seen.clear();
        assert_eq!(read_batches(&gz, 0, None, |o, r| seen.push((o, r))), 2);
        assert!(
            matches!(
                &seen[..],
                [(
                    0,
                    Err(SkipReason::Compressed(DecompressError::Corrupt {
                        codec: "gzip",
                        ..
                    }))
                )]
            ),
            "{seen:?}"
        );
        // Garbage never panics.
        for n in 0..batch.len() {
            let mut b = batch.clone();
            b[n] ^= 0xff;
            let _ = read_batches(&b, 0, None, |_, _| {});
        }
    }

    /// With the key, what is written carries a MAC and reads back; a record
    /// without one, with another key's, or with its value changed after
    /// signing is skipped as such.
    #[test]
    fn signed_records_read_back_and_others_are_skipped() {
        let auth = StateAuth::new(b"0123456789abcdef0123456789abcdef", "__mirror_state", 0);
        let written = [origin(1, true), origin(2, false)];
        let signed = encode_batch(&written, 5, Some(&auth)).unwrap();
        let mut seen = Vec::new();
        assert_eq!(
            read_batches(&signed, 0, Some(&auth), |o, r| seen.push((o, r))),
            2
        );
        assert_eq!(
            seen,
            vec![(0, Ok(written[0].clone())), (1, Ok(written[1].clone()))]
        );
        // Without a key, the header is not looked at.
        seen.clear();
        read_batches(&signed, 0, None, |o, r| seen.push((o, r)));
        assert_eq!(seen.len(), 2);
        assert!(seen.iter().all(|(_, r)| r.is_ok()));

        let unsigned = encode_batch(&written[..1], 5, None).unwrap();
        let other = StateAuth::new(b"another secret of 32 bytes......", "__mirror_state", 0);
        let forged = encode_batch(&written[..1], 5, Some(&other)).unwrap();
        // The same record signed, then its mapped PID (the value's last
        // bytes before the timestamp) changed.
        let mut altered = encode_batch(&written[..1], 5, Some(&auth)).unwrap();
        let at = altered
            .windows(8)
            .position(|w| w == (-2i64).to_be_bytes())
            .expect("mapped pid");
        altered[at + 7] = 0xfd;
        for (batch, why) in [
            (unsigned, MacError::Missing),
            (forged, MacError::Wrong),
            (altered, MacError::Wrong),
        ] {
            seen.clear();
            read_batches(&batch, 0, Some(&auth), |o, r| seen.push((o, r)));
            assert_eq!(seen, vec![(0, Err(SkipReason::Mac(why)))]);
        }
    }
}
