//! The answers walk against a hand-written v9 response (exact bytes) and
//! responses encoded by `kafka-protocol` at every version.

use super::*;
use kafka_protocol::messages::produce_response::{
    LeaderIdAndEpoch, PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;

fn topic(name: &str, id: u128) -> TopicRef {
    TopicRef {
        name: TopicName(StrBytes::from_string(name.to_string())),
        topic_id: Uuid::from_u128(id),
    }
}

fn answer(error_code: i16, base_offset: i64, log_append_time_ms: i64) -> PartitionAnswer {
    PartitionAnswer {
        error_code,
        base_offset,
        log_append_time_ms,
        leader_id: -1,
    }
}

/// Produce v9 (flexible), correlation id 7: topic "t" with partition 0
/// (base offset 100) and partition 1 (error 6, NOT_LEADER_OR_FOLLOWER),
/// then topic "u" with partition 0 (base offset 5, log append time 1000).
fn v9_bytes() -> Vec<u8> {
    let mut f = vec![0, 0, 0, 7, 0]; // correlation id, header tags
    f.push(3); // two topics
    f.extend([2, b't', 3]); // "t", two partitions
    f.extend([0, 0, 0, 0, 0, 0]); // index 0, error 0
    f.extend(100i64.to_be_bytes());
    f.extend((-1i64).to_be_bytes()); // log append time
    f.extend(0i64.to_be_bytes()); // log start offset
    f.extend([1, 0, 0]); // no record errors, null message, tags
    f.extend([0, 0, 0, 1, 0, 6]); // index 1, error 6
    f.extend((-1i64).to_be_bytes());
    f.extend((-1i64).to_be_bytes());
    f.extend((-1i64).to_be_bytes());
    f.extend([1, 0, 0]);
    f.push(0); // topic tags
    f.extend([2, b'u', 2]); // "u", one partition
    f.extend([0, 0, 0, 0, 0, 0]);
    f.extend(5i64.to_be_bytes());
    f.extend(1000i64.to_be_bytes());
    f.extend(0i64.to_be_bytes());
    f.extend([1, 0, 0]);
    f.push(0);
    f.extend([0, 0, 0, 0, 0]); // throttle time, body tags
    f
}

#[test]
fn finds_each_asked_partition_in_exact_v9_bytes() {
    let (t, u, v) = (topic("t", 1), topic("u", 2), topic("v", 3));
    let asked = vec![(&u, 0), (&t, 1), (&t, 0), (&t, 5), (&v, 0)];
    let frame = v9_bytes();
    let mut a = Answers::new(asked);
    a.walk(&frame, 9).expect("walk");
    assert_eq!(
        a.into_found().to_vec(),
        vec![
            Some(answer(0, 5, 1000)),
            Some(answer(6, -1, -1)),
            Some(answer(0, 100, -1)),
            None,
            None,
        ]
    );
}

#[test]
fn a_cut_or_padded_response_is_an_error() {
    let t = topic("t", 1);
    let frame = v9_bytes();
    for cut in [3, 5, 9, frame.len() - 1] {
        let mut a = Answers::new(vec![(&t, 0)]);
        assert!(a.walk(&frame[..cut], 9).is_err(), "cut at {cut}");
    }
    let mut padded = frame.clone();
    padded.push(0);
    assert!(Answers::new(vec![(&t, 0)]).walk(&padded, 9).is_err());
    // A forged topic count: an error, no allocation sized by it.
    let mut forged = frame;
    forged[5] = 0xff;
    assert!(Answers::new(vec![(&t, 0)]).walk(&forged, 9).is_err());
}

fn encoded(version: i16, response: &ProduceResponse) -> Vec<u8> {
    crate::mirror::produce::encode_response(3, version, response)
        .expect("encode")
        .to_vec()
}

#[test]
fn matches_topics_by_name_before_v13_and_by_id_from_v13_at_every_version() {
    let (a, b) = (topic("a", 0xa), topic("b", 0xb));
    let response = ProduceResponse::default().with_responses(vec![
        TopicProduceResponse::default()
            .with_name(a.name.clone())
            .with_topic_id(a.topic_id)
            .with_partition_responses(vec![PartitionProduceResponse::default()
                .with_index(2)
                .with_base_offset(40)
                .with_log_append_time_ms(-1)]),
        TopicProduceResponse::default()
            .with_name(b.name.clone())
            .with_topic_id(b.topic_id)
            .with_partition_responses(vec![PartitionProduceResponse::default()
                .with_index(2)
                .with_error_code(6)
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_current_leader(
                    LeaderIdAndEpoch::default()
                        .with_leader_id(4.into())
                        .with_leader_epoch(9),
                )]),
    ]);
    for version in 3..=13 {
        let frame = encoded(version, &response);
        let mut found = Answers::new(vec![(&b, 2), (&a, 2)]);
        found.walk(&frame, version).expect("walk");
        // The current leader exists from v10.
        let leader = if version >= 10 { 4 } else { -1 };
        assert_eq!(
            found.into_found().to_vec(),
            vec![
                Some(PartitionAnswer {
                    leader_id: leader,
                    ..answer(6, -1, -1)
                }),
                Some(answer(0, 40, -1)),
            ],
            "v{version}"
        );
    }
}

#[test]
fn the_first_answer_for_a_partition_counts() {
    let t = topic("t", 1);
    let part = |base| {
        PartitionProduceResponse::default()
            .with_index(0)
            .with_base_offset(base)
            .with_log_append_time_ms(-1)
    };
    let response = ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
        .with_name(t.name.clone())
        .with_partition_responses(vec![part(10), part(20)])]);
    let frame = encoded(9, &response);
    let mut a = Answers::new(vec![(&t, 0)]);
    a.walk(&frame, 9).expect("walk");
    assert_eq!(a.into_found().to_vec(), vec![Some(answer(0, 10, -1))]);
}

#[test]
fn a_response_naming_a_moved_leader_is_answered_then_left_to_the_address_rewrite() {
    use kafka_protocol::messages::produce_response::NodeEndpoint;
    use kafka_protocol::messages::BrokerId;
    let orders = topic("orders", 0);
    let moved = ProduceResponse::default()
        .with_responses(vec![TopicProduceResponse::default()
            .with_name(orders.name.clone())
            .with_partition_responses(vec![PartitionProduceResponse::default()
                .with_index(3)
                .with_error_code(6)
                .with_base_offset(-1)
                .with_current_leader(
                    LeaderIdAndEpoch::default().with_leader_id(BrokerId(2)),
                )])])
        .with_node_endpoints(vec![NodeEndpoint::default()
            .with_node_id(BrokerId(2))
            .with_host(StrBytes::from_static_str("b2.internal.example.com"))
            .with_port(9092)]);
    for version in 10..=13 {
        let frame = encoded(version, &moved);
        let mut answers = Answers::new(vec![(&orders, 3)]);
        let walked = answers.walk(&frame, version).expect("walk");
        assert_eq!(walked, Walked::NamesBrokers, "v{version}");
        assert_eq!(
            answers.into_found().to_vec(),
            vec![Some(PartitionAnswer {
                leader_id: 2,
                ..answer(6, -1, -1)
            })],
            "v{version}"
        );
        // The response half then rewrites the endpoint with a schema walk:
        // `filter::addresses`' test of Produce responses with endpoints.
    }
}
