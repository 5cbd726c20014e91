//! The mirrored producer state on a link's Produce path (SPEC §6): the
//! request half ([`Dedupe::begin`]: check every tracked batch of a planned
//! request, answer duplicates and refusals locally) and the response half
//! ([`Tracked::settle`]: record what the broker appended), with the
//! per-request state ([`Tracked`]) that links them.
//!
//! The state itself is the pure [`ProducerStates`], behind a std mutex that
//! is never held across an await. A request's begun batches are marked in
//! flight until its response is settled.
//!
//! No batch of a partition is begun before the partition's state has been
//! rebuilt from its log tail (a [`RebuildClaim`], read by `filter::rebuild`): once after start-up,
//! and again after its outcome became unknown (a [`Tracked`] dropped
//! unsettled: a lost connection, a session ending, an undecodable answer;
//! or a timeout answer), its leader moved, or its log was truncated. One
//! request claims the rebuild; the partition's other requests wait for it.
//!
//! A rebuild *replaces* what the partition's state remembered of appended
//! batches (forgotten when the rebuild is claimed, before the tail is read;
//! batches in flight stay marked) with what its log holds: a batch the
//! broker acknowledged and then lost in a truncation (an unclean leader
//! election, a leader whose log ends below it) is no longer answered as a
//! duplicate. Answers settled while the tail is read are recorded on top, so
//! nothing appended meanwhile is lost.
//!
//! A truncation is seen on the hot path when a broker answers a batch with a
//! base offset below the log end the partition was known to have when the
//! request was begun (a log only grows, except by truncation); and, because
//! an idle partition answers nothing, a duplicate answer is checked against
//! the log first (`filter::produce`, with `Tracked::duplicates`): it must
//! name a batch the log still holds.
//!
//! A batch whose answer never came may still be appended after the tail
//! was read (the broker handles a request it read even once its connection
//! closed, and one may sit in its queue or on the network): such batches
//! are held in `Doubts` until a tail holds them (settled: the retry is a
//! duplicate) or their wait is over and a stable tail read after it does
//! not (never appended); meanwhile their producer's batches on that
//! partition are answered retriable ([`Refusal::OutcomeUnknown`]).
//!
//! Each instance's state is its own memory: another instance may have
//! appended to a partition since this one last read it, and a retry of that
//! batch through this instance would look new. So a partition's state is
//! trusted only by the connections (writers) that claimed one of its
//! rebuilds here: a connection new to a partition first catches up,
//! whatever it sends, reading what the log holds past the offset up to
//! which this instance has seen all of it (`RebuildClaim::since`), and
//! merging it. A replicator reconnecting (to this instance or, after a
//! kill, to another) is such a connection; one that keeps its connection
//! writes through this instance and is seen here. Only what is new is read:
//! a tail read again would take the batches of an expired origin for those
//! of the origin its mapped PID went to.

// foldhash: looked up for every mirrored batch; SipHash showed in profiles.
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use smallvec::SmallVec;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::mirror::doubt::{Doubts, Resolved, Verdict};
use crate::mirror::origins::{OriginId, PartitionId};
use crate::mirror::produce::{
    LocalOutcome, LocalPartition, ProducePlan, Refusal, TopicRef, TrackedBatches,
};
use crate::mirror::produce_response::{Answers, PartitionAnswer};
use crate::mirror::producer_state::{BatchId, Check, ProducerStates, Replayed};

/// What the state is kept per (with the mapped PID): a destination
/// partition and the origin the mapped PID stands for. An origin that
/// expires frees its mapped PID for another (SPEC §5); keyed by origin, the
/// newcomer never inherits the expired one's batches.
pub(crate) type StateKey = (PartitionId, OriginId);

/// One connection's identity for the partitions it may write without a
/// rebuild (see the module doc); unique for the life of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Writer(u64);

/// Writers remembered per partition: more connections writing one
/// partition at once are not expected of a replicator; past it, the
/// longest-known writer rebuilds again on its next request (a cost, not a
/// risk).
const WRITERS_PER_PARTITION: usize = 16;

/// The producer state of every mirrored partition, shared by all sessions.
pub(crate) struct Dedupe {
    inner: Mutex<Inner>,
    metrics: Arc<Metrics>,
    /// Notified when batches leave flight or a rebuild ends.
    changed: tokio::sync::Notify,
    /// Bound on the bytes of a partition's tail read for a rebuild.
    rebuild_bytes: i32,
    /// The longest a batch whose answer never came is waited out before a
    /// tail without it is taken to mean it was never appended
    /// (`MIRROR_PROXY_UNKNOWN_OUTCOME_WAIT_MS`).
    unknown_wait: Duration,
    /// The next [`Writer`].
    next_writer: std::sync::atomic::AtomicU64,
}

