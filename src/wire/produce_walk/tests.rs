//! The hand-written Produce walk: exact bytes in, exact events out; and
//! held to the schema walk on requests `kafka-protocol` encodes at every
//! version, whole and damaged.

use super::*;
use crate::wire::schema::{message, Field, Type, Versions};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, TopicName, TransactionalId};
use kafka_protocol::protocol::{Encodable, StrBytes};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Both walks on `body`; they must agree, and this walk's result is returned.
fn both(version: i16, body: &[u8]) -> (Vec<Event<RequestPartition>>, Result<(), WalkError>) {
    let ours = events(version, body, 0);
    let theirs = schema_events(version, body, 0);
    assert_eq!(ours, theirs, "v{version}: {body:02x?}");
    ours
}

#[test]
fn the_layout_spelled_out_here_is_the_compiled_in_schema() {
    fn kind(ty: &Type) -> &'static str {
        match ty {
            Type::String => "string",
            Type::Int16 => "int16",
            Type::Int32 => "int32",
            Type::Uuid => "uuid",
            Type::Records => "records",
            Type::Array(_) => "[]",
            _ => "other",
        }
    }
    fn flatten(fields: &[Field], out: &mut Vec<(String, &'static str, Versions, Versions, bool)>) {
        for f in fields {
            out.push((
                f.path.clone(),
                kind(&f.ty),
                f.versions,
                f.nullable,
                f.tag.is_some(),
            ));
            if let Type::Array(inner) = &f.ty {
                if let Type::Struct(fields) = inner.as_ref() {
                    flatten(fields, out);
                }
            }
        }
    }
    let m = message("ProduceRequest").expect("schema");
    assert_eq!((m.valid.min, m.valid.max), VERSIONS);
    assert_eq!((m.flexible.min, m.flexible.max), (FIRST_FLEXIBLE, i16::MAX));
    let mut layout = Vec::new();
    flatten(&m.fields, &mut layout);
    let v = |min, max| Versions { min, max };
    let all = v(0, i16::MAX);
    let expected = vec![
        (
            TRANSACTIONAL_ID.to_string(),
            "string",
            v(3, i16::MAX),
            v(3, i16::MAX),
            false,
        ),
        (ACKS.to_string(), "int16", all, Versions::NONE, false),
        (TIMEOUT_MS.to_string(), "int32", all, Versions::NONE, false),
        (TOPIC_DATA.to_string(), "[]", all, Versions::NONE, false),
        (
            NAME.to_string(),
            "string",
            v(0, FIRST_BY_ID - 1),
            Versions::NONE,
            false,
        ),
        (
            TOPIC_ID.to_string(),
            "uuid",
            v(FIRST_BY_ID, i16::MAX),
            Versions::NONE,
            false,
        ),
        (PARTITION_DATA.to_string(), "[]", all, Versions::NONE, false),
        (INDEX.to_string(), "int32", all, Versions::NONE, false),
        (RECORDS.to_string(), "records", all, all, false),
    ];
    assert_eq!(layout, expected);
}

/// v8: null transactional id, acks -1, timeout 30000, topic "t" with
/// partition 2 holding 3 record bytes, then partition 5 with null records.
#[test]
fn a_v8_body_reports_its_topic_and_partitions() {
    let mut b = vec![0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0x75, 0x30];
    b.extend_from_slice(&[0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 2]);
    b.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3]);
    b.extend_from_slice(&[0, 0, 0, 5, 0xFF, 0xFF, 0xFF, 0xFF]);
    let (events, result) = both(8, &b);
    result.expect("walks");
    assert_eq!(
        events,
        vec![
            Event::Name(b"t".to_vec()),
            Event::Partition((2, Some(27..30))),
            Event::Partition((5, None)),
        ]
    );
}

