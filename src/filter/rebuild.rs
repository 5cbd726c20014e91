//! Reading a partition's log tail for a rebuild of its mirrored producer
//! state (SPEC §6). What is read is replayed by the pure side,
//! [`RebuildClaim::apply`](crate::mirror::dedupe::RebuildClaim::apply).

use bytes::Bytes;
use std::time::Duration;

use crate::client::protocol::OffsetSpec;
use crate::client::{Client, ClientError};
use crate::wire::batch::{BatchHeader, Batches};

/// What was read of a partition's log.
#[derive(Debug)]
pub struct Tail {
    /// The log start offset (raised to the floor).
    pub start: i64,
    /// The log end offset.
    pub end: i64,
    /// The offset `records` start at.
    pub from: i64,
    pub records: Bytes,
}

/// Read the longest tail of `topic`-`partition`, ending at the log end,
/// that fits in `max_bytes`: a window of offsets widened fourfold until
/// its batches no longer fit or it reaches the log start; if not even the
/// first fits, what the bound returned of it.
///
/// Nothing below `floor` is read: the log end offset the partition's
/// latest failover barrier recorded (0 if none), below which every
/// mirrored producer was expired.
pub async fn read_tail(
    client: &Client,
    topic: &str,
    partition: i32,
    floor: i64,
    max_bytes: i32,
) -> Result<Tail, ClientError> {
    let end = client
        .list_offset(topic, partition, OffsetSpec::Latest)
        .await?
        .offset;
    let start = client
        .list_offset(topic, partition, OffsetSpec::Earliest)
        .await?
        .offset
        .max(floor.min(end));
    let mut best: Option<(i64, Bytes)> = None;
    let mut span: i64 = 64;
    // An empty log has nothing to replay.
    let mut from = end;
    while from > start {
        from = end.saturating_sub(span).max(start);
        let f = client
            .fetch(topic, partition, from, max_bytes, Duration::ZERO)
            .await?;
        let fits = whole_end(&f.records).is_some_and(|e| e >= end);
        if fits || best.is_none() {
            best = Some((from, f.records));
        }
        if !fits {
            break;
        }
        span = span.saturating_mul(4);
    }
    let (from, records) = best.unwrap_or((end, Bytes::new()));
    Ok(Tail {
        start,
        end,
        from,
        records,
    })
}

/// The end offset of the whole batches of `records`.
fn whole_end(records: &[u8]) -> Option<i64> {
    let mut end = None;
    for b in Batches::new(records) {
        let Ok(b) = b else { break };
        let Ok(h) = BatchHeader::parse(&records[b.range()]) else {
            break;
        };
        end = Some(h.base_offset() + i64::from(h.last_offset_delta()) + 1);
    }
    end
}
