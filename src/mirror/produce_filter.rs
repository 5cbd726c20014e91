//! The mirrored producer state on a link's Produce path (SPEC §6): the
//! request half ([`Dedupe::begin`]: check every tracked batch of a planned
//! request, answer duplicates and refusals locally) and the response half
//! ([`Tracked::settle`]: record what the broker appended), with the
//! per-request state ([`Tracked`]) that links them.
//!
//! The state itself is the pure [`ProducerStates`], behind a std mutex that
//! is never held across an await. A request's begun batches are marked in
//! flight until its response is settled; a [`Tracked`] dropped unsettled (a
//! lost connection, a session ending, `acks=0`) ends their flight as failed,
//! so a retry is checked afresh.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kafka_protocol::messages::produce_response::ProduceResponse;

use crate::client::protocol::OffsetSpec;
use crate::client::{Client, ClientError};
use crate::metrics::Metrics;
use crate::mirror::origins::{OriginId, PartitionId};
use crate::mirror::produce::{
    same_topic, LocalOutcome, LocalPartition, ProducePlan, Refusal, TopicRef, TrackedBatch,
};
use crate::mirror::producer_state::{Check, ProducerStates, Replayed};
use crate::wire::batch::{BatchHeader, Batches};

/// What the state is kept per (with the mapped PID): a destination
/// partition and the origin the mapped PID stands for. An origin that
/// expires frees its mapped PID for another (SPEC §5); keyed by origin, the
/// newcomer never inherits the expired one's batches.
pub type StateKey = (PartitionId, OriginId);

/// The producer state of every mirrored partition, shared by all sessions.
pub struct Dedupe {
    states: Mutex<ProducerStates<StateKey>>,
    metrics: Arc<Metrics>,
    changed: tokio::sync::Notify,
    /// Partitions whose state was rebuilt from their log tail since start.
    rebuilt: Mutex<HashSet<PartitionId>>,
    /// One rebuild at a time (each partition once after start-up).
    rebuilding: tokio::sync::Mutex<()>,
    /// Bound on the bytes of a partition's tail read for a rebuild.
    rebuild_bytes: i32,
}

/// What a rebuild read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
    /// The first offset read (the dedupe window starts about there).
    pub from_offset: i64,
    /// The log end offset when read.
    pub log_end_offset: i64,
    pub replayed: Replayed,
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

/// The batches of one request that were begun (marked in flight), for the
/// response half. Dropped unsettled, they are failed.
pub struct Tracked {
    dedupe: Option<Arc<Dedupe>>,
    partitions: Vec<BegunPartition>,
}

struct BegunPartition {
    topic: TopicRef,
    partition: PartitionId,
    batches: Vec<TrackedBatch>,
}

impl Dedupe {
    /// At most `max_entries` producers over all partitions; a rebuild
    /// reads at most about `rebuild_bytes` of a partition's tail.
    pub fn new(max_entries: usize, rebuild_bytes: i32, metrics: Arc<Metrics>) -> Arc<Dedupe> {
        Arc::new(Dedupe {
            states: Mutex::new(ProducerStates::new(max_entries)),
            metrics,
            changed: tokio::sync::Notify::new(),
            rebuilt: Mutex::new(HashSet::new()),
            rebuilding: tokio::sync::Mutex::new(()),
            rebuild_bytes,
        })
    }

    fn is_rebuilt(&self, p: &PartitionId) -> bool {
        self.rebuilt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(p)
    }

    /// The tracked partitions of `plan` whose state was not rebuilt yet
    /// since start (each with its topic as the request names it).
    pub fn unrebuilt(&self, plan: &ProducePlan) -> Vec<(PartitionId, TopicRef)> {
        let rebuilt = self.rebuilt.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(PartitionId, TopicRef)> = Vec::new();
        for tp in &plan.tracked {
            if !rebuilt.contains(&tp.partition) && !out.iter().any(|(p, _)| *p == tp.partition) {
                out.push((tp.partition, tp.topic.clone()));
            }
        }
        out
    }