/// v13: compact encoding, topic ids, an unknown tagged field on the
/// partition (tag 7, two bytes) that is skipped.
#[test]
fn a_v13_body_reports_topic_ids_and_skips_unknown_tagged_fields() {
    let id = [0xAB; 16];
    let mut b = vec![0x00, 0xFF, 0xFF, 0, 0, 0x75, 0x30, 0x02];
    b.extend_from_slice(&id);
    b.extend_from_slice(&[0x02, 0, 0, 0, 9, 0x04, 7, 8, 9]);
    b.extend_from_slice(&[0x01, 7, 2, 0xEE, 0xEE]); // one tagged field
    b.extend_from_slice(&[0x00, 0x00]); // topic's and body's tagged fields
    let (events, result) = both(13, &b);
    result.expect("walks");
    assert_eq!(
        events,
        vec![Event::Id(id), Event::Partition((9, Some(30..33)))]
    );
}

#[test]
fn a_forged_topic_count_is_an_error_not_an_allocation() {
    // v9: topic count 0xFFFFFFFF - 1 as a compact array, nothing behind it.
    let b = [
        0x00, 0xFF, 0xFF, 0, 0, 0x75, 0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F,
    ];
    let (events, result) = both(9, &b);
    assert!(events.is_empty());
    assert_eq!(
        result,
        Err(WalkError::Count {
            path: TOPIC_DATA.into(),
            at: 7,
            count: u64::from(u32::MAX) - 1,
            left: 0,
        })
    );
}

#[test]
fn versions_outside_the_schema_are_refused() {
    for version in [-1, 0, 2, 14, i16::MAX] {
        let (_, result) = both(version, &[]);
        assert!(
            matches!(result, Err(WalkError::Version { .. })),
            "v{version}"
        );
    }
}

/// A partition: index, records, whether it carries unknown tagged fields.
type PartitionSpec = (i32, Option<Vec<u8>>, bool);
/// A topic: name, id, partitions, whether it carries unknown tagged fields.
type TopicSpec = (String, [u8; 16], Vec<PartitionSpec>, bool);

fn request(txn: Option<String>, topics: Vec<TopicSpec>, tagged: bool) -> ProduceRequest {
    let tags = |on: bool| match on {
        true => BTreeMap::from([(3, Bytes::from_static(b"xyz")), (40_000, Bytes::new())]),
        false => BTreeMap::new(),
    };
    ProduceRequest::default()
        .with_transactional_id(txn.map(|t| TransactionalId(StrBytes::from_string(t))))
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(
            topics
                .into_iter()
                .map(|(name, id, partitions, t)| {
                    TopicProduceData::default()
                        .with_name(TopicName(StrBytes::from_string(name)))
                        .with_topic_id(uuid::Uuid::from_bytes(id))
                        .with_partition_data(
                            partitions
                                .into_iter()
                                .map(|(index, records, t)| {
                                    PartitionProduceData::default()
                                        .with_index(index)
                                        .with_records(records.map(Bytes::from))
                                        .with_unknown_tagged_fields(tags(t))
                                })
                                .collect(),
                        )
                        .with_unknown_tagged_fields(tags(t))
                })
                .collect(),
        )
        .with_unknown_tagged_fields(tags(tagged))
}

fn arb_request() -> impl Strategy<Value = ProduceRequest> {
    let partition = (
        any::<i32>(),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
        any::<bool>(),
    );
    let topic = (
        "[a-z.-]{0,12}",
        any::<[u8; 16]>(),
        proptest::collection::vec(partition, 0..4),
        any::<bool>(),
    );
    (
        proptest::option::of("[a-z]{0,8}"),
        proptest::collection::vec(topic, 0..4),
        any::<bool>(),
    )
        .prop_map(|(txn, topics, tagged)| request(txn, topics, tagged))
}

/// How to damage an encoded body: cut it, overwrite a byte, insert one or
/// drop one, at a place picked by `at` (modulo the length).
#[derive(Debug, Clone)]
enum Damage {
    None,
    Cut(usize),
    Set(usize, u8),
    Insert(usize, u8),
    Drop(usize),
}

