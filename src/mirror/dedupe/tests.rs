//! The request and response halves of the mirrored producer state, on plans
//! and responses built by hand.

use super::*;
use kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use crate::mirror::pid::ClusterId;
use crate::mirror::produce::TrackedBatch;
use crate::mirror::producer_state::BatchId;

const TOPIC_ID: Uuid = Uuid::from_u128(7);
const PID: i64 = -42;
/// The connection every test's requests come from, unless said otherwise
/// ([`Dedupe::writer`] starts at 1).
const W: Writer = Writer(0);
const V: i16 = 13;

fn topic() -> TopicRef {
    TopicRef {
        name: TopicName(StrBytes::from_static_str("")),
        topic_id: TOPIC_ID,
    }
}

fn at(partition: i32) -> PartitionId {
    PartitionId {
        topic_id: TOPIC_ID,
        partition,
    }
}

fn id(epoch: i16, first: i32, last: i32) -> BatchId {
    BatchId {
        producer_id: PID,
        epoch,
        first_seq: first,
        last_seq: last,
    }
}

/// A plan forwarding `partition` with these batches (and no others).
fn origin(pid: i64) -> OriginId {
    OriginId {
        source: ClusterId::from_bytes(*b"source-cluster-1"),
        pid,
    }
}

fn plan(partition: i32, batches: &[(BatchId, i64)]) -> ProducePlan {
    plan_from(partition, origin(5), batches)
}

fn plan_from(partition: i32, from: OriginId, batches: &[(BatchId, i64)]) -> ProducePlan {
    let mut plan = ProducePlan::default();
    plan.forwarded_partitions = 1;
    plan.tracked.push(crate::mirror::produce::TrackedPartition {
        topic: topic().into(),
        partition: at(partition),
        entry: 0,
        batch_count: batches.len(),
        batches: batches
            .iter()
            .map(|&(id, offset_delta)| TrackedBatch {
                id,
                origin: from,
                offset_delta,
            })
            .collect(),
    });
    plan
}

/// Settle with a response as the broker sends it: encoded, then walked.
trait SettleWith {
    fn settle_with(self, response: &ProduceResponse);
}

impl SettleWith for Tracked {
    fn settle_with(self, response: &ProduceResponse) {
        let frame = crate::mirror::produce::encode_response(1, V, response).expect("encode");
        let mut answers = self.answers();
        answers.walk(&frame, V).expect("walk");
        let found = answers.into_found();
        self.settle(&found, 1);
    }
}

fn response(partition: i32, error_code: i16, base_offset: i64) -> ProduceResponse {
    ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
        .with_topic_id(TOPIC_ID)
        .with_partition_responses(vec![PartitionProduceResponse::default()
            .with_index(partition)
            .with_error_code(error_code)
            .with_base_offset(base_offset)
            .with_log_append_time_ms(-1)])])
}

fn dedupe() -> Arc<Dedupe> {
    dedupe_waiting(std::time::Duration::from_secs(60))
}

/// A lost batch is waited out for `wait` before a tail without it counts.
fn dedupe_waiting(wait: std::time::Duration) -> Arc<Dedupe> {
    Dedupe::new(100, 1 << 20, wait, Arc::new(Metrics::default()))
}

/// Rebuild partition `partition` (which must need it) from a stable tail
/// of `batches` read now.
fn rebuild_stable(d: &Arc<Dedupe>, partition: i32, batches: &[(i64, i32, usize)]) -> Rebuilt {
    let owner = |pid: i64| (pid == PID).then(|| origin(5));
    let mut p = plan(partition, &[(id(0, 1000, 1000), 0)]);
    let (mut claims, _) = must_rebuild(d.begin(&mut p, "east", true, W));
    let claim = claims.pop().expect("one claim");
    let end = batches
        .iter()
        .map(|&(base, _, n)| base + n as i64)
        .max()
        .unwrap_or(0);
    claim.apply(
        0,
        end,
        0,
        &tail(batches),
        &owner,
        std::time::Instant::now(),
        true,
    )
}

/// [`Dedupe::begin`] on partitions taken as rebuilt from their log: `Some`
/// when begun, `None` when it must wait for a batch in flight.
fn begin(d: &Arc<Dedupe>, plan: &mut ProducePlan, link: &str, wait: bool) -> Option<Tracked> {
    for tp in &plan.tracked {
        d.assume_rebuilt(tp.partition, W);
    }
    match d.begin(plan, link, wait, W) {
        Begin::Begun(t) => Some(t),
        Begin::InFlight => None,
        Begin::Rebuild { .. } => panic!("every partition was taken as rebuilt"),
    }
}