/// Everything behind the one lock: the states and, per partition, whether
/// they may be used (rebuilt from the log since start-up or since the
/// partition was last marked).
struct Inner {
    states: ProducerStates<StateKey>,
    /// Partitions rebuilt and not marked since: their batches may begin,
    /// by the writers in `writers`.
    ready: HashSet<PartitionId>,
    /// Per partition, the writers that claimed one of its rebuilds, or
    /// were taken as having done so ([`Dedupe::assume_rebuilt`]): what they
    /// send was seen here since the log was read, the rest rebuild first.
    /// Closed connections' writers stay until pushed out (never reused).
    writers: HashMap<PartitionId, SmallVec<[Writer; 2]>>,
    /// Partitions a request is rebuilding now; `true` once marked again
    /// meanwhile (then the rebuild ends without making it ready).
    rebuilding: HashMap<PartitionId, bool>,
    /// Per partition, the log end it is known to have had (from a rebuild's
    /// read, or the end of a batch the broker answered). A batch begun
    /// after it was known and answered below it means the log was
    /// truncated. One word per partition.
    known_end: HashMap<PartitionId, i64>,
    /// Per partition, the offset up to which this instance has seen every
    /// batch of the log: the end of its last read, moved on by an answer
    /// only when the batch starts right there (a gap is someone else's
    /// writing). A writer new to the partition catches up from it.
    seen_end: HashMap<PartitionId, i64>,
    /// Batches sent whose answer never came, until a tail settles them.
    doubts: Doubts<StateKey>,
}

/// Why a partition needs its state rebuilt again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RebuildReason {
    /// A link batch was sent and its answer never came (connection lost,
    /// undecodable answer), or came as a timeout: it may be in the log.
    UnknownOutcome,
    /// The broker named another leader for the partition.
    LeaderMoved,
    /// The log was truncated below what the state remembers: a batch
    /// answered below the known log end, or a duplicate answer naming a
    /// batch the log no longer holds.
    Truncated,
}

impl RebuildReason {
    pub(crate) fn label(self) -> &'static str {
        match self {
            RebuildReason::UnknownOutcome => "unknown_outcome",
            RebuildReason::LeaderMoved => "leader_moved",
            RebuildReason::Truncated => "truncated",
        }
    }
}

/// What a rebuild read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rebuilt {
    /// The first offset read (the dedupe window starts about there).
    pub from_offset: i64,
    /// The log start offset when read.
    pub log_start_offset: i64,
    /// The log end offset when read.
    pub log_end_offset: i64,
    pub replayed: Replayed,
    /// What the read did to the batches whose answer never came.
    pub doubts: Resolved,
}

/// The batches of one request that were begun (marked in flight), for the
/// response half. Dropped unsettled, their outcome is unknown: they are
/// failed and their partitions marked for a rebuild.
pub(crate) struct Tracked {
    dedupe: Option<Arc<Dedupe>>,
    partitions: Vec<BegunPartition>,
    /// The partitions answered as duplicates, for a check that the log
    /// still holds what the answer names (empty, unallocated, otherwise).
    duplicates: Vec<DuplicateAnswer>,
    /// If the answer never comes, how long the broker may still append the
    /// batches (the request's `timeout_ms`, capped).
    wait: Duration,
}

struct BegunPartition {
    topic: Arc<TopicRef>,
    partition: PartitionId,
    batches: TrackedBatches,
    /// The partition's known log end when begun (`-1`: none known).
    known_end: i64,
}

/// A partition answered as a duplicate: its first batch, which the log
/// must hold at `base_offset`.
#[derive(Debug, Clone)]
pub(crate) struct DuplicateAnswer {
    pub topic: Arc<TopicRef>,
    pub partition: PartitionId,
    pub batch: BatchId,
    pub base_offset: i64,
}

/// What [`Dedupe::begin`] decided for a request.
pub(crate) enum Begin {
    /// Every tracked partition was checked: the begun ones are in
    /// [`Tracked`], the rest became local answers in the plan.
    Begun(Tracked),
    /// A batch of the request is in flight on another request: nothing was
    /// begun; wait for `Dedupe::changed` and begin again.
    InFlight,
    /// Some partitions' state must be rebuilt first: nothing was begun.
    /// `claims` are this request's to rebuild;
    /// `waiting` are being rebuilt by other requests (wait for
    /// `Dedupe::changed`, bounded, then begin again).
    Rebuild {
        claims: Vec<RebuildClaim>,
        waiting: Vec<PartitionId>,
    },
}

