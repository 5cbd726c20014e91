//! The dedupe check of a batch from a known producer is on the Produce hot
//! path and must not allocate (issue 9). Counted with a global allocator
//! that counts this thread's allocations (`support/counting_alloc.rs`); a
//! test binary of its own, so the counting allocator touches nothing else.

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use kafka_mirror_proxy::mirror::producer_state::{BatchId, Check, ProducerStates};

use counting_alloc::allocations;

#[test]
fn checking_and_recording_a_known_producer_does_not_allocate() {
    let mut states: ProducerStates<(u128, i32)> = ProducerStates::new(1000);
    let partition = (7u128, 3);
    for i in 0..100 {
        let id = BatchId {
            producer_id: -1000 - i,
            epoch: 0,
            first_seq: 0,
            last_seq: 9,
        };
        states.appended(&partition, &id, i * 10, 0);
    }
    let producer_id = -1042;
    let before = allocations();
    let mut offset = 1000;
    for n in 1..1000 {
        let id = BatchId {
            producer_id,
            epoch: 0,
            first_seq: n * 10,
            last_seq: n * 10 + 9,
        };
        assert_eq!(states.begin(&partition, &id), Check::Append);
        assert_eq!(states.check(&partition, &id), Check::InFlight);
        states.appended(&partition, &id, offset, 0);
        assert_eq!(
            states.check(&partition, &id),
            Check::Duplicate {
                base_offset: offset
            }
        );
        offset += 10;
    }
    let failed = BatchId {
        producer_id,
        epoch: 1,
        first_seq: 0,
        last_seq: 0,
    };
    assert_eq!(states.begin(&partition, &failed), Check::Append);
    states.failed(&partition, &failed);
    assert_eq!(allocations() - before, 0, "allocations on the hot path");

    // The counter does count: a refusal builds its message.
    let before = allocations();
    let older = BatchId {
        producer_id,
        epoch: 0,
        first_seq: 5,
        last_seq: 5,
    };
    assert!(matches!(
        states.check(&partition, &older),
        Check::Refuse { .. }
    ));
    assert!(allocations() > before);
}
