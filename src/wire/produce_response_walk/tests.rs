//! The hand-written Produce response walk: exact bytes in, exact events
//! out; and held to the schema walk on responses `kafka-protocol` encodes
//! at every version, whole and damaged.

use super::*;
use crate::wire::schema::{message, Field, Type, Versions};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, LeaderIdAndEpoch, NodeEndpoint, PartitionProduceResponse,
    TopicProduceResponse,
};
use kafka_protocol::messages::{BrokerId, ProduceResponse, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Both walks on `body`: the same events, and the same result unless this
/// walk stopped at leader endpoints. This walk's result is returned.
fn both(version: i16, body: &[u8]) -> (Vec<Event>, Result<Walked, WalkError>) {
    let (ours, result) = events(version, body, 0);
    let (theirs, schema) = schema_events(version, body, 0);
    assert_eq!(ours, theirs, "v{version}: {body:02x?}");
    match &result {
        Ok(Walked::Whole) => assert_eq!(schema, Ok(()), "v{version}: {body:02x?}"),
        Err(e) => assert_eq!(schema.as_ref(), Err(e), "v{version}: {body:02x?}"),
        Ok(Walked::NamesBrokers) => {}
    }
    (ours, result)
}

#[test]
fn the_layout_spelled_out_here_is_the_compiled_in_schema() {
    fn flatten(fields: &[Field], out: &mut Vec<(String, Versions, Versions, Option<u32>)>) {
        for f in fields {
            out.push((f.path.clone(), f.versions, f.nullable, f.tag.map(|t| t.0)));
            let inner = match &f.ty {
                Type::Array(inner) => inner.as_ref(),
                other => other,
            };
            if let Type::Struct(fields) = inner {
                flatten(fields, out);
            }
        }
    }
    let m = message("ProduceResponse").expect("schema");
    assert_eq!((m.valid.min, m.valid.max), VERSIONS);
    assert_eq!((m.flexible.min, m.flexible.max), (FIRST_FLEXIBLE, i16::MAX));
    let mut layout = Vec::new();
    flatten(&m.fields, &mut layout);
    let v = |min, max| Versions { min, max };
    let from = |min| v(min, i16::MAX);
    let none = Versions::NONE;
    let node = "NodeEndpoints";
    let expected = vec![
        (RESPONSES.to_string(), from(0), none, None),
        (NAME.to_string(), v(0, FIRST_BY_ID - 1), none, None),
        (TOPIC_ID.to_string(), from(FIRST_BY_ID), none, None),
        (PARTITIONS.to_string(), from(0), none, None),
        (INDEX.to_string(), from(0), none, None),
        (ERROR_CODE.to_string(), from(0), none, None),
        (BASE_OFFSET.to_string(), from(0), none, None),
        (LOG_APPEND_TIME.to_string(), from(2), none, None),
        (
            LOG_START_OFFSET.to_string(),
            from(FIRST_LOG_START_OFFSET),
            none,
            None,
        ),
        (
            RECORD_ERRORS.to_string(),
            from(FIRST_RECORD_ERRORS),
            none,
            None,
        ),
        (BATCH_INDEX.to_string(), from(8), none, None),
        (BATCH_ERROR.to_string(), from(8), from(8), None),
        (
            ERROR_MESSAGE.to_string(),
            from(FIRST_RECORD_ERRORS),
            from(8),
            None,
        ),
        (
            CURRENT_LEADER.to_string(),
            from(FIRST_LEADERS),
            none,
            Some(0),
        ),
        (LEADER_ID.to_string(), from(10), none, None),
        (LEADER_EPOCH.to_string(), from(10), none, None),
        (THROTTLE.to_string(), from(1), none, None),
        (node.to_string(), from(FIRST_LEADERS), none, Some(0)),
        (format!("{node}.NodeId"), from(10), none, None),
        (format!("{node}.Host"), from(10), none, None),
        (format!("{node}.Port"), from(10), none, None),
        (format!("{node}.Rack"), from(10), from(10), None),
    ];
    assert_eq!(layout, expected);
}

/// v10: topic "t", partition 4 answered with error 6 (not leader), base
/// offset -1, no log append time, and leader 2 (epoch 7) as `CurrentLeader`;
/// no throttle, no leader endpoints.
#[test]
fn a_v10_body_reports_its_answer_and_the_leader_it_names() {
    let mut b = vec![0x02, 0x02, b't', 0x02];
    b.extend_from_slice(&[0, 0, 0, 4, 0, 6]);
    b.extend_from_slice(&[0xFF; 8]); // base offset
    b.extend_from_slice(&[0xFF; 8]); // log append time
    b.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]); // log start offset
    b.extend_from_slice(&[0x01, 0x00]); // no record errors, null message
    b.extend_from_slice(&[0x01, 0x00, 0x09, 0, 0, 0, 2, 0, 0, 0, 7, 0x00]);
    b.extend_from_slice(&[0x00, 0, 0, 0, 0, 0x00]); // topic tags, throttle, tags
    let (events, result) = both(10, &b);
    assert_eq!(result, Ok(Walked::Whole));
    assert_eq!(
        events,
        vec![
            Event::Name(b"t".to_vec()),
            Event::Partition(Partition {
                index: 4,
                error_code: 6,
                base_offset: -1,
                log_append_time_ms: -1,
                leader_id: 2,
            }),
        ]
    );
    // A CurrentLeader that declares more bytes than its value takes.
    let mut padded = b.clone();
    padded[38] = 0x0A;
    padded.insert(48, 0);
    assert_eq!(
        both(10, &padded).1,
        Err(WalkError::TaggedSize {
            path: CURRENT_LEADER.into(),
            tag: 0,
            size: 10,
            used: 9,
        })
    );
}