/// One request's right and duty to rebuild one partition's state. Dropped
/// without `apply`, the partition stays unrebuilt and
/// the next request claims it.
pub(crate) struct RebuildClaim {
    dedupe: Arc<Dedupe>,
    partition: PartitionId,
    topic: Arc<TopicRef>,
    /// The claiming request's connection: it may write the partition once
    /// rebuilt (its request came before the tail was read).
    writer: Writer,
    /// A catch-up: the state is kept and only what the log holds from
    /// this offset on (a log end known here) is to be read and merged.
    since: Option<i64>,
}

impl RebuildClaim {
    pub(crate) fn partition(&self) -> PartitionId {
        self.partition
    }

    /// The topic as the request names it.
    pub(crate) fn topic(&self) -> &TopicRef {
        &self.topic
    }

    /// `Some(offset)` for a catch-up from `offset` (see
    /// [`RebuildClaim::full`] when that cannot be read).
    pub(crate) fn since(&self) -> Option<i64> {
        self.since
    }

    /// Make a catch-up a rebuild from the tail (the log was truncated
    /// below the offset, or more was appended than a read holds): the
    /// partition's appended batches are forgotten now, before the tail is
    /// read.
    pub(crate) fn full(&mut self) {
        if self.since.take().is_none() {
            return;
        }
        let p = self.partition;
        let mut inner = self.dedupe.lock();
        inner.states.forget_appended_where(|(q, _)| *q == p);
        inner.known_end.remove(&p);
        inner.seen_end.remove(&p);
    }

    /// How many bytes of the log tail a rebuild may read.
    pub(crate) fn rebuild_bytes(&self) -> i32 {
        self.dedupe.rebuild_bytes
    }

    /// Whether the partition has batches whose answer never came and whose
    /// wait is over: the tail must then be read stable (the log end the
    /// same when read again), and what it does not hold of them is taken
    /// as never appended.
    pub(crate) fn confirming(&self) -> bool {
        self.dedupe
            .lock()
            .doubts
            .confirming(&self.partition, Instant::now())
    }

    /// With the tail read (`filter::rebuild`): `records` from offset
    /// `from`, the log spanning `start..end`. Replays them into the state
    /// (emptied of the partition's appended batches when claimed; mapped
    /// producers are keyed by `owner`, the origin a mapped PID stands for,
    /// and batches of unknown ones are skipped), makes the partition ready
    /// unless it was marked meanwhile or a batch found no room (the bound
    /// reached with every producer held busy: `replayed.untaken`, then the
    /// caller answers the partition retriable), and wakes the requests
    /// waiting for it. The partition's batches whose answer never came are
    /// settled if the tail holds them, or dropped as never appended if
    /// `read_at` (when the log end was read) is past their wait and the
    /// read was `stable` ([`Doubts::after_tail`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply(
        self,
        start: i64,
        end: i64,
        from: i64,
        records: &[u8],
        owner: &(dyn Fn(i64) -> Option<OriginId> + Sync),
        read_at: Instant,
        stable: bool,
    ) -> Rebuilt {
        let d = &self.dedupe;
        let partition = self.partition;
        let mut inner = d.lock();
        let replayed = inner.states.replay_records_keyed(records, |mapped| {
            owner(mapped).map(|origin| (partition, origin))
        });
        let Inner { states, doubts, .. } = &mut *inner;
        let doubts = doubts.after_tail(&partition, read_at, stable, |k, b| {
            states.holds_appended(k, b)
        });
        let marked_meanwhile = inner.rebuilding.remove(&partition).unwrap_or(true);
        if !marked_meanwhile && replayed.untaken == 0 {
            inner.ready.insert(partition);
            add_writer(&mut inner.writers, partition, self.writer);
        }
        let known = inner.known_end.entry(partition).or_insert(end);
        *known = (*known).max(end);
        // Everything below `from` was seen before (a catch-up) or is past
        // the tail read: either way the log up to `end` has been seen.
        let seen = inner.seen_end.entry(partition).or_insert(end);
        *seen = (*seen).max(end);
        drop(inner);
        if self.since.is_some() {
            // A catch-up: what came before `from` is held already.
            d.metrics.producer_state_rebuilt("caught_up", 0);
        } else {
            let beyond = from.saturating_sub(start).max(0);
            d.metrics.producer_state_rebuilt(
                if beyond > 0 { "bounded" } else { "complete" },
                u64::try_from(beyond).unwrap_or(0),
            );
        }
        d.changed.notify_waiters();
        Rebuilt {
            from_offset: from,
            log_start_offset: start,
            log_end_offset: end,
            replayed,
            doubts,
        }
    }
}