/// The claims and waits of a [`Dedupe::begin`] that must rebuild first.
fn must_rebuild(b: Begin) -> (Vec<RebuildClaim>, Vec<PartitionId>) {
    match b {
        Begin::Rebuild { claims, waiting } => (claims, waiting),
        Begin::Begun(_) => panic!("begun before a rebuild"),
        Begin::InFlight => panic!("in flight before a rebuild"),
    }
}

#[test]
fn an_acknowledged_batch_sent_again_is_answered_with_its_offset() {
    let d = dedupe();
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    let t = begin(&d, &mut p, "east", false).expect("begun");
    assert!(p.local.is_empty());
    assert_eq!(p.forwarded_partitions, 1);
    t.settle_with(&response(0, 0, 100));

    let mut again = plan(0, &[(id(0, 0, 9), 0)]);
    let t = begin(&d, &mut again, "east", false).expect("begun");
    assert!(t.is_empty());
    assert_eq!(again.forwarded_partitions, 0);
    assert_eq!(
        again.local,
        vec![LocalPartition {
            topic: topic().into(),
            partition: 0,
            entry: 0,
            outcome: LocalOutcome::Duplicate {
                base_offset: 100,
                batches: 1
            },
        }]
    );
}

#[test]
fn later_batches_of_a_partition_are_recorded_at_their_own_offsets() {
    let d = dedupe();
    let mut p = plan(0, &[(id(0, 0, 4), 0), (id(0, 5, 9), 5)]);
    begin(&d, &mut p, "east", false)
        .expect("begun")
        .settle_with(&response(0, 0, 100));
    let mut again = plan(0, &[(id(0, 5, 9), 0)]);
    begin(&d, &mut again, "east", false).expect("begun");
    assert!(matches!(
        again.local[0].outcome,
        LocalOutcome::Duplicate {
            base_offset: 105,
            ..
        }
    ));
}

#[test]
fn a_retry_while_in_flight_is_answered_retriable_and_never_forwarded() {
    let d = dedupe();
    let mut first = plan(0, &[(id(0, 0, 9), 0)]);
    let t = begin(&d, &mut first, "east", false).expect("begun");
    let mut retry = plan(0, &[(id(0, 0, 9), 0)]);
    let _ = begin(&d, &mut retry, "east", false).expect("begun");
    assert_eq!(retry.forwarded_partitions, 0);
    assert!(matches!(
        retry.local[0].outcome,
        LocalOutcome::Refused {
            refusal: Refusal::RetryInFlight,
            ..
        }
    ));
    t.settle_with(&response(0, 0, 7));
    let mut later = plan(0, &[(id(0, 0, 9), 0)]);
    begin(&d, &mut later, "east", false).expect("begun");
    assert!(matches!(
        later.local[0].outcome,
        LocalOutcome::Duplicate { base_offset: 7, .. }
    ));
}

#[test]
fn an_error_or_a_lost_response_ends_the_flight_without_recording() {
    // Lost batches are not waited out here (see the tests of doubts below).
    let d = dedupe_waiting(std::time::Duration::ZERO);
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    begin(&d, &mut p, "east", false)
        .expect("begun")
        .settle_with(&response(0, 6, -1));
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    drop(begin(&d, &mut p, "east", false).expect("begun")); // the connection was lost
    assert!(p.local.is_empty());
    // A stable tail without it, read past its (zero) wait: never appended.
    let r = rebuild_stable(&d, 0, &[]);
    assert_eq!(r.doubts.absent, 1, "{r:?}");
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    let t = begin(&d, &mut p, "east", false).expect("begun");
    assert!(p.local.is_empty(), "{:?}", p.local);
    assert!(!t.is_empty());
    // A response without the partition fails it too.
    t.settle_with(&response(1, 0, 5));
    assert!(d.is_empty());
}