fn arb_damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        1 => Just(Damage::None),
        2 => any::<usize>().prop_map(Damage::Cut),
        4 => (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Damage::Set(a, b)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Damage::Insert(a, b)),
        2 => any::<usize>().prop_map(Damage::Drop),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Whole or damaged, at every version, both walks report the same.
    #[test]
    fn agrees_with_the_schema_walk(
        body in arb_request(),
        version in VERSIONS.0..=VERSIONS.1,
        damage in proptest::collection::vec(arb_damage(), 1..3),
    ) {
        let mut out = BytesMut::new();
        body.encode(&mut out, version).expect("encode");
        let mut b = out.to_vec();
        let whole = damage.iter().all(|d| matches!(d, Damage::None));
        for d in damage {
            let n = b.len().max(1);
            match d {
                Damage::None => {}
                Damage::Cut(at) => b.truncate(at % n),
                Damage::Set(at, v) if !b.is_empty() => b[at % n] = v,
                Damage::Insert(at, v) => b.insert(at % (b.len() + 1), v),
                Damage::Drop(at) if !b.is_empty() => {
                    b.remove(at % n);
                }
                _ => {}
            }
        }
        let (events, result) = both(version, &b);
        if whole {
            prop_assert!(result.is_ok(), "v{version}: {result:?}");
            let partitions: usize = body.topic_data.iter().map(|t| t.partition_data.len()).sum();
            prop_assert_eq!(events.len(), body.topic_data.len() + partitions);
        }
    }
}

/// The schema walk's re-emit of `body` keeping the partition entries
/// `keep` holds for (by their place in the request) and the topics left
/// with any: what [`Index::without`] is held to.
fn schema_without(version: i16, body: &[u8], keep: &[bool]) -> Vec<u8> {
    use crate::wire::walk;
    struct Drop<'k> {
        keep: &'k [bool],
        entry: usize,
        kept_in_topic: usize,
    }
    impl walk::Visitor for Drop<'_> {
        fn enter(&mut self, field: &Field) {
            if field.path == TOPIC_DATA {
                self.kept_in_topic = 0;
            }
        }
        fn leave(&mut self, field: &Field) -> bool {
            match field.path.as_str() {
                PARTITION_DATA => {
                    let kept = self.keep[self.entry];
                    self.entry += 1;
                    self.kept_in_topic += usize::from(kept);
                    kept
                }
                TOPIC_DATA => self.kept_in_topic > 0,
                _ => true,
            }
        }
    }
    let msg = message("ProduceRequest").expect("schema");
    let mut v = Drop {
        keep,
        entry: 0,
        kept_in_topic: 0,
    };
    walk::rewrite(msg, version, body, 0, &mut v).expect("rewrite")
}

/// v8 (fixed-width counts): topic "t" with partitions 2 and 5, topic "u"
/// with partition 1.
fn two_topics_v8() -> Vec<u8> {
    let mut b = vec![0xFF, 0xFF, 0, 1, 0, 0, 0x75, 0x30]; // null txn, acks 1, timeout
    b.extend_from_slice(&[0, 0, 0, 2]); // two topics
    b.extend_from_slice(&[0, 1, b't', 0, 0, 0, 2]); // "t", two partitions
    b.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3]); // 2: three bytes
    b.extend_from_slice(&[0, 0, 0, 5, 0xFF, 0xFF, 0xFF, 0xFF]); // 5: null
    b.extend_from_slice(&[0, 1, b'u', 0, 0, 0, 1]); // "u", one partition
    b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1, 9]); // 1: one byte
    b
}

#[test]
fn an_index_names_each_entry_and_where_it_is() {
    let b = two_topics_v8();
    let index = Index::new(8, &b, 0).expect("index");
    let topics: Vec<_> = index.topics().iter().map(|t| index.topic(&b, t)).collect();
    assert_eq!(topics, [Topic::Name(b"t"), Topic::Name(b"u")]);
    assert_eq!(index.key(&b, &index.topics()[1]), b"u");
    let partitions: Vec<_> = index
        .partitions()
        .iter()
        .map(|p| (p.topic, p.index, p.records()))
        .collect();
    assert_eq!(
        partitions,
        [(0, 2, Some(27..30)), (0, 5, None), (1, 1, Some(53..54))]
    );
    assert_eq!(index.topics()[0].partitions(), 0..2);
    assert_eq!(index.topics()[1].partitions(), 2..3);
}