impl Drop for RebuildClaim {
    fn drop(&mut self) {
        let mut inner = self.dedupe.lock();
        // After a successful run the entry is gone already.
        let was = inner.rebuilding.remove(&self.partition).is_some();
        drop(inner);
        if was {
            self.dedupe.changed.notify_waiters();
        }
    }
}

impl Dedupe {
    /// At most `max_entries` producers over all partitions; a rebuild
    /// reads at most about `rebuild_bytes` of a partition's tail.
    /// A batch whose answer never came is waited out for at most
    /// `unknown_wait` before a tail without it is trusted.
    pub(crate) fn new(
        max_entries: usize,
        rebuild_bytes: i32,
        unknown_wait: Duration,
        metrics: Arc<Metrics>,
    ) -> Arc<Dedupe> {
        Arc::new(Dedupe {
            inner: Mutex::new(Inner {
                states: ProducerStates::new(max_entries),
                ready: HashSet::new(),
                writers: HashMap::new(),
                rebuilding: HashMap::new(),
                known_end: HashMap::new(),
                seen_end: HashMap::new(),
                doubts: Doubts::default(),
            }),
            metrics,
            changed: tokio::sync::Notify::new(),
            rebuild_bytes,
            unknown_wait,
            next_writer: std::sync::atomic::AtomicU64::new(1),
        })
    }

