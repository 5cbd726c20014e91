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

use std::sync::{Arc, Mutex, MutexGuard};

use kafka_protocol::messages::produce_response::ProduceResponse;

use crate::metrics::Metrics;
use crate::mirror::origins::{OriginId, PartitionId};
use crate::mirror::produce::{
    same_topic, LocalOutcome, LocalPartition, ProducePlan, Refusal, TopicRef, TrackedBatch,
};
use crate::mirror::producer_state::{Check, ProducerStates};

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
    /// At most `max_entries` producers over all partitions.
    pub fn new(max_entries: usize, metrics: Arc<Metrics>) -> Arc<Dedupe> {
        Arc::new(Dedupe {
            states: Mutex::new(ProducerStates::new(max_entries)),
            metrics,
            changed: tokio::sync::Notify::new(),
        })
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

    /// Forget every mirrored producer of `partition` (the failover
    /// barrier, SPEC §7); returns how many. Meant for once the link's
    /// requests have drained: an answer settled later records its batch
    /// again.
    pub fn expire_partition(&self, partition: PartitionId) -> usize {
        let n = self.lock().clear_where(|(p, _)| *p == partition);
        self.changed.notify_waiters();
        n
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