#[test]
fn epochs_going_back_and_overlapping_sequences_are_refused() {
    let d = dedupe();
    let mut p = plan(0, &[(id(1, 0, 9), 0)]);
    begin(&d, &mut p, "east", false)
        .expect("begun")
        .settle_with(&response(0, 0, 0));
    let mut back = plan(0, &[(id(0, 10, 19), 0)]);
    begin(&d, &mut back, "east", false).expect("begun");
    let LocalOutcome::Refused { refusal, message } = &back.local[0].outcome else {
        panic!("{:?}", back.local);
    };
    assert_eq!(*refusal, Refusal::InvalidProducerEpoch);
    assert!(
        message.starts_with("mirror link 'east': partition 0: "),
        "{message}"
    );
    let mut overlap = plan(0, &[(id(1, 5, 14), 0)]);
    begin(&d, &mut overlap, "east", false).expect("begun");
    assert!(matches!(
        overlap.local[0].outcome,
        LocalOutcome::Refused {
            refusal: Refusal::OutOfOrderSequence,
            ..
        }
    ));
    assert_eq!(overlap.forwarded_partitions, 0);
}

#[test]
fn a_partition_mixing_a_duplicate_and_a_new_batch_is_refused_whole() {
    let d = dedupe();
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    begin(&d, &mut p, "east", false)
        .expect("begun")
        .settle_with(&response(0, 0, 0));
    let mut mixed = plan(0, &[(id(0, 0, 9), 0), (id(0, 10, 19), 10)]);
    let t = begin(&d, &mut mixed, "east", false).expect("begun");
    assert!(t.is_empty());
    assert!(matches!(
        mixed.local[0].outcome,
        LocalOutcome::Refused {
            refusal: Refusal::OutOfOrderSequence,
            ..
        }
    ));
    // The new batch's flight ended with the refusal: alone, it appends.
    let mut alone = plan(0, &[(id(0, 10, 19), 0)]);
    begin(&d, &mut alone, "east", false).expect("begun");
    assert!(alone.local.is_empty());
}

/// Partitions 0 to 2 of one request, each with one batch.
fn plan_of_three(batches: [BatchId; 3]) -> ProducePlan {
    let mut p = ProducePlan::default();
    for (partition, batch) in batches.into_iter().enumerate() {
        let one = plan(partition as i32, &[(batch, 0)]);
        p.tracked.extend(one.tracked);
        p.forwarded_partitions += 1;
    }
    p
}

#[test]
fn partitions_answered_here_leave_the_others_begun_in_request_order() {
    let d = dedupe();
    // Partitions 0 and 2 have appended a batch; partition 1 has not.
    let mut first = plan_of_three([id(0, 0, 9), id(0, 0, 9), id(0, 0, 9)]);
    let t = begin(&d, &mut first, "east", false).expect("begun");
    let found = [
        Some(answer(100)),
        Some(PartitionAnswer {
            error_code: 1, // OFFSET_OUT_OF_RANGE: failed, nothing appended
            ..answer(-1)
        }),
        Some(answer(300)),
    ];
    t.settle(&found, 1);
    // Sent again with partition 1's batch: 0 and 2 are duplicates, answered
    // here with their offsets; 1 alone is begun and goes to the broker.
    let mut again = plan_of_three([id(0, 0, 9), id(0, 0, 9), id(0, 0, 9)]);
    let t = begin(&d, &mut again, "east", false).expect("begun");
    assert_eq!(again.forwarded_partitions, 1);
    let local: Vec<(i32, LocalOutcome)> = again
        .local
        .iter()
        .map(|l| (l.partition, l.outcome.clone()))
        .collect();
    assert_eq!(
        local,
        vec![
            (
                0,
                LocalOutcome::Duplicate {
                    base_offset: 100,
                    batches: 1
                }
            ),
            (
                2,
                LocalOutcome::Duplicate {
                    base_offset: 300,
                    batches: 1
                }
            ),
        ]
    );
    // Begun: partition 1 alone, which its answer then records.
    t.settle(&[Some(answer(200))], 1);
    let mut third = plan(1, &[(id(0, 0, 9), 0)]);
    begin(&d, &mut third, "east", false).expect("begun");
    assert_eq!(
        third.local[0].outcome,
        LocalOutcome::Duplicate {
            base_offset: 200,
            batches: 1
        }
    );
}

fn answer(base_offset: i64) -> PartitionAnswer {
    PartitionAnswer {
        error_code: 0,
        base_offset,
        log_append_time_ms: -1,
        leader_id: -1,
    }
}