    /// A new writer, for a new connection.
    pub(crate) fn writer(&self) -> Writer {
        Writer(
            self.next_writer
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Whether `partition`'s state is rebuilt and usable now.
    #[cfg(test)]
    pub(crate) fn is_ready(&self, partition: &PartitionId) -> bool {
        self.lock().ready.contains(partition)
    }

    /// Take `partition` as rebuilt by `writer` without reading its log
    /// (the unit tests and `examples/cold_cost.rs`).
    pub(crate) fn assume_rebuilt(&self, partition: PartitionId, writer: Writer) {
        let mut inner = self.lock();
        inner.ready.insert(partition);
        add_writer(&mut inner.writers, partition, writer);
    }

    /// `partition`'s state may miss what the log holds: the next request
    /// for it rebuilds it from the log tail first (merging into what is
    /// held), and one being rebuilt now is rebuilt again after.
    pub(crate) fn mark_for_rebuild(&self, partition: PartitionId, reason: RebuildReason) {
        let mut inner = self.lock();
        mark(&mut inner, partition);
        drop(inner);
        self.metrics.producer_state_rebuild_marked(reason.label());
    }

    /// Answer `partition` of `plan` locally (its state could not be
    /// rebuilt): retriable ([`Refusal::StateNotRebuilt`]), nothing of it
    /// forwarded.
    pub(crate) fn refuse_partition(
        plan: &mut ProducePlan,
        partition: PartitionId,
        message: String,
    ) {
        let Some(i) = plan.tracked.iter().position(|t| t.partition == partition) else {
            return;
        };
        let tp = plan.tracked.remove(i);
        plan.forwarded_partitions -= 1;
        plan.local.push(LocalPartition {
            topic: tp.topic,
            partition: partition.partition,
            entry: tp.entry,
            outcome: LocalOutcome::Refused {
                refusal: Refusal::StateNotRebuilt,
                message: message.into(),
            },
        });
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        crate::sync::lock(&self.inner)
    }

    /// Producers held now, per partition (a scan of every producer under
    /// the lock, bounded by `PRODUCER_STATE_MAX_ENTRIES`: for the admin API).
    pub(crate) fn producers_by_partition(&self) -> HashMap<PartitionId, usize> {
        let inner = self.lock();
        let mut out = HashMap::new();
        for (partition, _) in inner.states.partition_keys() {
            *out.entry(*partition).or_insert(0) += 1;
        }
        out
    }

    /// Producers held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().states.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget every mirrored producer of `partition` (the failover
    /// barrier, SPEC §7); returns how many. Meant for once the link's
    /// requests have drained: an answer settled later records its batch
    /// again.
    pub(crate) fn expire_partition(&self, partition: PartitionId) -> usize {
        let mut inner = self.lock();
        let n = inner.states.clear_where(|(p, _)| *p == partition);
        inner.doubts.clear(&partition);
        drop(inner);
        self.changed.notify_waiters();
        n
    }

    /// Notified whenever batches leave flight (appended or failed), for a
    /// request waiting on [`Dedupe::begin`] returning `None`. Create (and
    /// enable) it before calling `begin`, so no change is missed.
    pub(crate) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
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
    /// First, every tracked partition must be rebuilt from its log since
    /// start-up (or since it was marked): if one is not, nothing is begun
    /// and [`Begin::Rebuild`] says which partitions this request must
    /// rebuild (claimed now: no other request begins or rebuilds them
    /// meanwhile) and which others are rebuilding.
    ///
    /// A batch whose same attempt is in flight: with `wait`, nothing of the
    /// request is begun and [`Begin::InFlight`] is returned (`plan`
    /// unchanged), for the caller to wait for `changed`
    /// and begin again; else its partition is answered with the retriable
    /// [`Refusal::RetryInFlight`]. Never a second append.
    ///
    /// A partition is begun only by a `writer` that claimed one of its
    /// rebuilds: for another, the request catches up first (see the module
    /// doc).
    pub(crate) fn begin(
        self: &Arc<Self>,
        plan: &mut ProducePlan,
        link: &str,
        wait: bool,
        writer: Writer,
    ) -> Begin {
        let mut tracked = Tracked {
            dedupe: None,
            partitions: Vec::new(),
            duplicates: Vec::new(),
            wait: self.unknown_wait,
        };
        if plan.tracked.is_empty() {
            return Begin::Begun(tracked);
        }
        let mut inner = self.lock();
        let Inner {
            states,
            ready,
            writers,
            rebuilding,
            known_end,
            seen_end,
            doubts,
        } = &mut *inner;
        let now = Instant::now();
        let mut claims: Vec<RebuildClaim> = Vec::new();
        let mut waiting: Vec<PartitionId> = Vec::new();
        for tp in &plan.tracked {
            let p = tp.partition;
            // A producer with a lost batch whose wait is over: its tail is
            // read again (stable) before anything of it begins.
            if doubts.any(&p)
                && ready.contains(&p)
                && tp
                    .batches
                    .iter()
                    .any(|b| doubts.check(&p, &(p, b.origin), now) == Verdict::Confirm)
            {
                ready.remove(&p);
            }
            // Ready for the writers that read it; a new one first catches
            // up on what was appended since the log end known here
            // (everyone's requests wait meanwhile, as for any rebuild).
            let mut since = None;
            if ready.contains(&p) && !writers.get(&p).is_some_and(|w| w.contains(&writer)) {
                ready.remove(&p);
                since = seen_end.get(&p).copied().filter(|&e| e >= 0);
                self.metrics.producer_state_rebuild_marked("new_writer");
            }
            if ready.contains(&p) || claims.iter().any(|c| c.partition == p) || waiting.contains(&p)
            {
                continue;
            }
            match rebuilding.entry(p) {
                std::collections::hash_map::Entry::Occupied(_) => waiting.push(p),
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(false);
                    // Replace, not merge: what the log no longer holds must
                    // not be answered as a duplicate. (A catch-up merges
                    // what was appended past a log end known here; the
                    // tail before it is not read again, so batches of an
                    // expired origin there are not taken for those of the
                    // origin its mapped PID went to.)
                    if since.is_none() {
                        states.forget_appended_where(|(q, _)| *q == p);
                        known_end.remove(&p);
                        seen_end.remove(&p);
                    }
                    claims.push(RebuildClaim {
                        dedupe: Arc::clone(self),
                        partition: p,
                        topic: tp.topic.clone(),
                        writer,
                        since,
                    });
                }
            }
        }
        if !claims.is_empty() || !waiting.is_empty() {
            drop(inner);
            return Begin::Rebuild { claims, waiting };
        }
        tracked.dedupe = Some(Arc::clone(self));
        let evictions = states.evictions();
        let full_refusals = states.full_refusals();
        // The partitions answered here, by their place in `plan.tracked`
        // (in order; allocated only when there are some). Every batch of
        // the others was begun.
        let mut answered: Vec<(usize, LocalOutcome)> = Vec::new();
        let mut in_flight = false;
        for (i, tp) in plan.tracked.iter().enumerate() {
            // Which batches were begun (marked in flight), to undo them if
            // the partition is answered here after all.
            let mut begun: SmallVec<[usize; 16]> = SmallVec::new();
            let mut duplicate: Option<(i64, usize, BatchId)> = None;
            let mut outcome = None;
            for (k, b) in tp.batches.iter().enumerate() {
                if let Verdict::Wait { deadline } =
                    doubts.check(&tp.partition, &(tp.partition, b.origin), now)
                {
                    outcome = Some(LocalOutcome::Refused {
                        refusal: Refusal::OutcomeUnknown,
                        message: format!(
                            "mirror link '{link}': partition {}: producer {} epoch {}: an earlier request of it was sent and its answer lost with the broker connection; the broker may still append it, so nothing more of this producer is appended for up to {} ms, until the log shows whether it was; retry",
                            tp.partition.partition,
                            b.id.producer_id,
                            b.id.epoch,
                            deadline.saturating_duration_since(now).as_millis()
                        )
                        .into(),
                    });
                    break;
                }
                match states.begin(&(tp.partition, b.origin), &b.id) {
                    Check::Append => begun.push(k),
                    Check::Duplicate { base_offset } => {
                        let d = duplicate.get_or_insert((base_offset, 0, b.id));
                        d.1 += 1;
                    }
                    Check::InFlight => {
                        in_flight = true;
                        outcome = Some(LocalOutcome::Refused {
                            refusal: Refusal::RetryInFlight,
                            message: format!(
                                "mirror link '{link}': partition {}: producer {} epoch {} sequences {}..{} are being appended by an earlier request; retry",
                                tp.partition.partition, b.id.producer_id, b.id.epoch, b.id.first_seq, b.id.last_seq
                            ).into(),
                        });
                        break;
                    }
                    Check::Refuse { kind, message } => {
                        outcome = Some(LocalOutcome::Refused {
                            refusal: kind.into(),
                            message: format!(
                                "mirror link '{link}': partition {}: {message}",
                                tp.partition.partition
                            )
                            .into(),
                        });
                        break;
                    }
                }
            }
            if outcome.is_none() {
                if let Some((base_offset, batches, first)) = duplicate {
                    outcome = Some(if batches == tp.batch_count {
                        tracked.duplicates.push(DuplicateAnswer {
                            topic: tp.topic.clone(),
                            partition: tp.partition,
                            batch: first,
                            base_offset,
                        });
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
                            ).into(),
                        }
                    });
                }
            }
            if let Some(outcome) = outcome {
                for &k in &begun {
                    let b = &tp.batches[k];
                    states.failed(&(tp.partition, b.origin), &b.id);
                }
                answered.push((i, outcome));
            }
        }
        if in_flight && wait {
            for (i, tp) in plan.tracked.iter().enumerate() {
                if answered.iter().any(|(j, _)| *j == i) {
                    continue; // undone above
                }
                for b in &tp.batches {
                    states.failed(&(tp.partition, b.origin), &b.id);
                }
            }
            drop(inner);
            tracked.dedupe = None;
            tracked.duplicates.clear();
            // No notify: the lock was held throughout, so no other request
            // saw these batches in flight. (Notifying here woke the caller's
            // own registration at once: it spun until the first attempt's
            // outcome came, which with one worker thread never did.)
            return Begin::InFlight;
        }
        let evicted = states.evictions() - evictions;
        let full = states.full_refusals() - full_refusals;
        let held = states.len();
        let mut answered = answered.into_iter().peekable();
        for (i, tp) in std::mem::take(&mut plan.tracked).into_iter().enumerate() {
            match answered.next_if(|(j, _)| *j == i) {
                None => tracked.partitions.push(BegunPartition {
                    topic: tp.topic,
                    known_end: known_end.get(&tp.partition).copied().unwrap_or(-1),
                    partition: tp.partition,
                    batches: tp.batches,
                }),
                Some((_, outcome)) => {
                    plan.forwarded_partitions -= 1;
                    plan.local.push(LocalPartition {
                        topic: tp.topic,
                        partition: tp.partition.partition,
                        entry: tp.entry,
                        outcome,
                    });
                }
            }
        }
        drop(inner);
        if evicted > 0 {
            self.metrics.producer_state_evicted(evicted);
        }
        if full > 0 {
            // One line per request, however many of its batches were refused
            // (each refused partition is counted by the caller, as
            // `producer_state_full`).
            tracing::warn!(
                link,
                producers_held = held,
                new_producers_refused = full,
                "mirrored producer state full: every producer held has a batch in flight, none may be evicted; new producers answered retriable"
            );
        }
        Begin::Begun(tracked)
    }
}

