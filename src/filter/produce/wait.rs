//! The waits of a link Produce before it is forwarded (SPEC §6): its
//! mirrored producer state begun ([`begin`]), which may mean rebuilding
//! partitions from their log tail, waiting (bounded) for another request's
//! rebuild or for a retry's attempt in flight, and checking that the log
//! still holds the batches answered as duplicates. What reads the log is
//! behind [`Recovery`], as `control/io.rs` puts the control's outside world
//! behind traits, so the loop is tested with a fake and paused time;
//! [`LogRecovery`] is the real one, reading through the proxy's client.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::decide;
use crate::client::ClientError;
use crate::filter::{rebuild, Context};
use crate::mirror::dedupe::{
    Begin, Dedupe, DuplicateAnswer, RebuildClaim, RebuildReason, Tracked, Writer,
};
use crate::mirror::origins::PartitionId;
use crate::mirror::produce::{LocalOutcome, LocalPartition, ProducePlan, Refusal};
use crate::state::StateStore;

/// What the wait needs from outside the mirrored producer state: the
/// log of a partition, read to rebuild its state or to check a duplicate;
/// the request planned again; the proxy's shutdown.
pub(crate) trait Recovery: Sync {
    /// Rebuild `claim`'s partition from its log tail, bounded by
    /// [`REBUILD_TIMEOUT`]; if it cannot be read, its partition of `plan`
    /// is answered retriable.
    fn rebuild<'a>(
        &'a self,
        plan: &'a mut ProducePlan,
        claim: RebuildClaim,
    ) -> impl Future<Output = ()> + Send + 'a;

    /// The partitions whose log no longer holds a batch `tracked` answers
    /// as a duplicate (truncated: they need a rebuild). One that cannot be
    /// checked in time is answered retriable in `plan` instead.
    fn lost_duplicates<'a>(
        &'a self,
        plan: &'a mut ProducePlan,
        tracked: &'a Tracked,
    ) -> impl Future<Output = Vec<PartitionId>> + Send + 'a;

    /// The request planned again from its frame.
    fn replan(&self) -> ProducePlan;

    /// Resolves once the proxy begins to shut down.
    fn shutting_down(&self) -> impl Future<Output = ()> + Send + '_;
}