#[test]
fn leader_endpoints_stop_the_walk_for_the_schema_walk() {
    let with = ProduceResponse::default().with_node_endpoints(vec![NodeEndpoint::default()
        .with_node_id(BrokerId(2))
        .with_host(StrBytes::from_static_str("b2.internal"))
        .with_port(9092)]);
    for version in FIRST_LEADERS..=VERSIONS.1 {
        let mut out = BytesMut::new();
        with.encode(&mut out, version).expect("encode");
        assert_eq!(
            both(version, &out).1,
            Ok(Walked::NamesBrokers),
            "v{version}"
        );
    }
    // v9 has no leader endpoints: tag 0 there is an unknown field, skipped.
    let b = [0x01, 0, 0, 0, 0, 0x01, 0x00, 0x01, 0xAA];
    assert_eq!(both(9, &b).1, Ok(Walked::Whole));
}

#[test]
fn a_forged_partition_count_is_an_error_not_an_allocation() {
    // v8: one topic "t", then 2^31-1 partitions and nothing behind them.
    let b = [0, 0, 0, 1, 0, 1, b't', 0x7F, 0xFF, 0xFF, 0xFF];
    let (events, result) = both(8, &b);
    assert_eq!(events, vec![Event::Name(b"t".to_vec())]);
    assert_eq!(
        result,
        Err(WalkError::Count {
            path: PARTITIONS.into(),
            at: 7,
            count: i32::MAX as u64,
            left: 0,
        })
    );
}

fn tags(on: bool) -> BTreeMap<i32, Bytes> {
    match on {
        true => BTreeMap::from([(3, Bytes::from_static(b"xyz")), (40_000, Bytes::new())]),
        false => BTreeMap::new(),
    }
}

