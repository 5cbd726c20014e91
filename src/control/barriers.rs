//! One partition's failover barrier (SPEC §7): send the `MIRROR_PID_RESET`
//! control batch to the partition's leader (acks=all), whatever the broker
//! answers read the partition's log end offset, record the barrier in the
//! state topic, and expire the mirrored producer state of the partition.
//!
//! The expiry is not done here but where the record is read: every instance
//! that follows the state topic applies a barrier record it reads to its own
//! producer state (`StateStore::expire_with`), so no instance keeps stale
//! state for the partition, and the one placing the barrier has applied it
//! before [`place`] returns. A barrier that arrives mirrored, in link
//! traffic, is a batch like any other there and expires nothing.

use bytes::Bytes;

use crate::client::protocol::{OffsetSpec, Produced};
use crate::mirror::barrier::barrier_batch;
use crate::mirror::pid::ClusterId;
use crate::mirror::state_records::{BarrierKey, BarrierValue};
use crate::state::{now_ms, AppliedBarrier, StateStore};
use crate::sync::error_chain;

/// How a partition's barrier ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierResult {
    /// The log appended the barrier; it is recorded.
    Accepted,
    /// The broker refused the barrier (a stock broker answers
    /// INVALID_RECORD: control batches from clients); it is recorded.
    Refused,
    /// It could not be sent, its log end offset read, or the record
    /// written: nothing is recorded, and placing it again is safe.
    Failed,
}

impl BarrierResult {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BarrierResult::Accepted => "accepted",
            BarrierResult::Refused => "refused",
            BarrierResult::Failed => "failed",
        }
    }
}

/// One partition's barrier, as reported to the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BarrierOutcome {
    pub topic: String,
    pub partition: i32,
    pub result: BarrierResult,
    /// The broker's answer to the barrier (0: appended); -1 if none came.
    pub error_code: i16,
    pub message: Option<String>,
    /// The partition's log end offset after the barrier; -1 unknown.
    pub log_end_offset: i64,
    /// Mirrored producers of the partition this instance forgot.
    pub expired_producers: usize,
    /// When the barrier was recorded; -1 if it was not.
    pub recorded_at_ms: i64,
}

impl BarrierOutcome {
    fn failed(topic: &str, partition: i32, message: String) -> BarrierOutcome {
        tracing::warn!(topic, partition, reason = %message, "failover barrier failed; it can be placed again");
        BarrierOutcome {
            topic: topic.to_string(),
            partition,
            result: BarrierResult::Failed,
            error_code: -1,
            message: Some(message),
            log_end_offset: -1,
            expired_producers: 0,
            recorded_at_ms: -1,
        }
    }

    fn recorded(topic: &str, partition: i32, b: &AppliedBarrier, message: Option<String>) -> Self {
        BarrierOutcome {
            topic: topic.to_string(),
            partition,
            result: if b.value.accepted {
                BarrierResult::Accepted
            } else {
                BarrierResult::Refused
            },
            error_code: b.value.error_code,
            message,
            log_end_offset: b.value.log_end_offset,
            expired_producers: b.expired_here,
            recorded_at_ms: b.value.timestamp_ms,
        }
    }
}

/// Place, record and apply the barrier of failover `failover_id` of `link`
/// (whose source cluster is `source`) in one partition. Idempotent: when
/// the state topic already holds this failover's barrier for the
/// partition, that is returned and nothing is sent again (a failover
/// resumed after a restart skips the partitions it finished).
pub async fn place(
    state: &StateStore,
    link: &str,
    source: &ClusterId,
    failover_id: i64,
    topic: &str,
    partition: i32,
) -> BarrierOutcome {
    let topic_id = match state.lookup_topic_id(topic).await {
        Ok(id) => id,
        Err(e) => return BarrierOutcome::failed(topic, partition, error_chain(&e)),
    };
    let key = BarrierKey {
        link: link.to_string(),
        topic_id,
        partition,
    };
    if let Some(done) = state.barrier(&key) {
        if done.value.failover_id == failover_id {
            return BarrierOutcome::recorded(topic, partition, &done, None);
        }
    }
    let timestamp_ms = now_ms();
    let batch = match barrier_batch(source, timestamp_ms) {
        Ok(b) => b,
        Err(e) => return BarrierOutcome::failed(topic, partition, error_chain(&e)),
    };
    let client = state.client();
    let (error_code, message) = match client
        .produce(topic, partition, Bytes::from(batch.clone()))
        .await
    {
        Ok(Produced::Appended { .. }) => (0, None),
        Ok(Produced::Refused { code, message }) => (code, message),
        Err(e) => {
            return BarrierOutcome::failed(
                topic,
                partition,
                format!("sending the barrier: {}", error_chain(&e)),
            )
        }
    };
    let log_end_offset = match client
        .list_offset(topic, partition, OffsetSpec::Latest)
        .await
    {
        Ok(l) => l.offset,
        Err(e) => {
            return BarrierOutcome::failed(
                topic,
                partition,
                format!(
                    "reading the log end offset after the barrier: {}",
                    error_chain(&e)
                ),
            )
        }
    };
    let value = BarrierValue {
        failover_id,
        source: *source,
        log_end_offset,
        timestamp_ms,
        accepted: error_code == 0,
        error_code,
        batch,
    };
    match state.record_barrier(key, value).await {
        Ok(applied) => {
            tracing::info!(
                link,
                topic,
                partition,
                failover_id,
                log_end_offset,
                broker_error = error_code,
                broker_message = message.as_deref().unwrap_or(""),
                expired = applied.expired_here,
                "failover barrier placed and recorded"
            );
            BarrierOutcome::recorded(topic, partition, &applied, message)
        }
        Err(e) => BarrierOutcome::failed(
            topic,
            partition,
            format!("recording the barrier: {}", error_chain(&e)),
        ),
    }
}