    /// Rebuild `partition`'s state from its log tail (SPEC §6): the longest
    /// tail, ending at the log end, that fits in the byte bound (a window of
    /// offsets widened fourfold until its batches no longer fit or it
    /// reaches the log start; if not even the first fits, what the bound
    /// returned of it). Mapped producers are keyed by `owner` (the origin a
    /// mapped PID stands for; batches of unknown ones are skipped). Once per
    /// partition: later calls return `None`.
    pub async fn rebuild(
        &self,
        client: &Client,
        topic: &str,
        partition: PartitionId,
        owner: &(dyn Fn(i64) -> Option<OriginId> + Sync),
    ) -> Result<Option<Rebuilt>, ClientError> {
        let _one = self.rebuilding.lock().await;
        if self.is_rebuilt(&partition) {
            return Ok(None);
        }
        let p = partition.partition;
        let end = client
            .list_offset(topic, p, OffsetSpec::Latest)
            .await?
            .offset;
        let start = client
            .list_offset(topic, p, OffsetSpec::Earliest)
            .await?
            .offset;
        let mut best: Option<(i64, bytes::Bytes)> = None;
        let mut span: i64 = 64;
        // An empty log has nothing to replay.
        let mut from = end;
        while from > start {
            from = end.saturating_sub(span).max(start);
            let f = client
                .fetch(topic, p, from, self.rebuild_bytes, Duration::ZERO)
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
        let mut out = Rebuilt {
            from_offset: end,
            log_end_offset: end,
            replayed: Replayed::default(),
        };
        if let Some((from, records)) = best {
            out.from_offset = from;
            let mut states = self.lock();
            out.replayed = states.replay_records_keyed(&records, |mapped| {
                owner(mapped).map(|origin| (partition, origin))
            });
        }
        self.rebuilt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(partition);
        Ok(Some(out))
    }

    /// Answer `partition` of `plan` locally (its state could not be
    /// rebuilt): retriable, nothing of it forwarded.
    pub fn refuse_partition(plan: &mut ProducePlan, partition: PartitionId, message: String) {
        let Some(i) = plan.tracked.iter().position(|t| t.partition == partition) else {
            return;
        };
        let tp = plan.tracked.remove(i);
        plan.forwarded_partitions -= 1;
        plan.local.push(LocalPartition {
            topic: tp.topic,
            partition: partition.partition,
            outcome: LocalOutcome::Refused {
                refusal: Refusal::StateNotLoaded,
                message,
            },
        });
    }

    fn lock(&self) -> MutexGuard<'_, ProducerStates<StateKey>> {
        // The state is consistent between calls: a panic elsewhere while it
        // was held leaves nothing half-done worth refusing service over.
        self.states.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Producers held now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Notified whenever batches leave flight (appended or failed), for a
    /// request waiting on [`Dedupe::begin`] returning `None`. Create (and
    /// enable) it before calling `begin`, so no change is missed.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    /// Request half: check every tracked partition of `plan` (taking
    /// `plan.tracked`). A partition whose batches were all appended already
    /// becomes a local [`LocalOutcome::Duplicate`]; a refused one (epoch
    /// going backwards, overlapping sequence, or a mix of duplicates and new
    /// batches, which the proxy cannot split) a local refusal; both leave
    /// the forwarded request. The rest are marked in flight and returned,
    /// for [`Tracked::settle`].
    ///
    /// A batch whose same attempt is in flight: with `wait`, nothing of the
    /// request is begun and `None` is returned (`plan` unchanged), for the
    /// caller to wait for [`changed`](Self::changed) and begin again; else
    /// its partition is answered with the retriable
    /// [`Refusal::RetryInFlight`]. Never a second append.
    pub fn begin(
        self: &Arc<Self>,
        plan: &mut ProducePlan,
        link: &str,
        wait: bool,
    ) -> Option<Tracked> {
        let mut tracked = Tracked {
            dedupe: None,
            partitions: Vec::new(),
        };
        if plan.tracked.is_empty() {
            return Some(tracked);
        }
        tracked.dedupe = Some(Arc::clone(self));
        let mut states = self.lock();
        let evictions = states.evictions();
        let mut decisions = Vec::with_capacity(plan.tracked.len());
        let mut in_flight = false;
        for tp in &plan.tracked {
            let mut begun = Vec::with_capacity(tp.batches.len());
            let mut duplicate: Option<(i64, usize)> = None;
            let mut outcome = None;
            for b in &tp.batches {
                match states.begin(&(tp.partition, b.origin), &b.id) {
                    Check::Append => begun.push(*b),
                    Check::Duplicate { base_offset } => {
                        let d = duplicate.get_or_insert((base_offset, 0));
                        d.1 += 1;
                    }
                    Check::InFlight => {
                        in_flight = true;
                        outcome = Some(LocalOutcome::Refused {
                            refusal: Refusal::RetryInFlight,
                            message: format!(
                                "mirror link '{link}': partition {}: producer {} epoch {} sequences {}..{} are being appended by an earlier request; retry",
                                tp.partition.partition, b.id.producer_id, b.id.epoch, b.id.first_seq, b.id.last_seq
                            ),
                        });
                        break;
                    }
                    Check::Refuse { kind, message } => {
                        outcome = Some(LocalOutcome::Refused {
                            refusal: kind.into(),
                            message: format!(
                                "mirror link '{link}': partition {}: {message}",
                                tp.partition.partition
                            ),
                        });
                        break;
                    }
                }
            }
            if outcome.is_none() {
                if let Some((base_offset, batches)) = duplicate {
                    outcome = Some(if batches == tp.batch_count {
                        LocalOutcome::Duplicate {
                            base_offset,
                            batches,
                        }
                    } else {
                        LocalOutcome::Refused {
                            refusal: Refusal::OutOfOrderSequence,
                            message: format!(
                                "mirror link '{link}': partition {}: {batches} of the {} batches were appended already; the proxy cannot split a partition's records, send the new batches alone",
                                tp.partition.partition, tp.batch_count
                            ),
                        }
                    });
                }
            }
            if outcome.is_some() {
                for b in &begun {
                    states.failed(&(tp.partition, b.origin), &b.id);
                }
                begun.clear();
            }
            decisions.push((outcome, begun));
        }
        if in_flight && wait {
            for (tp, (_, begun)) in plan.tracked.iter().zip(&decisions) {
                for b in begun {
                    states.failed(&(tp.partition, b.origin), &b.id);
                }
            }
            drop(states);
            tracked.dedupe = None;
            self.changed.notify_waiters();
            return None;
        }
        let evicted = states.evictions() - evictions;
        drop(states);
        for (tp, (outcome, begun)) in std::mem::take(&mut plan.tracked).into_iter().zip(decisions) {
            match outcome {
                None => tracked.partitions.push(BegunPartition {
                    topic: tp.topic,
                    partition: tp.partition,
                    batches: begun,
                }),
                Some(outcome) => {
                    plan.forwarded_partitions -= 1;
                    plan.local.push(LocalPartition {
                        topic: tp.topic,
                        partition: tp.partition.partition,
                        outcome,
                    });
                }
            }
        }
        if evicted > 0 {
            self.metrics.producer_state_evicted(evicted);
        }
        Some(tracked)
    }
}

impl Tracked {
    /// Nothing tracked (not a link request).
    pub fn none() -> Tracked {
        Tracked {
            dedupe: None,
            partitions: Vec::new(),
        }
    }