impl Tracked {
    /// Nothing tracked (not a link request).
    pub(crate) fn none() -> Tracked {
        Tracked {
            dedupe: None,
            partitions: Vec::new(),
            duplicates: Vec::new(),
            wait: Duration::ZERO,
        }
    }

    /// The request's Produce `timeout_ms`: if its answer never comes, its
    /// batches are waited out that long (at most the configured cap) from
    /// when the loss is seen. Kafka bounds no request's time in its queue,
    /// so the cap is what bounds the wait; the request's own timeout only
    /// shortens it.
    pub(crate) fn set_timeout_ms(&mut self, timeout_ms: i32) {
        let ms = u64::try_from(timeout_ms).unwrap_or(0);
        self.wait = self.wait.min(Duration::from_millis(ms));
    }

    /// The partitions answered as duplicates: before the answer leaves,
    /// the caller checks that the log still holds each (the batch at its
    /// base offset); one it does not hold is marked
    /// ([`Dedupe::mark_for_rebuild`], [`RebuildReason::Truncated`]) and the
    /// request begun again.
    pub(crate) fn duplicates(&self) -> &[DuplicateAnswer] {
        &self.duplicates
    }

    /// Nothing was begun.
    pub(crate) fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }

    /// The begun partitions as the request names them, in the order
    /// [`settle`](Self::settle) takes their answers.
    pub(crate) fn asked(&self) -> impl Iterator<Item = (&TopicRef, i32)> + '_ {
        self.partitions
            .iter()
            .map(|bp| (&*bp.topic, bp.partition.partition))
    }

    /// A visitor of the Produce response that finds the answers to the
    /// begun partitions, for [`settle`](Self::settle).
    pub(crate) fn answers(&self) -> Answers<'_> {
        Answers::new(
            self.partitions
                .iter()
                .map(|bp| (&*bp.topic, bp.partition.partition)),
        )
    }

    /// Response half: every begun partition the broker answered with error
    /// NONE is recorded as appended (each batch at the partition's base
    /// offset plus its offset delta; at the broker's log append time, or
    /// `now_ms` when the topic uses create time); any other answer, or none,
    /// fails its batches. An answer that leaves the outcome unknown (no
    /// answer for the partition, `REQUEST_TIMED_OUT`,
    /// `NOT_ENOUGH_REPLICAS_AFTER_APPEND`: the batch may be in the log) or
    /// names another leader (`NOT_LEADER_OR_FOLLOWER`, a current leader
    /// given) marks the partition for a rebuild from its log.
    /// `answers` are the broker's, one per begun partition in the order of
    /// [`answers`](Self::answers).
    pub(crate) fn settle(mut self, answers: &[Option<PartitionAnswer>], now_ms: i64) {
        let Some(dedupe) = self.dedupe.take() else {
            return;
        };
        let mut marks: Vec<(PartitionId, RebuildReason)> = Vec::new();
        let mut inner = dedupe.lock();
        let evictions = inner.states.evictions();
        let partitions = std::mem::take(&mut self.partitions);
        for (i, bp) in partitions.iter().enumerate() {
            let answer = answers.get(i).copied().flatten();
            match answer {
                Some(p) if p.error_code == 0 && p.base_offset >= 0 => {
                    let time = if p.log_append_time_ms >= 0 {
                        p.log_append_time_ms
                    } else {
                        now_ms
                    };
                    let mut end = p.base_offset;
                    for b in &bp.batches {
                        inner.states.appended(
                            &(bp.partition, b.origin),
                            &b.id,
                            p.base_offset + b.offset_delta,
                            time,
                        );
                        end = end.max(p.base_offset + b.offset_delta + batch_len(&b.id));
                    }
                    // The request left after the log was known to end at
                    // `bp.known_end`: appended below it, the log lost what
                    // was there (a truncation), and what the state holds of
                    // those offsets may name batches it no longer has.
                    if p.base_offset < bp.known_end {
                        mark(&mut inner, bp.partition);
                        marks.push((bp.partition, RebuildReason::Truncated));
                        inner.known_end.insert(bp.partition, end);
                    } else {
                        let known = inner.known_end.entry(bp.partition).or_insert(end);
                        *known = (*known).max(end);
                    }
                    if let Some(seen) = inner.seen_end.get_mut(&bp.partition) {
                        if *seen == p.base_offset {
                            *seen = end;
                        }
                    }
                }
                _ => {
                    for b in &bp.batches {
                        inner.states.failed(&(bp.partition, b.origin), &b.id);
                    }
                    let reason = match answer {
                        None => Some(RebuildReason::UnknownOutcome),
                        Some(p) if p.leader_id >= 0 => Some(RebuildReason::LeaderMoved),
                        Some(p) => match p.error_code {
                            NOT_LEADER_OR_FOLLOWER => Some(RebuildReason::LeaderMoved),
                            REQUEST_TIMED_OUT | NOT_ENOUGH_REPLICAS_AFTER_APPEND => {
                                Some(RebuildReason::UnknownOutcome)
                            }
                            _ => None,
                        },
                    };
                    if let Some(reason) = reason {
                        mark(&mut inner, bp.partition);
                        marks.push((bp.partition, reason));
                    }
                }
            }
        }
        let evicted = inner.states.evictions() - evictions;
        drop(inner);
        dedupe.changed.notify_waiters();
        if evicted > 0 {
            dedupe.metrics.producer_state_evicted(evicted);
        }
        for (partition, reason) in marks {
            tracing::info!(
                topic_id = %partition.topic_id,
                partition = partition.partition,
                reason = reason.label(),
                "mirrored producer state marked for a rebuild from the log"
            );
            dedupe.metrics.producer_state_rebuild_marked(reason.label());
        }
    }
}