fn arb_partition() -> impl Strategy<Value = PartitionProduceResponse> {
    (
        (any::<i32>(), any::<i16>(), any::<i64>(), any::<i64>()),
        proptest::collection::vec((any::<i32>(), proptest::option::of("[a-z ]{0,10}")), 0..3),
        proptest::option::of("[a-z ]{0,10}"),
        proptest::option::of((any::<i32>(), any::<i32>())),
        any::<bool>(),
    )
        .prop_map(|((index, error, base, time), errors, message, leader, t)| {
            PartitionProduceResponse::default()
                .with_index(index)
                .with_error_code(error)
                .with_base_offset(base)
                .with_log_append_time_ms(time)
                .with_log_start_offset(base / 2)
                .with_record_errors(
                    errors
                        .into_iter()
                        .map(|(i, m)| {
                            BatchIndexAndErrorMessage::default()
                                .with_batch_index(i)
                                .with_batch_index_error_message(m.map(StrBytes::from_string))
                        })
                        .collect(),
                )
                .with_error_message(message.map(StrBytes::from_string))
                .with_current_leader(match leader {
                    Some((id, epoch)) => LeaderIdAndEpoch::default()
                        .with_leader_id(BrokerId(id))
                        .with_leader_epoch(epoch),
                    None => LeaderIdAndEpoch::default(),
                })
                .with_unknown_tagged_fields(tags(t))
        })
}

fn arb_response() -> impl Strategy<Value = ProduceResponse> {
    let topic = (
        "[a-z.-]{0,12}",
        any::<[u8; 16]>(),
        proptest::collection::vec(arb_partition(), 0..3),
        any::<bool>(),
    )
        .prop_map(|(name, id, partitions, t)| {
            TopicProduceResponse::default()
                .with_name(TopicName(StrBytes::from_string(name)))
                .with_topic_id(uuid::Uuid::from_bytes(id))
                .with_partition_responses(partitions)
                .with_unknown_tagged_fields(tags(t))
        });
    (
        proptest::collection::vec(topic, 0..3),
        any::<i32>(),
        proptest::collection::vec(
            (
                any::<i32>(),
                "[a-z.]{0,10}",
                any::<i32>(),
                proptest::option::of("[a-z]{0,4}"),
            ),
            0..2,
        ),
        any::<bool>(),
    )
        .prop_map(|(responses, throttle, nodes, t)| {
            ProduceResponse::default()
                .with_responses(responses)
                .with_throttle_time_ms(throttle)
                .with_node_endpoints(
                    nodes
                        .into_iter()
                        .map(|(id, host, port, rack)| {
                            NodeEndpoint::default()
                                .with_node_id(BrokerId(id))
                                .with_host(StrBytes::from_string(host))
                                .with_port(port)
                                .with_rack(rack.map(StrBytes::from_string))
                        })
                        .collect(),
                )
                .with_unknown_tagged_fields(tags(t))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Whole or damaged, at every version, both walks report the same.
    #[test]
    fn agrees_with_the_schema_walk(
        body in arb_response(),
        version in VERSIONS.0..=VERSIONS.1,
        damage in proptest::collection::vec(
            (0..4u8, any::<usize>(), any::<u8>()),
            0..3,
        ),
    ) {
        let mut out = BytesMut::new();
        body.encode(&mut out, version).expect("encode");
        let mut b = out.to_vec();
        for (kind, at, value) in &damage {
            let n = b.len().max(1);
            match kind {
                0 => b.truncate(at % n),
                1 if !b.is_empty() => b[at % n] = *value,
                2 => b.insert(at % (b.len() + 1), *value),
                3 if !b.is_empty() => {
                    b.remove(at % n);
                }
                _ => {}
            }
        }
        let (events, result) = both(version, &b);
        if damage.is_empty() {
            let names_brokers = version >= FIRST_LEADERS && !body.node_endpoints.is_empty();
            let expected = match names_brokers {
                true => Walked::NamesBrokers,
                false => Walked::Whole,
            };
            prop_assert_eq!(result, Ok(expected));
            let partitions: usize =
                body.responses.iter().map(|t| t.partition_responses.len()).sum();
            prop_assert_eq!(events.len(), body.responses.len() + partitions);
        }
    }
}