#[test]
fn a_mapped_pid_reused_by_another_origin_starts_afresh() {
    let d = dedupe();
    let mut p = plan(0, &[(id(0, 0, 0), 0)]);
    begin(&d, &mut p, "east", false)
        .expect("begun")
        .settle_with(&response(0, 0, 0));
    // Origin 5 expired; origin 6 now holds the same mapped PID.
    let mut other = plan_from(0, origin(6), &[(id(0, 0, 0), 0)]);
    let t = begin(&d, &mut other, "east", false).expect("begun");
    assert!(other.local.is_empty(), "{:?}", other.local);
    assert!(!t.is_empty());
}

#[test]
fn a_waiting_retry_begins_nothing_until_the_first_attempt_settles() {
    let d = dedupe();
    let mut first = plan(0, &[(id(0, 0, 9), 0)]);
    let t = begin(&d, &mut first, "east", true).expect("begun");
    // The retry also carries a new batch of another partition: neither is
    // begun while it waits.
    let mut retry = plan(0, &[(id(0, 0, 9), 0)]);
    retry.forwarded_partitions = 2;
    retry
        .tracked
        .push(crate::mirror::produce::TrackedPartition {
            topic: topic().into(),
            partition: at(1),
            entry: 1,
            batch_count: 1,
            batches: smallvec::smallvec![TrackedBatch {
                id: id(0, 0, 4),
                origin: origin(5),
                offset_delta: 0,
            }],
        });
    assert!(begin(&d, &mut retry, "east", true).is_none());
    assert_eq!(retry.tracked.len(), 2, "the plan is left as it was");
    assert!(retry.local.is_empty());
    t.settle_with(&response(0, 0, 40));
    let t2 = begin(&d, &mut retry, "east", true).expect("begun");
    assert_eq!(retry.forwarded_partitions, 1);
    assert!(matches!(
        retry.local[0].outcome,
        LocalOutcome::Duplicate {
            base_offset: 40,
            ..
        }
    ));
    assert!(!t2.is_empty(), "partition 1's batch is in flight");
}

#[tokio::test]
async fn settling_wakes_a_waiter() {
    let d = dedupe();
    let mut first = plan(0, &[(id(0, 0, 9), 0)]);
    let t = begin(&d, &mut first, "east", true).expect("begun");
    let changed = d.changed();
    tokio::pin!(changed);
    changed.as_mut().enable();
    t.settle_with(&response(0, 0, 1));
    tokio::time::timeout(std::time::Duration::from_secs(5), changed)
        .await
        .expect("notified");
}

#[test]
fn nothing_begins_before_the_partition_is_rebuilt_and_one_request_rebuilds_it() {
    let d = dedupe();
    let mut first = plan(0, &[(id(0, 0, 9), 0)]);
    let (claims, waiting) = must_rebuild(d.begin(&mut first, "east", true, W));
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].partition(), at(0));
    assert!(waiting.is_empty());
    assert_eq!(first.tracked.len(), 1, "the plan is left as it was");
    // A second request for the partition waits for that rebuild: it
    // neither begins nor claims it.
    let mut second = plan(0, &[(id(0, 10, 19), 0)]);
    let (c2, w2) = must_rebuild(d.begin(&mut second, "east", true, W));
    assert!(c2.is_empty());
    assert_eq!(w2, [at(0)]);
    assert!(d.is_empty(), "nothing in flight");
    // A claim dropped unfinished (its rebuild failed) frees the partition
    // for the next request to claim; it is still not ready.
    drop(claims);
    assert!(!d.is_ready(&at(0)));
    let (c3, _) = must_rebuild(d.begin(&mut second, "east", true, W));
    assert_eq!(c3.len(), 1);
}

#[test]
fn an_unknown_outcome_or_a_leader_move_marks_the_partition_for_a_rebuild() {
    let d = dedupe_waiting(std::time::Duration::ZERO);
    // The connection was lost with the batch in flight.
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    drop(begin(&d, &mut p, "east", false).expect("begun"));
    assert!(!d.is_ready(&at(0)));
    let mut retry = plan(0, &[(id(0, 0, 9), 0)]);
    let (claims, _) = must_rebuild(d.begin(&mut retry, "east", true, W));
    assert_eq!(claims.len(), 1);
    drop(claims);
    // Settled as never appended by a stable tail past its (zero) wait.
    assert_eq!(rebuild_stable(&d, 0, &[]).doubts.absent, 1);
    // A timeout answer leaves the outcome open too; a leader named in the
    // answer, or NOT_LEADER_OR_FOLLOWER, means another log.
    for (error_code, leader) in [(7, -1), (20, -1), (6, -1), (2, 3)] {
        let mut p = plan(0, &[(id(0, 0, 9), 0)]);
        let t = begin(&d, &mut p, "east", false).expect("begun");
        let mut r = response(0, error_code, -1);
        r.responses[0].partition_responses[0]
            .current_leader
            .leader_id = leader.into();
        t.settle_with(&r);
        assert!(!d.is_ready(&at(0)), "error {error_code}, leader {leader}");
    }
    // A refusal of the batch itself (CORRUPT_MESSAGE) does not.
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    begin(&d, &mut p, "east", false)
        .expect("begun")
        .settle_with(&response(0, 2, -1));
    assert!(d.is_ready(&at(0)));
}