/// The mirrored producer state of a link's `plan` begun (`link`'s request
/// from connection `writer`, with its `timeout_ms`): duplicates and
/// refusals become local answers in `plan`, the rest is tracked.
///
/// Nothing of a partition begins before its state is rebuilt from its log
/// tail (after start-up, an unknown outcome, a leader move); one request
/// rebuilds, the partition's others wait (bounded by [`REBUILD_WAIT`]) for
/// it. A retry of a batch still in flight waits for that attempt's outcome
/// (bounded by [`IN_FLIGHT_WAIT`]: then it is answered retriable), never a
/// second append.
pub(crate) async fn begin(
    dedupe: &Arc<Dedupe>,
    recovery: &impl Recovery,
    link: &str,
    writer: Writer,
    timeout_ms: i32,
    plan: &mut ProducePlan,
) -> Tracked {
    let mut in_flight_deadline = None;
    let mut rebuild_deadline = None;
    let mut shutting_down = false;
    // Registered only once a request has to wait, so the common case
    // (begun at the first try) never touches the Notify's waiter list.
    let mut changed = None;
    // A duplicate answer must name a batch the log still holds: checked
    // once per request (rare: only retries are duplicates); a partition
    // whose log lost it (truncated) is rebuilt and the request begun
    // again, after which what the state says comes from the log.
    let mut duplicates_checked = false;
    loop {
        // The clock is read only where a deadline is set or checked: a
        // request begun at the first try (the usual case) reads none.
        let wait =
            !shutting_down && in_flight_deadline.is_none_or(|d| tokio::time::Instant::now() < d);
        let deadline = match dedupe.begin(plan, link, wait, writer) {
            Begin::Begun(mut tracked) => {
                // If its answer never comes, the broker may still append
                // it until its own timeout (capped) has passed.
                tracked.set_timeout_ms(timeout_ms);
                if duplicates_checked || tracked.duplicates().is_empty() {
                    return tracked;
                }
                duplicates_checked = true;
                // Held as not sent while the log is read: the session
                // drops this wait when its client resets. Boxed, like the
                // rebuild below: rare, and its future would otherwise size
                // every connection's task for good.
                let unsent = Unsent(tracked);
                let lost = Box::pin(recovery.lost_duplicates(plan, &unsent.0)).await;
                let tracked = unsent.sent();
                if lost.is_empty() {
                    return tracked;
                }
                // Begin again from the frame: nothing of this attempt was
                // sent.
                tracked.unanswered();
                for partition in lost {
                    dedupe.mark_for_rebuild(partition, RebuildReason::Truncated);
                }
                *plan = recovery.replan();
                continue;
            }
            Begin::InFlight => *in_flight_deadline
                .get_or_insert_with(|| tokio::time::Instant::now() + IN_FLIGHT_WAIT),
            Begin::Rebuild { claims, waiting } if claims.is_empty() => {
                let now = tokio::time::Instant::now();
                let d = *rebuild_deadline.get_or_insert(now + REBUILD_WAIT);
                if shutting_down || now >= d {
                    for partition in waiting {
                        let message = format!(
                            "mirror link '{link}': partition {}: the mirrored producer state is still being rebuilt from the log by another request; retry",
                            partition.partition
                        );
                        Dedupe::refuse_partition(plan, partition, message);
                    }
                    continue;
                }
                d
            }
            Begin::Rebuild { claims, .. } => {
                // Bounded too: a partition marked again during each of its
                // rebuilds is not rebuilt forever by one request.
                let d = *rebuild_deadline
                    .get_or_insert_with(|| tokio::time::Instant::now() + REBUILD_WAIT);
                for claim in claims {
                    if shutting_down || tokio::time::Instant::now() >= d {
                        let message = format!(
                            "mirror link '{link}': partition {}: the mirrored producer state was marked again while it was rebuilt; retry",
                            claim.partition().partition
                        );
                        Dedupe::refuse_partition(plan, claim.partition(), message);
                        continue;
                    }
                    Box::pin(recovery.rebuild(plan, claim)).await;
                }
                continue;
            }
        };
        let Some(notified) = changed.as_mut() else {
            // Register, then look again: a change between that `begin`
            // and now is not missed.
            let mut notified = Box::pin(dedupe.changed());
            notified.as_mut().enable();
            changed = Some(notified);
            continue;
        };
        tokio::select! {
            _ = notified.as_mut() => changed = None,
            _ = tokio::time::sleep_until(deadline) => {}
            _ = recovery.shutting_down() => shutting_down = true,
        }
    }
}

/// The real [`Recovery`]: the partitions' logs read through the state
/// store's client, the request planned again by `replan`.
pub(crate) struct LogRecovery<'a, P> {
    pub(crate) ctx: &'a Context,
    pub(crate) state: &'a StateStore,
    pub(crate) link: &'a str,
    pub(crate) replan: P,
}

impl<P: Fn() -> ProducePlan + Sync> Recovery for LogRecovery<'_, P> {
    fn rebuild<'a>(
        &'a self,
        plan: &'a mut ProducePlan,
        claim: RebuildClaim,
    ) -> impl Future<Output = ()> + Send + 'a {
        rebuild(self.ctx, self.state, self.link, plan, claim)
    }

    fn lost_duplicates<'a>(
        &'a self,
        plan: &'a mut ProducePlan,
        tracked: &'a Tracked,
    ) -> impl Future<Output = Vec<PartitionId>> + Send + 'a {
        lost_duplicates(self.ctx, self.state, self.link, plan, tracked)
    }

    fn replan(&self) -> ProducePlan {
        (self.replan)()
    }

    fn shutting_down(&self) -> impl Future<Output = ()> + Send + '_ {
        self.ctx.shutting_down()
    }
}

/// How long a link retry waits for the same batch's attempt in flight
/// before it is answered with a retriable error instead.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(10);
/// How long a request rebuilding a partition's producer state may take to
/// read its log tail before the partition is answered retriable.
const REBUILD_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a request waits for another request's rebuild of a partition
/// before that partition is answered retriable (longer than a rebuild may
/// take, so a rebuild that ends in time is waited for).
const REBUILD_WAIT: Duration = Duration::from_secs(20);

