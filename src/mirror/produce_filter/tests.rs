//! The request and response halves of the mirrored producer state, on plans
//! and responses built by hand.

use super::*;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use crate::mirror::pid::ClusterId;
use crate::mirror::producer_state::BatchId;

const TOPIC_ID: Uuid = Uuid::from_u128(7);
const PID: i64 = -42;
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
        topic: topic(),
        partition: at(partition),
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
    Dedupe::new(100, 1 << 20, Arc::new(Metrics::default()))
}

#[test]
fn an_acknowledged_batch_sent_again_is_answered_with_its_offset() {
    let d = dedupe();
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    let t = d.begin(&mut p, "east", false).expect("begun");
    assert!(p.local.is_empty());
    assert_eq!(p.forwarded_partitions, 1);
    t.settle(&response(0, 0, 100), V, 1);

    let mut again = plan(0, &[(id(0, 0, 9), 0)]);
    let t = d.begin(&mut again, "east", false).expect("begun");
    assert!(t.is_empty());
    assert_eq!(again.forwarded_partitions, 0);
    assert_eq!(
        again.local,
        vec![LocalPartition {
            topic: topic(),
            partition: 0,
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
    d.begin(&mut p, "east", false)
        .expect("begun")
        .settle(&response(0, 0, 100), V, 1);
    let mut again = plan(0, &[(id(0, 5, 9), 0)]);
    d.begin(&mut again, "east", false).expect("begun");
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
    let t = d.begin(&mut first, "east", false).expect("begun");
    let mut retry = plan(0, &[(id(0, 0, 9), 0)]);
    let _ = d.begin(&mut retry, "east", false).expect("begun");
    assert_eq!(retry.forwarded_partitions, 0);
    assert!(matches!(
        retry.local[0].outcome,
        LocalOutcome::Refused {
            refusal: Refusal::RetryInFlight,
            ..
        }
    ));
    t.settle(&response(0, 0, 7), V, 1);
    let mut later = plan(0, &[(id(0, 0, 9), 0)]);
    d.begin(&mut later, "east", false).expect("begun");
    assert!(matches!(
        later.local[0].outcome,
        LocalOutcome::Duplicate { base_offset: 7, .. }
    ));
}

#[test]
fn an_error_or_a_lost_response_ends_the_flight_without_recording() {
    let d = dedupe();
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    d.begin(&mut p, "east", false)
        .expect("begun")
        .settle(&response(0, 6, -1), V, 1);
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    drop(d.begin(&mut p, "east", false).expect("begun")); // the connection was lost
    assert!(p.local.is_empty());
    let mut p = plan(0, &[(id(0, 0, 9), 0)]);
    let t = d.begin(&mut p, "east", false).expect("begun");
    assert!(p.local.is_empty(), "{:?}", p.local);
    assert!(!t.is_empty());
    // A response without the partition fails it too.
    t.settle(&response(1, 0, 5), V, 1);
    assert!(d.is_empty());
}

#[test]
fn epochs_going_back_and_overlapping_sequences_are_refused() {
    let d = dedupe();
    let mut p = plan(0, &[(id(1, 0, 9), 0)]);
    d.begin(&mut p, "east", false)
        .expect("begun")
        .settle(&response(0, 0, 0), V, 1);
    let mut back = plan(0, &[(id(0, 10, 19), 0)]);
    d.begin(&mut back, "east", false).expect("begun");
    let LocalOutcome::Refused { refusal, message } = &back.local[0].outcome else {
        panic!("{:?}", back.local);
    };
    assert_eq!(*refusal, Refusal::InvalidProducerEpoch);
    assert!(
        message.starts_with("mirror link 'east': partition 0: "),
        "{message}"
    );
    let mut overlap = plan(0, &[(id(1, 5, 14), 0)]);
    d.begin(&mut overlap, "east", false).expect("begun");
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
    d.begin(&mut p, "east", false)
        .expect("begun")
        .settle(&response(0, 0, 0), V, 1);
    let mut mixed = plan(0, &[(id(0, 0, 9), 0), (id(0, 10, 19), 10)]);
    let t = d.begin(&mut mixed, "east", false).expect("begun");
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
    d.begin(&mut alone, "east", false).expect("begun");
    assert!(alone.local.is_empty());
}

#[test]
fn a_mapped_pid_reused_by_another_origin_starts_afresh() {
    let d = dedupe();
    let mut p = plan(0, &[(id(0, 0, 0), 0)]);
    d.begin(&mut p, "east", false)
        .expect("begun")
        .settle(&response(0, 0, 0), V, 1);
    // Origin 5 expired; origin 6 now holds the same mapped PID.
    let mut other = plan_from(0, origin(6), &[(id(0, 0, 0), 0)]);
    let t = d.begin(&mut other, "east", false).expect("begun");
    assert!(other.local.is_empty(), "{:?}", other.local);
    assert!(!t.is_empty());
}

#[test]
fn a_waiting_retry_begins_nothing_until_the_first_attempt_settles() {
    let d = dedupe();
    let mut first = plan(0, &[(id(0, 0, 9), 0)]);
    let t = d.begin(&mut first, "east", true).expect("begun");
    // The retry also carries a new batch of another partition: neither is
    // begun while it waits.
    let mut retry = plan(0, &[(id(0, 0, 9), 0)]);
    retry.forwarded_partitions = 2;
    retry
        .tracked
        .push(crate::mirror::produce::TrackedPartition {
            topic: topic(),
            partition: at(1),
            batch_count: 1,
            batches: vec![TrackedBatch {
                id: id(0, 0, 4),
                origin: origin(5),
                offset_delta: 0,
            }],
        });
    assert!(d.begin(&mut retry, "east", true).is_none());
    assert_eq!(retry.tracked.len(), 2, "the plan is left as it was");
    assert!(retry.local.is_empty());
    t.settle(&response(0, 0, 40), V, 1);
    let t2 = d.begin(&mut retry, "east", true).expect("begun");
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
    let t = d.begin(&mut first, "east", true).expect("begun");
    let changed = d.changed();
    tokio::pin!(changed);
    changed.as_mut().enable();
    t.settle(&response(0, 0, 1), V, 1);
    tokio::time::timeout(std::time::Duration::from_secs(5), changed)
        .await
        .expect("notified");
}