/// A log tail of PID's batches (epoch 0), each `(base offset, first
/// sequence, records)`.
fn tail(batches: &[(i64, i32, usize)]) -> Vec<u8> {
    use crate::wire::batch::{build, NewBatch, NewRecord};
    let mut out = Vec::new();
    for &(base, seq, n) in batches {
        let records: Vec<NewRecord<'_>> = (0..n)
            .map(|_| NewRecord {
                key: None,
                value: Some(b"v"),
                headers: &[],
                timestamp: 1,
            })
            .collect();
        let mut b = build(
            &NewBatch {
                producer_id: PID,
                producer_epoch: 0,
                base_sequence: seq,
                transactional: false,
                control: false,
            },
            &records,
        )
        .expect("build");
        b[..8].copy_from_slice(&base.to_be_bytes());
        out.extend_from_slice(&b);
    }
    out
}

#[test]
fn a_rebuild_merges_with_what_was_recorded_meanwhile() {
    let d = dedupe();
    let owner = |pid: i64| (pid == PID).then(|| origin(5));
    let mut first = plan(0, &[(id(0, 0, 9), 0)]);
    let (mut claims, _) = must_rebuild(d.begin(&mut first, "east", true, W));
    let claim = claims.pop().expect("one claim");
    // While the tail is read, a request begun before a mark (another
    // connection) records batch 20..29 at offset 20.
    d.assume_rebuilt(at(0), W);
    let mut other = plan(0, &[(id(0, 20, 29), 0)]);
    let t = d.begin(&mut other, "east", false, W);
    let Begin::Begun(t) = t else { panic!("begun") };
    t.settle_with(&response(0, 0, 20));
    // The tail read before that append: batches 0..9 and 10..19.
    let r = claim.apply(
        0,
        20,
        0,
        &tail(&[(0, 0, 10), (10, 10, 10)]),
        &owner,
        std::time::Instant::now(),
        false,
    );
    assert_eq!((r.replayed.batches, r.replayed.taken), (2, 2));
    assert!(d.is_ready(&at(0)));
    // All three are known, the recorded one is not lost.
    for (seq, offset) in [(0, 0), (10, 10), (20, 20)] {
        let mut p = plan(0, &[(id(0, seq, seq + 9), 0)]);
        begin(&d, &mut p, "east", false).expect("begun");
        assert!(
            matches!(p.local[0].outcome, LocalOutcome::Duplicate { base_offset, .. } if base_offset == offset),
            "{seq}: {:?}",
            p.local
        );
    }
}

#[test]
fn a_mark_during_a_rebuild_leaves_the_partition_for_another_rebuild() {
    let d = dedupe();
    let owner = |pid: i64| (pid == PID).then(|| origin(5));
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    let (mut claims, _) = must_rebuild(d.begin(&mut p, "east", true, W));
    d.mark_for_rebuild(at(0), RebuildReason::UnknownOutcome);
    let claim = claims.pop().expect("one claim");
    claim.apply(
        0,
        10,
        0,
        &tail(&[(0, 0, 10)]),
        &owner,
        std::time::Instant::now(),
        false,
    );
    assert!(!d.is_ready(&at(0)), "read before the mark: read again");
    let (claims, _) = must_rebuild(d.begin(&mut p, "east", true, W));
    assert_eq!(claims.len(), 1);
}

#[test]
fn acks_0_ends_the_flight_without_a_rebuild() {
    let d = dedupe();
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    begin(&d, &mut p, "east", false)
        .expect("begun")
        .unanswered();
    assert!(d.is_ready(&at(0)));
    assert!(d.is_empty(), "nothing in flight, nothing recorded");
}