/// Rebuild `claim`'s partition from its log tail (bounded by
/// [`REBUILD_TIMEOUT`]); if it cannot be read, its partition of `plan` is
/// answered retriable.
async fn rebuild(
    ctx: &Context,
    state: &StateStore,
    link: &str,
    plan: &mut ProducePlan,
    mut claim: RebuildClaim,
) {
    let partition = claim.partition();
    let name = decide::log_name(&ctx.topics, partition.topic_id, claim.topic());
    let owner = |mapped: i64| state.view().owner(partition, mapped);
    let floor = state.barrier_floor(partition).unwrap_or(0);
    // Batches whose answer never came and whose wait is over: what this
    // read does not hold of them is taken as never appended, so the read
    // must be stable (the log end the same when read again after it).
    let confirming = claim.confirming();
    let client = state.client();
    let bytes = claim.rebuild_bytes();
    let read = async {
        // A writer new to a ready partition catches up from the log end
        // known here, unless lost batches must be confirmed (a stable
        // tail) or that cannot be read (then the tail, as after start-up).
        if let (Some(since), false) = (claim.since(), confirming) {
            let since = since.max(floor);
            let read_at = Instant::now();
            if let Some(tail) =
                rebuild::read_since(client, &name, partition.partition, since, bytes).await?
            {
                return Ok((tail, read_at, false));
            }
        }
        claim.full();
        rebuild::read_tail_stable(
            client,
            &name,
            partition.partition,
            floor,
            bytes,
            if confirming { STABLE_READS } else { 0 },
        )
        .await
    };
    let error = match tokio::time::timeout(REBUILD_TIMEOUT, read).await {
        Ok(Ok((_, _, false))) if confirming => format!(
            "its log end kept moving over {STABLE_READS} reads, so whether a request whose answer was lost was appended cannot be told yet"
        ),
        Ok(Ok((tail, read_at, stable))) => {
            let r = claim.apply(
                tail.start,
                tail.end,
                tail.from,
                &tail.records,
                &owner,
                read_at,
                stable,
            );
            if r.replayed.untaken > 0 {
                // Not made ready: the state would miss batches the log holds.
                ctx.metrics.producer_state_rebuilt("failed", 0);
                tracing::warn!(
                    link,
                    topic = name,
                    partition = partition.partition,
                    untaken = r.replayed.untaken,
                    "could not rebuild the mirrored producer state: it is full of producers with batches in flight; the partition is answered retriable"
                );
                let message = format!(
                    "mirror link '{link}': {name}-{}: the mirrored producer state is full of producers with batches in flight (PRODUCER_STATE_MAX_ENTRIES); retry",
                    partition.partition
                );
                Dedupe::refuse_partition(plan, partition, message);
                return;
            }
            tracing::info!(
                link,
                topic = name,
                partition = partition.partition,
                from_offset = r.from_offset,
                log_start_offset = r.log_start_offset,
                log_end_offset = r.log_end_offset,
                batches = r.replayed.batches,
                taken = r.replayed.taken,
                lost_found = r.doubts.found,
                lost_absent = r.doubts.absent,
                lost_in_doubt = r.doubts.left,
                stable,
                "rebuilt the mirrored producer state from the log tail"
            );
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("not read within {} s", REBUILD_TIMEOUT.as_secs()),
    };
    ctx.metrics.producer_state_rebuilt("failed", 0);
    let message = format!(
        "mirror link '{link}': {name}-{}: the mirrored producer state could not be rebuilt from the log ({error}); retry",
        partition.partition
    );
    Dedupe::refuse_partition(plan, partition, message);
}

/// How many times a rebuild that must settle lost batches reads the tail
/// for a log end that stays put before the partition is answered
/// retriable.
const STABLE_READS: u32 = 3;

/// How long a duplicate's check waits for its batch to become readable
/// (past the high watermark) before taking it as not held.
const HOLDS_WAIT: Duration = Duration::from_secs(2);

/// How many of one request's duplicate checks run at once. The proxy's
/// client carries one request at a time per broker, so checks of
/// partitions led by one broker queue there anyway, ahead of the state
/// topic's own requests: a few at once lets partitions on different
/// brokers overlap without one request queueing all its checks in front
/// of everyone else's.
const DUPLICATE_CHECKS_AT_ONCE: usize = 4;

/// Checks that the log still holds each batch `tracked` answers as a
/// duplicate. Returns the partitions whose log does not (truncated: they
/// need a rebuild). One that cannot be checked (an error, or not done
/// when the request's [`REBUILD_TIMEOUT`] is up) is answered retriable in
/// `plan` instead.
async fn lost_duplicates(
    ctx: &Context,
    state: &StateStore,
    link: &str,
    plan: &mut ProducePlan,
    tracked: &Tracked,
) -> Vec<PartitionId> {
    let client = state.client();
    let name = |d: &DuplicateAnswer| decide::log_name(&ctx.topics, d.partition.topic_id, &d.topic);
    check_duplicates(link, &mut plan.local, tracked.duplicates(), &name, |d| {
        let topic = name(d);
        async move {
            rebuild::holds(
                client,
                &topic,
                d.partition.partition,
                d.base_offset,
                &d.batch,
                HOLDS_WAIT,
            )
            .await
        }
    })
    .await
}

/// [`lost_duplicates`] with the one check (`check`, a Fetch of the batch
/// in the proxy; anything in the tests) and the topic's name (`name`) given.
///
/// One deadline, [`REBUILD_TIMEOUT`] from now, bounds all of a request's
/// checks together: a check per partition, each with a bound of its own,
/// would hold the request's frame (and its client's retry) for as many
/// bounds as the request has duplicate partitions. A check not done by
/// then is answered as one that timed out always was (retriable), while
/// those done keep what they found. Cancel-safe: dropping this (the
/// client reset) drops the checks in flight, whose client connections
/// then close rather than carry a late answer.
async fn check_duplicates<'d, C, F>(
    link: &str,
    local: &mut [LocalPartition],
    duplicates: &'d [DuplicateAnswer],
    name: &(dyn Fn(&DuplicateAnswer) -> String + Sync),
    check: C,
) -> Vec<PartitionId>
where
    C: Fn(&'d DuplicateAnswer) -> F,
    F: Future<Output = Result<rebuild::Held, ClientError>>,
{
    let deadline = tokio::time::Instant::now() + REBUILD_TIMEOUT;
    // By the duplicate's place, so the answers below follow the request's
    // order whichever check ends first; `None`: not done in time.
    let mut found: Vec<Option<Result<rebuild::Held, ClientError>>> =
        std::iter::repeat_with(|| None)
            .take(duplicates.len())
            .collect();
    let mut waiting = duplicates.iter().enumerate();
    let mut running = FuturesUnordered::new();
    let all = async {
        loop {
            // Topped up as checks end: at most a few at once, each begun
            // once, so the cost stays linear in the request.
            while running.len() < DUPLICATE_CHECKS_AT_ONCE {
                let Some((at, d)) = waiting.next() else {
                    break;
                };
                let check = check(d);
                running.push(async move { (at, check.await) });
            }
            let Some((at, result)) = running.next().await else {
                break;
            };
            if let Some(slot) = found.get_mut(at) {
                *slot = Some(result);
            }
        }
    };
    // Timed out or not, `found` holds what ended by the deadline.
    let _ = tokio::time::timeout_at(deadline, all).await;
    let mut lost = Vec::new();
    for (d, found) in duplicates.iter().zip(found) {
        let error = match found {
            Some(Ok(rebuild::Held::Yes | rebuild::Held::BelowLogStart)) => continue,
            Some(Ok(rebuild::Held::No)) => {
                tracing::warn!(
                    link,
                    topic = name(d),
                    partition = d.partition.partition,
                    offset = d.base_offset,
                    producer_id = d.batch.producer_id,
                    epoch = d.batch.epoch,
                    first_sequence = d.batch.first_seq,
                    "a batch remembered as appended is not in the log (truncated): its partition's mirrored producer state is rebuilt from the log"
                );
                lost.push(d.partition);
                continue;
            }
            Some(Err(e)) => e.to_string(),
            None => format!(
                "not read within {} s, the bound of all the request's checks",
                REBUILD_TIMEOUT.as_secs()
            ),
        };
        let message = format!(
            "mirror link '{link}': {}-{}: could not check that the log still holds the duplicate batch at offset {} ({error}); retry",
            name(d),
            d.partition.partition,
            d.base_offset
        );
        let message: Arc<str> = message.into();
        for l in local.iter_mut().filter(|l| {
            l.partition == d.partition.partition
                && Arc::ptr_eq(&l.topic, &d.topic)
                && matches!(l.outcome, LocalOutcome::Duplicate { .. })
        }) {
            l.outcome = LocalOutcome::Refused {
                refusal: Refusal::StateNotRebuilt,
                message: message.clone(),
            };
        }
    }
    lost
}

/// A request's begun batches while its request half still waits, before
/// anything of it is written to the broker. The session drops that wait
/// when its client resets: the batches' flight then ends unrecorded, as
/// with `acks=0` (nothing was sent, so their outcome is known: not
/// appended), not as an unknown outcome, which would hold the producer's
/// next batches back and have the partition read again for nothing.
struct Unsent(Tracked);

impl Unsent {
    /// The wait is over: the batches go on with the request.
    fn sent(mut self) -> Tracked {
        std::mem::replace(&mut self.0, Tracked::none())
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        std::mem::replace(&mut self.0, Tracked::none()).unanswered();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;
    use tokio::time::{sleep, Instant};
    use uuid::Uuid;

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::rebuild::Held;
    use super::*;
    use crate::filter::produce::decide::tests::{self as decide_tests, ORDERS_ID};
    use crate::filter::produce::decide::Head;
    use crate::mirror::origins::OriginId;
    use crate::mirror::pid::ClusterId;
    use crate::mirror::produce::{TopicRef, TrackedBatch, TrackedPartition};
    use crate::mirror::producer_state::BatchId;

    /// When each check's future ended (finished or dropped), by partition.
    type Ends = Arc<Mutex<Vec<(i32, Instant)>>>;

    /// Records, when dropped, that its check ended: a check cut off at
    /// the deadline is dropped there, not left running.
    struct Ended(Ends, i32);

    impl Drop for Ended {
        fn drop(&mut self) {
            if let Ok(mut ends) = self.0.lock() {
                ends.push((self.1, Instant::now()));
            }
        }
    }

    fn topic() -> Arc<TopicRef> {
        Arc::new(TopicRef {
            name: TopicName(StrBytes::from_static_str("mirrored")),
            topic_id: Uuid::from_u128(7),
        })
    }

    fn duplicate(topic: &Arc<TopicRef>, partition: i32) -> DuplicateAnswer {
        DuplicateAnswer {
            topic: topic.clone(),
            partition: PartitionId {
                topic_id: topic.topic_id,
                partition,
            },
            batch: BatchId {
                producer_id: 1000,
                epoch: 0,
                first_seq: partition * 10,
                last_seq: partition * 10 + 9,
            },
            base_offset: 100 + i64::from(partition),
        }
    }

    fn answered_duplicate(topic: &Arc<TopicRef>, partition: i32) -> LocalPartition {
        LocalPartition {
            topic: topic.clone(),
            partition,
            entry: partition as u32,
            outcome: LocalOutcome::Duplicate {
                base_offset: 100 + i64::from(partition),
                batches: 1,
            },
        }
    }

    fn name(d: &DuplicateAnswer) -> String {
        d.topic.name.0.to_string()
    }

    /// How long the check of each partition takes and what it finds
    /// (`None`: it never answers). Partitions 1, 3 and 5 are slower than
    /// the bound; 4 fails, 2 finds the batch lost, 6 ends shortly before
    /// the deadline (begun at 3 s, done at 13 s: four run at once).
    fn scripted(partition: i32) -> (Duration, Option<Result<Held, ClientError>>) {
        let s = Duration::from_secs;
        match partition {
            0 => (s(0), Some(Ok(Held::Yes))),
            1 => (s(0), None),
            2 => (s(1), Some(Ok(Held::No))),
            3 => (s(40), Some(Ok(Held::Yes))),
            4 => (
                s(3),
                Some(Err(ClientError::Closed {
                    broker: "broker:9092".into(),
                })),
            ),
            5 => (s(16), Some(Ok(Held::Yes))),
            _ => (s(10), Some(Ok(Held::BelowLogStart))),
        }
    }

    /// A check that follows [`scripted`], recording when it ends in `ends`.
    fn check(
        ends: &Ends,
    ) -> impl Fn(
        &DuplicateAnswer,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Held, ClientError>> + Send>>
           + '_ {
        move |d| {
            let ended = Ended(ends.clone(), d.partition.partition);
            let (after, answer) = scripted(d.partition.partition);
            Box::pin(async move {
                let _ended = ended;
                sleep(after).await;
                match answer {
                    Some(answer) => answer,
                    None => std::future::pending().await,
                }
            })
        }
    }

    fn refused_message(l: &LocalPartition) -> Option<&str> {
        match &l.outcome {
            LocalOutcome::Refused {
                refusal: Refusal::StateNotRebuilt,
                message,
            } => Some(message),
            _ => None,
        }
    }

    /// A request with many duplicate partitions whose checks are slow
    /// waits one bound for all of them, not one per partition: the slow
    /// ones are cut off together at the deadline and answered retriable as
    /// a timed-out check is, and those done by then keep their answers.
    #[tokio::test(start_paused = true)]
    async fn duplicate_checks_share_one_deadline() {
        let topic = topic();
        let duplicates: Vec<_> = (0..7).map(|p| duplicate(&topic, p)).collect();
        let mut local: Vec<_> = (0..7).map(|p| answered_duplicate(&topic, p)).collect();
        // Not a duplicate: left alone.
        local.push(LocalPartition {
            topic: topic.clone(),
            partition: 9,
            entry: 9,
            outcome: LocalOutcome::DroppedControl { batches: 1 },
        });
        let ends = Ends::default();
        let start = Instant::now();

        let lost = check_duplicates("link-a", &mut local, &duplicates, &name, check(&ends)).await;

        assert_eq!(
            Instant::now() - start,
            REBUILD_TIMEOUT,
            "three checks slower than the bound end at the one deadline, not after three bounds"
        );
        let mut ends = ends.lock().map(|e| e.clone()).unwrap_or_default();
        ends.sort_by_key(|(partition, _)| *partition);
        let ended = |p: i32| {
            ends.iter()
                .find(|(q, _)| *q == p)
                .map(|(_, at)| *at - start)
        };
        let s = Duration::from_secs;
        // Each check began once and ended (done, or cut off at the deadline).
        assert_eq!(ends.len(), 7, "{ends:?}");
        assert_eq!(ended(0), Some(s(0)));
        assert_eq!(ended(2), Some(s(1)));
        assert_eq!(ended(4), Some(s(3)));
        // Begun once the check of partition 4 ended (four at once).
        assert_eq!(ended(6), Some(s(13)));
        for slow in [1, 3, 5] {
            assert_eq!(ended(slow), Some(REBUILD_TIMEOUT), "partition {slow}");
        }

        // Not in the log: rebuilt, its duplicate answer left to the rebuild.
        assert_eq!(
            lost,
            vec![PartitionId {
                topic_id: topic.topic_id,
                partition: 2
            }]
        );
        for kept in [0, 2, 6] {
            assert!(
                matches!(local[kept].outcome, LocalOutcome::Duplicate { base_offset, batches: 1 } if base_offset == 100 + kept as i64),
                "partition {kept}: {:?}",
                local[kept].outcome
            );
        }
        // The retriable answer of a check that could not be done.
        let failed = refused_message(&local[4]).unwrap_or_default();
        assert!(
            failed.contains("broker:9092 closed the connection"),
            "{failed}"
        );
        assert!(failed.ends_with("; retry"), "{failed}");
        for slow in [1, 3, 5] {
            let message = refused_message(&local[slow]).unwrap_or_default();
            assert!(
                message.contains(&format!(
                    "mirrored-{slow}: could not check that the log still holds the duplicate batch at offset {}",
                    100 + slow
                )) && message.contains("not read within 15 s"),
                "partition {slow}: {message}"
            );
        }
        assert!(matches!(
            local[7].outcome,
            LocalOutcome::DroppedControl { batches: 1 }
        ));
    }

    /// Cancel-safe: a request dropped while its checks run (its client
    /// reset) drops every check in flight at once and begins no more.
    #[tokio::test(start_paused = true)]
    async fn dropped_duplicate_checks_end_at_once() {
        let topic = topic();
        let duplicates: Vec<_> = (0..7).map(|p| duplicate(&topic, p)).collect();
        let mut local: Vec<_> = (0..7).map(|p| answered_duplicate(&topic, p)).collect();
        let ends = Ends::default();
        let start = Instant::now();
        let checks = check_duplicates("link-a", &mut local, &duplicates, &name, check(&ends));
        let reset = Duration::from_secs(2);
        assert!(tokio::time::timeout(reset, checks).await.is_err());

        let ends = ends.lock().map(|e| e.clone()).unwrap_or_default();
        let at = |p: i32| {
            ends.iter()
                .find(|(q, _)| *q == p)
                .map(|(_, at)| *at - start)
        };
        // Ended by 2 s: 0 and 2 done; 1, 3, 4 and 5 running, dropped then.
        assert_eq!(ends.len(), 6, "{ends:?}");
        for p in [1, 3, 4, 5] {
            assert_eq!(at(p), Some(reset), "partition {p}");
        }
        assert_eq!(at(6), None, "not begun: four were running");
        assert!(local
            .iter()
            .all(|l| matches!(l.outcome, LocalOutcome::Duplicate { .. })));
    }

    /// The outside world of [`begin`], faked: a rebuild applies an empty
    /// log tail (the partition had nothing) when `rebuilds_succeed`, else
    /// never ends; a duplicate's check finds it in the log; a replan gives
    /// the request's plan again.
    struct FakeRecovery {
        rebuilds_succeed: bool,
        rebuilds: AtomicUsize,
        checks: AtomicUsize,
        batch: BatchId,
    }

    impl FakeRecovery {
        fn new(rebuilds_succeed: bool) -> FakeRecovery {
            FakeRecovery {
                rebuilds_succeed,
                rebuilds: AtomicUsize::new(0),
                checks: AtomicUsize::new(0),
                batch: BatchId {
                    producer_id: 1000,
                    epoch: 0,
                    first_seq: 0,
                    last_seq: 4,
                },
            }
        }

        /// A link request writing `self.batch` to partition 0 of `orders`.
        fn plan(&self) -> ProducePlan {
            let origin = OriginId {
                source: ClusterId::from_bytes(*b"source-cluster-1"),
                pid: 5,
            };
            let mut plan = ProducePlan::default();
            plan.forwarded_partitions = 1;
            plan.tracked.push(TrackedPartition {
                topic: orders(),
                partition: PartitionId {
                    topic_id: ORDERS_ID,
                    partition: 0,
                },
                entry: 0,
                batch_count: 1,
                batches: [TrackedBatch {
                    id: self.batch,
                    origin,
                    offset_delta: 0,
                }]
                .into_iter()
                .collect(),
            });
            plan
        }
    }

    impl Recovery for FakeRecovery {
        fn rebuild<'a>(
            &'a self,
            _plan: &'a mut ProducePlan,
            claim: RebuildClaim,
        ) -> impl Future<Output = ()> + Send + 'a {
            self.rebuilds.fetch_add(1, Ordering::Relaxed);
            async move {
                if !self.rebuilds_succeed {
                    std::future::pending::<()>().await;
                }
                let none = |_: i64| None;
                claim.apply(0, 0, 0, &[], &none, std::time::Instant::now(), true);
            }
        }

        fn lost_duplicates<'a>(
            &'a self,
            _plan: &'a mut ProducePlan,
            _tracked: &'a Tracked,
        ) -> impl Future<Output = Vec<PartitionId>> + Send + 'a {
            self.checks.fetch_add(1, Ordering::Relaxed);
            std::future::ready(Vec::new())
        }

        fn replan(&self) -> ProducePlan {
            self.plan()
        }

        fn shutting_down(&self) -> impl Future<Output = ()> + Send + '_ {
            std::future::pending()
        }
    }

    fn orders() -> Arc<TopicRef> {
        Arc::new(TopicRef {
            name: TopicName(StrBytes::from_static_str("orders")),
            topic_id: ORDERS_ID,
        })
    }

    fn dedupe() -> Arc<Dedupe> {
        Dedupe::new(
            100,
            1 << 20,
            Duration::from_secs(60),
            Arc::new(crate::metrics::Metrics::default()),
        )
    }

    /// A partition's state not yet rebuilt (after start-up): the request
    /// rebuilds it, then goes through at once, its batch tracked.
    #[tokio::test(start_paused = true)]
    async fn a_rebuild_that_succeeds_lets_the_request_through() {
        let dedupe = dedupe();
        let fake = FakeRecovery::new(true);
        let mut plan = fake.plan();
        let start = Instant::now();
        let tracked = begin(&dedupe, &fake, "east", dedupe.writer(), 30_000, &mut plan).await;
        assert_eq!(fake.rebuilds.load(Ordering::Relaxed), 1);
        assert_eq!(Instant::now(), start, "no wait beyond the rebuild");
        assert!(!tracked.is_empty(), "the batch is tracked");
        assert!(plan.local.is_empty(), "{:?}", plan.local);
        assert_eq!(plan.forwarded_partitions, 1);
        assert!(dedupe.is_ready(&PartitionId {
            topic_id: ORDERS_ID,
            partition: 0
        }));
        tracked.unanswered();
    }

    /// Another request holds the partition's rebuild and never finishes
    /// it: this one waits [`REBUILD_WAIT`], no longer, then answers the
    /// partition retriable and forwards nothing of it.
    #[tokio::test(start_paused = true)]
    async fn the_wait_for_another_rebuild_gives_up_at_its_bound_retriably() {
        let dedupe = dedupe();
        let fake = FakeRecovery::new(false);
        let mut first = fake.plan();
        let Begin::Rebuild { claims, .. } = dedupe.begin(&mut first, "east", true, dedupe.writer())
        else {
            panic!("a partition not rebuilt yet is claimed");
        };
        assert_eq!(claims.len(), 1);
        let mut plan = fake.plan();
        let start = Instant::now();
        let tracked = begin(&dedupe, &fake, "east", dedupe.writer(), 30_000, &mut plan).await;
        assert_eq!(Instant::now() - start, REBUILD_WAIT);
        assert_eq!(
            fake.rebuilds.load(Ordering::Relaxed),
            0,
            "not this request's to rebuild"
        );
        assert!(tracked.is_empty());
        assert_eq!(plan.forwarded_partitions, 0);
        assert_eq!(plan.local.len(), 1);
        match &plan.local[0].outcome {
            LocalOutcome::Refused {
                refusal: Refusal::StateNotRebuilt,
                message,
            } => assert_eq!(
                &**message,
                "mirror link 'east': partition 0: the mirrored producer state is still being rebuilt from the log by another request; retry"
            ),
            other => panic!("{other:?}"),
        }
        drop(claims);
    }

    /// A retry of a batch the broker appended is answered here with the
    /// first attempt's offset, once the log is checked to hold it: the
    /// response a client gets, byte for byte.
    #[tokio::test(start_paused = true)]
    async fn a_duplicate_is_answered_with_the_first_offset() {
        use kafka_protocol::messages::produce_response::{
            PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
        };
        let dedupe = dedupe();
        let fake = FakeRecovery::new(true);
        let writer = dedupe.writer();
        let mut plan = fake.plan();
        let tracked = begin(&dedupe, &fake, "east", writer, 30_000, &mut plan).await;
        // The broker appended it at 100.
        let appended =
            ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
                .with_topic_id(ORDERS_ID)
                .with_partition_responses(vec![PartitionProduceResponse::default()
                    .with_index(0)
                    .with_base_offset(100)
                    .with_log_append_time_ms(-1)])]);
        let frame = crate::mirror::produce::encode_response(1, 13, &appended).expect("encode");
        let mut answers = tracked.answers();
        answers.walk(&frame, 13).expect("walk");
        let found = answers.into_found();
        tracked.settle(&found, 1);
        assert_eq!(
            fake.checks.load(Ordering::Relaxed),
            0,
            "nothing to check yet"
        );

        let mut retry = fake.plan();
        let tracked = begin(&dedupe, &fake, "east", writer, 30_000, &mut retry).await;
        assert_eq!(
            fake.checks.load(Ordering::Relaxed),
            1,
            "the log checked once"
        );
        assert!(tracked.is_empty(), "nothing sent again");
        assert_eq!(retry.forwarded_partitions, 0);
        let head = Head {
            version: 13,
            correlation_id: 42,
            body_offset: 0,
            acks: -1,
        };
        assert_eq!(
            head.answer(&retry.local).expect("answer").as_deref(),
            Some(&decide_tests::response(13, &[(decide_tests::ORDERS, &[(0, 0, 100, None)])])[..])
        );
    }
}
