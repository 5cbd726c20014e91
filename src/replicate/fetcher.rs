//! One source broker's fetcher: a connection of its own, and one Fetch at
//! a time for every partition the broker leads that has room to be
//! fetched (Kafka's `AbstractFetcherThread` shape). The answer is cut into
//! batches outside the lock and queued for the senders.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::bulk::{fetch_request_many, fetch_result_many, FetchPart, FetchSpec};
use crate::client::conn::Connection;
use crate::client::error::error_name;
use crate::client::protocol::{Fetched, IsolationLevel, OffsetSpec};
use crate::client::{Client, ClientError};
use crate::config::replicator::Isolation;
use crate::sync::error_chain;

use super::batches::split;
use super::metrics::ErrorKind;
use super::partitions::{Table, ToFetch, Tp};
use super::{lock, ReplicateError, Shared};

/// OFFSET_OUT_OF_RANGE: the source no longer (or not yet) holds the offset.
const OFFSET_OUT_OF_RANGE: i16 = 1;
/// Authorization failures: no retry fixes them.
const AUTHORIZATION: [i16; 3] = [29, 30, 31];

pub(super) async fn run(shared: Arc<Shared>, source: Client, broker: i32) {
    let mut conn: Option<Connection> = None;
    let mut backoff = shared.backoff();
    let spec = FetchSpec {
        max_wait_ms: i32::try_from(shared.config.fetch_max_wait.as_millis()).unwrap_or(i32::MAX),
        min_bytes: 1,
        max_bytes: shared.config.fetch_max_bytes,
        isolation: match shared.config.isolation {
            Isolation::ReadCommitted => IsolationLevel::ReadCommitted,
            Isolation::ReadUncommitted => IsolationLevel::ReadUncommitted,
        },
    };
    loop {
        if shared.stopping() {
            return;
        }
        let changed = shared.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let (parts, max_bytes, reservation) =
            shared
                .table()
                .next_fetches(broker, shared.config.fetch_max_bytes, Instant::now());
        if parts.is_empty() {
            shared.table().fetched(reservation);
            // A pause ends without a notification: look again soon.
            tokio::select! {
                _ = &mut changed => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            continue;
        }
        let spec = FetchSpec { max_bytes, ..spec };
        let answer = fetch(&shared, &source, &mut conn, broker, &parts, &spec).await;
        shared.table().fetched(reservation);
        match answer {
            Ok(answers) => {
                backoff.reset();
                for (part, answer) in parts.iter().zip(answers) {
                    take(&shared, &source, part, answer).await;
                }
                shared.changed.notify_waiters();
            }
            Err(e) => {
                conn = None;
                shared.metrics.error(ErrorKind::Fetch);
                shared.metadata_stale.notify_one();
                let delay = backoff.next_delay();
                tracing::warn!(broker, error = %error_chain(&e), retry_in_ms = delay.as_millis() as u64, "source fetch failed");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// One Fetch on this broker's connection, opened if needed.
async fn fetch(
    shared: &Shared,
    source: &Client,
    conn: &mut Option<Connection>,
    broker: i32,
    parts: &[ToFetch],
    spec: &FetchSpec,
) -> Result<Vec<Result<Fetched, ClientError>>, ClientError> {
    let c = match conn {
        Some(c) => c,
        None => {
            let address = lock(&shared.source_nodes)
                .get(&broker)
                .cloned()
                .ok_or(ClientError::NoBrokers)?;
            conn.insert(Connection::open(source.config(), &address).await?)
        }
    };
    let refs: Vec<FetchPart<'_>> = parts
        .iter()
        .map(|p| FetchPart {
            from: p.placement.partition_ref(&p.tp),
            offset: p.offset,
            max_bytes: p.max_bytes,
        })
        .collect();
    let (version, response) = c
        .call(shared.config.fetch_max_wait, |v| {
            fetch_request_many(v, &refs, spec)
        })
        .await?;
    fetch_result_many(&response, version, &refs)
}

/// One partition's answer into the table.
async fn take(
    shared: &Shared,
    source: &Client,
    part: &ToFetch,
    answer: Result<Fetched, ClientError>,
) {
    let now = Instant::now();
    let fetched = match answer {
        Ok(fetched) => fetched,
        Err(ClientError::Kafka { code, .. }) if code == OFFSET_OUT_OF_RANGE => {
            reset(shared, source, &part.tp, part.offset).await;
            return;
        }
        Err(ClientError::Kafka { code, .. }) if AUTHORIZATION.contains(&code) => {
            shared.fail(ReplicateError::client(
                format!("fetch from source {}", part.tp),
                ClientError::Kafka {
                    context: format!("fetch from {}", part.tp),
                    code,
                    message: Some(format!(
                        "{}: grant the replicator's principal Read on the topic",
                        error_name(code)
                    )),
                },
            ));
            return;
        }
        Err(e) => {
            shared.metrics.error(ErrorKind::Fetch);
            if e.invalidates_metadata() {
                shared.metadata_stale.notify_one();
            }
            tracing::debug!(tp = %part.tp, error = %error_chain(&e), "partition fetch failed; retried");
            pause(
                &mut shared.table(),
                &part.tp,
                shared.config.retry_backoff,
                now,
            );
            return;
        }
    };
    let split = match split(&fetched.records, fetched.aborted_transactions) {
        Ok(split) => split,
        Err(source) => {
            shared.fail(ReplicateError::Records {
                tp: part.tp.to_string(),
                offset: part.offset,
                source,
            });
            return;
        }
    };
    let mut table = shared.table();
    let taken = table.push(
        &part.tp,
        part.offset,
        split.items,
        fetched.high_watermark,
        now,
    );
    if !taken {
        if let Some(needed) = split.partial_needed {
            // Only a cut batch came back: ask for all of it next time.
            if let Some(p) = table.get_mut(&part.tp) {
                if p.fetch_offset == part.offset {
                    p.fetch_max_bytes = i32::try_from(needed).unwrap_or(i32::MAX);
                }
            }
        }
    }
}

fn pause(table: &mut Table, tp: &Tp, for_: Duration, now: Instant) {
    if let Some(p) = table.get_mut(tp) {
        p.paused_until = Some(now + for_);
    }
}

/// The source no longer holds `offset` (retention deleted it before it
/// was copied) or not yet (its log was truncated): go on from the log
/// start, or from the log end, loudly. What was deleted is lost to the
/// mirror; what a truncation removed was never acknowledged on the source.
async fn reset(shared: &Shared, source: &Client, tp: &Tp, offset: i64) {
    shared.metrics.error(ErrorKind::OffsetOutOfRange);
    let key = [(tp.topic.to_string(), tp.partition)];
    let (start, end) = tokio::join!(
        source.list_offsets(&key, OffsetSpec::Earliest),
        source.list_offsets(&key, OffsetSpec::Latest)
    );
    let (Some(start), Some(end)) = (
        start.ok().and_then(|m| m.get(&key[0]).copied()),
        end.ok().and_then(|m| m.get(&key[0]).copied()),
    ) else {
        pause(
            &mut shared.table(),
            tp,
            shared.config.retry_backoff_max,
            Instant::now(),
        );
        return;
    };
    let to = if offset < start { start } else { end };
    if offset < start {
        tracing::error!(%tp, offset, log_start = start, lost = start - offset,
            "the source deleted records before they were copied; going on from its log start");
    } else {
        tracing::error!(%tp, offset, log_end = end,
            "the source log ends below the copy position (truncated); going on from its log end");
    }
    let mut table = shared.table();
    if table.get(tp).is_some_and(|p| p.fetch_offset == offset) {
        table.reset(tp, to, Instant::now());
    }
}