#[test]
fn a_rebuild_after_a_truncation_replaces_what_the_log_lost() {
    let d = dedupe();
    let owner = |pid: i64| (pid == PID).then(|| origin(5));
    // Batches 0..9 at offset 0 and 10..19 at offset 10, acknowledged.
    for (seq, offset) in [(0, 0), (10, 10)] {
        let mut p = plan(0, &[(id(0, seq, seq + 9), 0)]);
        begin(&d, &mut p, "east", false)
            .expect("begun")
            .settle_with(&response(0, 0, offset));
    }
    // An unclean leader election: the new leader's log ends at 10 (it never
    // had 10..19). The partition is marked and rebuilt from that log.
    d.mark_for_rebuild(at(0), RebuildReason::LeaderMoved);
    let mut retry = plan(0, &[(id(0, 10, 19), 0)]);
    let (mut claims, _) = must_rebuild(d.begin(&mut retry, "east", true, W));
    let claim = claims.pop().expect("one claim");
    let r = claim.apply(
        0,
        10,
        0,
        &tail(&[(0, 0, 10)]),
        &owner,
        std::time::Instant::now(),
        false,
    );
    assert_eq!((r.replayed.batches, r.replayed.taken), (1, 1));
    assert!(d.is_ready(&at(0)));
    // The lost batch's retry is appended, not answered "duplicate, 10".
    let t = d.begin(&mut retry, "east", false, W);
    let Begin::Begun(t) = t else { panic!("begun") };
    assert!(retry.local.is_empty(), "{:?}", retry.local);
    assert!(t.duplicates().is_empty());
    t.settle_with(&response(0, 0, 10));
    // What the log still holds is still a duplicate.
    let mut again = plan(0, &[(id(0, 0, 9), 0)]);
    let t = begin(&d, &mut again, "east", false).expect("begun");
    assert!(
        matches!(
            again.local[0].outcome,
            LocalOutcome::Duplicate { base_offset: 0, .. }
        ),
        "{:?}",
        again.local
    );
    // ... and named for the check that the log holds it.
    assert_eq!(t.duplicates().len(), 1);
    assert_eq!(t.duplicates()[0].base_offset, 0);
    assert_eq!(t.duplicates()[0].batch, id(0, 0, 9));
}

#[test]
fn an_answer_below_the_known_log_end_marks_a_truncation() {
    let d = dedupe();
    // 0..9 appended at offset 100: the log is known to end at 110.
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    begin(&d, &mut p, "east", false)
        .expect("begun")
        .settle_with(&response(0, 0, 100));
    assert!(d.is_ready(&at(0)));
    // The next batch lands at 105: the log lost 105..109 since.
    let mut p = plan(0, &[(id(0, 10, 19), 0)]);
    begin(&d, &mut p, "east", false)
        .expect("begun")
        .settle_with(&response(0, 0, 105));
    assert!(!d.is_ready(&at(0)), "truncation seen: rebuilt before more");
}

#[test]
fn answers_settled_out_of_order_are_no_truncation() {
    let d = dedupe();
    let mut a = plan(0, &[(id(0, 0, 9), 0)]);
    begin(&d, &mut a, "east", false)
        .expect("begun")
        .settle_with(&response(0, 0, 0));
    // Two requests (two connections) begun while the log is known to end
    // at 10, the later one answered first.
    let mut c = plan(0, &[(id(0, 10, 19), 0)]);
    let tc = begin(&d, &mut c, "east", false).expect("begun");
    let mut e = plan_from(0, origin(6), &[(id(0, 0, 4), 0)]);
    let te = begin(&d, &mut e, "east", false).expect("begun");
    // Both begun knowing the log ends at 10: answered 15 then 10.
    te.settle_with(&response(0, 0, 15));
    tc.settle_with(&response(0, 0, 10));
    assert!(d.is_ready(&at(0)));
}