#[test]
fn an_index_re_emits_the_request_without_the_entries_dropped() {
    let b = two_topics_v8();
    let index = Index::new(8, &b, 0).expect("index");
    // Everything kept: the same bytes.
    assert_eq!(index.without(&b, |_| true), b);
    // Partition 5 of "t" dropped: "t" keeps one partition.
    let mut want = vec![0xFF, 0xFF, 0, 1, 0, 0, 0x75, 0x30, 0, 0, 0, 2];
    want.extend_from_slice(&[0, 1, b't', 0, 0, 0, 1]);
    want.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3]);
    want.extend_from_slice(&[0, 1, b'u', 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 9]);
    assert_eq!(index.without(&b, |i| i != 1), want);
    // Both of "t" dropped: the topic goes too.
    let mut want = vec![0xFF, 0xFF, 0, 1, 0, 0, 0x75, 0x30, 0, 0, 0, 1];
    want.extend_from_slice(&[0, 1, b'u', 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 9]);
    assert_eq!(index.without(&b, |i| i == 2), want);
    // Each entry is asked about once, in order.
    let mut asked = Vec::new();
    index.without(&b, |i| {
        asked.push(i);
        true
    });
    assert_eq!(asked, [0, 1, 2]);
}

/// v13 (compact counts, topic ids): the tagged fields of a kept partition,
/// of its topic and of the body stay as they were.
#[test]
fn a_v13_index_keeps_every_tagged_field_of_what_it_keeps() {
    let (a, c) = ([0xAA; 16], [0xCC; 16]);
    let mut b = vec![0x00, 0xFF, 0xFF, 0, 0, 0x75, 0x30, 0x03]; // two topics
    b.extend_from_slice(&a);
    b.extend_from_slice(&[0x03]); // two partitions
    b.extend_from_slice(&[0, 0, 0, 0, 0x02, 7, 0x01, 7, 1, 0xEE]); // 0: tagged
    b.extend_from_slice(&[0, 0, 0, 1, 0x00, 0x00]); // 1: null records
    b.extend_from_slice(&[0x01, 3, 1, 0xDD]); // topic a's tagged field
    b.extend_from_slice(&c);
    b.extend_from_slice(&[0x02, 0, 0, 0, 4, 0x01, 0x00, 0x00]); // c: partition 4
    b.extend_from_slice(&[0x01, 9, 0]); // the body's tagged field
    let index = Index::new(13, &b, 0).expect("index");
    assert_eq!(
        index
            .topics()
            .iter()
            .map(|t| index.topic(&b, t))
            .collect::<Vec<_>>(),
        [Topic::Id(a), Topic::Id(c)]
    );
    let mut want = vec![0x00, 0xFF, 0xFF, 0, 0, 0x75, 0x30, 0x02];
    want.extend_from_slice(&a);
    want.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02, 7, 0x01, 7, 1, 0xEE]);
    want.extend_from_slice(&[0x01, 3, 1, 0xDD, 0x01, 9, 0]);
    assert_eq!(index.without(&b, |i| i == 0), want);
    assert_eq!(schema_without(13, &b, &[true, false, false]), want);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// The index's re-emit is the schema walk's, at every version, for
    /// any choice of entries to keep.
    #[test]
    fn an_index_re_emits_as_the_schema_walk_does(
        body in arb_request(),
        version in VERSIONS.0..=VERSIONS.1,
        keep in proptest::collection::vec(any::<bool>(), 16),
    ) {
        let mut out = BytesMut::new();
        body.encode(&mut out, version).expect("encode");
        let index = Index::new(version, &out, 0).expect("index");
        let n = index.partitions().len();
        prop_assert_eq!(n, body.topic_data.iter().map(|t| t.partition_data.len()).sum::<usize>());
        let keep = &keep[..n];
        prop_assert_eq!(
            index.without(&out, |i| keep[i]),
            schema_without(version, &out, keep)
        );
    }
}
