//! Reading a partition's log tail for a rebuild of its mirrored producer
//! state (SPEC §6), and checking that the log still holds a batch a
//! duplicate answer would name ([`holds`]). What is read is replayed by the
//! pure side, [`RebuildClaim::apply`](crate::mirror::dedupe::RebuildClaim::apply).

use bytes::Bytes;
use std::time::{Duration, Instant};

use crate::client::protocol::OffsetSpec;
use crate::client::{Client, ClientError};
use crate::mirror::producer_state::BatchId;
use crate::wire::batch::{BatchHeader, Batches};

/// How long a rebuild waits for the high watermark to reach batches the
/// leader holds above it (a follower not yet caught up; one that died and
/// is still in the ISR holds an `acks=all` batch until the controller drops
/// it, seconds), polling every [`UNREPLICATED_POLL`]. Past it the rebuild
/// fails and the partition is answered retriable: the retry of such a
/// batch, read from below the high watermark, would look new.
const UNREPLICATED_WAIT: Duration = Duration::from_secs(2);
const UNREPLICATED_POLL: Duration = Duration::from_millis(20);

/// Errors of a tail read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TailError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(
        "the leader holds offsets {high_watermark}..{log_end} above the high watermark, not yet replicated (a follower lagging or dead); waited {} ms",
        UNREPLICATED_WAIT.as_millis()
    )]
    Unreplicated { high_watermark: i64, log_end: i64 },
}

/// What was read of a partition's log.
#[derive(Debug)]
pub(crate) struct Tail {
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
pub(crate) async fn read_tail(
    client: &Client,
    topic: &str,
    partition: i32,
    floor: i64,
    max_bytes: i32,
) -> Result<Tail, TailError> {
    let end = replicated_end(client, topic, partition).await?;
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

/// What was appended to `topic`-`partition` since `since` (a log end this
/// instance knew), for a writer new to the partition to catch up on:
/// `None` when it cannot be read that way (the log now ends below `since`:
/// truncated; or more was appended than `max_bytes` holds), and the
/// caller rebuilds from the tail instead. Read up to the high watermark
/// once it covers the leader's log end, like [`read_tail`].
pub(crate) async fn read_since(
    client: &Client,
    topic: &str,
    partition: i32,
    since: i64,
    max_bytes: i32,
) -> Result<Option<Tail>, TailError> {
    let end = replicated_end(client, topic, partition).await?;
    if end < since {
        return Ok(None);
    }
    let start = client
        .list_offset(topic, partition, OffsetSpec::Earliest)
        .await?
        .offset;
    if start > since {
        return Ok(None);
    }
    if end == since {
        return Ok(Some(Tail {
            start,
            end,
            from: since,
            records: Bytes::new(),
        }));
    }
    let f = client
        .fetch(topic, partition, since, max_bytes, Duration::ZERO)
        .await?;
    if whole_end(&f.records).is_none_or(|e| e < end) {
        return Ok(None);
    }
    Ok(Some(Tail {
        start,
        end,
        from: since,
        records: f.records,
    }))
}

/// The high watermark, once it covers every batch the leader held when
/// asked (see [`UNREPLICATED_WAIT`]). A tail read below it would miss a
/// batch already appended (by another instance, or through a connection
/// since lost) and waiting only for its followers: its retry would be
/// appended again.
async fn replicated_end(client: &Client, topic: &str, partition: i32) -> Result<i64, TailError> {
    let deadline = Instant::now() + UNREPLICATED_WAIT;
    let log_end = client
        .list_offset(topic, partition, OffsetSpec::LeaderLogEnd)
        .await?
        .offset;
    loop {
        let high_watermark = client
            .list_offset(topic, partition, OffsetSpec::Latest)
            .await?
            .offset;
        if high_watermark >= log_end {
            return Ok(high_watermark);
        }
        if Instant::now() >= deadline {
            return Err(TailError::Unreplicated {
                high_watermark,
                log_end,
            });
        }
        tokio::time::sleep(UNREPLICATED_POLL).await;
    }
}

/// [`read_tail`], and when it was begun; with `attempts` > 0, until the
/// log end read again after the records is the one the tail was read to
/// (a stable tail: nothing was appended while it was read), at most
/// `attempts` times. Returns the last tail read, when it was begun, and
/// whether it was stable (`false` when `attempts` is 0).
pub(crate) async fn read_tail_stable(
    client: &Client,
    topic: &str,
    partition: i32,
    floor: i64,
    max_bytes: i32,
    attempts: u32,
) -> Result<(Tail, Instant, bool), TailError> {
    let mut n = 0;
    loop {
        let read_at = Instant::now();
        let tail = read_tail(client, topic, partition, floor, max_bytes).await?;
        if attempts == 0 {
            return Ok((tail, read_at, false));
        }
        let end = client
            .list_offset(topic, partition, OffsetSpec::Latest)
            .await?
            .offset;
        n += 1;
        let stable = end == tail.end;
        if stable || n >= attempts {
            return Ok((tail, read_at, stable));
        }
    }
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

/// Whether a partition's log holds a batch at an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// The log holds that very batch there (same producer id, epoch and
    /// first sequence).
    Yes,
    /// Not there: another batch, or nothing (the log ends before it, also
    /// after waiting up to the bound for it to become readable).
    No,
    /// Below the log start: removed by retention, as a broker's own
    /// producer state outlives its batches.
    BelowLogStart,
}

/// Kafka's OFFSET_OUT_OF_RANGE.
const OFFSET_OUT_OF_RANGE: i16 = 1;
/// Enough for the header of the batch at the offset: a broker returns the
/// first batch whole whatever the bound (KIP-74).
const HOLDS_BYTES: i32 = 1024;

/// Does the log of `topic`-`partition` hold `batch` at `offset`? A Fetch
/// from `offset`, waiting up to `wait` if nothing is readable there yet (a
/// batch appended with `acks=1` is readable once the high watermark passes
/// it, which an in-sync follower makes happen in a moment).
pub(crate) async fn holds(
    client: &Client,
    topic: &str,
    partition: i32,
    offset: i64,
    batch: &BatchId,
    wait: Duration,
) -> Result<Held, ClientError> {
    let fetched = match client
        .fetch(topic, partition, offset, HOLDS_BYTES, wait)
        .await
    {
        Ok(f) => f,
        Err(ClientError::Kafka { code, .. }) if code == OFFSET_OUT_OF_RANGE => {
            let start = client
                .list_offset(topic, partition, OffsetSpec::Earliest)
                .await?
                .offset;
            return Ok(if offset < start {
                Held::BelowLogStart
            } else {
                Held::No
            });
        }
        Err(e) => return Err(e),
    };
    if offset < fetched.log_start_offset {
        return Ok(Held::BelowLogStart);
    }
    let records = &fetched.records[..];
    let Some(Ok(first)) = Batches::new(records).next() else {
        return Ok(Held::No);
    };
    let Ok(h) = BatchHeader::parse(&records[first.range()]) else {
        return Ok(Held::No);
    };
    let same = h.base_offset() == offset
        && h.producer_id() == batch.producer_id
        && h.producer_epoch() == batch.epoch
        && h.base_sequence() == batch.first_seq;
    Ok(if same { Held::Yes } else { Held::No })
}