#[test]
fn a_new_producer_is_answered_retriable_when_the_state_is_full_of_batches_in_flight() {
    let d = Dedupe::new(
        1,
        1 << 20,
        std::time::Duration::from_secs(60),
        Arc::new(Metrics::default()),
    );
    let mut first = plan_from(0, origin(5), &[(id(0, 0, 9), 0)]);
    let t = begin(&d, &mut first, "east", false).expect("begun");
    let mut other = plan_from(0, origin(6), &[(id(0, 0, 9), 0)]);
    let t2 = begin(&d, &mut other, "east", false).expect("begun");
    assert!(t2.is_empty(), "nothing of it forwarded");
    assert!(
        matches!(
            &other.local[0].outcome,
            LocalOutcome::Refused { refusal: Refusal::ProducerStateFull, message }
                if message.contains("in flight")
        ),
        "{:?}",
        other.local
    );
    // The first producer's retry still waits for its attempt in flight.
    let mut retry = plan_from(0, origin(5), &[(id(0, 0, 9), 0)]);
    assert!(begin(&d, &mut retry, "east", true).is_none(), "waits");
    t.settle_with(&response(0, 0, 0));
    // Settled, it may be evicted for the new one.
    let mut other = plan_from(0, origin(6), &[(id(0, 0, 9), 0)]);
    let t2 = begin(&d, &mut other, "east", false).expect("begun");
    assert!(other.local.is_empty() && !t2.is_empty());
}

/// The refusal of `p`'s only partition, if refused.
fn refusal(p: &ProducePlan) -> Option<Refusal> {
    match p.local.first().map(|l| &l.outcome) {
        Some(LocalOutcome::Refused { refusal, .. }) => Some(*refusal),
        _ => None,
    }
}

#[test]
fn a_lost_batch_holds_its_producer_until_a_tail_shows_it() {
    let d = dedupe();
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    drop(begin(&d, &mut p, "east", false).expect("begun")); // answer lost
                                                            // The retry's rebuild reads a tail without it: not settled (the broker
                                                            // may still append it), the retry is answered retriable.
    let r = rebuild_stable(&d, 0, &[]);
    assert_eq!((r.doubts.found, r.doubts.left), (0, 1), "{r:?}");
    let mut retry = plan(0, &[(id(0, 0, 9), 0)]);
    let t = d.begin(&mut retry, "east", true, W);
    assert!(matches!(t, Begin::Begun(ref t) if t.is_empty()));
    assert_eq!(refusal(&retry), Some(Refusal::OutcomeUnknown));
    // So is the producer's next batch: nothing of it overtakes the lost one.
    let mut next = plan(0, &[(id(0, 10, 19), 0)]);
    let _ = d.begin(&mut next, "east", true, W);
    assert_eq!(refusal(&next), Some(Refusal::OutcomeUnknown));
    // Another producer on the partition, and the producer elsewhere, go on.
    let mut other = plan_from(0, origin(6), &[(id(0, 0, 9), 0)]);
    let Begin::Begun(t) = d.begin(&mut other, "east", true, W) else {
        panic!("another producer waits");
    };
    assert!(!t.is_empty() && other.local.is_empty());
    t.settle_with(&response(0, 0, 0));
    let mut elsewhere = plan(1, &[(id(0, 0, 9), 0)]);
    let t = begin(&d, &mut elsewhere, "east", true).expect("begun");
    assert!(!t.is_empty() && elsewhere.local.is_empty());
    t.settle_with(&response(0, 0, 0));
    // The broker appended it late: the next tail holding it settles it, and
    // the retry is answered with its offset, never appended again.
    d.mark_for_rebuild(at(0), RebuildReason::UnknownOutcome);
    let r = rebuild_stable(&d, 0, &[(10, 0, 10)]);
    assert_eq!((r.doubts.found, r.doubts.left), (1, 0), "{r:?}");
    let mut retry = plan(0, &[(id(0, 0, 9), 0)]);
    let Begin::Begun(t) = d.begin(&mut retry, "east", true, W) else {
        panic!("not begun");
    };
    assert!(t.is_empty());
    assert!(matches!(
        retry.local[0].outcome,
        LocalOutcome::Duplicate {
            base_offset: 10,
            ..
        }
    ));
}

