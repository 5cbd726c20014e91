use super::*;
use crate::wire::batch::{build, BatchHeader, NewBatch, NewRecord};

const PID: i64 = -5136071999516311547;
const P0: (u8, i32) = (1, 0);

fn id(epoch: i16, first_seq: i32, last_seq: i32) -> BatchId {
    BatchId {
        producer_id: PID,
        epoch,
        first_seq,
        last_seq,
    }
}

fn states() -> ProducerStates<(u8, i32)> {
    ProducerStates::new(100)
}

/// Appends `b` through the whole cycle: begin, broker answer.
fn append(s: &mut ProducerStates<(u8, i32)>, b: BatchId, base_offset: i64) {
    assert_eq!(s.begin(&P0, &b), Check::Append, "{b:?}");
    s.appended(&P0, &b, base_offset, 1_000 + base_offset);
}

fn refusal(c: Check) -> (i16, String) {
    match c {
        Check::Refuse { kind, message } => (kind.error_code(), message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn last_sequence_wraps_like_kafka() {
    assert_eq!(last_sequence(5, 0), 5);
    assert_eq!(last_sequence(5, 9), 14);
    assert_eq!(last_sequence(i32::MAX - 2, 2), i32::MAX);
    // incrementSequence(MAX - 1, 3) = 3 - (MAX - (MAX - 1)) - 1 = 1
    assert_eq!(last_sequence(i32::MAX - 1, 3), 1);
    assert_eq!(last_sequence(i32::MAX, 1), 0);
    assert_eq!(last_sequence(NO_SEQUENCE, 4), NO_SEQUENCE);
}

#[test]
fn after_is_serial_arithmetic_over_2_pow_31() {
    assert!(is_after(9, 10));
    assert!(is_after(9, 15), "a forward gap");
    assert!(!is_after(9, 9));
    assert!(!is_after(9, 5));
    assert!(is_after(i32::MAX, 0), "wrap-around");
    assert!(is_after(i32::MAX - 2, 3), "a gap across the wrap");
    assert!(!is_after(0, i32::MAX), "just before, across the wrap");
    // (next - last - 1) mod 2^31 missing sequences: at most 2^30 - 1.
    assert!(is_after(0, 1 << 30), "largest gap");
    assert!(
        !is_after(0, (1 << 30) + 1),
        "half the space ahead counts as behind"
    );
}

#[test]
fn an_unknown_producer_appends() {
    let mut s = states();
    assert_eq!(s.check(&P0, &id(0, 0, 4)), Check::Append);
    assert_eq!(s.check(&P0, &id(3, 700, 704)), Check::Append);
    assert!(s.is_empty(), "check alone keeps nothing");
}

#[test]
fn the_next_batch_and_a_forward_gap_append() {
    let mut s = states();
    append(&mut s, id(0, 0, 4), 100);
    assert_eq!(s.check(&P0, &id(0, 5, 9)), Check::Append);
    assert_eq!(s.check(&P0, &id(0, 50, 59)), Check::Append, "gap");
}

#[test]
fn a_duplicate_of_each_of_the_last_five_gets_its_offset() {
    let mut s = states();
    for i in 0..7 {
        append(&mut s, id(2, i * 10, i * 10 + 9), 1000 + i64::from(i) * 10);
    }
    let e = s.entry(&P0, PID).expect("entry");
    assert_eq!(e.batches().len(), RETAINED_BATCHES);
    assert_eq!(e.epoch(), 2);
    for i in 2..7 {
        assert_eq!(
            s.check(&P0, &id(2, i * 10, i * 10 + 9)),
            Check::Duplicate {
                base_offset: 1000 + i64::from(i) * 10
            },
            "batch {i}"
        );
    }
    // Older than the last five: it overlaps, and nothing proves it landed.
    let (code, message) = refusal(s.check(&P0, &id(2, 10, 19)));
    assert_eq!(code, OUT_OF_ORDER_SEQUENCE_NUMBER);
    assert!(message.contains("10..=19"), "{message}");
}

#[test]
fn an_overlap_that_is_not_an_exact_duplicate_is_refused() {
    let mut s = states();
    append(&mut s, id(0, 0, 9), 0);
    append(&mut s, id(0, 10, 19), 10);
    for b in [
        id(0, 10, 14),
        id(0, 15, 24),
        id(0, 5, 14),
        id(0, 19, 19),
        id(0, 0, 19),
    ] {
        let (code, _) = refusal(s.check(&P0, &b));
        assert_eq!(code, OUT_OF_ORDER_SEQUENCE_NUMBER, "{b:?}");
    }
    assert_eq!(s.check(&P0, &id(0, 20, 20)), Check::Append);
}

#[test]
fn an_older_epoch_is_refused() {
    let mut s = states();
    append(&mut s, id(3, 0, 9), 0);
    let (code, message) = refusal(s.check(&P0, &id(2, 10, 19)));
    assert_eq!(code, INVALID_PRODUCER_EPOCH);
    assert!(
        message.contains("epoch 2") && message.contains("3"),
        "{message}"
    );
    // Even a batch that would have been a duplicate under the old epoch.
    let (code, _) = refusal(s.check(&P0, &id(2, 0, 9)));
    assert_eq!(code, INVALID_PRODUCER_EPOCH);
}

#[test]
fn an_epoch_bump_resets_the_sequences() {
    let mut s = states();
    append(&mut s, id(0, 0, 9), 0);
    append(&mut s, id(0, 10, 19), 10);
    assert_eq!(s.check(&P0, &id(1, 0, 4)), Check::Append);
    assert_eq!(s.check(&P0, &id(1, 37, 40)), Check::Append, "any start");
    append(&mut s, id(1, 0, 4), 20);
    let e = s.entry(&P0, PID).expect("entry");
    assert_eq!(e.epoch(), 1);
    assert_eq!(e.batches().len(), 1, "the old epoch's batches are gone");
    assert_eq!(
        s.check(&P0, &id(1, 0, 4)),
        Check::Duplicate { base_offset: 20 }
    );
    assert_eq!(
        refusal(s.check(&P0, &id(0, 20, 29))).0,
        INVALID_PRODUCER_EPOCH
    );
}

#[test]
fn sequences_wrap_around() {
    let mut s = states();
    let max = i32::MAX;
    append(&mut s, id(0, max - 9, max), 0);
    // Spans the wrap: MAX - 1, MAX, 0, 1.
    let spanning = id(0, 0, 3);
    assert_eq!(s.check(&P0, &spanning), Check::Append);
    append(&mut s, spanning, 10);
    let across = id(0, 4, last_sequence(4, 5));
    append(&mut s, across, 14);
    assert_eq!(
        s.check(&P0, &id(0, 0, 3)),
        Check::Duplicate { base_offset: 10 }
    );
    assert_eq!(
        s.check(&P0, &id(0, max - 9, max)),
        Check::Duplicate { base_offset: 0 }
    );
    assert_eq!(
        refusal(s.check(&P0, &id(0, max - 3, 1))).0,
        OUT_OF_ORDER_SEQUENCE_NUMBER
    );
    assert_eq!(s.check(&P0, &id(0, 10, 12)), Check::Append);

    // A batch whose own range wraps, recorded and found again.
    let mut s = states();
    append(&mut s, id(0, max - 4, max - 2), 0);
    let wrapping = id(0, max - 1, last_sequence(max - 1, 3));
    assert_eq!(wrapping.last_seq, 1);
    append(&mut s, wrapping, 3);
    assert_eq!(s.check(&P0, &wrapping), Check::Duplicate { base_offset: 3 });
    assert_eq!(s.check(&P0, &id(0, 2, 2)), Check::Append);
    assert_eq!(
        refusal(s.check(&P0, &id(0, 0, 5))).0,
        OUT_OF_ORDER_SEQUENCE_NUMBER
    );
}

#[test]
fn a_retry_of_a_batch_in_flight_waits() {
    let mut s = states();
    let b = id(0, 0, 9);
    assert_eq!(s.begin(&P0, &b), Check::Append);
    assert_eq!(s.begin(&P0, &b), Check::InFlight);
    assert_eq!(s.check(&P0, &b), Check::InFlight);
    assert_eq!(s.entry(&P0, PID).map(|e| e.in_flight_count()), Some(1));
    s.appended(&P0, &b, 42, 7);
    assert_eq!(s.check(&P0, &b), Check::Duplicate { base_offset: 42 });
    let e = s.entry(&P0, PID).expect("entry");
    assert_eq!(e.in_flight_count(), 0);
    assert_eq!(
        e.batches(),
        [AppendedBatch {
            first_seq: 0,
            last_seq: 9,
            base_offset: 42,
            append_time_ms: 7
        }]
    );
}

#[test]
fn a_failed_flight_lets_the_retry_append() {
    let mut s = states();
    let b = id(0, 0, 9);
    assert_eq!(s.begin(&P0, &b), Check::Append);
    s.failed(&P0, &b);
    assert!(
        s.is_empty(),
        "an entry that held only the flight is dropped"
    );
    assert_eq!(s.begin(&P0, &b), Check::Append);

    append(&mut s, id(0, 10, 19), 10);
    let next = id(0, 20, 29);
    assert_eq!(s.begin(&P0, &next), Check::Append);
    s.failed(&P0, &next);
    assert_eq!(s.len(), 1, "a producer with appended batches stays");
    assert_eq!(s.begin(&P0, &next), Check::Append);
}

#[test]
fn pipelined_batches_are_checked_against_those_in_flight() {
    let mut s = states();
    append(&mut s, id(0, 0, 9), 0);
    assert_eq!(s.begin(&P0, &id(0, 10, 19)), Check::Append);
    assert_eq!(s.begin(&P0, &id(0, 20, 29)), Check::Append);
    assert_eq!(
        refusal(s.check(&P0, &id(0, 25, 34))).0,
        OUT_OF_ORDER_SEQUENCE_NUMBER,
        "overlaps a batch in flight"
    );
    assert_eq!(s.check(&P0, &id(0, 30, 39)), Check::Append);
}

#[test]
fn an_epoch_in_flight_counts_as_current() {
    let mut s = states();
    append(&mut s, id(0, 0, 9), 0);
    assert_eq!(s.begin(&P0, &id(1, 0, 4)), Check::Append);
    assert_eq!(
        refusal(s.check(&P0, &id(0, 10, 19))).0,
        INVALID_PRODUCER_EPOCH
    );
    assert_eq!(s.check(&P0, &id(1, 5, 9)), Check::Append);
}

#[test]
fn at_most_five_batches_in_flight() {
    let mut s = states();
    for i in 0..MAX_IN_FLIGHT as i32 {
        assert_eq!(s.begin(&P0, &id(0, i * 10, i * 10 + 9)), Check::Append);
    }
    let (code, message) = refusal(s.begin(&P0, &id(0, 50, 59)));
    assert_eq!(code, OUT_OF_ORDER_SEQUENCE_NUMBER);
    // The client's message, word for word.
    assert!(
        message.starts_with("producer ") && message.ends_with(" has 5 batches in flight already"),
        "{message}"
    );
}

#[test]
fn the_least_recently_used_producer_is_evicted_first() {
    let mut s: ProducerStates<(u8, i32)> = ProducerStates::new(3);
    let (a, b, c, d) = (-10, -11, -12, -13);
    let batch = |pid| BatchId {
        producer_id: pid,
        epoch: 0,
        first_seq: 0,
        last_seq: 0,
    };
    s.appended(&(1, 0), &batch(a), 0, 0);
    s.appended(&(1, 1), &batch(b), 0, 0);
    s.appended(&(1, 0), &batch(c), 1, 0);
    // Using a makes b the least recently used.
    assert_eq!(
        s.check(&(1, 0), &batch(a)),
        Check::Duplicate { base_offset: 0 }
    );
    s.appended(&(1, 0), &batch(d), 2, 0);
    assert_eq!((s.len(), s.evictions()), (3, 1));
    assert!(s.entry(&(1, 1), b).is_none(), "b evicted");
    assert!(s.entry(&(1, 0), a).is_some() && s.entry(&(1, 0), c).is_some());
    // Next: c (a was used after it).
    s.appended(&(2, 0), &batch(b), 0, 0);
    assert!(s.entry(&(1, 0), c).is_none(), "c evicted");
    assert_eq!((s.len(), s.evictions()), (3, 2));
    // An evicted producer is unknown again: its retry appends.
    assert_eq!(s.check(&(1, 0), &batch(c)), Check::Append);
}

#[test]
fn a_producer_with_a_batch_in_flight_is_never_evicted() {
    let mut s: ProducerStates<(u8, i32)> = ProducerStates::new(2);
    let batch = |pid, seq| BatchId {
        producer_id: pid,
        epoch: 0,
        first_seq: seq,
        last_seq: seq,
    };
    let (a, b, c) = (-10, -11, -12);
    // a: appended once, then a second batch in flight (begun, not settled).
    assert_eq!(s.begin(&P0, &batch(a, 0)), Check::Append);
    s.appended(&P0, &batch(a, 0), 0, 0);
    assert_eq!(s.begin(&P0, &batch(a, 1)), Check::Append);
    // b: appended, nothing in flight; then used, so a is the least
    // recently used.
    s.appended(&P0, &batch(b, 0), 1, 0);
    assert_eq!(
        s.check(&P0, &batch(b, 0)),
        Check::Duplicate { base_offset: 1 }
    );
    assert_eq!(s.busy(), 1);
    // A new producer at the bound: b is evicted, not a (least recently
    // used, but busy).
    assert_eq!(s.begin(&P0, &batch(c, 0)), Check::Append);
    assert_eq!((s.len(), s.evictions()), (2, 1));
    assert!(s.entry(&P0, b).is_none(), "b evicted");
    assert_eq!(s.entry(&P0, a).map(|e| e.in_flight_count()), Some(1));
    // a's retry of the batch in flight still waits for it: not appended
    // again.
    assert_eq!(s.begin(&P0, &batch(a, 1)), Check::InFlight);
    // Settled, then retried: a duplicate.
    s.appended(&P0, &batch(a, 1), 2, 0);
    assert_eq!(
        s.begin(&P0, &batch(a, 1)),
        Check::Duplicate { base_offset: 2 }
    );
}

#[test]
fn a_new_producer_is_refused_retriable_when_every_producer_held_is_busy() {
    let mut s: ProducerStates<(u8, i32)> = ProducerStates::new(2);
    let batch = |pid, seq| BatchId {
        producer_id: pid,
        epoch: 0,
        first_seq: seq,
        last_seq: seq,
    };
    let (a, b, c) = (-10, -11, -12);
    assert_eq!(s.begin(&P0, &batch(a, 0)), Check::Append);
    assert_eq!(s.begin(&(1, 1), &batch(b, 0)), Check::Append);
    assert_eq!(s.busy(), 2);
    let (code, message) = refusal(s.begin(&P0, &batch(c, 0)));
    assert_eq!(code, NOT_ENOUGH_REPLICAS, "retriable");
    assert!(message.contains("in flight"), "{message}");
    assert_eq!((s.len(), s.evictions(), s.full_refusals()), (2, 0, 1));
    assert!(s.entry(&P0, c).is_none(), "nothing kept of the refused one");
    // Both in-flight batches are still known: their retries wait.
    assert_eq!(s.begin(&P0, &batch(a, 0)), Check::InFlight);
    assert_eq!(s.begin(&(1, 1), &batch(b, 0)), Check::InFlight);
    // A replayed batch of a new producer finds no room either, and says so.
    // Once one settles, the new producer gets its place.
    s.appended(&P0, &batch(a, 0), 0, 0);
    assert_eq!(s.busy(), 1);
    assert_eq!(s.begin(&P0, &batch(c, 0)), Check::Append);
    assert!(s.entry(&P0, a).is_none(), "a, idle now, evicted");
    assert_eq!(s.begin(&(1, 1), &batch(b, 0)), Check::InFlight);
    // A failed flight frees the producer too.
    s.failed(&(1, 1), &batch(b, 0));
    s.failed(&P0, &batch(c, 0));
    assert_eq!((s.busy(), s.len()), (0, 0));
}

#[test]
fn a_replay_with_no_room_is_counted_not_taken() {
    let mut s: ProducerStates<(u8, i32)> = ProducerStates::new(1);
    let busy = BatchId {
        producer_id: -10,
        epoch: 0,
        first_seq: 0,
        last_seq: 0,
    };
    assert_eq!(s.begin(&(1, 1), &busy), Check::Append);
    let log = log_batch(7, PID, 0, 0, 1, false);
    let r = s.replay_records(&P0, &log);
    assert_eq!((r.batches, r.taken, r.untaken), (1, 0, 1));
    assert!(s.entry(&P0, PID).is_none());
}

#[test]
fn forgetting_appended_batches_keeps_those_in_flight() {
    let mut s = states();
    append(&mut s, id(0, 0, 4), 100);
    assert_eq!(s.begin(&P0, &id(0, 5, 9)), Check::Append);
    s.appended(&(1, 1), &id(0, 0, 9), 0, 0);
    assert_eq!(s.forget_appended_where(|p| *p == P0), 1);
    // What was appended is forgotten: no longer a duplicate (behind the
    // batch in flight, it is out of order meanwhile).
    assert_eq!(s.entry(&P0, PID).map(|e| e.batches().len()), Some(0));
    assert!(matches!(s.check(&P0, &id(0, 0, 4)), Check::Refuse { .. }));
    // What is in flight is not: its retry waits.
    assert_eq!(s.check(&P0, &id(0, 5, 9)), Check::InFlight);
    // Another partition keeps everything.
    assert_eq!(
        s.check(&(1, 1), &id(0, 0, 9)),
        Check::Duplicate { base_offset: 0 }
    );
    // An entry with nothing left is dropped; then the forgotten batch's
    // retry appends (the log decides, through the rebuild).
    s.failed(&P0, &id(0, 5, 9));
    assert!(s.entry(&P0, PID).is_none());
    assert_eq!(s.len(), 1);
    assert_eq!(s.check(&P0, &id(0, 0, 4)), Check::Append);
}

#[test]
fn clearing_a_partition_drops_its_producers() {
    let mut s = states();
    append(&mut s, id(0, 0, 9), 0);
    s.appended(&(1, 1), &id(0, 0, 9), 0, 0);
    assert_eq!(s.clear_partition(&P0), 1);
    assert_eq!(s.len(), 1);
    assert_eq!(s.check(&P0, &id(0, 0, 9)), Check::Append);
}

fn log_batch(
    base_offset: i64,
    producer_id: i64,
    epoch: i16,
    seq: i32,
    n: usize,
    control: bool,
) -> Vec<u8> {
    let records: Vec<NewRecord<'_>> = (0..n)
        .map(|i| NewRecord {
            key: None,
            value: Some(b"v"),
            headers: &[],
            timestamp: 5_000 + i as i64,
        })
        .collect();
    let mut b = build(
        &NewBatch {
            producer_id,
            producer_epoch: epoch,
            base_sequence: seq,
            transactional: false,
            control,
        },
        &records,
    )
    .expect("build");
    b[..8].copy_from_slice(&base_offset.to_be_bytes());
    b
}

#[test]
fn rebuilt_from_the_log_tail() {
    let log = [
        log_batch(0, PID, 0, 0, 3, false),
        log_batch(3, 7, 0, 0, 2, false), // a local producer: ignored
        log_batch(5, -1, -1, -1, 1, false), // no producer: ignored
        log_batch(6, PID, 0, 3, 2, false),
        log_batch(8, PID, 0, 0, 1, true), // control: ignored
        log_batch(9, PID - 1, 4, 100, 1, false),
    ];
    let mut s = states();
    let taken: Vec<bool> = log
        .iter()
        .map(|b| s.replay(&P0, &BatchHeader::parse(b).expect("header")))
        .collect();
    assert_eq!(taken, [true, false, false, true, false, true]);
    assert_eq!(s.len(), 2);
    let e = s.entry(&P0, PID).expect("entry");
    assert_eq!(
        e.batches(),
        [
            AppendedBatch {
                first_seq: 0,
                last_seq: 2,
                base_offset: 0,
                append_time_ms: 5_002
            },
            AppendedBatch {
                first_seq: 3,
                last_seq: 4,
                base_offset: 6,
                append_time_ms: 5_001
            },
        ]
    );
    assert_eq!(
        s.check(&P0, &id(0, 3, 4)),
        Check::Duplicate { base_offset: 6 }
    );
    assert_eq!(
        refusal(s.check(&P0, &id(0, 4, 5))).0,
        OUT_OF_ORDER_SEQUENCE_NUMBER
    );
    assert_eq!(s.check(&P0, &id(0, 5, 9)), Check::Append);
    let other = BatchId {
        producer_id: PID - 1,
        epoch: 4,
        first_seq: 100,
        last_seq: 100,
    };
    assert_eq!(s.check(&P0, &other), Check::Duplicate { base_offset: 9 });
}

#[test]
fn batch_id_from_a_header() {
    let b = log_batch(0, PID, 3, i32::MAX - 1, 4, false);
    let h = BatchHeader::parse(&b).expect("header");
    assert_eq!(
        BatchId::from_header(&h),
        BatchId {
            producer_id: PID,
            epoch: 3,
            first_seq: i32::MAX - 1,
            last_seq: 1
        }
    );
}

#[test]
fn rebuilt_from_fetched_records_up_to_a_partial_batch() {
    let mut records = Vec::new();
    records.extend(log_batch(10, PID, 2, 7, 3, false));
    records.extend(log_batch(13, 8, 0, 0, 1, false));
    records.extend(log_batch(14, PID, 2, 10, 2, false));
    let cut = log_batch(16, PID, 2, 12, 2, false);
    records.extend_from_slice(&cut[..cut.len() - 1]);
    let mut s = states();
    assert_eq!(
        s.replay_records(&P0, &records),
        Replayed {
            batches: 3,
            taken: 2,
            next_offset: Some(16),
            truncated: true,
            untaken: 0,
        }
    );
    assert_eq!(
        s.check(&P0, &id(2, 10, 11)),
        Check::Duplicate { base_offset: 14 }
    );
    assert_eq!(
        s.check(&P0, &id(2, 12, 13)),
        Check::Append,
        "the cut batch is not known"
    );
    assert_eq!(
        s.replay_records(&P0, &[]),
        Replayed::default(),
        "an empty tail"
    );
}

#[test]
fn a_batch_without_a_sequence_is_not_tracked() {
    let mut s = states();
    append(&mut s, id(0, 0, 9), 0);
    let plain = id(0, NO_SEQUENCE, NO_SEQUENCE);
    assert_eq!(s.begin(&P0, &plain), Check::Append);
    assert_eq!(s.begin(&P0, &plain), Check::Append, "never in flight");
    s.appended(&P0, &plain, 10, 0);
    s.failed(&P0, &plain);
    let e = s.entry(&P0, PID).expect("entry");
    assert_eq!((e.batches().len(), e.in_flight_count()), (1, 0));
    assert_eq!(s.check(&P0, &id(0, 10, 19)), Check::Append);
}

#[test]
fn a_rebuild_merges_into_batches_recorded_meanwhile_in_log_order() {
    let mut s = states();
    // A live response recorded the newest batch first (offset 40)...
    append(&mut s, id(0, 40, 49), 40);
    // ...then the rebuild replays the tail, older batches and that one too.
    let log: Vec<u8> = [
        log_batch(0, PID, 0, 0, 10, false),
        log_batch(10, PID, 0, 10, 10, false),
        log_batch(20, PID, 0, 20, 10, false),
        log_batch(30, PID, 0, 30, 10, false),
        log_batch(40, PID, 0, 40, 10, false),
    ]
    .concat();
    let r = s.replay_records(&P0, &log);
    assert_eq!((r.batches, r.taken), (5, 5));
    let offsets: Vec<i64> = s
        .entry(&P0, PID)
        .expect("entry")
        .batches()
        .iter()
        .map(|b| b.base_offset)
        .collect();
    assert_eq!(offsets, [0, 10, 20, 30, 40], "log order, no copy twice");
    // The next batch is after the newest, not after the last replayed.
    assert_eq!(s.check(&P0, &id(0, 50, 59)), Check::Append);
    assert_eq!(
        refusal(s.check(&P0, &id(0, 45, 54))).0,
        OUT_OF_ORDER_SEQUENCE_NUMBER
    );
    // A sixth, newer batch pushes out the oldest; one older than all five
    // retained is not kept (it is not one of the last five).
    append(&mut s, id(0, 50, 59), 50);
    s.appended(&P0, &id(0, 100, 100), -5, 0);
    let offsets: Vec<i64> = s
        .entry(&P0, PID)
        .expect("entry")
        .batches()
        .iter()
        .map(|b| b.base_offset)
        .collect();
    assert_eq!(offsets, [10, 20, 30, 40, 50]);
    // Replayed in any order, the same five.
    let mut t = states();
    for b in [40i32, 0, 30, 10, 50, 20] {
        t.appended(&P0, &id(0, b, b + 9), i64::from(b), 0);
    }
    let e = t.entry(&P0, PID).expect("entry");
    assert_eq!(
        e.batches()
            .iter()
            .map(|b| b.base_offset)
            .collect::<Vec<_>>(),
        [10, 20, 30, 40, 50]
    );
}