    /// Nothing was begun.
    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }

    /// Response half: every begun partition the broker answered with error
    /// NONE is recorded as appended (each batch at the partition's base
    /// offset plus its offset delta; at the broker's log append time, or
    /// `now_ms` when the topic uses create time); any other answer, or none,
    /// fails its batches.
    pub fn settle(mut self, response: &ProduceResponse, version: i16, now_ms: i64) {
        let Some(dedupe) = self.dedupe.take() else {
            return;
        };
        let mut states = dedupe.lock();
        let evictions = states.evictions();
        for bp in std::mem::take(&mut self.partitions) {
            let answer = response
                .responses
                .iter()
                .filter(|t| same_topic(version, &bp.topic, &t.name, t.topic_id))
                .flat_map(|t| t.partition_responses.iter())
                .find(|p| p.index == bp.partition.partition);
            match answer {
                Some(p) if p.error_code == 0 && p.base_offset >= 0 => {
                    let time = if p.log_append_time_ms >= 0 {
                        p.log_append_time_ms
                    } else {
                        now_ms
                    };
                    for b in &bp.batches {
                        states.appended(
                            &(bp.partition, b.origin),
                            &b.id,
                            p.base_offset + b.offset_delta,
                            time,
                        );
                    }
                }
                _ => {
                    for b in &bp.batches {
                        states.failed(&(bp.partition, b.origin), &b.id);
                    }
                }
            }
        }
        let evicted = states.evictions() - evictions;
        drop(states);
        dedupe.changed.notify_waiters();
        if evicted > 0 {
            dedupe.metrics.producer_state_evicted(evicted);
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let Some(dedupe) = self.dedupe.take() else {
            return;
        };
        if self.partitions.is_empty() {
            return;
        }
        let mut states = dedupe.lock();
        for bp in self.partitions.drain(..) {
            for b in &bp.batches {
                states.failed(&(bp.partition, b.origin), &b.id);
            }
        }
        drop(states);
        dedupe.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