/// Offsets a tracked batch takes: its records, from its sequences (a
/// tracked batch has one; a wrapped range counts its wrap).
fn batch_len(b: &BatchId) -> i64 {
    (i64::from(b.last_seq) - i64::from(b.first_seq)).rem_euclid(1 << 31) + 1
}

/// Kafka error codes that leave a batch's fate open or move the leader.
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const REQUEST_TIMED_OUT: i16 = 7;
const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;

/// `writer` may begin `partition` (once ready): remembered, the longest
/// known pushed out past [`WRITERS_PER_PARTITION`].
fn add_writer(
    writers: &mut HashMap<PartitionId, SmallVec<[Writer; 2]>>,
    partition: PartitionId,
    writer: Writer,
) {
    let list = writers.entry(partition).or_default();
    if list.contains(&writer) {
        return;
    }
    if list.len() >= WRITERS_PER_PARTITION {
        list.remove(0);
    }
    list.push(writer);
}

/// Marks `partition` for a rebuild (see [`Dedupe::mark_for_rebuild`]).
fn mark(inner: &mut Inner, partition: PartitionId) {
    inner.ready.remove(&partition);
    if let Some(marked) = inner.rebuilding.get_mut(&partition) {
        *marked = true;
    }
}

impl Tracked {
    /// No answer will come and none is awaited (`acks=0`): the batches'
    /// flight ends without recording them, and, no client retrying what it
    /// never heard about, their partitions are not marked for a rebuild.
    pub(crate) fn unanswered(mut self) {
        let Some(dedupe) = self.dedupe.take() else {
            return;
        };
        let mut inner = dedupe.lock();
        for bp in self.partitions.drain(..) {
            for b in &bp.batches {
                inner.states.failed(&(bp.partition, b.origin), &b.id);
            }
        }
        drop(inner);
        dedupe.changed.notify_waiters();
    }
}

impl Drop for Tracked {
    /// Never settled: the batches may or may not be in the log (the request
    /// may have reached the broker before its connection was lost). Their
    /// flight ends and their partitions are rebuilt from the log before
    /// anything of them begins again, so a retry is checked against what
    /// was really appended.
    fn drop(&mut self) {
        let Some(dedupe) = self.dedupe.take() else {
            return;
        };
        if self.partitions.is_empty() {
            return;
        }
        let mut inner = dedupe.lock();
        let mut marked = 0u64;
        // Seen lost now, after it was sent: its wait counts from here.
        let deadline = Instant::now() + self.wait;
        for bp in self.partitions.drain(..) {
            for b in &bp.batches {
                let key = (bp.partition, b.origin);
                inner.states.failed(&key, &b.id);
                inner.doubts.lost(bp.partition, key, b.id, deadline);
            }
            mark(&mut inner, bp.partition);
            marked += 1;
        }
        drop(inner);
        dedupe.changed.notify_waiters();
        for _ in 0..marked {
            dedupe
                .metrics
                .producer_state_rebuild_marked(RebuildReason::UnknownOutcome.label());
        }
    }
}

#[cfg(test)]
mod tests;