#[test]
fn a_lost_batch_absent_from_a_stable_tail_past_its_wait_was_never_appended() {
    let d = dedupe_waiting(std::time::Duration::from_millis(50));
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    let mut t = begin(&d, &mut p, "east", false).expect("begun");
    // The request's own timeout is longer: the cap holds.
    t.set_timeout_ms(30_000);
    drop(t);
    let r = rebuild_stable(&d, 0, &[]);
    assert_eq!(r.doubts.left, 1, "read within the wait: {r:?}");
    std::thread::sleep(std::time::Duration::from_millis(60));
    // Past the wait the retry asks for a confirming read first.
    let mut retry = plan(0, &[(id(0, 0, 9), 0)]);
    let (mut claims, _) = must_rebuild(d.begin(&mut retry, "east", true, W));
    let claim = claims.pop().expect("a claim");
    assert!(claim.confirming());
    let owner = |pid: i64| (pid == PID).then(|| origin(5));
    let at_read = std::time::Instant::now();
    // A read whose log end moved proves nothing...
    let r = claim.apply(0, 0, 0, &[], &owner, at_read, false);
    assert_eq!(r.doubts.left, 1, "{r:?}");
    // ...a stable one does: the retry is appended.
    let r = rebuild_stable(&d, 0, &[]);
    assert_eq!(r.doubts.absent, 1, "{r:?}");
    let mut retry = plan(0, &[(id(0, 0, 9), 0)]);
    let Begin::Begun(t) = d.begin(&mut retry, "east", true, W) else {
        panic!("not begun");
    };
    assert!(!t.is_empty() && retry.local.is_empty(), "{:?}", retry.local);
}

#[test]
fn a_short_request_timeout_shortens_the_wait() {
    let d = dedupe();
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    let mut t = begin(&d, &mut p, "east", false).expect("begun");
    t.set_timeout_ms(0);
    drop(t);
    // Its wait (0 ms) is over at once: a stable tail without it settles it.
    assert_eq!(rebuild_stable(&d, 0, &[]).doubts.absent, 1);
}

/// Each instance's state is its own memory: another instance may have
/// appended since. A connection that has not rebuilt a partition here
/// catches up (from where the log was seen whole) before anything of it
/// begins, even when it is ready for others; after that both may write,
/// and one catch-up does not send the first back (no ping-pong between two
/// connections).
#[test]
fn a_connection_new_to_a_partition_catches_up_before_writing() {
    let d = dedupe();
    let owner = |pid: i64| (pid == PID).then(|| origin(5));
    // W rebuilt partition 0 (empty) and appended sequences 0..9 at 0.
    assert_eq!(rebuild_stable(&d, 0, &[]).replayed.batches, 0);
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    let Begin::Begun(t) = d.begin(&mut p, "east", true, W) else {
        panic!("W rebuilt the partition: begun");
    };
    t.settle_with(&response(0, 0, 0));
    // Another instance appended 10..19 at 10. A second connection's retry
    // of it would be the next in sequence here: it must read the log first.
    let w2 = d.writer();
    assert_ne!(w2, W);
    let mut retry = plan(0, &[(id(0, 10, 19), 0)]);
    let (mut claims, waiting) = must_rebuild(d.begin(&mut retry, "east", true, w2));
    assert!(waiting.is_empty());
    assert!(!d.is_ready(&at(0)), "W waits for the rebuild too");
    let claim = claims.pop().expect("w2 claims the rebuild");
    // A catch-up from the log end known here: what came before is held.
    assert_eq!(claim.since(), Some(10));
    claim.apply(
        0,
        20,
        10,
        &tail(&[(10, 10, 10)]),
        &owner,
        std::time::Instant::now(),
        true,
    );
    // Read from the log: the retry is a duplicate of the batch at 10.
    let Begin::Begun(t) = d.begin(&mut retry, "east", true, w2) else {
        panic!("w2 rebuilt it: begun");
    };
    assert_eq!(t.duplicates().len(), 1);
    assert_eq!(t.duplicates()[0].base_offset, 10);
    // W still writes without another rebuild.
    let mut next = plan(0, &[(id(0, 20, 29), 0)]);
    let Begin::Begun(t) = d.begin(&mut next, "east", true, W) else {
        panic!("W keeps writing");
    };
    t.settle_with(&response(0, 0, 20));
    assert!(d.is_ready(&at(0)));
    // Another instance appends 30..39 at 30; W's next lands at 40. The log
    // up to 30 was seen here, not up to 50: a gap is someone else's.
    let mut after_gap = plan(0, &[(id(0, 40, 49), 0)]);
    let Begin::Begun(t) = d.begin(&mut after_gap, "east", true, W) else {
        panic!("W keeps writing");
    };
    t.settle_with(&response(0, 0, 40));
    // A third connection catches up from there.
    let mut third = plan(0, &[(id(0, 30, 39), 0)]);
    let w3 = d.writer();
    let (claims, _) = must_rebuild(d.begin(&mut third, "east", true, w3));
    assert_eq!(
        claims[0].since(),
        Some(30),
        "from where the log was seen whole"
    );
}
